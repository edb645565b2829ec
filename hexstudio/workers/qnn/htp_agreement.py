"""The Validate stage's "HTP simulation" leg: each deployment part on HexStudio's onnxruntime simulation and on
Qualcomm's HTP simulator (QNN 2.51 on x86), fed the same inputs, compared in the output's own codes.

For one AR-N block of held-out text (then one token-generator step on the cache it left), part k of each graph
gets exactly the inputs Genie would give it (hexstudio/workers/arloop.py GenieFeeds with the graphs' encodings; the input
carried from part k-1 is the onnxruntime simulation's, so each part is judged on its own). Measured per part
and output: the largest and mean difference in quantization codes; for logits, how often the argmax agrees.

Why a threshold and not equality: the two arithmetics differ in rounding inside HTP's fixed-point kernels
(facts: on random input ids, one part's logits differed by up to 5,878 of 65,535 codes, mean 116, argmax
agreeing on 95.3 % of positions). A wiring or encoding fault (a wrong scale, an untied KV, a swapped tensor)
shows as a mean error many times larger. The gate sits just past that worst healthy case: logits argmax
agreement >= 95 % and a mean logits code error <= 0.2 % of the code range (131 of 65,535 codes). Measured on
the built-in model's held-out text: 98.4 % and 0.03 %; with one RMSNorm's square turned into a cube (a wrong
rewrite, tests/qnn/test_htp_leg.py): 94.4 % and 0.70 %, refused.
"""

from __future__ import annotations

import os
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

HTP_ARGMAX_MIN = 0.95  # logits argmax agreement, onnxruntime simulation vs HTP simulator
HTP_MEAN_CODE_MAX = 0.002  # mean |code difference| of the logits, as a fraction of the code range
MAX_SIM_BYTES = 768 << 20  # the HTP simulator runs ~1 s a token on the built-in model: larger models skip


@dataclass
class OutputAgreement:
    name: str
    max_code_error: int
    mean_code_error: float
    code_range: int
    argmax_agreement: float | None = None  # logits only


@dataclass
class PartAgreement:
    graph: str
    outputs: list[OutputAgreement] = field(default_factory=list)


@dataclass
class HtpAgreement:
    parts: list[PartAgreement]
    logits_argmax_agreement: float
    logits_mean_code_error: float  # fraction of the code range
    logits_max_code_error: int
    positions: int
    ok: bool

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def sim_bytes(quantize_dir: Path, graphs: list[dict[str, Any]]) -> int:
    total = 0
    for g in graphs:
        p = quantize_dir / str(g.get("sim_onnx", ""))
        for f in (p, p.with_name(p.name + ".data")):
            if f.is_file():
                total += f.stat().st_size
    return total


def _codes(v: np.ndarray, scale: float, zp: int, bits: int) -> np.ndarray:
    return np.clip(np.round(np.asarray(v, np.float64) / scale) + zp, 0, (1 << bits) - 1).astype(np.int64)


def measure(
    quantize_dir: Path,
    q: dict[str, Any],
    work: Path,
    token_ids: list[int],
    target: Any = None,
    rewrite: Any = None,
) -> HtpAgreement:
    """Run each part of both graphs on both simulators (see the module doc). `work`: where the HTP graphs go.
    `rewrite(model) -> (model, report)`: the graph rewrite under test (hexstudio.workers.qnn.htp_graph.htp_graph)."""
    import onnxruntime as ort

    from hexstudio.workers.arloop import GenieFeeds, KVCache, _io_of, feed_graph, store_kv
    from hexstudio.workers.qnn.ep import HtpTarget
    from hexstudio.workers.qnn.htp_graph import genie_feed_quant, htp_graph, load_sim_graph, save_htp_graph
    from hexstudio.workers.qnn.htp_session import HtpSession

    target = target or HtpTarget(77, "v73")
    work.mkdir(parents=True, exist_ok=True)
    cl, ar_n = int(q["context_length"]), int(q["ar_n"])
    htp_paths: dict[str, Path] = {}
    models = []
    for g in q["graphs"]:
        src = quantize_dir / g["sim_onnx"]
        model, _ = (rewrite or htp_graph)(load_sim_graph(src))
        path = work / f"{g['name']}.onnx"
        save_htp_graph(model, path, src.parent)
        htp_paths[str(g["name"])] = path
        models.append(model)
    quant = genie_feed_quant(models)
    encs = {n: (s, -off, b) for n, (s, off, b) in quant.items()}  # (scale, zero point, bits) for the codes
    feeds = GenieFeeds(q["positional_encoding"], cl, quant)
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    opts.log_severity_level = 3
    parts_out: list[PartAgreement] = []
    logit_pairs: list[tuple[np.ndarray, np.ndarray]] = []
    layers: set[int] = set()
    kshape: list[Any] = []
    for g in q["graphs"]:
        if g["kind"] != "prompt_processor":
            continue
        probe = ort.InferenceSession(
            os.fspath(quantize_dir / g["sim_onnx"]), opts, providers=["CPUExecutionProvider"]
        )
        layers |= set(_io_of(probe).kv_in.values())
        kshape = kshape or next(i.shape for i in probe.get_inputs() if i.name.startswith("past_key"))
        del probe
    cache = KVCache(sorted(layers), int(kshape[0]), int(kshape[2]), cl, feeds)
    ids = list(token_ids)[:ar_n]
    for kind, block, n_past in (("prompt_processor", ids, 0), ("token_generator", ids[-1:], len(ids))):
        s = ar_n if kind == "prompt_processor" else 1
        x: np.ndarray = np.zeros((1, s), np.int32)
        x[0, : len(block)] = block
        m = len(block)
        for g in sorted((g for g in q["graphs"] if g["kind"] == kind), key=lambda g: int(g["part"])):
            sim = ort.InferenceSession(
                os.fspath(quantize_dir / g["sim_onnx"]), opts, providers=["CPUExecutionProvider"]
            )
            io = _io_of(sim)
            feed = feed_graph(io, x, feeds, cache, n_past, m, s, cl)
            a = dict(zip(io.outputs, sim.run(io.outputs, feed), strict=True))
            htp = HtpSession(htp_paths[str(g["name"])], target)
            b = dict(zip(io.outputs, htp.run(io.outputs, feed), strict=True))
            pa = PartAgreement(str(g["name"]))
            for name in io.outputs:
                if name not in encs:
                    continue
                scale, zp, bits = encs[name]
                ca, cb = _codes(a[name], scale, zp, bits), _codes(b[name], scale, zp, bits)
                if name == "logits":
                    ca, cb = ca[..., :m, :] if ca.ndim == 3 else ca, cb[..., :m, :] if cb.ndim == 3 else cb
                d = np.abs(ca - cb)
                oa = OutputAgreement(name, int(d.max()), round(float(d.mean()), 3), (1 << bits) - 1)
                if name == "logits":
                    oa.argmax_agreement = round(float(np.mean(np.argmax(ca, -1) == np.argmax(cb, -1))), 4)
                    logit_pairs.append((ca.reshape(-1, ca.shape[-1]), cb.reshape(-1, cb.shape[-1])))
                pa.outputs.append(oa)
            parts_out.append(pa)
            store_kv(io, a, feeds, cache, n_past, m)
            x = a[io.carried_out]
            del sim, htp
        cache.n_past = n_past + m
    la = np.concatenate([p[0] for p in logit_pairs])
    lb = np.concatenate([p[1] for p in logit_pairs])
    agree = float(np.mean(np.argmax(la, -1) == np.argmax(lb, -1)))
    rng = (1 << encs["logits"][2]) - 1 if "logits" in encs else 65535
    mean_err = float(np.abs(la - lb).mean()) / rng
    return HtpAgreement(
        parts_out,
        round(agree, 4),
        round(mean_err, 6),
        int(np.abs(la - lb).max()),
        int(la.shape[0]),
        ok=agree >= HTP_ARGMAX_MIN and mean_err <= HTP_MEAN_CODE_MAX,
    )


def measure_json(quantize_dir: Path, q: dict[str, Any], work: Path, token_ids: list[int]) -> dict[str, Any]:
    """measure(...).to_json(), where onnxruntime-qnn imports: in this process, or in a child process of the
    workstation installer's side environment (hexstudio.workers.qnn.libs: the validated GPU recipe's Python 3.10 cannot
    hold the wheel). The child gets the same arguments as a JSON file and prints the result as one JSON line."""
    import json
    import subprocess

    from hexstudio.shared.errors import ActionableError
    from hexstudio.workers.qnn.libs import find_qnn_libs, with_workers_on_path

    libs = find_qnn_libs()
    if libs is None or libs.in_process:
        return measure(quantize_dir, q, work, token_ids).to_json()
    work.mkdir(parents=True, exist_ok=True)
    args = work / "measure.json"
    args.write_text(
        json.dumps(
            {
                "quantize_dir": os.fspath(quantize_dir),
                "q": q,
                "work": os.fspath(work),
                "token_ids": list(token_ids),
            }
        ),
        encoding="utf-8",
    )
    env = with_workers_on_path(libs.env())
    limit_s = 3 * 3600
    try:
        proc = subprocess.run(
            [libs.python, "-m", "hexstudio.workers.qnn.htp_agreement", "--measure", os.fspath(args)],
            capture_output=True,
            text=True,
            env=env,
            check=False,
            timeout=limit_s,
        )
    except subprocess.TimeoutExpired:
        raise ActionableError(
            f"The HTP simulation leg ran past its limit of {limit_s / 3600:g} h in the side environment "
            f"({libs.python}) and was stopped.",
            "The leg runs only graphs small enough for the simulator, so the machine was starved (swapping, other "
            "heavy jobs): run the Validate stage again with the machine idle.",
            code="htp_leg_timeout",
        ) from None
    lines = [x for x in proc.stdout.splitlines() if x.startswith("{")]
    if proc.returncode != 0 or not lines:
        tail = (proc.stderr.strip().splitlines() or [f"exit code {proc.returncode}"])[-1]
        raise ActionableError(
            f"The HTP simulation leg failed in the side environment ({libs.python}): {tail[:500]}",
            'Check that environment: `<its python> -c "import onnxruntime_qnn, onnx, numpy"` '
            "(packaging/install-workstation.sh makes it), or clear the thresholds it gates by "
            "running without it.",
        )
    return dict(json.loads(lines[-1]))


def _main(argv: list[str]) -> int:
    import json

    if len(argv) != 2 or argv[0] != "--measure":
        print("usage: python -m hexstudio.workers.qnn.htp_agreement --measure ARGS.json", file=sys.stderr)
        return 2
    a = json.loads(Path(argv[1]).read_text(encoding="utf-8"))
    r = measure(Path(a["quantize_dir"]), a["q"], Path(a["work"]), [int(x) for x in a["token_ids"]])
    print(json.dumps(r.to_json()), flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(_main(sys.argv[1:]))
