"""Where `hexstudio chat`, `bench` and `serve` find their board and bundle: the --board, --bundle and --run flags,
the board and bundle they resolve to (hexstudio.core.services.chat_target), and what the command says of them
before it starts."""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

from hexstudio.cli.common import CliError, eprint, workspace_from
from hexstudio.shared.errors import ActionableError


def add_target_flags(p: argparse.ArgumentParser, run_help: str) -> None:
    """--board, --bundle and --run: where `chat`, `bench` and `serve` find the board and the bundle (board_and_bundle);
    run_help says what the command does with --run's run."""
    p.add_argument(
        "--board", default=None, help="board name from settings, or sim (default: the run's board, else sim)"
    )
    p.add_argument(
        "--bundle",
        default=None,
        help="a bundle folder: a local one (with bundle.json) is pushed first; otherwise the folder on "
        "the board (default: the latest run's bundle)",
    )
    p.add_argument("--run", default=None, help=f"{run_help} (default: the latest run with one)")


def _latest_run_with_bundle(args: argparse.Namespace) -> Path | None:
    from hexstudio.core.services.chat_target import latest_run_with_bundle

    ws = workspace_from(args)
    if args.run:
        d = ws.run_dir(args.run)
        if not d.is_dir():
            raise CliError(f"No run '{args.run}' in {ws.runs_dir}.", "`hexstudio runs list` shows the runs.")
        return d
    return latest_run_with_bundle(ws)


async def board_and_bundle(args: argparse.Namespace) -> tuple[Any, str, dict[str, Any], Path | None]:
    """(board, remote bundle dir, bundle.json doc or {}, run dir or None): hexstudio.core.services.chat_target."""
    from hexstudio.core.services.chat_target import chat_target
    from hexstudio.core.settings import Settings

    run_dir = None if args.bundle else _latest_run_with_bundle(args)
    try:
        t = await chat_target(
            workspace_from(args),
            Settings.load(),
            run_dir=run_dir,
            board=args.board,
            bundle=args.bundle,
            say=eprint,
        )
    except ActionableError as exc:  # the board cannot be reached, no bundle: said as the CLI says it
        raise CliError(exc.message, exc.hint) from None
    for line in target_lines(args, t.run_dir, t.remote_bundle, t.board.label):
        eprint(line)
    return t.board, t.remote_bundle, t.bundle_doc, t.run_dir


def target_lines(args: argparse.Namespace, run_dir: Path | None, remote: str, board_label: str) -> list[str]:
    """What `chat`, `bench` and `serve` say before they start: which run's bundle (and why that one) on which
    board, and a warning when that run did not pass every gate it ran (issue 32: they used the latest run's
    bundle, even one that failed its gate, without naming it)."""
    from hexstudio.core.runs import Workspace
    from hexstudio.core.status import override_text, stage_statuses

    if run_dir is None:
        return [f"Using the bundle {args.bundle or remote} on {board_label} (not from a run)."]
    why = "--run" if getattr(args, "run", None) else "the latest run with a bundle; --run RUN chooses another"
    lines = [f"Using run {run_dir.name}'s bundle ({why}): {remote} on {board_label}."]
    try:
        m = Workspace(run_dir.parent.parent).open_run(run_dir.name)
    except (ActionableError, OSError, ValueError) as exc:
        return [
            *lines,
            f"warning: run {run_dir.name}'s run.json cannot be read ({exc}): its gates are unknown.",
        ]
    sts = stage_statuses(m)
    bad = [s for s in sts if s.key in ("gate_failed", "failed", "interrupted", "cancelled")]
    for s in bad:
        lines.append(
            f"warning: in run {run_dir.name} the {s.title} stage {s.word}: {s.gate_reason or s.detail}. "
            f"This bundle has not passed every check; `hexstudio runs show {run_dir.name}` tells more."
        )
    for s in sts:
        if s.key == "overridden" and s.override:
            lines.append(
                f"note: in run {run_dir.name} the {s.title} stage's gate did not pass "
                f"({s.gate_reason}) and was {override_text(s.override)}."
            )
    return lines


def model_dir_of(args: argparse.Namespace, run_dir: Path | None) -> Path | None:
    """Where the model's chat template is: the run's model folder, or a local bundle folder (it carries the
    model's tokenizer_config.json); None for a bundle that is only on the board."""
    if run_dir is not None and (run_dir / "artifacts" / "model" / "model.json").is_file():
        return run_dir / "artifacts" / "model"
    if args.bundle and (Path(args.bundle) / "bundle.json").is_file():
        return Path(args.bundle)
    return None
