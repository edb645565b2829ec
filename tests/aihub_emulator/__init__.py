"""The local Qualcomm AI Hub emulator (EMULATED: it packages its inputs, it compiles nothing).

    from tests.aihub_emulator import AIHubEmulator, fast_client_knobs

    with AIHubEmulator() as emu:            # a thread serving http://127.0.0.1:<port>
        cfg = emu.client_config()          # qai_hub.ClientConfig for an in-process qai_hub.Client
        env = emu.worker_env()             # token + api url + NO_PROXY for a compile worker
        settings = emu.run_settings()      # run settings: api url, fast polling, no HTTP retries

pytest: `from tests.aihub_emulator.fixtures import aihub_emulator` in a conftest gives a started
emulator per test, with the worker environment set (monkeypatch) and the in-process client's knobs
fast. `python -m tests.aihub_emulator` serves one until Ctrl+C (for trying the GUI by hand).
"""

from tests.aihub_emulator.server import (
    DEFAULT_TOKEN,
    EMULATED_ATTRIBUTE,
    FAST_RUN_SETTINGS,
    AIHubEmulator,
    fast_client_knobs,
)

__all__ = ["DEFAULT_TOKEN", "EMULATED_ATTRIBUTE", "FAST_RUN_SETTINGS", "AIHubEmulator", "fast_client_knobs"]
