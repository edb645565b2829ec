"""`hexstudio`: with no arguments (or only `--workspace DIR`) the studio window; with a command, the CLI;
`hexstudio --worker STAGE --spec FILE` runs a worker (used by frozen builds)."""

from __future__ import annotations

import importlib.util
import os
import runpy
import sys
from collections.abc import Sequence


def _exit_code(exc: SystemExit) -> int:
    if isinstance(exc.code, str):
        print(exc.code, file=sys.stderr)
        return 1
    return int(exc.code or 0)


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if getattr(sys, "frozen", False):
        import multiprocessing

        multiprocessing.freeze_support()
    if args[:1] == ["-c"] and getattr(sys, "frozen", False):
        # a frozen build has no separate Python: `hexstudio -c CODE` stands in for `python -c CODE`
        # (the preflight probe runs its GPU probe and AIMET smoke test this way)
        if len(args) < 2:
            print("usage: hexstudio -c CODE", file=sys.stderr)
            return 2
        sys.argv = ["-c", *args[2:]]
        try:
            exec(compile(args[1], "<string>", "exec"), {"__name__": "__main__"})
        except SystemExit as exc:
            return _exit_code(exc)
        return 0
    if args[:1] == ["--worker"]:
        if len(args) < 2:
            print("usage: hexstudio --worker STAGE --spec FILE", file=sys.stderr)
            return 2
        stage = args[1]
        if not stage.replace("_", "").isalnum():
            print(f"error: '{stage}' is not a worker name", file=sys.stderr)
            return 2
        # Look the module up first: an ImportError raised *inside* a worker is that worker's failure
        # (traceback, exit 1, as with `python -m`), not "there is no worker".
        if importlib.util.find_spec(f"hexstudio.workers.{stage}") is None:
            print(f"error: there is no worker '{stage}'", file=sys.stderr)
            return 2
        sys.argv = [f"hexstudio.workers.{stage}", *args[2:]]
        try:
            runpy.run_module(f"hexstudio.workers.{stage}", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            return _exit_code(exc)
        return 0
    if args[:1] == ["--workspace"] and len(args) > 2 and not args[2].startswith("-"):
        # `hexstudio --workspace DIR COMMAND ...`: the folder for that command (and the workers it starts), as
        # `--workspace` after the command gives it; a command that takes no --workspace still reads it
        os.environ["HEXSTUDIO_WORKSPACE"] = args[1]
        args = args[2:]
    # the window's own flags alone (GUI_HELP: `hexstudio [gui] [--workspace FOLDER] [--startup-check]`) open it
    if not args or args[0] in ("gui", "--workspace", "--startup-check"):
        from hexstudio.ui.launch import launch_gui

        return launch_gui(args[1:] if args[:1] == ["gui"] else args)
    from hexstudio.cli.main import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
