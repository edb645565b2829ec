"""The board-side LLM runtimes behind one interface: Genie (QAIRT's libGenie / genie-t2t-run) and GenieX
(Qualcomm's successor: the `geniex` CLI and Python package with its qairt plugin; docs/genie.md).

Everything that talks to a model on a board (the chat page, `hexstudio chat`, the chat stage,
`hexstudio bench`) goes through app.core.genie.session.ChatSession, which loads the bundle once, streams
each reply, stops on request, reports KPIs per turn and keeps the model loaded between turns. The
runtime is a strategy of that session: which helper keeps the model loaded on the board, what it needs
there first, and how its per-turn profile becomes HexStudio's KPIs. Both helpers speak the same
JSON-lines protocol (workers/board/genie_session.py).

The runtime is chosen by `runtime=` (CLI `--runtime`), else the board's setting `"runtime"`, else
"genie". The same pushed bundle serves both: GenieX's extra file, metadata.json, is derived from the
bundle's own graph specs and written beside it on the board (workers/shared/bundle/geniex.py).
"""

from __future__ import annotations

import json
import posixpath
import tempfile
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from app.core.device.board import Board, python_env
from app.core.genie.profile import Kpis
from app.core.jobs import python_command
from workers.board import helper_file
from workers.shared.errors import ActionableError

if TYPE_CHECKING:
    from importlib.resources.abc import Traversable

RUNTIMES = ("genie", "geniex")
DEFAULT_RUNTIME = "genie"
GENIEX_LAUNCHER = "~/.local/bin/geniex"


class RuntimeError_(ActionableError):
    """The board's chat runtime cannot be chosen or started: message and hint."""


def resolve_runtime(board: Board, runtime: str | None = None) -> str:
    name = runtime or str((board.config or {}).get("runtime") or DEFAULT_RUNTIME)
    if name not in RUNTIMES:
        raise RuntimeError_(f"Unknown runtime '{name}'.", f"Use one of: {', '.join(RUNTIMES)} (board setting "
                            "\"runtime\" or --runtime).")
    return name


@dataclass(frozen=True)
class BoardRuntime:
    name: str                    # "genie" | "geniex"
    title: str
    helper: Traversable          # package data, copied to <home>/hexstudio/bin/ on a real board
    per_turn_fallback: bool      # can one-shot runs stand in when the helper cannot start

    def helper_argv(self, board: Board, sampler: dict[str, Any] | None, helper_remote: str | None,
                    bundle_dir: str) -> tuple[list[str], dict[str, str] | None]:
        extra = ["--sampler", json.dumps(sampler)] if sampler is not None else []
        cfg = board.config or {}
        if self.name == "genie":
            if board.simulated:
                return python_command("workers.genie_sim.session", "-c", "genie_config.json", *extra), python_env()
            py = cfg.get("python") or "python3"
            argv = [str(py), helper_remote or "genie_session.py", "--config", "genie_config.json", *extra]
            if cfg.get("genie_lib"):
                argv += ["--lib", str(cfg["genie_lib"])]
            if board.env_script:
                argv = ["bash", "-c", 'if [ -f "$1" ]; then source "$1"; fi; shift; exec "$@"', "_",
                        board.env_script, *argv]
            return argv, None
        # geniex
        if board.simulated:   # the simulator's GenieX face (as the Genie helper: this machine's python)
            return python_command("workers.genie_sim.geniex", "session", "-m", ".", *extra), python_env()
        py = cfg.get("geniex_python") or cfg.get("python") or "python3"
        argv = [str(py), helper_remote or "geniex_session.py", "--bundle", ".", *extra]
        # the geniex wheel as HexStudio's fix installs it (pip --target ~/.local/share/geniex-python)
        return ["sh", "-c", 'PYTHONPATH="$HOME/.local/share/geniex-python${PYTHONPATH:+:$PYTHONPATH}" exec "$@"', "_",
                *argv], None

    async def prepare(self, board: Board, bundle_dir: str) -> list[str]:
        """What the runtime needs beside the pushed bundle; returns notes of what was written."""
        if self.name != "geniex":
            return []
        from workers.shared.bundle.geniex import GenieXMetadataError, chat_template_problem, geniex_metadata

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
                "compile an instruct model whose tokenizer_config.json carries a chat_template.")
        meta = posixpath.join(bundle_dir, "metadata.json")
        if await t.exists(meta):
            return []

        with tempfile.TemporaryDirectory(prefix="hexstudio-geniex-") as tmp:
            local = Path(tmp)
            for name in ("genie_config.json", "metadata.yaml", "config.json"):
                p = posixpath.join(bundle_dir, name)
                if await t.exists(p):
                    (local / name).write_bytes(await t.read_bytes(p))
            if board.simulated:   # simulated context binaries are small JSON documents holding the graph specs
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
        await t.write_bytes(meta, json.dumps(doc, indent=1).encode("utf-8"))
        return [f"wrote {meta} for GenieX (model_id {doc['model_id']}, from the bundle's {doc['graph_specs_from']})"]

    def kpis(self, end: dict[str, Any], simulated: bool) -> Kpis | None:
        """A GenieX helper's per-turn profile (geniex_ProfileData: us and tok/s) as KPIs; Genie's profile is
        parsed by the session itself (app.core.genie.profile)."""
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
        return Kpis(init_ms=None, prompt_tokens=int(ptok) if isinstance(ptok, int) else None,
                    prompt_tok_s=num("prefill_speed"), ttft_ms=ms("ttft"),
                    generated_tokens=int(gtok) if isinstance(gtok, int) else None,
                    gen_tok_s=num("decoding_speed"), gen_time_ms=ms("decode_time"), source=src,
                    origin="geniex_profile")


_RUNTIMES = {
    "genie": BoardRuntime("genie", "Genie (libGenie / genie-t2t-run)", helper_file("genie_session"),
                          True),
    "geniex": BoardRuntime("geniex", "GenieX (qairt plugin)", helper_file("geniex_session"),
                           False),
}


def board_runtime(name: str) -> BoardRuntime:
    if name not in _RUNTIMES:
        raise RuntimeError_(f"Unknown runtime '{name}'.", f"Use one of: {', '.join(RUNTIMES)}.")
    return _RUNTIMES[name]
