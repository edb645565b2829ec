"""`hexstudio`: with no arguments the studio window; with a command, the CLI;
`hexstudio --worker STAGE --spec FILE` runs a worker (used by frozen builds)."""

from __future__ import annotations

import runpy
import sys
from collections.abc import Sequence


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["--worker"]:
        if len(args) < 2:
            print("usage: hexstudio --worker STAGE --spec FILE", file=sys.stderr)
            return 2
        stage = args[1]
        if not stage.replace("_", "").isalnum():
            print(f"error: '{stage}' is not a worker name", file=sys.stderr)
            return 2
        sys.argv = [f"workers.{stage}", *args[2:]]
        try:
            runpy.run_module(f"workers.{stage}", run_name="__main__", alter_sys=True)
        except SystemExit as exc:
            return int(exc.code or 0) if not isinstance(exc.code, str) else 1
        except ImportError:
            print(f"error: there is no worker '{stage}'", file=sys.stderr)
            return 2
        return 0
    if not args or args[0] in ("gui", "--workspace"):
        from app.ui.launch import launch_gui

        return launch_gui(args[1:] if args[:1] == ["gui"] else args)
    from app.core.cli.main import main as cli_main

    return cli_main(args)


if __name__ == "__main__":
    raise SystemExit(main())
