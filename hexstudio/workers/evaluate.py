"""The Evaluate stage's host legs: the same prompts the board gets, on the host float model and on the host
quantized simulation, run as Genie runs the deployment pair (hexstudio/workers/arloop.py DeploymentPair: the prompt
processor over AR-N blocks, then the token generator on the KV cache).

    python -m hexstudio.workers.evaluate --spec spec.json

The spec carries, beside the pipeline's fields (upstream: model, quantize, compile), its work as an EvalWork
(hexstudio/shared/worker_spec.py): the legs (float, sim, htp: the local compile's HTP graphs on
Qualcomm's simulator), the cases (generate: a prompt and max_tokens; nll: a text) with the legs each runs on,
and the journal (one line a finished (leg, key): a resumed stage skips them).

Tokens as Genie makes them (hexstudio/workers/genie_sim/t2t.py is its twin): BOS from the bundle's genie_config.json
`bos-token` when >= 0, then the prompt encoded without special tokens; generation stops at an `eos-token`.
Greedy (argmax), which is what the deterministic sampler (top-k 1) does on the board.
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any

from hexstudio.shared.journal import append_journal, done_keys
from hexstudio.shared.protocol import Emitter
from hexstudio.shared.worker_spec import EvalCase
from hexstudio.workers.documents import output_invalid
from hexstudio.workers.runtime import WorkerError, WorkerSpec, map_path, worker_main

LEGS = ("float", "sim", "htp")


def htp_pair_args(spec: WorkerSpec, q: dict[str, Any]) -> dict[str, Any]:
    """from_graphs arguments for the "htp" leg: the local compile's HTP graphs (artifacts/compile/htp/graphs)
    run on Qualcomm's x86 HTP simulator, fed as Genie feeds them (quantized with the graphs' I/O encodings)."""
    from hexstudio.workers.qnn.ep import HtpTarget
    from hexstudio.workers.qnn.htp_session import HtpSession

    cdir = spec.upstream_dir("compile")
    gdir = cdir / "htp" / "graphs"
    paths: dict[str, Path] = {}
    for g in q["graphs"]:
        found = sorted(gdir.glob(f"{g['name']}~*.onnx"))
        if not found:
            raise WorkerError(
                "htp_graphs_missing",
                f"The local compile left no HTP graph for {g['name']} in {gdir}.",
                "Compile locally (compile_target local) before an HTP-simulation leg.",
            )
        paths[str(g["name"])] = found[0]
    bundle = _read(cdir / "bundle" / "bundle.json")
    dev = bundle.get("device") or {}
    target = HtpTarget(int(dev.get("soc_model") or 77), str(dev.get("dsp_arch") or "v73"))
    import onnx

    from hexstudio.workers.qnn.htp_graph import genie_feed_quant

    quant = genie_feed_quant(onnx.load(str(p), load_external_data=False) for p in paths.values())
    return {"paths": paths, "quant": quant, "session_factory": lambda p: HtpSession(p, target)}


def _read(path: Path) -> dict[str, Any]:
    try:
        doc: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return doc
    except (OSError, ValueError) as exc:
        raise WorkerError(
            "missing_upstream",
            f"Cannot read {path}: {exc}.",
            "Run the earlier stages first (hexstudio run --until compile).",
        ) from None


def _tokenizer(spec: WorkerSpec) -> Any:
    from tokenizers import Tokenizer

    bundle = spec.upstream.get("compile")
    candidates = [bundle / "bundle" / "tokenizer.json"] if bundle else []
    model_dir = spec.upstream.get("model")
    if model_dir is not None and (model_dir / "model.json").is_file():
        from hexstudio.shared.modelinfo import hf_dir_of

        doc = _read(model_dir / "model.json")
        candidates.append(Path(map_path(str(hf_dir_of(doc, model_dir)))) / "tokenizer.json")
    for p in candidates:
        if p.is_file():
            return Tokenizer.from_file(str(p))
    raise WorkerError(
        "no_tokenizer",
        "Neither the bundle nor the model folder has a tokenizer.json.",
        "Run the compile stage again (the bundle carries the tokenizer).",
    )


def _special(spec: WorkerSpec) -> tuple[int | None, set[int]]:
    bundle = spec.upstream.get("compile")
    cfg_path = bundle / "bundle" / "genie_config.json" if bundle else None
    if cfg_path is None or not cfg_path.is_file():
        return None, set()
    ctx = (_read(cfg_path).get("dialog") or {}).get("context") or {}
    bos = ctx.get("bos-token")
    eos = ctx.get("eos-token")
    eos_ids = set(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
    return (bos if isinstance(bos, int) and bos >= 0 else None), eos_ids


def _log_softmax_at(logits: Any, idx: int) -> float:
    import numpy as np

    z = logits.astype(np.float64)
    m = float(z.max())
    return float(z[idx] - m - math.log(float(np.exp(z - m).sum())))


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    import numpy as np

    from hexstudio.workers.arloop import ContextFull, DeploymentPair

    work = spec.evaluate
    if work is None:
        raise WorkerError(
            "spec_invalid",
            'The evaluate spec names no cases (its "evaluate" part is missing).',
            "Start the Evaluate stage from the studio or `hexstudio run`.",
        )
    jobs = work.cases
    legs = [x for x in work.legs or LEGS if x in LEGS]
    journal = work.journal
    qdir = spec.upstream_dir("quantize")
    q = _read(qdir / "quantize.json")
    tok = _tokenizer(spec)
    bos, eos = _special(spec)
    done = done_keys(journal)

    def runs_on(leg: str, j: EvalCase) -> bool:  # a case lists its legs (the HTP leg runs few cases)
        return leg in (j.legs or legs)

    todo = [(leg, j) for leg in legs for j in jobs if runs_on(leg, j) and (leg, j.key) not in done]
    total = sum(1 for leg in legs for j in jobs if runs_on(leg, j))
    finished = total - len(todo)
    em.progress(
        finished / max(total, 1),
        f"host legs: {finished} of {total} case runs already done"
        if finished
        else f"host legs: {total} case runs",
    )
    threads = int(os.environ.get("HEXSTUDIO_EVAL_THREADS", "2"))
    for leg in legs:
        mine = [j for lg, j in todo if lg == leg]
        if not mine:
            continue
        try:
            extra = htp_pair_args(spec, q) if leg == "htp" else {}
            pair = DeploymentPair.from_graphs(
                q["graphs"],
                qdir,
                positional_encoding=q["positional_encoding"],
                variant="sim" if leg == "htp" else leg,
                context_length=int(q["context_length"]),
                ar_n=int(q["ar_n"]),
                intra_op_threads=threads,
                **extra,
            )
        except (OSError, KeyError, ValueError) as exc:
            raise output_invalid(
                "quantize", f"The {leg} deployment graphs cannot be loaded: {exc}."
            ) from None
        for j in mine:
            pair.reset()
            pre = [bos] if bos is not None else []
            rec: dict[str, Any] = {"leg": leg, "key": j.key}
            try:
                if j.kind == "nll":
                    ids = pre + tok.encode(j.text or "", add_special_tokens=False).ids
                    ids = ids[: pair.capacity]  # the first token is not predicted: it starts the passage
                    logits = pair.prefill(ids[:1])
                    nll = 0.0
                    for t in ids[1:]:
                        nll -= _log_softmax_at(logits, t)
                        logits = pair.step(t)
                    rec.update({"nll_sum": round(nll, 6), "tokens": len(ids) - 1})
                else:
                    ids = pre + tok.encode(j.prompt or "", add_special_tokens=False).ids
                    budget = min(j.max_tokens or 64, pair.capacity - len(ids))
                    out: list[int] = []
                    state = "complete"
                    if budget <= 0:
                        state = "context_full"
                    else:
                        logits = pair.prefill(ids)
                        while len(out) < budget:
                            nxt = int(np.argmax(logits))
                            if nxt in eos:
                                break
                            out.append(nxt)
                            if pair.n_past >= pair.capacity:
                                state = "context_full"
                                break
                            logits = pair.step(nxt)
                    rec.update(
                        {"ids": out, "text": tok.decode(out), "prompt_tokens": len(ids), "state": state}
                    )
            except ContextFull as exc:
                rec.update({"state": "context_full", "error": str(exc), "ids": [], "text": ""})
            append_journal(journal, rec)
            finished += 1
            em.progress(
                finished / max(total, 1),
                f"{leg}: {j.key} ({finished}/{total})",
                leg=leg,
                key=j.key,
                finished=finished,
                total=total,
            )
        del pair
    return {"case_runs": total, "legs": legs}


if __name__ == "__main__":
    worker_main("evaluate", run)
