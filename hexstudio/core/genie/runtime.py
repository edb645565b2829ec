"""The board-side LLM runtimes behind one interface (`BoardRuntime`), one implementation each:

    GenieOnBoard        Qualcomm's libGenie on a real board over SSH (the helper hexstudio/workers/board/genie_session.py
                        copied there, driven through Genie's C API)
    GenieHtpSimulator   the same helper and Genie's C API, on this machine: Qualcomm's x86 libGenie 1.21 over
                        the bundle's real context binaries on the HTP simulator (onnxruntime-qnn). Labeled
                        "Genie 1.21 on the HTP simulator (x86)"; everything it measures is simulated.
    OnnxruntimeTwin     HexStudio's own onnxruntime twin of Genie (hexstudio/workers/genie_sim), for a bundle whose
                        context binaries are stand-ins: the labeled fallback where onnxruntime-qnn is missing
    GenieX              Qualcomm's successor (the `geniex` package and qairt plugin) on a board, or its twin

Everything that talks to a model on a board (the chat page, `hexstudio chat`, the chat stage,
`hexstudio bench`, `hexstudio serve`) goes through hexstudio.core.genie.session.ChatSession, which loads the bundle
once, streams each reply, stops on request, reports KPIs per turn and keeps the model loaded between turns.
The runtime is a strategy of that session: which helper keeps the model loaded, what it needs first, and how
its per-turn profile becomes HexStudio's KPIs. All helpers speak one JSON-lines protocol
(hexstudio/workers/board/genie_session.py).

A user picks "genie" or "geniex" (`runtime=`, CLI `--runtime`, else the board's setting "runtime", else
genie); `select_runtime` picks the implementation from the board and the bundle it holds. A new runtime is
one class and one `register_runtime` call (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import json
import os
import posixpath
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hexstudio.core.device.board import Board, on_this_machine, python_env
from hexstudio.core.genie.profile import Kpis
from hexstudio.shared.errors import ActionableError
from hexstudio.shared.python_command import python_command
from hexstudio.workers import board as board_helpers

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

RUNTIMES = ("genie", "geniex")
DEFAULT_RUNTIME = "genie"
CONFIG = "genie_config.json"  # the basic dialog's config, what helper_argv runs when not told another
Sampler = dict[str, Any] | None  # the sampler values a helper is started with (None: the config's own)
# a helper's command line and environment (None: inherit)
HelperArgv = tuple[list[str], dict[str, str] | None]


class RuntimeError_(ActionableError):
    """The board's chat runtime cannot be chosen or started: message and hint."""


def resolve_runtime(board: Board, runtime: str | None = None) -> str:
    name = runtime or str((board.config or {}).get("runtime") or DEFAULT_RUNTIME)
    if name not in RUNTIMES:
        raise RuntimeError_(
            f"Unknown runtime '{name}'.",
            f'Use one of: {", ".join(RUNTIMES)} (board setting "runtime" or --runtime).',
        )
    return name


class BoardRuntime:
    """One way of running a bundle's dialog. Subclasses set the class attributes and override what differs."""

    key: str = ""  # registry key, e.g. "genie-htp-sim"
    name: str = ""  # what the user chose: "genie" | "geniex"
    title: str = ""  # shown in the UI, the CLI and reports
    per_turn_fallback: bool = False  # can one-shot runs (genie-t2t-run) stand in when the helper cannot start
    # what is copied to a real board's <home>/hexstudio/bin/<digest>/: the helper program (run), then the
    # modules it imports
    helper_files: tuple[Traversable, ...] = ()
    simulated: bool = False  # everything it measures is simulated (never a device figure)
    dialogs: tuple[str, ...] = ("basic",)  # the Genie dialog types it runs (genie_config.<type>.json)

    def helper_argv(
        self, board: Board, sampler: Sampler, helper_remote: str | None, bundle_dir: str, config: str = CONFIG
    ) -> HelperArgv:
        raise NotImplementedError

    async def prepare(self, board: Board, bundle_dir: str) -> list[str]:
        """What the runtime needs beside the pushed bundle; returns notes of what was written."""
        return []

    def kpis(self, end: dict[str, Any], simulated: bool) -> Kpis | None:
        """KPIs from a helper's end event when they are not Genie's profile (which the session parses)."""
        return None


def _sampler_args(sampler: dict[str, Any] | None) -> list[str]:
    return ["--sampler", json.dumps(sampler)] if sampler is not None else []


class GenieOnBoard(BoardRuntime):
    key, name, title, per_turn_fallback = "genie", "genie", "Genie (libGenie / genie-t2t-run)", True
    dialogs = ("basic", "lade", "spd")
    helper_files = board_helpers.helper_files("genie_session")

    def helper_argv(
        self, board: Board, sampler: Sampler, helper_remote: str | None, bundle_dir: str, config: str = CONFIG
    ) -> HelperArgv:
        cfg = board.config or {}
        py = cfg.get("python") or "python3"
        argv = [
            str(py),
            helper_remote or "genie_session.py",
            "--config",
            config,
            *_sampler_args(sampler),
            "--log-level",
            "warn",
        ]
        if cfg.get("genie_lib"):
            argv += ["--lib", str(cfg["genie_lib"])]
        if board.env_script:
            argv = [
                "bash",
                "-c",
                'if [ -f "$1" ]; then source "$1"; fi; shift; exec "$@"',
                "_",
                board.env_script,
                *argv,
            ]
        return argv, None


def simulator_helper(board: Board, module: str, *args: str) -> HelperArgv:
    """A simulator helper's command: this machine's interpreter and environment for the studio's own simulator
    board; on a remote host declared `"runner": "simulator"`, that host's `python` (HexStudio installed there)
    in its own environment, where this machine's paths mean nothing."""
    if on_this_machine(board):
        return python_command(module, *args), python_env()
    py = (board.config or {}).get("python") or "python3"
    return [str(py), "-m", module, *args], None


class GenieHtpSimulator(BoardRuntime):
    key, name, per_turn_fallback, simulated = "genie-htp-sim", "genie", True, True
    dialogs = ("basic", "lade", "spd")
    title = "Genie 1.21 on the HTP simulator (x86)"

    def helper_argv(
        self, board: Board, sampler: Sampler, helper_remote: str | None, bundle_dir: str, config: str = CONFIG
    ) -> HelperArgv:
        from hexstudio.workers.qnn.libs import INSTALL_HINT, find_qnn_libs

        if not on_this_machine(board):
            # the helper's libGenie and its x86 engine settings are found on this machine
            raise RuntimeError_(
                f"Real Genie on the HTP simulator keeps the model loaded only on this machine, not on "
                f"{board.label}.",
                "Chat one turn at a time there (--mode per_turn: that host's genie-t2t-run), or push the bundle to "
                "the built-in simulator board.",
            )
        libs = find_qnn_libs()
        if libs is None:
            raise RuntimeError_(
                "This bundle holds real QNN context binaries, and Qualcomm's libGenie is not "
                "installed here to run them.",
                INSTALL_HINT,
            )
        from hexstudio.workers.qnn.libs import x86_engine_overrides

        argv = python_command(
            "hexstudio.workers.board.genie_session",
            "--config",
            config,
            "--lib",
            str(libs.genie),
            *_sampler_args(sampler),
            "--engine",
            json.dumps(x86_engine_overrides(os.cpu_count() or 1)),
            "--log-level",
            "warn",
            "--htp-simulator",
        )
        # the wheel's libraries first, then this process's own LD_LIBRARY_PATH (a libpython or CUDA path the helper's
        # Python needs too: the transport puts this variable over the environment, not beside it)
        inherited = {k: v for k, v in os.environ.items() if k == "LD_LIBRARY_PATH"}
        return argv, libs.env({**inherited, **python_env()})


class OnnxruntimeTwin(BoardRuntime):
    key, name, per_turn_fallback, simulated = "ort-twin", "genie", True, True
    title = "HexStudio's onnxruntime twin of Genie (a stand-in bundle; not Genie)"

    def helper_argv(
        self, board: Board, sampler: Sampler, helper_remote: str | None, bundle_dir: str, config: str = CONFIG
    ) -> HelperArgv:
        return simulator_helper(
            board, "hexstudio.workers.genie_sim.session", "-c", "genie_config.json", *_sampler_args(sampler)
        )


class GenieX(BoardRuntime):
    key, name, title = "geniex", "geniex", "GenieX (qairt plugin)"
    helper_files = board_helpers.helper_files("geniex_session")

    def helper_argv(
        self, board: Board, sampler: Sampler, helper_remote: str | None, bundle_dir: str, config: str = CONFIG
    ) -> HelperArgv:
        extra = _sampler_args(sampler)
        if board.simulated:  # the simulator's GenieX face (as the Genie helper)
            return simulator_helper(board, "hexstudio.workers.genie_sim.geniex", "session", "-m", ".", *extra)
        cfg = board.config or {}
        py = cfg.get("geniex_python") or cfg.get("python") or "python3"
        argv = [str(py), helper_remote or "geniex_session.py", "--bundle", ".", *extra]
        # the geniex wheel as HexStudio's fix installs it (pip --target ~/.local/share/geniex-python)
        return [
            "sh",
            "-c",
            'PYTHONPATH="$HOME/.local/share/geniex-python${PYTHONPATH:+:$PYTHONPATH}" exec "$@"',
            "_",
            *argv,
        ], None

    async def prepare(self, board: Board, bundle_dir: str) -> list[str]:
        from hexstudio.shared.bundle.geniex import (
            GenieXMetadataError,
            chat_template_problem,
            geniex_metadata,
        )

        t = board.transport
        tc_path = posixpath.join(bundle_dir, "tokenizer_config.json")
        try:
            tc = json.loads(await t.read_bytes(tc_path)) if await t.exists(tc_path) else None
        except ValueError:
            tc = None
        if chat_template_problem(tc, tc_path):
            raise RuntimeError_(
                f"GenieX cannot load this bundle: {tc_path} has no chat template, and GenieX's qairt plugin applies "
                "the model's chat template itself (it refuses to create the pipeline without one).",
                "Chat through Genie instead (set the board's runtime to genie: the same bundle, no re-push), or "
                "compile an instruct model whose tokenizer_config.json carries a chat_template.",
            )
        # made again each time from the bundle as it is (three small files): one left by an earlier push of this run's
        # folder (a recompile with other binaries or parts) or cut short on the board would load the wrong graphs
        meta = posixpath.join(bundle_dir, "metadata.json")
        with tempfile.TemporaryDirectory(prefix="hexstudio-geniex-") as tmp:
            local = Path(tmp)
            for name in ("genie_config.json", "metadata.yaml", "config.json"):
                p = posixpath.join(bundle_dir, name)
                if await t.exists(p):
                    (local / name).write_bytes(await t.read_bytes(p))
            if board.simulated:  # simulated context binaries are small JSON documents holding the graph specs
                try:
                    cfg = json.loads((local / "genie_config.json").read_text())
                    for b in cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]:
                        (local / b).write_bytes(await t.read_bytes(posixpath.join(bundle_dir, b)))
                except (OSError, ValueError, KeyError, TypeError):
                    pass
            try:
                doc = geniex_metadata(local)
            except GenieXMetadataError as exc:
                raise RuntimeError_(exc.message, exc.hint) from None
        data = json.dumps(doc, indent=1).encode("utf-8")
        if await t.exists(meta) and await t.read_bytes(meta) == data:
            return []
        await t.write_bytes(meta, data)
        return [
            f"wrote {meta} for GenieX (model_id {doc['model_id']}, from the bundle's {doc['graph_specs_from']})"
        ]

    def kpis(self, end: dict[str, Any], simulated: bool) -> Kpis | None:
        """A GenieX helper's per-turn profile (geniex_ProfileData: us and tok/s) as KPIs; Genie's profile is
        parsed by the session itself (hexstudio.core.genie.profile)."""
        pd = end.get("geniex_profile")
        if not isinstance(pd, dict):
            return None
        src = "simulated" if simulated or pd.get("simulated") else "device"

        def ms(k: str) -> float | None:
            v = pd.get(k)
            return round(float(v) / 1000, 3) if isinstance(v, (int, float)) else None

        def num(k: str) -> float | None:
            v = pd.get(k)
            return round(float(v), 4) if isinstance(v, (int, float)) else None

        ptok, gtok = pd.get("prompt_tokens"), pd.get("generated_tokens")
        return Kpis(
            init_ms=None,
            prompt_tokens=int(ptok) if isinstance(ptok, int) else None,
            prompt_tok_s=num("prefill_speed"),
            ttft_ms=ms("ttft"),
            generated_tokens=int(gtok) if isinstance(gtok, int) else None,
            gen_tok_s=num("decoding_speed"),
            gen_time_ms=ms("decode_time"),
            source=src,
            origin="geniex_profile",
        )


_REGISTRY: dict[str, BoardRuntime] = {}


def register_runtime(runtime: BoardRuntime) -> None:
    """Add (or replace) a runtime under its key; `select_runtime` and `board_runtime` find it there."""
    _REGISTRY[runtime.key] = runtime


for _rt in (GenieOnBoard(), GenieHtpSimulator(), OnnxruntimeTwin(), GenieX()):
    register_runtime(_rt)

# Which implementation serves a choice on a board holding a kind of bundle: (name, simulated board, binaries).
# binaries: "qnn" (real context binaries), "stand-in" (the twin's simulated ones). A test or a plug-in may add
# rules; the first match wins.
Rule = Callable[[str, Board, str], "str | None"]


def _default_rule(name: str, board: Board, binaries: str) -> str | None:
    if name == "geniex":
        return "geniex"
    if not board.simulated:
        return "genie"
    return "genie-htp-sim" if binaries == "qnn" else "ort-twin"


RULES: list[Rule] = [_default_rule]


def board_runtime(key: str) -> BoardRuntime:
    if key not in _REGISTRY:
        raise RuntimeError_(f"Unknown runtime '{key}'.", f"Use one of: {', '.join(RUNTIMES)}.")
    return _REGISTRY[key]


def runtime_for(name: str, board: Board, binaries: str) -> BoardRuntime:
    for rule in RULES:
        key = rule(name, board, binaries)
        if key is not None:
            return board_runtime(key)
    raise RuntimeError_(f"No runtime serves '{name}' on {board.name}.", "Use --runtime genie.")


async def bundle_binaries(board: Board, bundle_dir: str) -> str:
    """ "qnn" when the bundle's first ctx-bin is a real QNN context binary, "stand-in" for the twin's simulated
    ones (a small JSON document), "unknown" when it cannot be read. Only the file's first bytes are read."""
    from hexstudio.workers.genie_sim.simbin import FORMAT

    t = board.transport
    try:
        cfg = json.loads(
            (await t.read_bytes(posixpath.join(bundle_dir, "genie_config.json"))).decode("utf-8")
        )
        first = str(cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"][0])
        head = (
            await t.read_head(posixpath.join(bundle_dir, first), 256)
            if hasattr(t, "read_head")
            else (await t.read_bytes(posixpath.join(bundle_dir, first)))[:256]
        )
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return "unknown"
    return "stand-in" if FORMAT.encode() in head else "qnn"


async def select_runtime(board: Board, bundle_dir: str, runtime: str | None = None) -> BoardRuntime:
    """The implementation for the user's choice (or the board's setting) and the bundle on the board."""
    name = resolve_runtime(board, runtime)
    binaries = await bundle_binaries(board, bundle_dir) if board.simulated else "qnn"
    rt = runtime_for(name, board, binaries)
    if rt.key == "geniex" and board.simulated and binaries == "qnn":
        raise RuntimeError_(
            "GenieX's qairt plugin does not run on an x86 workstation, and this bundle holds real "
            "context binaries that only Qualcomm's runtimes can run.",
            "Chat through Genie (--runtime genie): Qualcomm's libGenie runs them on the HTP simulator.",
        )
    return rt
