"""The speed predictor's types and arithmetic (issue 28), light so the studio, the CLI and the worker share them.

hexstudio/workers/predict.py compiles synthetic decoder layers at a model's true shapes for the target's Hexagon arch and
runs them on QNN's x86 HTP simulator (hexstudio/workers/predict_graphs.py); what it measures per graph is a GraphTiming.
`combine` adds the terms up into a Prediction:

    token (AR-1)       = layers x per-layer cost + per-graph fixed cost x parts + lm_head + embedding row
                         (or the DDR floor when larger: every weight is read once per token)
                         + host/FastRPC overhead per graph execution (an assumption, stated)
    prompt pass (AR-N) = the same with the AR-N graphs; TTFT(P) = ceil(P / N) passes

Everything here is labeled PREDICTED: it is a model of the device, never a device result.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any

LABEL = "predicted (HTP simulator)"
SCHEMA = 1


@dataclass(frozen=True)
class Bandwidth:
    """A target's DRAM bandwidth, as its vendor states it (peak = data rate x bus width)."""

    peak_bytes_per_s: float
    source: str
    # sustained fraction of peak an NPU stream reaches: the upper (slow) bound of the DDR floor uses it.
    # An assumption (LPDDR5 streaming reads typically sustain 60-80 % of peak), not a measurement.
    sustained_fraction: float = 0.7


_IQ9075_DDR = Bandwidth(
    6 * 2 * 6400e6,  # six 16-bit LPDDR5 channels (96 bits) at 6400 MT/s (3200 MHz): 76.8 GB/s
    "IQ-9075 EVK LPDDR: six 16-bit channels (96-bit) at 3200 MHz = 6400 MT/s -> 76.8 GB/s peak "
    "(dragonwingdocs.qualcomm.com/Linux/devices/iq9075-evk/peripherals-interfaces/LPDDR_memory)",
)

# chipset (AI Hub's `chipset`, without "qualcomm-") -> DRAM bandwidth. Only figures with a stated source.
BANDWIDTH: dict[str, Bandwidth] = {
    "qcs9075": _IQ9075_DDR,
    # SA8775P is the automotive part of the same Hexagon v73 SoC family as QCS9075/QCS9100 (facts/board.md);
    # the IQ-9075 memory subsystem is assumed for it
    "sa8775p": Bandwidth(
        _IQ9075_DDR.peak_bytes_per_s,
        "assumed equal to the QCS9075's (same SoC family): " + _IQ9075_DDR.source,
    ),
}

# Per graph execution on the device, outside the accelerator: the FastRPC call from the CPU to the HTP, Genie's
# scheduling and its copy of a part's output to the next part's input. Not in the simulator's figure and not
# measured here: an assumption (typical FastRPC round trips are 0.1-0.5 ms), stated wherever it is used.
SWITCH_US = (100.0, 250.0, 500.0)  # lower, value, upper


@dataclass(frozen=True)
class Target:
    """What the graphs compile for: a QNN soc_model and the Hexagon arch (e.g. 77 / "v73" = QCS9075)."""

    name: str
    soc_model: int
    dsp_arch: str
    chipset: str = ""
    bandwidth: Bandwidth | None = None
    note: str = ""

    @property
    def htp_arch(self) -> str:
        """QNN's htp_arch provider option: the arch number ("73" for v73)."""
        return self.dsp_arch.lower().lstrip("v")

    def key(self) -> str:
        return f"soc{self.soc_model}-{self.dsp_arch}"

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> Target:
        bw = d.get("bandwidth")
        return cls(
            name=str(d["name"]),
            soc_model=int(d["soc_model"]),
            dsp_arch=str(d["dsp_arch"]),
            chipset=str(d.get("chipset") or ""),
            note=str(d.get("note") or ""),
            bandwidth=Bandwidth(**bw) if isinstance(bw, dict) else None,
        )


def target_for_device(name: str, dev: dict[str, Any], note: str = "") -> Target:
    """A Target from an AI Hub device record (hexstudio.shared.bundle.KNOWN_DEVICES or AI Hub's list)."""
    chipset = str(dev.get("chipset") or "").removeprefix("qualcomm-")
    return Target(
        name=name,
        soc_model=int(dev["soc_model"]),
        dsp_arch=str(dev["dsp_arch"]),
        chipset=chipset,
        bandwidth=BANDWIDTH.get(chipset),
        note=note,
    )


LPBQ_BLOCK = 64  # LPBQ's block along a weight's input features (int4 values, one uint8 scale per block)


@dataclass(frozen=True)
class ModelShape:
    """A decoder's true shapes, from config.json (hexstudio.shared.modelinfo.inspect_config)."""

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int

    @classmethod
    def from_info(cls, name: str, info: dict[str, Any]) -> ModelShape:
        return cls(
            name=name,
            layers=int(info["num_layers"]),
            hidden=int(info["hidden_size"]),
            heads=int(info["num_heads"]),
            kv_heads=int(info["num_kv_heads"]),
            head_dim=int(info["head_dim"]),
            intermediate=int(info["intermediate_size"]),
            vocab=int(info["vocab_size"]),
        )

    def lpbq_misfits(self) -> list[str]:
        """The weights' input-feature counts that LPBQ's blocks of LPBQ_BLOCK do not divide (the graphs the
        predictor builds are quantized so, as the deployed model is): each as "name N"."""
        features = (
            ("hidden_size", self.hidden),
            ("num_attention_heads x head_dim", self.heads * self.head_dim),
            ("intermediate_size", self.intermediate),
        )
        return [f"{name} {n}" for name, n in features if n % LPBQ_BLOCK]

    def layer_weight_bytes(self) -> int:
        """One decoder layer's weights as deployed: int4 values + one uint8 block scale per 64 (LPBQ)."""
        params = (
            self.hidden * (self.heads + 2 * self.kv_heads) * self.head_dim
            + self.heads * self.head_dim * self.hidden
            + 3 * self.hidden * self.intermediate
        )
        return int(params * (0.5 + 1 / 64))

    def lm_head_bytes(self) -> int:
        return self.hidden * self.vocab  # int8 per channel

    def kv_bytes(self, context: int) -> int:
        """One layer's KV cache read per execution (uint8 keys and values over the whole context)."""
        return 2 * self.kv_heads * self.head_dim * context


@dataclass(frozen=True)
class GraphTiming:
    """One synthetic graph run on the HTP simulator: its "Simulated (Accelerator exec time us)" rows and
    bandwidth stats (bytes) from QNN's profiling CSV, and what compiling it cost on this machine."""

    key: str
    seq: int
    context: int
    layers: int
    vocab: int
    sim_us: float
    sim_lower_us: float
    sim_upper_us: float
    sim_cycles: int = 0
    input_fill_bytes: int = 0
    intermediate_fill_bytes: int = 0
    intermediate_spill_bytes: int = 0
    output_spill_bytes: int = 0
    missing_ops: int = 0
    compile_s: float = 0.0
    run_s: float = 0.0
    peak_rss_bytes: int = 0
    context_bytes: int = 0  # the QNN context binary the compile wrote (what a local compile outputs)
    qnn_version: str = ""
    cached: bool = False

    def to_json(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_json(cls, d: dict[str, Any]) -> GraphTiming:
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in d.items() if k in names})


@dataclass(frozen=True)
class Bounds:
    """A predicted figure with the simulator's lower/upper estimates (and the stated assumptions') around it."""

    value: float
    lower: float
    upper: float

    def scaled(self, k: float) -> Bounds:
        return Bounds(self.value * k, self.lower * k, self.upper * k)

    def __add__(self, o: Bounds) -> Bounds:
        return Bounds(self.value + o.value, self.lower + o.lower, self.upper + o.upper)

    def inverse_rate(self) -> Bounds:
        """ms per token -> tokens/s (the lower time is the upper rate)."""
        return Bounds(1000.0 / self.value, 1000.0 / self.upper, 1000.0 / self.lower)

    def to_json(self) -> dict[str, float]:
        return {"value": round(self.value, 3), "lower": round(self.lower, 3), "upper": round(self.upper, 3)}


def zero() -> Bounds:
    return Bounds(0.0, 0.0, 0.0)


def per_layer(one: GraphTiming, two: GraphTiming | None) -> tuple[Bounds, Bounds]:
    """(per-layer cost, per-graph fixed cost) in ms from a 1-layer and a 2-layer graph: the slope and the
    intercept of the line through both, so a part of n layers costs t1 + (n - 1) x slope. The intercept may be
    negative: at 1B shapes a 2-layer AR-1 graph simulates at 2.2x the 1-layer one (the first layer of a graph
    is cheaper than the next). With only the 1-layer graph: all of it per layer, no fixed cost."""
    t1 = Bounds(one.sim_us, one.sim_lower_us, one.sim_upper_us).scaled(1e-3)
    if two is None:
        return t1, zero()
    t2 = Bounds(two.sim_us, two.sim_lower_us, two.sim_upper_us).scaled(1e-3)
    slope = Bounds(t2.value - t1.value, t2.lower - t1.lower, t2.upper - t1.upper)
    return slope, Bounds(t1.value - slope.value, t1.lower - slope.lower, t1.upper - slope.upper)


@dataclass
class Pass:
    """One execution of the whole model (all parts) for `seq` new tokens: the terms and their total (ms)."""

    seq: int
    layers: Bounds
    fixed: Bounds
    lm_head: Bounds
    embedding: Bounds
    switch: Bounds
    simulated: Bounds  # layers + fixed + lm_head + embedding (the simulator's part)
    ddr_floor: Bounds  # every weight and the KV read once from DRAM at the target's bandwidth
    total: Bounds
    dominant: str  # "simulated compute" or "DDR weight traffic"
    weight_bytes: int
    kv_bytes: int

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "seq": self.seq,
            "dominant": self.dominant,
            "weight_bytes": self.weight_bytes,
            "kv_bytes": self.kv_bytes,
        }
        for k in ("layers", "fixed", "lm_head", "embedding", "switch", "simulated", "ddr_floor", "total"):
            out[f"{k}_ms"] = getattr(self, k).to_json()
        return out


def _pass(
    m: ModelShape,
    t: Target,
    context: int,
    parts: int,
    seq: int,
    one: GraphTiming,
    two: GraphTiming | None,
    lm: GraphTiming,
) -> Pass:
    layer, fixed = per_layer(one, two)
    lm_ms = Bounds(lm.sim_us, lm.sim_lower_us, lm.sim_upper_us).scaled(1e-3 * m.vocab / max(1, lm.vocab))
    weight_bytes = m.layers * m.layer_weight_bytes() + m.lm_head_bytes()
    kv_bytes = m.layers * m.kv_bytes(context)
    emb_bytes = seq * m.hidden * 2  # the embedding rows gathered (uint16), read from DRAM
    if t.bandwidth is not None:
        bw = t.bandwidth

        def dram(n: int) -> Bounds:
            return Bounds(
                n / bw.peak_bytes_per_s * 1e3,
                n / bw.peak_bytes_per_s * 1e3,
                n / (bw.peak_bytes_per_s * bw.sustained_fraction) * 1e3,
            )

        floor, emb = dram(weight_bytes + kv_bytes + emb_bytes), dram(emb_bytes)
    else:
        floor, emb = zero(), zero()
    layers = layer.scaled(m.layers)
    fixed_all = fixed.scaled(parts)
    sim = layers + fixed_all + lm_ms + emb
    core = Bounds(max(sim.value, floor.value), max(sim.lower, floor.lower), max(sim.upper, floor.upper))
    switch = Bounds(*(x / 1e3 for x in (SWITCH_US[1], SWITCH_US[0], SWITCH_US[2]))).scaled(parts)
    dominant = "DDR weight traffic" if floor.value > sim.value else "simulated compute"
    return Pass(
        seq=seq,
        layers=layers,
        fixed=fixed_all,
        lm_head=lm_ms,
        embedding=emb,
        switch=switch,
        simulated=sim,
        ddr_floor=floor,
        total=core + switch,
        dominant=dominant,
        weight_bytes=weight_bytes,
        kv_bytes=kv_bytes,
    )


@dataclass
class Prediction:
    """Predicted speed of a model on a target: TTFT per prompt length and decode tokens/s, with bounds."""

    model: str
    target: Target
    qnn_version: str
    context_length: int
    ar_n: int
    parts: int
    shape: ModelShape
    prompt_pass: Pass
    token: Pass
    ttft_ms: dict[int, Bounds]
    decode_tok_s: dict[str, Bounds]
    graphs: list[GraphTiming]
    notes: list[str] = field(default_factory=list)
    label: str = LABEL

    def to_json(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "label": self.label,
            "predicted": True,
            "model": self.model,
            "target": self.target.to_json(),
            "qnn_version": self.qnn_version,
            "context_length": self.context_length,
            "ar_n": self.ar_n,
            "parts": self.parts,
            "shape": asdict(self.shape),
            "ttft_ms": {str(k): v.to_json() for k, v in self.ttft_ms.items()},
            "decode_tok_s": {k: v.to_json() for k, v in self.decode_tok_s.items()},
            "prompt_pass": self.prompt_pass.to_json(),
            "token": self.token.to_json(),
            "graphs": [g.to_json() for g in self.graphs],
            "notes": list(self.notes),
        }


def prompt_lengths(context: int, ar_n: int) -> list[int]:
    """The prompts TTFT is predicted for: one AR-N pass (128), 1,024 and the full context."""
    return sorted({p for p in (ar_n, 1024, context) if p <= context})


def combine(
    model: str,
    m: ModelShape,
    t: Target,
    context: int,
    ar_n: int,
    parts: int,
    qnn_version: str,
    timings: dict[str, GraphTiming],
) -> Prediction:
    """Add up the measured graphs. `timings` keys: pp1, pp2 (optional), tg1, tg2 (optional), lm_pp, lm_tg."""
    pp = _pass(m, t, context, parts, ar_n, timings["pp1"], timings.get("pp2"), timings["lm_pp"])
    tg = _pass(m, t, context, parts, 1, timings["tg1"], timings.get("tg2"), timings["lm_tg"])
    ttft = {p: pp.total.scaled(math.ceil(p / ar_n)) for p in prompt_lengths(context, ar_n)}
    rate = tg.total.inverse_rate()
    notes = [
        f"Token generator: {tg.dominant} dominates ({tg.simulated.value:.1f} ms simulated vs "
        f"{tg.ddr_floor.value:.1f} ms DDR floor per token).",
        f"Prompt processor: {pp.dominant} dominates ({pp.simulated.value:.1f} ms simulated vs "
        f"{pp.ddr_floor.value:.1f} ms DDR floor per {ar_n}-token pass).",
        "Genie's graphs have a fixed context: every token attends over the whole KV cache (masked), so decode "
        "speed at a short and at a full context is the same graph cost.",
        f"Per graph execution {SWITCH_US[1] / 1e3:.2f} ms ({SWITCH_US[0] / 1e3:.2f}-{SWITCH_US[2] / 1e3:.2f}) "
        "host/FastRPC overhead is an assumption, not simulated.",
    ]
    if t.note:  # a device assumed or put in another's place: said beside the figures, not only in the JSON
        notes.insert(0, f"Target: {t.note}.")
    if t.bandwidth is None:
        notes.append(f"No DRAM bandwidth known for {t.name}: the DDR floor is left out.")
    else:
        notes.append(
            f"DDR: {t.bandwidth.peak_bytes_per_s / 1e9:.1f} GB/s peak ({t.bandwidth.source}); the slow "
            f"bound assumes {t.bandwidth.sustained_fraction:.0%} of it sustained."
        )
    graphs = [timings[k] for k in ("pp1", "pp2", "tg1", "tg2", "lm_pp", "lm_tg") if k in timings]
    if any(g.missing_ops for g in graphs):
        notes.append(
            'The simulator had no cost for some ops ("Missing Ops": '
            f"{max(g.missing_ops for g in graphs)} per graph at most, the KV cache's uint8 quantize): "
            "they count as free."
        )
    return Prediction(
        model=model,
        target=t,
        qnn_version=qnn_version,
        context_length=context,
        ar_n=ar_n,
        parts=parts,
        shape=m,
        prompt_pass=pp,
        token=tg,
        ttft_ms=ttft,
        decode_tok_s={"short_context": rate, "full_context": rate},
        graphs=graphs,
        notes=notes,
    )


def summary_lines(p: dict[str, Any]) -> list[str]:
    """A prediction document (Prediction.to_json) as text lines, labeled predicted on each figure."""
    t = p["target"]
    lines = [
        f"{p['label']}: {p['model']} on {t['name']} (soc_model {t['soc_model']}, {t['dsp_arch']}), "
        f"context {p['context_length']}, AR-{p['ar_n']}, {p['parts']} parts, QNN {p['qnn_version']}"
    ]
    for n, b in p["ttft_ms"].items():
        lines.append(
            f"  predicted TTFT, {int(n):>5} prompt tokens: {b['value']:9.1f} ms "
            f"({b['lower']:.1f}-{b['upper']:.1f})"
        )
    for k, b in p["decode_tok_s"].items():
        lines.append(
            f"  predicted decode, {k.replace('_', ' ')}: {b['value']:6.2f} tok/s "
            f"({b['lower']:.2f}-{b['upper']:.2f})"
        )
    lines += [f"  note: {n}" for n in p.get("notes", [])]
    return lines


def _b(d: dict[str, Any]) -> Bounds:
    return Bounds(float(d["value"]), float(d["lower"]), float(d["upper"]))


def speculative_rate(
    target: dict[str, Any],
    dialog: str,
    accepted_per_step: float,
    *,
    draft_len: int = 3,
    draft: dict[str, Any] | None = None,
    step_tokens: int | None = None,
    ar_sizes: Sequence[int] = (),
) -> dict[str, Any] | None:
    """Predicted decode tokens/s of a speculative dialog at a measured acceptance (tokens per step), beside the
    basic dialog's, from predictions (Prediction.to_json) of the target and, for spd, of the draft model.

    A step runs on the smallest graph that holds it (Genie's KVManager; docs/genie.md): the AR-N graph, or a smaller
    one the bundle holds (`ar_sizes`) for a step of `step_tokens` (lade: (window + gcap) x (ngram - 1); spd:
    draft_len + 1). So  lade step = one pass;  spd step = draft_len draft tokens (AR-1) + one verification pass.
    A smaller AR-k pass is costed between the predicted AR-1 token and AR-N pass, linearly in k (interpolated, not
    simulated). Break-even: the acceptance at which the dialog equals basic (step time / token time). None when
    the step cannot be costed (spd without a prediction of its draft)."""
    token, prompt_pass = _b(target["token"]["total_ms"]), _b(target["prompt_pass"]["total_ms"])
    ar_n = int(target["ar_n"])
    need = step_tokens if step_tokens is not None else (draft_len + 1 if dialog == "spd" else ar_n)
    ar = min((k for k in {*ar_sizes, ar_n} if k >= need and 1 < k <= ar_n), default=ar_n)
    verify = prompt_pass if ar == ar_n else _between(token, prompt_pass, (ar - 1) / max(ar_n - 1, 1))
    if dialog == "lade":
        step = verify
    elif dialog == "spd" and draft is not None:
        step = _b(draft["token"]["total_ms"]).scaled(draft_len) + verify
    else:
        return None
    a = max(0.0, float(accepted_per_step))
    rate = Bounds(a * 1000.0 / step.value, a * 1000.0 / step.upper, a * 1000.0 / step.lower)
    return {
        "label": LABEL,
        "dialog": dialog,
        "accepted_per_step": round(a, 3),
        "step_ms": step.to_json(),
        "tok_s": rate.to_json(),
        "basic_tok_s": token.inverse_rate().to_json(),
        "break_even_accepted": round(step.value / token.value, 2),
        "step": (
            f"one AR-{ar} pass"
            if dialog == "lade"
            else f"{draft_len} draft tokens (AR-1) + one AR-{ar} verification pass"
        )
        + ("" if ar == ar_n else f" (AR-{ar} costed between the AR-1 and AR-{ar_n} predictions)"),
        "step_ar": ar,
    }


def _between(low: Bounds, high: Bounds, f: float) -> Bounds:
    """low + f x (high - low), bound by bound."""
    return Bounds(
        low.value + f * (high.value - low.value),
        low.lower + f * (high.lower - low.lower),
        low.upper + f * (high.upper - low.upper),
    )
