"""genie-t2t-run's command line, as both of HexStudio's runners read it: the onnxruntime twin
(hexstudio/workers/genie_sim/t2t.py) and Qualcomm's libGenie on the HTP simulator (hexstudio/workers/qnn/genie_t2t.py).
Standard library only."""

from __future__ import annotations

import argparse
import sys
from typing import NoReturn


class _Parser(argparse.ArgumentParser):
    def error(self, message: str) -> NoReturn:  # genie-t2t-run style
        print(f"ERROR: {message}", file=sys.stderr)
        sys.exit(1)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="genie-t2t-run", add_help=True)
    p.add_argument("-c", "--config", required=False)
    p.add_argument("-p", "--prompt")
    p.add_argument("--prompt_file")
    p.add_argument("--profile")
    p.add_argument("--log", choices=["error", "warn", "info", "verbose"], default=None)
    p.add_argument("-l", "--lora", help="(refused: the simulator has no LoRA adapters)")
    p.add_argument("-s", "--save", help="(refused: the simulator cannot save dialog state)")
    p.add_argument("-r", "--restore", help="(refused: the simulator cannot restore dialog state)")
    p.add_argument(
        "--action",
        type=str.upper,
        choices=["ABORT", "PAUSE"],
        help="signal the query --sleep ms after it starts (the simulator implements ABORT)",
    )
    p.add_argument("--sleep", type=int, default=None, metavar="MS", help="delay before --action, in ms")
    p.add_argument(
        "--max-tokens",
        type=int,
        default=None,
        help="(simulator only; genie-t2t-run takes the budget from the config's dialog.max-num-tokens)",
    )
    return p
