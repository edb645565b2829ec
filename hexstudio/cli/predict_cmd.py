"""`hexstudio predict`: a model's TTFT and tokens/s on a board, PREDICTED by QNN's HTP simulator from config.json
alone (issue 28). Every figure it prints is labeled predicted; none is a device result."""

from __future__ import annotations

import argparse
import asyncio
import sys
from typing import Any

from hexstudio.cli.common import (
    EXIT_USAGE,
    CliError,
    add_shape_flags,
    eprint,
    print_json,
    set_action,
    workspace_from,
)
from hexstudio.core.paths import BUILTIN_MODEL_ID
from hexstudio.core.services import predict as predict_service
from hexstudio.shared.predict import summary_lines


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "predict",
        help="predict TTFT and tokens/s on a board from config.json (HTP simulator)",
        description="Builds synthetic decoder layers at the model's true shapes (random weights, "
        "int4 LPBQ / 16-bit activations / 8-bit KV), compiles them for the target's "
        "Hexagon arch with QNN and runs them on QNN's x86 HTP simulator. The result is "
        "a prediction, labeled so, never a device measurement. Timings are cached per "
        "graph shape, target and QNN version under WORKSPACE/cache/predict.",
    )
    p.add_argument(
        "--model",
        default=None,
        help=f"built-in model, Hugging Face id or folder (only config.json is read; default {BUILTIN_MODEL_ID})",
    )
    t = p.add_mutually_exclusive_group()
    t.add_argument(
        "--board", default=None, help="a board's name (its device); 'sim': the run's default device"
    )
    t.add_argument("--device", default=None, help="an AI Hub device name, e.g. 'Dragonwing IQ-9075 EVK'")
    add_shape_flags(p, "context length (default: the run default)", ("--context", "--context-length"))
    p.add_argument(
        "--run",
        default=None,
        metavar="RUN_ID",
        help="predict for a run's model, board and settings, and keep the prediction with the run "
        "(its report and Compare show it beside the measured figures, labeled predicted)",
    )
    p.add_argument(
        "--one-layer",
        action="store_true",
        help="simulate 1-layer graphs only (faster; no per-graph fixed cost from the 2-layer slope)",
    )
    set_action(p, cmd_predict, workspace=True)


def cmd_predict(args: argparse.Namespace) -> int:
    ws_ = workspace_from(args)
    ws = ws_.root
    run_dir = ws_.run_dir(args.run) if args.run else None
    if run_dir is not None and not (run_dir / "run.json").is_file():
        raise CliError(f"No run '{args.run}' in {ws_.runs_dir}.", "`hexstudio runs list` shows the runs.")
    if run_dir is not None:
        given = [
            flag
            for flag, v in (
                ("--model", args.model),
                ("--board", args.board),
                ("--device", args.device),
                ("--context", args.context_length),
                ("--ar-n", args.ar_n),
                ("--parts", args.parts),
            )
            if v is not None
        ]
        if given:
            raise CliError(
                f"--run predicts for the run's own model, board and settings; {', '.join(given)} cannot change "
                "them.",
                "Leave those flags out, or drop --run to predict for other ones (that prediction is not kept "
                "with a run).",
                exit_code=EXIT_USAGE,
            )
        req = predict_service.request_for_run(run_dir, two_layers=not args.one_layer)
    else:
        req = predict_service.PredictRequest(
            model=args.model or BUILTIN_MODEL_ID,
            board=args.board,
            device=args.device,
            context_length=args.context_length,
            ar_n=args.ar_n,
            parts=args.parts,
            two_layers=not args.one_layer,
        )
    pl = predict_service.plan(req)

    def on_event(ev: dict[str, Any]) -> None:
        if ev.get("type") in ("progress", "log") and not args.json and sys.stderr.isatty():
            eprint(f"  {ev.get('message')}")

    if not args.json:
        eprint(
            f"predicting {pl.model} on {pl.target.name} ({pl.target.dsp_arch}, soc_model {pl.target.soc_model}): "
            f"context {pl.context_length}, AR-{pl.ar_n}, {pl.parts} parts ..."
        )
    doc = asyncio.run(predict_service.run_prediction(pl, ws, on_event))
    if run_dir is not None:
        kept = predict_service.save_for_run(run_dir, doc)
        if not args.json:
            eprint(f"kept with run {args.run}: {kept}")
    if args.json:
        print_json(doc)
    else:
        for line in summary_lines(doc):
            print(line)
    return 0
