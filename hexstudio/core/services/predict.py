"""The speed predictor (issue 28): a model's TTFT and tokens/s on a target, PREDICTED from config.json alone by
QNN's x86 HTP simulator, before any download, quantization or compile (`hexstudio predict`, the Preflight page's
speed panel). The heavy part runs in hexstudio/workers/predict.py; this service resolves the model's shapes, the target
(a board's or an AI Hub device's soc_model / dsp_arch) and the run settings, starts the worker and returns its
prediction document (hexstudio.shared.predict.Prediction.to_json: labeled "predicted (HTP simulator)")."""

from __future__ import annotations

import asyncio
import dataclasses
import json
import shutil
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import write_json_atomic
from hexstudio.core.jobs import JobRunner
from hexstudio.core.manifest import RunManifest
from hexstudio.core.reports.predicted import PREDICTION_FILE, read_prediction
from hexstudio.core.services import ServiceError
from hexstudio.core.services.model import model_config
from hexstudio.core.services.preflight import resolve_estimate_settings, run_settings
from hexstudio.core.settings import Settings, SettingsError
from hexstudio.core.stage_api import wait_or_cancel
from hexstudio.shared import modelinfo
from hexstudio.shared.bundle import KNOWN_DEVICES
from hexstudio.shared.predict import LPBQ_BLOCK, ModelShape, Target, target_for_device
from hexstudio.shared.run_settings import DEFAULT_DEVICE
from hexstudio.shared.worker_spec import PredictPlan, WorkerSpec

SIM_BOARD = "sim"


@dataclass(frozen=True)
class PredictRequest:
    """What to predict: a model (built-in, folder or Hugging Face id: only config.json is read) and a target
    (a board by name, or an AI Hub device; neither: the device a new run compiles for)."""

    model: str
    board: str | None = None
    device: str | None = None
    context_length: int | None = None
    ar_n: int | None = None
    parts: int | None = None
    two_layers: bool = True  # also the 2-layer graphs: per-layer slope and per-graph fixed cost
    # the run's device where this studio does not know it offline (an AI Hub device by name): on the simulator
    # board the prediction is for the default device in its place, and says so
    unknown_device: str | None = None


def resolve_target(
    board: str | None,
    device: str | None,
    boards: dict[str, dict[str, Any]] | None = None,
    default_device: str = DEFAULT_DEVICE,
) -> Target:
    """The soc_model / dsp_arch to compile for. An AI Hub device by name; a board by its settings' `device`
    (an AI Hub device name) or `soc_model` + `dsp_arch`; the simulator board stands for the run's device."""
    if device:
        if device not in KNOWN_DEVICES:
            raise ServiceError(f"Unknown device '{device}'.", f"Known offline: {', '.join(KNOWN_DEVICES)}.")
        return target_for_device(device, KNOWN_DEVICES[device])
    if not board or board == SIM_BOARD:
        note = (
            f"the simulator board stands for {default_device}, the device a run compiles for"
            if board == SIM_BOARD
            else ""
        )
        return target_for_device(default_device, KNOWN_DEVICES[default_device], note=note)
    cfg = (boards or {}).get(board)
    if cfg is None:
        raise ServiceError(f"No board named '{board}'.", "Add it on the Board page, or give --device NAME.")
    dev = cfg.get("device")
    if isinstance(dev, str) and dev in KNOWN_DEVICES:
        return target_for_device(dev, KNOWN_DEVICES[dev], note=f"board '{board}'")
    if cfg.get("soc_model") and cfg.get("dsp_arch"):
        if not str(cfg["soc_model"]).strip().isdigit():
            raise ServiceError(
                f"Board '{board}' has soc_model '{cfg['soc_model']}': a number is expected, as AI Hub numbers "
                "devices (77 for the IQ-9075 EVK's QCS9075).",
                f"Correct soc_model in board '{board}' of the settings, or give --device NAME (a device HexStudio "
                "knows offline).",
            )
        return target_for_device(
            f"board '{board}'",
            {"soc_model": cfg["soc_model"], "dsp_arch": cfg["dsp_arch"], "chipset": cfg.get("chipset") or ""},
        )
    return target_for_device(
        default_device,
        KNOWN_DEVICES[default_device],
        note=f"board '{board}' does not record its device: assumed {default_device}",
    )


def _boards() -> dict[str, dict[str, Any]]:
    try:
        return Settings.load().boards
    except (SettingsError, OSError, ValueError):
        return {}


def plan(
    req: PredictRequest, config: dict[str, Any] | None = None, boards: dict[str, dict[str, Any]] | None = None
) -> PredictPlan:
    """Resolve a request from config.json (fetched, or given) and the settings a new run would get."""
    cfg = config if config is not None else model_config(req.model)
    info = modelinfo.inspect_config(cfg)
    if not info["supported"]:
        raise ServiceError(
            info["reason"], "Pick a dense Llama-family model (Llama 3.x, Nemotron-Nano-8B, Qwen2/3)."
        )
    settings = run_settings({"context_length": req.context_length, "ar_n": req.ar_n, "parts": req.parts})
    r = resolve_estimate_settings(info, req.model, settings)
    err = modelinfo.check_context(info, r["context_length"], r["ar_n"])
    if err:
        raise ServiceError(err)
    if bad := modelinfo.check_parts(info, r["parts"]):  # as the Model stage refuses it: no such split
        raise ServiceError(*bad)
    target = resolve_target(req.board, req.device, _boards() if boards is None else boards)
    if req.unknown_device and (not req.board or req.board == SIM_BOARD):
        target = dataclasses.replace(
            target,
            note=f"the run compiles for '{req.unknown_device}', a device HexStudio does not know offline: "
            f"predicted for {target.name} (Hexagon {target.dsp_arch}) in its place",
        )
    shape = ModelShape.from_info(req.model, info)
    misfits = shape.lpbq_misfits()
    if misfits:  # the graph would fail minutes in, in a child process: say why now
        raise ServiceError(
            f"The predictor cannot build this model's layers: their weights are quantized as the bundle's are (int4 "
            f"LPBQ, blocks of {LPBQ_BLOCK} input features), and {', '.join(misfits)} "
            + ("is not a multiple" if len(misfits) == 1 else "are not multiples")
            + f" of {LPBQ_BLOCK}.",
            "Predict a model whose hidden size, intermediate size and heads x head_dim are multiples of "
            f"{LPBQ_BLOCK} (every released Llama 3.x, Nemotron and Qwen2/3 model is).",
        )
    return PredictPlan(
        model=req.model,
        shape=shape,
        target=target,
        context_length=int(r["context_length"]),
        ar_n=int(r["ar_n"]),
        parts=int(r["parts"]),
        two_layers=req.two_layers,
    )


def cache_dir(workspace: Path) -> Path:
    """Where simulated graph timings are kept, per QNN version / target / graph shape."""
    return workspace / "cache" / "predict"


async def run_prediction(
    p: PredictPlan, workspace: Path, on_event: Callable[[dict[str, Any]], None] | None = None
) -> dict[str, Any]:
    """Run hexstudio/workers/predict.py for a plan; its prediction document (labeled predicted)."""
    cache = cache_dir(workspace)
    job_dir = cache / "jobs" / f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}"
    out = job_dir / "out"
    out.mkdir(parents=True, exist_ok=True)
    spec = job_dir / "spec.json"
    WorkerSpec.build("predict", job_dir, out, {}, predict=p.work(cache)).write(spec)
    job = await JobRunner().start_local(
        "hexstudio.workers.predict",
        spec,
        on_event=on_event,
        log_path=job_dir / "predict.jsonl",
        what="The speed predictor",
    )
    # the caller cancelled (the panel's time limit, the window closed, Ctrl+C): the simulation stops with it, or a
    # second Predict ran beside a first that went on
    res = await wait_or_cancel(job, asyncio.Event())
    if not res.ok:  # the job's folder kept, for its log
        log_hint = f"The predictor's log: {job_dir / 'predict.jsonl'}."
        raise ServiceError(
            res.message or "The speed predictor failed.", f"{res.hint} {log_hint}" if res.hint else log_hint
        )
    doc: dict[str, Any] = json.loads((out / "prediction.json").read_text(encoding="utf-8"))
    shutil.rmtree(
        job_dir, ignore_errors=True
    )  # the timings stay in the cache; a job's folder is no use after it
    return doc


def request_for_run(run_dir: Path, two_layers: bool = True) -> PredictRequest:
    """A run's model, board and settings (context length, AR-N, parts where set) as a prediction request, for
    the device the run compiles for (its `device` setting: the Compile stage's target on every board)."""
    m = RunManifest.load(run_dir)

    def num(key: str) -> int | None:
        v = m.settings.get(key)
        return int(v) if isinstance(v, int) and not isinstance(v, bool) else None

    device = m.settings.get("device")
    return PredictRequest(
        model=str(m.inputs.get("model")),
        board=str(m.inputs.get("board") or SIM_BOARD),
        # a device this studio knows offline (an AI Hub device it does not know: the board's, and the prediction
        # names the device it is for)
        device=device if isinstance(device, str) and device in KNOWN_DEVICES else None,
        unknown_device=device if isinstance(device, str) and device and device not in KNOWN_DEVICES else None,
        context_length=num("context_length"),
        ar_n=num("ar_n"),
        parts=num("parts"),
        two_layers=two_layers,
    )


def save_for_run(run_dir: Path, doc: dict[str, Any]) -> Path:
    """Keep a prediction with its run (runs/<id>/predicted/, apart from every measured artifact): the report and
    Compare show it beside the measured figures, labeled predicted."""
    if doc.get("predicted") is not True:
        raise ServiceError(
            "Only a prediction document (labeled predicted) can be kept as a run's prediction."
        )
    path = run_dir / PREDICTION_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    write_json_atomic(path, doc)
    return path


async def predict_for_run(
    run_dir: Path,
    workspace: Path,
    two_layers: bool = True,
    on_event: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """Predict for a run's model, board and settings and keep the prediction with the run (`hexstudio predict
    --run` and the Preflight page's speed panel). ServiceError says what failed and what to do."""
    req = request_for_run(run_dir, two_layers=two_layers)
    p = await asyncio.to_thread(plan, req)  # config.json may come from the Hub
    doc = await run_prediction(p, workspace, on_event)
    save_for_run(run_dir, doc)
    return doc


def run_prediction_doc(run_dir: Path) -> dict[str, Any] | None:
    """The prediction kept with a run, if any."""
    return read_prediction(run_dir)


def prediction_out_of_date(run_dir: Path, doc: dict[str, Any]) -> str | None:
    """Why a run's kept prediction no longer describes it (its settings or device changed since), as the report
    says it; None when it still does."""
    from hexstudio.core.reports.predicted import run_prediction_stale

    return run_prediction_stale(run_dir, doc)
