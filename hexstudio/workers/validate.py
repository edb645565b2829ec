"""Validate stage worker: the gate before compile. Runs the prompt processor then the token
generator together exactly as the board will (hexstudio/workers/arloop.py), float vs quantized (the QDQ
sim ONNX), and scores top-1 agreement, KL divergence, greedy-continuation agreement, perplexity
on held-out text and a token-salad check, each against a threshold. Also scores the
calibration-shape graph (the prompt processor) alone, to expose the known trap "calibration
graph fine, deployment pair broken".

    python -m hexstudio.workers.validate --spec SPEC.json

Emits metric "verdict" ("pass"/"fail"), every metric with *_threshold and *_ok, and writes
validation.json.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections import Counter
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hexstudio.shared import modelinfo
from hexstudio.shared.protocol import Emitter
from hexstudio.workers.documents import model_doc, output_invalid, read_doc
from hexstudio.workers.runtime import WorkerError, WorkerSpec, worker_main

EVAL_WINDOWS = 3  # held-out windows: prompt through the prompt processor, then teacher-forced AR-1 steps
PROMPT_TOKENS = modelinfo.VALIDATION_PROMPT_TOKENS  # the Model stage refuses a context without room for them
FORCED_STEPS = modelinfo.VALIDATION_FORCED_STEPS
# a later turn: after the forced steps, the windows but the first send this many tokens more through the prompt
# processor with the KV cache already holding the window (past KV, the past columns of the mask), as Genie runs
# every prompt longer than one block and every later chat turn; in CONTINUATION_CALLS blocks, each scored at its
# last token (8 positions over the two windows: a mean over 2 would fail a sound model on one unlucky token)
CONTINUATION_TOKENS = 16
CONTINUATION_CALLS = 4
GREEDY_PROMPTS = 3
GREEDY_TOKENS = 24
# the float deployment pair against the checkpoint itself (issue 19 item 3): thresholds recorded in
# validation.json; fp32 export noise on the built-in model is ~1e-6 relative (docs/quantize.md)
EXPORT_THRESHOLDS: dict[str, float] = {
    "export_top1_agreement": 0.98,  # minimum: argmax of the float pair == argmax of the checkpoint
    "export_max_logit_error": 0.05,  # maximum: largest |logit difference| over the window
    "export_layer_error": 1e-3,  # maximum: a layer's largest hidden-state difference / its largest value
}


# the "HTP simulation" leg: the onnxruntime simulation against Qualcomm's HTP simulator, part by part
# (hexstudio/workers/qnn/htp_agreement.py says why these are thresholds and not equality)
HTP_THRESHOLDS: dict[str, float] = {
    "htp_logits_argmax_agreement": 0.95,  # minimum: logits argmax, onnxruntime simulation == HTP simulator
    "htp_logits_mean_code_error": 0.002,  # maximum: mean |logits code difference| / code range
}


def _htp_leg(q: dict[str, Any], qdir: Path, ids: list[int], spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    """Run the HTP leg where Qualcomm's simulator is installed and the model is small enough for it."""
    from hexstudio.workers.qnn.libs import find_qnn_libs

    libs = find_qnn_libs()
    if libs is None:
        return {"ran": False, "why": "onnxruntime-qnn (Qualcomm's QNN HTP simulator) is not installed"}
    from hexstudio.workers.qnn.htp_agreement import MAX_SIM_BYTES, measure_json, sim_bytes

    size = sim_bytes(qdir, q["graphs"])
    if size > MAX_SIM_BYTES:
        return {
            "ran": False,
            "why": f"the quantized graphs hold {size / 2**30:.1f} GiB; Qualcomm's HTP simulator "
            "runs them far too slowly on a CPU (it runs on the board instead)",
        }
    em.progress(
        0.86,
        "HTP simulation leg: each part on Qualcomm's HTP simulator (QNN, x86) against the onnxruntime "
        "simulation" + ("" if libs.in_process else f" (in the side environment {libs.python})"),
    )
    work = spec.out_dir / "htp.tmp"
    try:
        r = measure_json(qdir, q, work, ids)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return {"ran": True, **r}


def thresholds_from(overrides: Mapping[str, Any]) -> dict[str, float]:
    """The validation thresholds: the defaults, with the run's setting `thresholds` over them."""
    from hexstudio.workers.metrics import DEFAULT_THRESHOLDS

    thr = {**DEFAULT_THRESHOLDS, **EXPORT_THRESHOLDS, **HTP_THRESHOLDS}
    for k, v in overrides.items():
        if k not in thr:
            raise WorkerError(
                "bad_threshold",
                f"Unknown validation threshold {k!r}.",
                f"Known thresholds: {', '.join(sorted(thr))}.",
            )
        try:
            thr[k] = float(v)
        except (TypeError, ValueError):
            raise WorkerError("bad_threshold", f"Threshold {k}={v!r} is not a number.") from None
    return thr


def unscored_variants(q: dict[str, Any]) -> dict[str, Any]:
    """The bundle's other graphs (quantize.json "variants": the smaller context lengths of `context_lengths`, the
    prompt-processor lengths of `ar_sizes`), which this stage does not score: they hold the deployment pair's
    weights and encodings at other shapes. Their names, and a line saying so."""
    variants = [g for g in q.get("variants") or [] if isinstance(g, dict)]
    cls = sorted({int(g["context_length"]) for g in variants if g.get("context_length")})
    ars = sorted({int(g["seq_len"]) for g in variants if g.get("seq_len") and not g.get("context_length")})
    what = [
        f"context length {', '.join(map(str, cls))}" if cls else "",
        f"AR-{', AR-'.join(map(str, ars))}" if ars else "",
    ]
    text = (
        f"{len(variants)} more graph(s) of the bundle ({'; '.join(w for w in what if w)}) share these weights and "
        "encodings at other shapes and were not scored"
        if variants
        else ""
    )
    return {"graphs": [str(g.get("name")) for g in variants], "text": text}


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    from hexstudio.workers.quant.calib import load_tokenizer, resolve_hf_dir, resolve_text

    t0 = time.monotonic()
    qdir = spec.upstream_dir("quantize")
    q: dict[str, Any] = dict(read_doc(qdir / "quantize.json", dict, "quantize"))
    model: dict[str, Any] = dict(model_doc(spec))
    hf_dir = resolve_hf_dir(model, spec.upstream_dir("model"))
    thr = thresholds_from(spec.settings.thresholds)
    text_path = resolve_text(spec.settings.validation_text, "validation")
    tok = load_tokenizer(hf_dir)
    ids = tok.encode(text_path.read_text(encoding="utf-8"), add_special_tokens=False).ids
    window = PROMPT_TOKENS + FORCED_STEPS + 1
    if len(ids) < window * EVAL_WINDOWS:
        raise WorkerError(
            "validation_text_short",
            f"{text_path} has {len(ids)} tokens; validation needs {window * EVAL_WINDOWS}.",
            "Use a longer held-out text.",
        )
    threads = max(1, min(os.cpu_count() or 1, 4))
    # One run unit's sessions open at a time (arloop.UnitSessions), one variant at a time: the memory is
    # one decoder layer's (or lm_head chunk's) graph plus the KV caches and hidden states, not a part.
    pe = q.get("positional_encoding")
    if not isinstance(pe, dict):
        raise output_invalid(
            "quantize",
            "quantize.json has no positional_encoding: it was written by an "
            "older HexStudio whose graphs Genie cannot run (rope inside the graph).",
            "quantize_output_old",
        )
    mode = spec.settings.validate_unit
    if mode not in ("unit", "part"):
        raise WorkerError(
            "bad_validate_unit",
            f"validate_unit {mode!r} is not known.",
            'Use "unit" (one decoder layer, embedding or lm_head chunk at a time) or "part".',
        )
    work = spec.out_dir / "units.tmp"
    shutil.rmtree(work, ignore_errors=True)
    try:
        return _validate(
            spec, em, q, qdir, model, hf_dir, thr, tok, ids, text_path, pe, mode, work, threads, t0
        )
    finally:
        shutil.rmtree(work, ignore_errors=True)


def _hidden_names(q: dict[str, Any]) -> dict[int, list[str]]:
    """Layer -> the float graph tensors that hold its output hidden state (inside a part, or at its end)."""
    from hexstudio.workers.export.graphs import boundary_name

    return {li: [f"/layers.{li}/hidden", boundary_name(li)] for li in range(int(q["num_layers"]))}


@dataclass
class _Pair:
    """The float and the quantized ("sim") deployment graphs, each opened one part (mode "part") or one run
    unit (mode "unit") at a time, and run as the board runs them."""

    sessions: dict[str, Any]
    mode: str
    context_length: int
    kv_heads: int
    head_dim: int

    def states(self, v: str, n: int) -> dict[int, Any]:
        """Empty KV caches for `n` sequences of variant `v`."""
        ps = self.sessions[v]
        if self.mode == "part":
            return {w: ps.cache(self.kv_heads, self.head_dim, self.context_length) for w in range(n)}
        return {w: ps.cache(self.kv_heads, self.head_dim) for w in range(n)}

    def run(
        self,
        v: str,
        calls: list[Any],
        states: dict[int, Any],
        last_only: bool = True,
        capture: dict[int, dict[str, Any]] | None = None,
    ) -> list[Any]:
        from hexstudio.workers.arloop import run_part_major, run_unit_major

        cl = self.context_length
        if self.mode == "part":
            return run_part_major(self.sessions[v], calls, states, cl, last_only=last_only)
        return run_unit_major(self.sessions[v], calls, states, cl, last_only=last_only, capture=capture)


def _open_pair(
    q: dict[str, Any],
    qdir: Path,
    pe: dict[str, Any],
    mode: str,
    work: Path,
    threads: int,
    capture_names: set[str],
    em: Emitter,
) -> _Pair:
    from hexstudio.workers.arloop import PartSessions, UnitSessions

    cl = int(q["context_length"])
    sessions: dict[str, Any] = {}
    if mode == "part":
        # one part's sessions open at a time (arloop.PartSessions), one variant at a time
        sessions = {
            v: PartSessions(
                q["graphs"],
                qdir,
                variant=v,
                intra_op_threads=threads,
                positional_encoding=pe,
                context_length=cl,
            )
            for v in ("float", "sim")
        }
    else:
        # one run unit's sessions open at a time: a decoder layer, the embedding or an lm_head column chunk
        from hexstudio.workers.quant.rununits import split_for_run

        em.progress(0.01, "cutting the deployment graphs into run units")
        for v, key in (("float", "float_onnx"), ("sim", "sim_onnx")):
            units = {
                (g["kind"], int(g["part"])): [
                    u.to_json()
                    for u in split_for_run(
                        qdir / g[key], work / v, g["name"], capture_names if v == "float" else None
                    )
                ]
                for g in q["graphs"]
            }
            sessions[v] = UnitSessions(
                units, q["graphs"], positional_encoding=pe, context_length=cl, intra_op_threads=threads
            )
    return _Pair(sessions, mode, cl, int(q["num_kv_heads"]), int(q["head_dim"]))


@dataclass
class _FirstWindow:
    """What the float export check needs from the first teacher-forced window: its calls, the hidden states
    captured on them (unit mode), and the float pair's scored logits."""

    calls: list[Any]
    captured: list[dict[str, Any]]
    float_logits: Any


def continuation_tokens(context_length: int, ar_n: int) -> int:
    """Tokens of the later turn each window but the first sends through the prompt processor (0: the context has
    no room for a prompt-processor block after a window, where Genie too runs AR-1 steps)."""
    more = min(CONTINUATION_TOKENS, ar_n)
    # every block must fit a whole prompt-processor block after what the KV cache holds
    if PROMPT_TOKENS + FORCED_STEPS + more + ar_n > context_length:
        return 0
    return more


def _teacher_forced(
    pair: _Pair, ids: list[int], starts: list[int], ar_n: int, em: Emitter
) -> tuple[dict[str, float], int, _FirstWindow]:
    """Section 1: the deployment pair, teacher-forced. Each window's prompt goes through the prompt processor
    (AR-N), then every next token through the token generator (AR-1); every window's calls go through the
    first part (unit), then the next. Returns the scores, the scored positions and the first window."""
    import numpy as np

    from hexstudio.workers import metrics
    from hexstudio.workers.arloop import prefill_calls

    cl = pair.context_length
    more = continuation_tokens(cl, ar_n)
    window = PROMPT_TOKENS + FORCED_STEPS + more + 1
    em.progress(0.02, "deployment pair: teacher-forced windows")
    calls: list[Any] = []
    # the calls whose logits are scored: the prompt's last, then each step
    keep: list[int] = []
    targets: list[int] = []
    # the kept logits of the later turns through the prompt processor over a filled KV cache
    continued: list[int] = []
    for w, s in enumerate(starts):
        seq = ids[s : s + window]
        c, n_past = prefill_calls(w, seq[:PROMPT_TOKENS], 0, ar_n, cl)
        calls += c
        keep.append(len(calls) - 1)
        for t in seq[PROMPT_TOKENS : PROMPT_TOKENS + FORCED_STEPS]:
            calls.append((w, "token_generator", [int(t)], n_past))
            keep.append(len(calls) - 1)
            n_past += 1
        targets.extend(seq[PROMPT_TOKENS : PROMPT_TOKENS + FORCED_STEPS + 1])
        # the first window stays as the checkpoint comparison below replays it
        if more and w > 0:
            step = max(1, more // CONTINUATION_CALLS)
            first_token = PROMPT_TOKENS + FORCED_STEPS
            for a in range(first_token, first_token + more, step):
                block = [int(t) for t in seq[a : min(a + step, first_token + more)]]
                calls.append((w, "prompt_processor", block, n_past))
                n_past += len(block)
                continued.append(len(keep))
                keep.append(len(calls) - 1)
                targets.append(seq[a + len(block)])
    window0 = [i for i, c in enumerate(calls) if c[0] == 0]
    captured: dict[int, dict[str, Any]] = {i: {} for i in window0}
    logits: dict[str, list[np.ndarray]] = {}
    for i, v in enumerate(("float", "sim")):
        outs = pair.run(
            v,
            calls,
            pair.states(v, len(starts)),
            capture=captured if v == "float" and pair.mode == "unit" else None,
        )
        logits[v] = [outs[j] for j in keep]
        del outs
        em.progress(0.05 + 0.4 * (i + 1) / 2, f"deployment pair: {v} done")
    lf, lq = np.stack(logits["float"]), np.stack(logits["sim"])
    values: dict[str, float] = {
        "top1_agreement": round(metrics.top1_agreement(lf, lq), 4),
        "kl_divergence": round(metrics.kl_divergence(lf, lq), 6),
        "perplexity_float": round(metrics.perplexity(lf, targets), 4),
        "perplexity_quantized": round(metrics.perplexity(lq, targets), 4),
    }
    values["perplexity_ratio"] = round(
        values["perplexity_quantized"] / max(values["perplexity_float"], 1e-9), 4
    )
    if continued:
        # judged on its own: a few positions in the mean would hide a prompt processor that ignores its past KV
        values["continuation_kl_divergence"] = round(metrics.kl_divergence(lf[continued], lq[continued]), 6)
    first = _FirstWindow(
        [calls[i] for i in window0],
        [captured[i] for i in window0],
        np.stack(logits["float"][: FORCED_STEPS + 1]),
    )
    return values, len(targets), first


def _greedy(
    pair: _Pair, tok: Any, ids: list[int], starts: list[int], eos: list[int], em: Emitter
) -> tuple[dict[str, float], list[dict[str, Any]]]:
    """Section 2: greedy continuations (prompt processor prefill, token generator decode on its own KV
    cache), all prompts together, part by part at every step. Returns the scores and one row per prompt."""
    import numpy as np

    from hexstudio.workers import metrics
    from hexstudio.workers.arloop import greedy_batch

    ref_counts: Counter[int] = Counter(ids)
    prompts = [ids[s : s + PROMPT_TOKENS] for s in starts[:GREEDY_PROMPTS]]
    gens: dict[str, list[list[int]]] = {}
    for i, (v, ps) in enumerate(pair.sessions.items()):
        gens[v] = greedy_batch(
            ps, prompts, GREEDY_TOKENS, eos, pair.context_length, pair.kv_heads, pair.head_dim
        )
        em.progress(0.5 + 0.3 * (i + 1) / len(pair.sessions), f"greedy continuations: {v} done")
    rows: list[dict[str, Any]] = []
    agree: list[float] = []
    sal_q: list[float] = []
    sal_f: list[float] = []
    for i, prompt in enumerate(prompts):
        gen = {v: gens[v][i] for v in gens}
        frac, first_diff = metrics.sequence_agreement(gen["float"], gen["sim"])
        texts = {v: tok.decode(g) for v, g in gen.items()}
        sq = metrics.salad(texts["sim"], gen["sim"], ref_counts)
        sf = metrics.salad(texts["float"], gen["float"], ref_counts)
        agree.append(frac)
        sal_q.append(sq["score"])
        sal_f.append(sf["score"])
        rows.append(
            {
                "prompt": tok.decode(prompt),
                "float": texts["float"],
                "quantized": texts["sim"],
                "agreement": round(frac, 4),
                "first_difference": first_diff,
                "salad_quantized": sq,
                "salad_float": sf,
            }
        )
    values = {
        "greedy_agreement": round(float(np.mean(agree)), 4),
        "salad_score_quantized": round(float(np.mean(sal_q)), 4),
        "salad_score_float": round(float(np.mean(sal_f)), 4),
    }
    values["salad_score"] = round(max(0.0, values["salad_score_quantized"] - values["salad_score_float"]), 4)
    return values, rows


def _calibration_graph(
    pair: _Pair, ids: list[int], start: int, ar_n: int, thr: dict[str, float]
) -> dict[str, Any]:
    """Section 3: the calibration-shape graph alone, the prompt processor chain over one full AR-N block,
    judged on its own (the trap "calibration graph fine, deployment pair broken")."""
    from hexstudio.workers import metrics

    block = ids[start : start + ar_n]
    block = block + [block[-1]] * (ar_n - len(block))
    pp_logits = {
        v: pair.run(v, [(0, "prompt_processor", block, 0)], pair.states(v, 1), last_only=False)[0]
        for v in pair.sessions
    }
    calib: dict[str, Any] = {
        "graph": f"prompt_processor alone (calibration shape, AR-{ar_n})",
        "top1_agreement": round(metrics.top1_agreement(pp_logits["float"], pp_logits["sim"]), 4),
        "kl_divergence": round(metrics.kl_divergence(pp_logits["float"], pp_logits["sim"]), 6),
    }
    cj = metrics.judge(
        {k: float(calib[k]) for k in ("top1_agreement", "kl_divergence")},
        {k: thr[k] for k in ("top1_agreement", "kl_divergence")},
    )
    calib["verdict"] = cj["verdict"]
    return calib


@dataclass
class _Judgement:
    """Every score against its threshold, the verdict and its one-line reason."""

    values: dict[str, Any]
    checks: dict[str, Any]
    verdict: str
    summary: str
    failed: list[str]
    export_ok: bool


def _judge(
    values: dict[str, Any], thr: dict[str, float], export: dict[str, Any] | None, calib: dict[str, Any]
) -> _Judgement:
    """The scores judged against the thresholds, the float export's checks with them; the summary says the
    most telling cause first: an export bug, then the calibration-graph trap, then HTP-only disagreement."""
    from hexstudio.workers import metrics

    result = metrics.judge(values, thr)
    export_ok = export is None or all(c["ok"] for c in export["checks"].values())
    if export is not None:
        for name, c in export["checks"].items():
            values[name] = c["value"]
            result["checks"][name] = c
        values["export_first_differing_layer"] = (
            -1 if export["first_differing_layer"] is None else export["first_differing_layer"]
        )
        result["verdict"] = "pass" if all(c["ok"] for c in result["checks"].values()) else "fail"
    verdict = result["verdict"]
    failed = [k for k, c in result["checks"].items() if not c["ok"]]
    if not export_ok:
        assert export is not None
        li = export["first_differing_layer"]
        summary = (
            "the float deployment graphs differ from the checkpoint "
            + (f"from decoder layer {li} on" if li is not None else "at the logits (final norm / lm_head)")
            + ": an export bug, not quantization"
        )
    elif calib["verdict"] == "pass" and verdict == "fail":
        summary = "calibration graph fine, deployment pair broken"
    elif verdict == "pass":
        summary = "the quantized deployment pair matches the float model within every threshold"
    else:
        summary = "the quantized model differs from the float model beyond the thresholds"
    if failed and all(k.startswith("htp_") for k in failed):
        summary = (
            "the onnxruntime simulation and Qualcomm's HTP simulator disagree beyond the thresholds: a graph, "
            "encoding or rewrite fault, not quantization (validation.json: htp_simulation, part by part)"
        )
    return _Judgement(values, result["checks"], verdict, summary, failed, export_ok)


def _emit_judgement(em: Emitter, j: _Judgement, calib: dict[str, Any]) -> None:
    """Every metric with its threshold and outcome, and the warning that blocks Compile on a failure."""
    for name, value in j.values.items():
        em.metric(name, value)
    for name, c in j.checks.items():
        em.metric(f"{name}_threshold", c["threshold"])
        em.metric(f"{name}_ok", c["ok"])
    em.metric("calibration_graph_top1_agreement", calib["top1_agreement"])
    em.metric("calibration_graph_kl_divergence", calib["kl_divergence"])
    em.metric("calibration_graph_verdict", calib["verdict"])
    em.metric("verdict", j.verdict)
    if not j.export_ok:
        em.warning(
            f"Validation failed: {j.summary}.",
            "Compile is blocked. Report the model's architecture and this run folder: the exported graphs do "
            "not compute what the checkpoint computes.",
            code="export_mismatch",
        )
    elif j.verdict != "pass":
        em.warning(
            f"Validation failed: {', '.join(j.failed)} outside the threshold ({j.summary}).",
            "Compile is blocked. Re-quantize (more calibration samples, 8-bit weights for sensitive parts), "
            "or override with `hexstudio run --override-gate validate` if you accept the risk.",
            code="validation_failed",
        )


def _validate(
    spec: WorkerSpec,
    em: Emitter,
    q: dict[str, Any],
    qdir: Path,
    model: dict[str, Any],
    hf_dir: Path,
    thr: dict[str, float],
    tok: Any,
    ids: list[int],
    text_path: Path,
    pe: dict[str, Any],
    mode: str,
    work: Path,
    threads: int,
    t0: float,
) -> dict[str, Any]:
    import numpy as np

    cl, ar_n = int(q["context_length"]), int(q["ar_n"])
    window = PROMPT_TOKENS + FORCED_STEPS + continuation_tokens(cl, ar_n) + 1
    hidden_names = _hidden_names(q)
    capture_names = {n for names in hidden_names.values() for n in names}
    pair = _open_pair(q, qdir, pe, mode, work, threads, capture_names, em)
    seq_len = pair.sessions["float"].seq_len
    if seq_len["prompt_processor"] != ar_n:
        raise output_invalid(
            "quantize",
            f"the prompt processor graphs have AR-{seq_len['prompt_processor']}, quantize.json says AR-{ar_n}.",
            "graph_shape_mismatch",
        )
    starts = np.linspace(0, len(ids) - window, num=EVAL_WINDOWS).astype(int).tolist()
    values, positions, first = _teacher_forced(pair, ids, starts, ar_n, em)

    # 1b. float export fidelity: the float pair against the checkpoint itself (transformers' own layers, one
    #     at a time from the safetensors) on the first window, layer by layer
    export: dict[str, Any] | None = None
    if mode == "unit":
        em.progress(0.46, "float export against the checkpoint (layer by layer)")
        seq = ids[starts[0] : starts[0] + PROMPT_TOKENS + FORCED_STEPS]
        export = _export_fidelity(
            hf_dir, seq, first.calls, first.captured, first.float_logits, hidden_names, thr
        )
    del first

    eos = [int(e) for e in ((model.get("info") or {}).get("eos_token_ids") or [])]
    greedy_values, greedy = _greedy(pair, tok, ids, starts, eos, em)
    values.update(greedy_values)
    calib = _calibration_graph(pair, ids, starts[0], ar_n, thr)
    opens = {v: ps.opens for v, ps in pair.sessions.items()}
    open_s = round(sum(ps.open_seconds for ps in pair.sessions.values()), 2)
    em.metric("validate_session_opens", sum(opens.values()))
    em.metric("validate_session_open_seconds", open_s, "s")
    htp = _htp_leg(q, qdir, ids, spec, em)
    if htp["ran"]:
        values["htp_logits_argmax_agreement"] = htp["logits_argmax_agreement"]
        values["htp_logits_mean_code_error"] = htp["logits_mean_code_error"]
    else:
        em.log(f"HTP simulation leg skipped: {htp['why']}")
    em.progress(0.9, "judging")

    j = _judge(values, thr, export, calib)
    unscored = unscored_variants(q)
    if unscored["graphs"]:
        # said, not hidden: the verdict is the deployment pair's; Genie runs these graphs too
        j.summary += f"; {unscored['text']}"
        em.log(f"not scored: {unscored['text']}")
    em.metric("variants_not_scored", len(unscored["graphs"]))
    _emit_judgement(em, j, calib)
    doc = {
        "verdict": j.verdict,
        "summary": j.summary,
        "failed": j.failed,
        "metrics": j.values,
        "checks": j.checks,
        "thresholds": thr,
        "calibration_graph": calib,
        "variants_not_scored": unscored,
        "deployment_pair": {
            "windows": EVAL_WINDOWS,
            "prompt_tokens": PROMPT_TOKENS,
            "forced_steps": FORCED_STEPS,
            # then a later turn through the prompt processor over the window's KV (every window but the first)
            "continuation_tokens": continuation_tokens(cl, ar_n),
            "positions": positions,
            "context_length": cl,
            "ar_n": ar_n,
        },
        "greedy": greedy,
        "validation_text": str(text_path),
        "quantized": "sim (QDQ ONNX, onnxruntime)",
        "htp_simulation": htp,
        "float_export": export,
        "memory": {
            "mode": "unit-major: one run unit's sessions open at a time (a decoder layer, the embedding "
            "or an lm_head column chunk)"
            if mode == "unit"
            else "part-major: one part's sessions open at a time",
            "session_opens": opens,
            "session_open_seconds": open_s,
        },
        "precision": q.get("precision"),
        "seconds": round(time.monotonic() - t0, 2),
    }
    tmp = spec.out_dir / "validation.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(spec.out_dir / "validation.json")
    em.artifact("validation.json", kind="json", role="validation")
    em.progress(1.0, f"verdict: {j.verdict}")
    return {"verdict": j.verdict, "summary": j.summary, "failed": j.failed}


def _export_fidelity(
    hf_dir: Path,
    seq: list[int],
    calls: list[Any],
    captured: list[dict[str, Any]],
    graph_logits: Any,
    hidden_names: dict[int, list[str]],
    thr: dict[str, float],
) -> dict[str, Any]:
    """The float pair's first window (hidden states per layer at every position, logits from the prompt's
    last token on) against the checkpoint's own forward on the same tokens (hexstudio.workers.export.reference)."""
    import numpy as np

    from hexstudio.workers.export.reference import checkpoint_forward, fidelity

    rows: dict[int, list[np.ndarray]] = {li: [] for li in hidden_names}
    for (_, _, ids, _), cap in zip(calls, captured, strict=True):
        for li, names in hidden_names.items():
            name = next((n for n in names if n in cap), None)
            if name is None:
                raise WorkerError(
                    "export_check_failed",
                    f"the float graphs expose no hidden state for layer {li}.",
                    "This is a bug: report it with the run folder.",
                )
            rows[li].append(np.asarray(cap[name])[0, : len(ids)])
    graph_hidden = {li: np.concatenate(r) for li, r in rows.items()}
    ref_hidden, ref_logits = checkpoint_forward(hf_dir, seq)
    n = graph_logits.shape[0]
    res = fidelity(
        graph_hidden, graph_logits, ref_hidden, ref_logits[len(seq) - n :], thr["export_layer_error"]
    )
    worst = max((x["max_relative_error"] for x in res["layers"]), default=0.0)
    values = {
        "export_top1_agreement": round(res["top1_agreement"], 4),
        "export_max_logit_error": float(f"{res['max_logit_error']:.3g}"),
        "export_layer_error": float(f"{worst:.3g}"),
    }
    checks = {
        k: {
            "value": v,
            "threshold": thr[k],
            "ok": bool(v >= thr[k] if k == "export_top1_agreement" else v <= thr[k]),
            "direction": "min" if k == "export_top1_agreement" else "max",
        }
        for k, v in values.items()
    }
    return {
        "reference": "transformers, layer by layer from the safetensors (fp32)",
        "positions": len(seq),
        "scored_positions": n,
        "checks": checks,
        "first_differing_layer": res["first_differing_layer"],
        "layers": [
            {"layer": x["layer"], "max_relative_error": float(f"{x['max_relative_error']:.3g}")}
            for x in res["layers"]
        ],
    }


if __name__ == "__main__":
    raise SystemExit(worker_main("validate", run))
