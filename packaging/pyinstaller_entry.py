"""Entry point of the frozen HexStudio (PyInstaller): the studio, the CLI, `--worker STAGE` and `-c CODE`."""

from hexstudio.__main__ import main

if __name__ == "__main__":
    raise SystemExit(main())
