"""Validate stage worker: the gate before compile. Runs the prompt processor then the token
generator together exactly as the board will (workers/arloop.py), float vs quantized (the QDQ
sim ONNX), and scores top-1 agreement, KL divergence, greedy-continuation agreement, perplexity
on held-out text and a token-salad check, each against a threshold. Also scores the
calibration-shape graph (the prompt processor) alone, to expose the known trap "calibration
graph fine, deployment pair broken".

    python -m workers.validate --spec SPEC.json

Emits metric "verdict" ("pass"/"fail"), every metric with *_threshold and *_ok, and writes
validation.json.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

from workers.protocol import Emitter
from workers.runtime import WorkerError, WorkerSpec, worker_main

EVAL_WINDOWS = 3          # held-out windows: prompt through the prompt processor, then teacher-forced AR-1 steps
PROMPT_TOKENS = 48
FORCED_STEPS = 48
GREEDY_PROMPTS = 3
GREEDY_TOKENS = 24


def _load_json(p: Path, stage: str) -> dict[str, Any]:
    try:
        return dict(json.loads(p.read_text(encoding="utf-8")))
    except FileNotFoundError:
        raise WorkerError(f"{stage}_output_missing", f"{p} does not exist.", f"Run the {stage} stage again.") from None
    except json.JSONDecodeError as exc:
        raise WorkerError(f"{stage}_output_invalid", f"{p} is not valid JSON: {exc.msg}.",
                          f"Run the {stage} stage again (--force).") from None


def thresholds_from(settings: dict[str, Any]) -> dict[str, float]:
    from workers.metrics import DEFAULT_THRESHOLDS

    thr = dict(DEFAULT_THRESHOLDS)
    for k, v in (settings.get("thresholds") or {}).items():
        if k not in thr:
            raise WorkerError("bad_threshold", f"Unknown validation threshold {k!r}.",
                              f"Known thresholds: {', '.join(sorted(thr))}.")
        try:
            thr[k] = float(v)
        except (TypeError, ValueError):
            raise WorkerError("bad_threshold", f"Threshold {k}={v!r} is not a number.") from None
    return thr


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    import numpy as np

    from workers.arloop import PartSessions, greedy_part_major, prefill_calls, run_part_major
    from workers.metrics import judge, kl_divergence, perplexity, salad, sequence_agreement, top1_agreement
    from workers.quant.calib import load_tokenizer, resolve_hf_dir, resolve_text

    t0 = time.monotonic()
    qdir = spec.upstream_dir("quantize")
    q = _load_json(qdir / "quantize.json", "quantize")
    model = _load_json(spec.upstream_dir("model") / "model.json", "model")
    hf_dir = resolve_hf_dir(model, spec.upstream_dir("model"))
    thr = thresholds_from(spec.settings)
    text_path = resolve_text(spec.settings.get("validation_text", "builtin"), "validation")
    tok = load_tokenizer(hf_dir)
    ids = tok.encode(text_path.read_text(encoding="utf-8"), add_special_tokens=False).ids
    cl, ar_n = int(q["context_length"]), int(q["ar_n"])
    window = PROMPT_TOKENS + FORCED_STEPS + 1
    if len(ids) < window * EVAL_WINDOWS:
        raise WorkerError("validation_text_short", f"{text_path} has {len(ids)} tokens; validation needs "
                          f"{window * EVAL_WINDOWS}.", "Use a longer held-out text.")
    threads = max(1, min(os.cpu_count() or 1, 4))
    kvh, hd = int(q["num_kv_heads"]), int(q["head_dim"])
    # One part's sessions open at a time (arloop.PartSessions), one variant at a time: the memory is
    # one part's graphs plus the KV caches and hidden states, not the whole model twice.
    pe = q.get("positional_encoding")
    if not isinstance(pe, dict):
        raise WorkerError("quantize_output_old", "quantize.json has no positional_encoding: it was written by an "
                          "older HexStudio whose graphs Genie cannot run (rope inside the graph).",
                          "Run the quantize stage again (--force).")
    sessions = {v: PartSessions(q["graphs"], qdir, variant=v, intra_op_threads=threads, positional_encoding=pe,
                                context_length=cl) for v in ("float", "sim")}
    ps0 = sessions["float"]
    if ps0.seq_len["prompt_processor"] != ar_n:
        raise WorkerError("graph_shape_mismatch", f"the prompt processor graphs have AR-{ps0.seq_len['prompt_processor']}"
                          f", quantize.json says AR-{ar_n}.", "Run the quantize stage again (--force).")
    starts = np.linspace(0, len(ids) - window, num=EVAL_WINDOWS).astype(int).tolist()

    # 1. deployment pair, teacher-forced: prompt via AR-N, then every next token via AR-1 (part-major:
    #    every window's prompt and forced steps go through part 1, then part 2, ...)
    em.progress(0.02, "deployment pair: teacher-forced windows")
    calls: list[Any] = []
    keep: list[int] = []          # the calls whose logits are scored: prompt's last, then each step
    targets: list[int] = []
    for w, s in enumerate(starts):
        seq = ids[s:s + window]
        c, n_past = prefill_calls(w, seq[:PROMPT_TOKENS], 0, ar_n, cl)
        calls += c
        keep.append(len(calls) - 1)
        for t in seq[PROMPT_TOKENS:PROMPT_TOKENS + FORCED_STEPS]:
            calls.append((w, "token_generator", [int(t)], n_past))
            keep.append(len(calls) - 1)
            n_past += 1
        targets.extend(seq[PROMPT_TOKENS:PROMPT_TOKENS + FORCED_STEPS + 1])
    logits: dict[str, list[np.ndarray]] = {}
    for i, (v, ps) in enumerate(sessions.items()):
        states = {w: ps.cache(kvh, hd, cl) for w in range(len(starts))}
        outs = run_part_major(ps, calls, states, cl)
        logits[v] = [outs[j] for j in keep]
        del outs, states
        em.progress(0.05 + 0.45 * (i + 1) / len(sessions), f"deployment pair: {v} done")
    lf, lq = np.stack(logits["float"]), np.stack(logits["sim"])
    values: dict[str, float] = {
        "top1_agreement": round(top1_agreement(lf, lq), 4),
        "kl_divergence": round(kl_divergence(lf, lq), 6),
        "perplexity_float": round(perplexity(lf, targets), 4),
        "perplexity_quantized": round(perplexity(lq, targets), 4),
    }
    values["perplexity_ratio"] = round(values["perplexity_quantized"] / max(values["perplexity_float"], 1e-9), 4)
    del lf, lq, logits

    # 2. greedy continuations (prompt processor prefill, token generator decode on its own KV cache),
    #    all prompts together, part by part at every step
    eos = [int(e) for e in ((model.get("info") or {}).get("eos_token_ids") or [])]
    ref_counts: Counter[int] = Counter(ids)
    prompts = [ids[s:s + PROMPT_TOKENS] for s in starts[:GREEDY_PROMPTS]]
    gens: dict[str, list[list[int]]] = {}
    for i, (v, ps) in enumerate(sessions.items()):
        gens[v] = greedy_part_major(ps, prompts, GREEDY_TOKENS, eos, cl, kvh, hd)
        em.progress(0.5 + 0.3 * (i + 1) / len(sessions), f"greedy continuations: {v} done")
    greedy: list[dict[str, Any]] = []
    agree: list[float] = []
    sal_q: list[float] = []
    sal_f: list[float] = []
    for i, prompt in enumerate(prompts):
        gen = {v: gens[v][i] for v in gens}
        frac, first_diff = sequence_agreement(gen["float"], gen["sim"])
        texts = {v: tok.decode(g) for v, g in gen.items()}
        sq, sf = salad(texts["sim"], gen["sim"], ref_counts), salad(texts["float"], gen["float"], ref_counts)
        agree.append(frac)
        sal_q.append(sq["score"])
        sal_f.append(sf["score"])
        greedy.append({"prompt": tok.decode(prompt), "float": texts["float"], "quantized": texts["sim"],
                       "agreement": round(frac, 4), "first_difference": first_diff,
                       "salad_quantized": sq, "salad_float": sf})
    values["greedy_agreement"] = round(float(np.mean(agree)), 4)
    values["salad_score_quantized"] = round(float(np.mean(sal_q)), 4)
    values["salad_score_float"] = round(float(np.mean(sal_f)), 4)
    values["salad_score"] = round(max(0.0, values["salad_score_quantized"] - values["salad_score_float"]), 4)

    # 3. the calibration-shape graph alone: the prompt processor chain over one full AR-N block
    pp_logits: dict[str, np.ndarray] = {}
    block = ids[starts[0]:starts[0] + ar_n]
    block = block + [block[-1]] * (ar_n - len(block))
    for v, ps in sessions.items():
        st = {0: ps.cache(kvh, hd, cl)}
        pp_logits[v] = run_part_major(ps, [(0, "prompt_processor", block, 0)], st, cl, last_only=False)[0]
    opens = {v: ps.opens for v, ps in sessions.items()}
    open_s = round(sum(ps.open_seconds for ps in sessions.values()), 2)
    em.metric("validate_session_opens", sum(opens.values()))
    em.metric("validate_session_open_seconds", open_s, "s")
    calib: dict[str, Any] = {"graph": f"prompt_processor alone (calibration shape, AR-{ar_n})",
             "top1_agreement": round(top1_agreement(pp_logits["float"], pp_logits["sim"]), 4),
             "kl_divergence": round(kl_divergence(pp_logits["float"], pp_logits["sim"]), 6)}
    cj = judge({k: float(calib[k]) for k in ("top1_agreement", "kl_divergence")}, {k: thr[k] for k in ("top1_agreement", "kl_divergence")})
    calib["verdict"] = cj["verdict"]
    em.progress(0.9, "judging")

    result = judge(values, thr)
    verdict = result["verdict"]
    if calib["verdict"] == "pass" and verdict == "fail":
        summary = "calibration graph fine, deployment pair broken"
    elif verdict == "pass":
        summary = "the quantized deployment pair matches the float model within every threshold"
    else:
        summary = "the quantized model differs from the float model beyond the thresholds"
    failed = [k for k, c in result["checks"].items() if not c["ok"]]
    for name, value in values.items():
        em.metric(name, value)
    for name, c in result["checks"].items():
        em.metric(f"{name}_threshold", c["threshold"])
        em.metric(f"{name}_ok", c["ok"])
    em.metric("calibration_graph_top1_agreement", calib["top1_agreement"])
    em.metric("calibration_graph_kl_divergence", calib["kl_divergence"])
    em.metric("calibration_graph_verdict", calib["verdict"])
    em.metric("verdict", verdict)
    if verdict != "pass":
        em.warning(f"Validation failed: {', '.join(failed)} outside the threshold ({summary}).",
                   "Compile is blocked. Re-quantize (more calibration samples, 8-bit weights for sensitive parts), "
                   "or override with `hexstudio run --override-gate validate` if you accept the risk.",
                   code="validation_failed")
    doc = {"verdict": verdict, "summary": summary, "failed": failed, "metrics": values, "checks": result["checks"],
           "thresholds": thr, "calibration_graph": calib,
           "deployment_pair": {"windows": EVAL_WINDOWS, "prompt_tokens": PROMPT_TOKENS, "forced_steps": FORCED_STEPS,
                               "positions": len(targets), "context_length": cl, "ar_n": ar_n},
           "greedy": greedy, "validation_text": str(text_path), "quantized": "sim (QDQ ONNX, onnxruntime)",
           "memory": {"mode": "part-major: one part's sessions open at a time", "session_opens": opens,
                      "session_open_seconds": open_s},
           "precision": q.get("precision"), "seconds": round(time.monotonic() - t0, 2)}
    tmp = spec.out_dir / "validation.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2, ensure_ascii=False), encoding="utf-8")
    tmp.replace(spec.out_dir / "validation.json")
    em.artifact("validation.json", kind="json", role="validation")
    em.progress(1.0, f"verdict: {verdict}")
    return {"verdict": verdict, "summary": summary, "failed": failed}


if __name__ == "__main__":
    raise SystemExit(worker_main("validate", run))
