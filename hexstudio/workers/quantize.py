"""Quantize stage worker: export the deployment graphs per part and quantize them W4A16 with a
real aimet_onnx QuantizationSimModel, one part at a time (docs/CONTRACTS.md §2).

    python -m hexstudio.workers.quantize --spec SPEC.json

Recipe (Qualcomm's W4A16 for Llama on HTP): int4 low-power blockwise (LPBQ, block 64) weights
for the backbone, 16-bit activations, 8-bit KV cache, lm_head and embeddings at 8 bits.
Sequential part-wise calibration (hexstudio/workers/quant/partwise.py): part k is calibrated on the
QUANTIZED outputs of part k-1, one calibration unit's QuantSim in memory at a time; one encodings
file per part serves its prompt processor and token generator, with every I/O tensor Genie shares
between graphs quantized identically (hexstudio/workers/quant/io_encodings.py, docs/genie.md).

Writes into spec.out_dir: float/<graph>.onnx, parts/<graph>/model.{onnx,data,encodings},
sim/<graph>.onnx (QDQ, for onnxruntime) and quantize.json.
"""

from __future__ import annotations

import errno
import gc
import json
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexstudio.shared.artifacts import ModelDoc
from hexstudio.shared.disk_use import tree_bytes
from hexstudio.shared.protocol import Emitter
from hexstudio.workers.documents import model_doc, output_invalid
from hexstudio.workers.runtime import WorkerError, WorkerSpec, worker_main


def resolve_shape(model: ModelDoc) -> tuple[int, int, int]:
    """The deployment shape the Model stage resolved (model.json "resolved": no "auto" left), checked."""
    res = model["resolved"]
    cl, ar_n, parts = int(res["context_length"]), int(res["ar_n"]), int(res["parts"])
    num_layers = int((model.get("info") or {}).get("num_layers") or 0)
    if ar_n < 1 or cl < 2 or ar_n >= cl:
        raise WorkerError(
            "bad_context",
            f"context_length {cl} must be larger than ar_n {ar_n}.",
            "Pick e.g. context_length 512 with ar_n 128.",
        )
    if cl % ar_n:
        raise WorkerError(
            "context_not_multiple_of_ar_n",
            f"context_length {cl} is not a multiple of ar_n {ar_n}: the prompt processor "
            "fills the KV cache in whole blocks of ar_n tokens.",
            f"Use a context length such as {(cl // ar_n + 1) * ar_n} or {max(ar_n, cl // ar_n * ar_n)}.",
        )
    if parts < 1 or (num_layers and parts > num_layers):
        raise WorkerError(
            "bad_parts",
            f"parts {parts} must be between 1 and the number of layers ({num_layers}).",
            'Use parts "auto" or a smaller number.',
        )
    return cl, ar_n, parts


def _threads() -> int:
    return max(1, min(int(os.environ.get("HEXSTUDIO_THREADS", "0") or 0) or (os.cpu_count() or 2), 8))


def protect_protocol_stdout(em: Emitter) -> None:
    """AIMET prints to stdout, the protocol channel: keep the protocol on a private copy of fd 1
    and send everything else written to fd 1 to stderr (the stage log)."""
    import sys

    sys.stdout.flush()
    em._stream = os.fdopen(os.dup(1), "w", buffering=1, encoding="utf-8")
    os.dup2(2, 1)


@dataclass(frozen=True)
class _Plan:
    """The stage's inputs, resolved and checked before anything is exported."""

    context_length: int
    ar_n: int
    parts: int
    samples: int
    seq_len: int
    more_cls: list[int]
    more_ars: list[int]
    unit: str
    text: Path


def _plan(spec: WorkerSpec, model_json: ModelDoc) -> _Plan:
    """Every setting the stage reads, checked, with an error that says which to change."""
    from hexstudio.shared.run_settings import extra_ar_sizes, extra_context_lengths, genie_cl_problem
    from hexstudio.shared.run_settings import spec as setting_spec
    from hexstudio.workers.quant.calib import resolve_text

    settings = spec.settings
    try:
        cl, ar_n, parts = resolve_shape(model_json)
    except (KeyError, TypeError, ValueError) as exc:
        raise output_invalid("model", f"model.json's resolved shape is damaged ({exc}).") from None
    for key in ("weight_bits", "activation_bits", "kv_bits"):
        allowed = getattr(setting_spec(key), "choices", None) or ()  # the settings' own choices
        if getattr(settings, key) not in allowed:
            raise WorkerError(
                "bad_precision",
                f"{key} {getattr(settings, key)} is not supported.",
                f"Use one of {', '.join(map(str, allowed))}.",
            )
    samples = settings.calibration_samples
    # unset: one prompt-processor block (the shape the graphs run at)
    seq_len = settings.calibration_seq_len if spec.is_set("calibration_seq_len") else ar_n
    if samples < 1 or seq_len < 2 or seq_len > cl:
        raise WorkerError(
            "bad_calibration",
            f"calibration_samples {samples} / calibration_seq_len {seq_len} are out of range (1.., 2..{cl}).",
            "Use e.g. 8 samples of 128 tokens.",
        )
    if (why := genie_cl_problem(cl, ar_n)) is not None:
        raise WorkerError(
            "bad_context_length",
            why[0].upper() + why[1:],
            "Set context_length or ar_n so that the "
            "context length is not twice ar_n (e.g. ar_n 128 with 512 or 1024).",
        )
    try:
        more_cls = extra_context_lengths(settings.context_lengths, cl, ar_n)
    except ValueError as exc:
        raise WorkerError(
            "bad_context_lengths",
            str(exc),
            "Fix context_lengths (or leave it empty), then run the Quantize stage again.",
        ) from None
    try:
        more_ars = extra_ar_sizes(settings.ar_sizes, ar_n, [cl, *more_cls])
    except ValueError as exc:
        raise WorkerError(
            "bad_ar_sizes", str(exc), "Fix ar_sizes (or leave it empty), then run the Quantize stage again."
        ) from None
    unit = settings.calibration_unit
    if unit not in ("layer", "part"):
        raise WorkerError(
            "bad_calibration_unit",
            f"calibration_unit {unit!r} is not known.",
            'Use "layer" (one QuantSim per decoder layer, least memory) or "part" (one QuantSim per part).',
        )
    text = resolve_text(settings.calibration_text, "calibration")
    return _Plan(cl, ar_n, parts, samples, seq_len, more_cls, more_ars, unit, text)


def model_config(hf_dir: Path) -> Any:
    """The model's configuration as transformers reads it (its defaults filled in, e.g. a Llama's BOS id)."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(str(hf_dir))
    except (OSError, ValueError) as exc:
        raise WorkerError(
            "model_load_failed",
            f"Could not read the model configuration in {hf_dir}: {exc}",
            "Check the model folder (model stage) and its config.json.",
        ) from None


def _export(
    hf_dir: Path, out: Path, plan: _Plan, em: Emitter
) -> tuple[Any, dict[str, Any], list[dict[str, Any]]]:
    """Step 1: the float deployment graphs, exported piece by piece (one decoder layer's weights read from the
    safetensors files at a time); (the model's config, Genie's positional encoding, the graph entries)."""
    cl, parts, more_cls = plan.context_length, plan.parts, plan.more_cls
    em.progress(0.01, "exporting the float deployment graphs")
    from hexstudio.shared.rope import RopeError, genie_positional_encoding
    from hexstudio.workers.export import export_deployment_graphs

    t0 = time.monotonic()
    cfg = model_config(hf_dir)
    try:
        # the rope Genie will compute from genie_config.json: calibration and validation feed the same tables
        pe = genie_positional_encoding(json.loads((hf_dir / "config.json").read_text(encoding="utf-8")), cl)
    except RopeError as exc:
        raise WorkerError(
            "rope_not_expressible", str(exc), "Choose another model or context length."
        ) from None

    def exported(entries: list[dict[str, Any]], weights: list[str]) -> None:
        em.log(f"exported part {entries[0]['part']} of {parts} ({', '.join(g['name'] for g in entries)})")

    try:
        graphs = export_deployment_graphs(
            hf_dir,
            out / "float",
            context_length=cl,
            ar_n=plan.ar_n,
            parts=parts,
            after_part=exported,
            extra_context_lengths=tuple(more_cls),
            extra_ar_sizes=tuple(plan.more_ars),
        )
    except (OSError, ValueError) as exc:
        if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EROFS):
            # writing the float graphs (tens of GB at 8B): worker_main says disk_full, with what to do
            raise
        raise WorkerError(
            "model_load_failed",
            f"Could not load the model from {hf_dir}: {exc}",
            "Check the model folder (model stage) and its safetensors files.",
        ) from None
    gc.collect()
    em.metric("export_seconds", round(time.monotonic() - t0, 2), "s")
    em.log(
        f"exported {len(graphs)} float graphs ({parts} parts, context {cl}"
        + (f" and {', '.join(map(str, more_cls))}" if more_cls else "")
        + f", AR-{plan.ar_n} and AR-1)"
    )
    return cfg, pe, graphs


class _CalibrationProgress:
    """Progress of step 3 as quantize_partwise reports it: calibrated graphs share 0.1..0.98 evenly; the
    others (token generators, other context lengths) only say their encodings were written."""

    def __init__(self, calibrated: list[str], samples: int, em: Emitter, blocks: int | None = None) -> None:
        self.calibrated = calibrated
        # what each unit sees once: the AR-N-token blocks of the samples (a sample longer than AR-N is several)
        self.samples = blocks or samples
        self.word = "sample" if self.samples == samples else "block"
        self.em = em
        self.done: list[str] = []

    def __call__(self, name: str, i: int, n: int) -> None:
        em, samples = self.em, self.samples
        if name not in self.calibrated:
            em.progress(
                0.1 + 0.88 * len(self.done) / len(self.calibrated),
                f"{name}: encodings of its part written",
                graph=name,
            )
            return
        if i == n:
            self.done.append(name)
        frac = 0.1 + 0.88 * (len(self.done) + (i / n if i < n else 0)) / len(self.calibrated)
        if i == n:
            msg = f"{name}: calibrated"
        # partwise: every unit (embedding, layers, head) sees every sample
        elif n % samples == 0 and n > samples:
            msg = (
                f"{name}: calibration step {i + 1}/{n} ({self.word} {i % samples + 1} of {samples} through unit "
                f"{i // samples + 1} of {n // samples})"
            )
        else:
            msg = f"{name}: calibration sample {i + 1}/{n}"
        em.progress(frac, msg, graph=name, sample=i, samples=n)


def _say_weights_not_in_blocks(graphs: list[dict[str, Any]], em: Emitter) -> None:
    """aimet-onnx keeps a weight whose input features do not divide into blocks of 64 at int8 per channel, without
    a word (set_param_type, strict=False): said here, since such a weight takes twice the memory of int4."""
    for g in graphs:
        st = g["stats"]
        short = int(st.get("backbone_weights", 0)) - int(st.get("int4_lpbq_weight_encodings", 0))
        if g["kind"] == "prompt_processor" and short > 0:
            em.warning(
                f"{g['name']}: {short} of {st['backbone_weights']} decoder weights stayed int8 per channel, not int4 "
                "LPBQ (their input features do not divide into blocks of 64): they take twice the memory.",
                "Nothing to do for a model whose layer widths are not multiples of 64; the bundle still runs.",
                code="lpbq_not_applied",
            )


def _report_encodings(
    graphs: list[dict[str, Any]], sharing: dict[str, Any], storage: dict[str, int], em: Emitter
) -> int:
    """The encodings and storage figures as metrics; the int4 LPBQ weight encodings' count."""
    pp = [g for g in graphs if g["kind"] == "prompt_processor"]
    lpbq = sum(g["stats"]["int4_lpbq_weight_encodings"] for g in pp)
    em.metric("int4_lpbq_weight_encodings", lpbq)
    em.metric("lpbq_weight_encodings", sum(g["stats"]["lpbq_weight_encodings"] for g in pp))
    em.metric("activation_encodings", sum(g["stats"]["activation_encodings"] for g in graphs))
    em.metric("shared_weight_encodings", sum(v["shared"] for v in sharing.values()))
    em.metric("graphs", len(graphs))
    em.metric("aihub_upload_bytes", storage["aihub_upload_bytes"], "B")
    em.metric("quantize_disk_bytes", storage["disk_bytes"], "B")
    em.log(
        f"storage: {storage['disk_bytes'] / 2**30:.2f} GiB on disk (hard links counted once); AI Hub upload "
        f"{storage['aihub_upload_bytes'] / 2**30:.2f} GiB ({len(graphs)} graphs, each with its part's weights, "
        "as the Compile stage prepares them; the client zips each)"
    )
    return lpbq


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    from hexstudio.workers.quant.calib import (
        blocks_from_windows,
        calibration_bos,
        resolve_hf_dir,
        token_windows,
    )

    protect_protocol_stdout(em)
    t_start = time.monotonic()
    settings = spec.settings
    model_json = model_doc(spec)
    hf_dir = resolve_hf_dir(dict(model_json), spec.upstream_dir("model"))
    plan = _plan(spec, model_json)
    cl, ar_n, parts, samples = plan.context_length, plan.ar_n, plan.parts, plan.samples
    out = spec.out_dir
    # 2. calibration data, first: a text too short for one sample is said before the float export (at 8B, every
    # part's graphs: tens of GB and a long wait)
    bos = calibration_bos(hf_dir, getattr(model_config(hf_dir), "bos_token_id", None))
    windows = token_windows(hf_dir, plan.text, samples, plan.seq_len, bos_id=bos)
    blocks = blocks_from_windows(windows, ar_n)
    cfg, pe, graphs = _export(hf_dir, out, plan, em)
    # AIMET and onnxruntime load here, after the protocol's stdout is protected (AIMET prints on import)
    from hexstudio.shared.rope import genie_rope_tables
    from hexstudio.workers.export.segments import Dims
    from hexstudio.workers.quant.partwise import (
        ort_providers,
        quantize_partwise,
        quantsim_kind,
        shared_weight_check,
    )

    shape = Dims.of(cfg)
    kvh, hd = shape.kv_heads, shape.head_dim
    providers = ort_providers(em.log)

    # 3. sequential part-wise QuantSim. The main context length's prompt processors are calibrated; their token
    # generators and every other context length's graphs take their part's encodings (identical tensor names:
    # Genie requires identical encodings)
    calibrated = [g["name"] for g in graphs if g["kind"] == "prompt_processor" and "variant_of" not in g]
    t1 = time.monotonic()
    quantize_partwise(
        graphs,
        out,
        blocks,
        settings,
        {"context_length": cl, "num_kv_heads": kvh, "head_dim": hd},
        _CalibrationProgress(calibrated, samples, em, len(blocks)),
        em.log,
        rope=genie_rope_tables(pe, cl),
        threads=_threads(),
        providers=providers,
        per_layer=plan.unit == "layer",
    )
    em.metric("calibration_seconds", round(time.monotonic() - t1, 2), "s")
    # other context lengths: quantize.json "variants"
    variants = [g for g in graphs if "variant_of" in g]
    graphs = [g for g in graphs if "variant_of" not in g]
    sharing = shared_weight_check(graphs, out)
    mismatched = sum(v["different"] for v in sharing.values())
    if mismatched:
        raise WorkerError(
            "weight_sharing_broken",
            f"{mismatched} weight encodings differ between the prompt "
            "processor and token generator of a part.",
            "This is a bug: report it with the run folder.",
        )
    storage = storage_report(out, graphs + variants, settings.aihub_compact_upload)
    lpbq = _report_encodings(graphs, sharing, storage, em)
    wb = settings.weight_bits
    if wb == 4:
        _say_weights_not_in_blocks(graphs, em)
    doc = {
        "context_length": cl,
        "ar_n": ar_n,
        "parts": parts,
        "num_layers": int(cfg.num_hidden_layers),
        "hidden_size": int(cfg.hidden_size),
        "num_kv_heads": kvh,
        "head_dim": hd,
        "vocab_size": int(cfg.vocab_size),
        "precision": {
            "weights": f"int{wb} LPBQ block 64",
            "activations": f"int{settings.activation_bits}",
            "kv_cache": f"int{settings.kv_bits}",
            "lm_head": "int8",
            # the table takes its Gather output's activation encoding (genie-contract.md §3; a per-channel one is
            # refused in partwise), stored as those integers: per-tensor at the activation width
            "embeddings": f"int{settings.activation_bits} per-tensor",
        },
        "calibration": {
            "text": str(plan.text),
            "samples": samples,
            "seq_len": plan.seq_len,
            "blocks": len(blocks),
            "unit": plan.unit,
            "quantsim_config": quantsim_kind(settings),
            "method": "sequential part-wise, one calibration unit ("
            + ("decoder layer" if plan.unit == "layer" else "part")
            + ") at a time on the prompt processor; each unit calibrated on the "
            "quantized outputs of the one before; one encodings file per part, used by its "
            "prompt processor and token generator (qai-hub-models' scheme); shared I/O "
            "tensors tied (KV in = out, 8-bit symmetric; mask, cos/sin, part boundaries one "
            "encoding everywhere)",
        },
        "weight_sharing": sharing,
        "storage": storage,
        "positional_encoding": pe,
        "encodings_version": "1.0.0",
        "tool": {"aimet_onnx": _version("aimet_onnx"), "onnxruntime": _version("onnxruntime")},
        "graphs": graphs,
        "context_lengths": [cl, *plan.more_cls] if plan.more_cls else [cl],
        "variants": variants,
    }
    tmp = out / "quantize.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2), encoding="utf-8")
    tmp.replace(out / "quantize.json")
    em.artifact("quantize.json", kind="json", role="quantize")
    em.metric("quantize_seconds", round(time.monotonic() - t_start, 2), "s")
    em.progress(1.0, f"{len(graphs)} graphs quantized")
    return {"graphs": len(graphs), "parts": parts, "int4_lpbq_weight_encodings": lpbq}


def storage_report(out: Any, graphs: list[dict[str, Any]], compact: bool = True) -> dict[str, int]:
    """The stage folder's disk use and what the AI Hub compile uploads: per graph one directory as the Compile
    stage prepares it (hexstudio/workers/aihub_upload.py plan_bytes: weights as their integers where `compact`,
    the setting aihub_compact_upload; else fp32). An upload is one model, so each carries its part's weights:
    the prompt processor and token generator of a part upload the same weights twice (AI Hub links them into
    one context binary with shared weights afterwards)."""
    from hexstudio.workers.aihub_upload import plan_bytes

    upload = sum(plan_bytes(out / g["onnx"], out / g["encodings"], compact) for g in graphs)
    return {"disk_bytes": tree_bytes(out), "aihub_upload_bytes": upload}


def _version(mod: str) -> str:
    try:
        from importlib.metadata import version

        return version(mod.replace("_", "-"))
    except Exception:
        return "unknown"


if __name__ == "__main__":
    raise SystemExit(worker_main("quantize", run))
