"""Synthetic decoder graphs at a model's true shapes, for the speed predictor (hexstudio/workers/predict.py, issue 28).

Random weights, the deployment recipe's precisions and the QDQ forms Qualcomm's QNN EP compiles without CPU
fallback (facts/qnn-x86.md):
- backbone weights int4 LPBQ: a per-channel DequantizeLinear of uint8 block scales (block 64 along the input
  features) feeding a block-wise QuantizeLinear/DequantizeLinear of a float weight, the pattern the EP fuses
  into one QNN MatMul with LPBQ encodings (LowPowerBlockQuantizedMatMulFusion);
- lm_head weights int8 per channel; activations uint16; the KV cache uint8 (keys stored transposed);
- graph inputs and outputs quantized as Genie feeds them (uint16 / uint8), never float.

A graph is `layers` identical Llama decoder layers (RMSNorm, q/k/v, RoPE, grouped-query attention over the
past KV + the new entries, o_proj, SwiGLU MLP) for `seq` new tokens (the prompt processor AR-N or the token
generator AR-1) at `context` positions; or the model's final norm + lm_head over `vocab` columns.
Timing is what matters: values are random but finite.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from hexstudio.shared.predict import LPBQ_BLOCK

GRAPHS_VERSION = 4  # bump when the graphs change: cached timings of older graphs are not reused
OPSET = 21  # block-wise Q/DQ, int4 and 16-bit Q/DQ
BLOCK = LPBQ_BLOCK  # LPBQ block along the input features
U16, U8 = TensorProto.UINT16, TensorProto.UINT8
MID16 = 32768  # the zero point of a symmetric uint16 activation
MID8 = 128
UNIT = (
    1.0 / 65536
)  # [0, 1) outputs (softmax, sigmoid): scale 2^-16, zero point 0, HTP's own encoding for them


@dataclass(frozen=True)
class LayerShape:
    """One synthetic graph's shapes: `layers` decoder layers (or, with lm_head, the final norm + lm_head)."""

    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    seq: int  # new tokens per execution: AR-N (prompt processor) or 1 (token generator)
    context: int  # context length: past KV = context - seq entries
    layers: int = 1
    vocab: int = 0  # > 0: an lm_head graph of this many columns instead of decoder layers
    rms_eps: float = 1e-5
    sha: bool | None = None  # single-head attention; None: for the prompt processor (seq > 1) only
    kv_concat: bool = True  # attention over concat(past, new) KV; False: over each, scores concatenated

    def single_head_attention(self) -> bool:
        """Per-head attention ops (MHA -> SHA) for AR-N, where a whole [heads, n, ctx] score tensor spills
        out of VTCM (1B, AR-128, CL 4096: 9.4 ms vs 40.8 ms simulated per layer); one grouped op for AR-1,
        where 32 small heads cost more in op overhead than they save (3.4 ms vs 1.7 ms)."""
        return self.seq > 1 if self.sha is None else self.sha

    def key(self) -> str:
        kind = (
            f"lm{self.vocab}"
            if self.vocab
            else f"L{self.layers}"
            + ("-sha" if self.single_head_attention() else "")
            + ("" if self.kv_concat else "-split")
        )
        return (
            f"h{self.hidden}-a{self.heads}-kv{self.kv_heads}-d{self.head_dim}-i{self.intermediate}-"
            f"s{self.seq}-c{self.context}-{kind}"
        )


class _Builder:
    """Nodes, initializers and the scale of every float tensor (so data movement keeps its input's scale)."""

    def __init__(self, seed: int = 0) -> None:
        self.nodes: list[onnx.NodeProto] = []
        self.inits: list[onnx.TensorProto] = []
        self.rng = np.random.default_rng(seed)
        self.n = 0
        self.scale: dict[str, float] = {}

    def name(self, base: str) -> str:
        self.n += 1
        return f"{base}_{self.n}"

    def const(self, base: str, arr: np.ndarray) -> str:
        name = self.name(base)
        self.inits.append(numpy_helper.from_array(arr, name))
        return name

    def node(self, op: str, inputs: list[str], base: str, **attrs: object) -> str:
        out = self.name(base)
        self.nodes.append(helper.make_node(op, inputs, [out], name=self.name(op), **attrs))
        return out

    def _qparams(self, scale: float, bits: int) -> tuple[str, str]:
        s = self.const("s", np.array(scale, np.float32))
        mid = 0 if scale == UNIT else (MID16 if bits == 16 else MID8)
        z = self.const("z", np.array(mid, np.uint16) if bits == 16 else np.array(mid, np.uint8))
        return s, z

    def qdq(self, x: str, scale: float, bits: int = 16, out_q: str | None = None) -> str:
        """x (float) -> Q -> DQ: the activation quantization every op output gets; returns the float name.
        `out_q`: also name the quantized tensor (a graph output)."""
        s, z = self._qparams(scale, bits)
        q = out_q or self.name(f"{x}_q")
        self.nodes.append(helper.make_node("QuantizeLinear", [x, s, z], [q], name=self.name("Q")))
        y = self.node("DequantizeLinear", [q, s, z], f"{x}_dq")
        self.scale[y] = scale
        return y

    def deq(self, q: str, scale: float, bits: int = 16) -> str:
        """A quantized graph input -> float."""
        s, z = self._qparams(scale, bits)
        y = self.node("DequantizeLinear", [q, s, z], f"{q}_dq")
        self.scale[y] = scale
        return y

    def op(
        self, op: str, inputs: list[str], scale: float | None = None, bits: int = 16, **attrs: object
    ) -> str:
        """A float op followed by its output's Q/DQ; `scale` None keeps the first input's (data movement)."""
        y = self.node(op, inputs, op.lower(), **attrs)
        return self.qdq(y, self.scale[inputs[0]] if scale is None else scale, bits)

    def shape(self, dims: list[int]) -> str:
        return self.const("shape", np.array(dims, np.int64))

    def reshape(self, x: str, dims: list[int]) -> str:
        return self.op("Reshape", [x, self.shape(dims)])

    def axis_range(self, start: int, end: int, axis: int) -> list[str]:
        """Slice's starts, ends and axes inputs for [start, end) along one axis."""
        return [
            self.const("b", np.array([start], np.int64)),
            self.const("e", np.array([end], np.int64)),
            self.const("a", np.array([axis], np.int64)),
        ]

    def transpose(self, x: str, perm: list[int]) -> str:
        return self.op("Transpose", [x], perm=perm)

    def lpbq_matmul(self, x: str, k: int, n: int, out_scale: float) -> str:
        """x [.., k] @ W [k, n] with W int4 LPBQ: uint8 block scales x per-channel float scale (block 64)."""
        if k % BLOCK:
            raise ValueError(f"LPBQ needs input features divisible by {BLOCK}, not {k}")
        w = (self.rng.standard_normal((k, n), dtype=np.float32) * 0.02).astype(np.float32)
        blocks = k // BLOCK
        channel: np.ndarray = np.full((n,), 0.02 / 7 / 8, np.float32)  # per output channel
        int_scale = self.rng.integers(1, 16, size=(blocks, n), dtype=np.uint8)  # 4-bit block scales
        ib = self.const("lpbq_int_scale", int_scale)
        pc = self.const("lpbq_channel_scale", channel)
        pz = self.const("lpbq_channel_zp", np.zeros((n,), np.uint8))
        block_scale = self.node("DequantizeLinear", [ib, pc, pz], "lpbq_block_scale", axis=1)
        wz_name = self.name("lpbq_zp")
        self.inits.append(
            helper.make_tensor(wz_name, TensorProto.INT4, [blocks, n], np.zeros(blocks * n, np.int8))
        )
        wi = self.const("w", w)
        wq = self.node("QuantizeLinear", [wi, block_scale, wz_name], "w_q", axis=0, block_size=BLOCK)
        # the weight's DQ reads the same block scales as a constant: a DQ output with two consumers is duplicated
        # by the EP and the copy is refused ("Unsupported nodes ... DequantizeLinear .../duplicated")
        fs = self.const(
            "lpbq_block_scale_f", (int_scale.astype(np.float32) * channel[None, :]).astype(np.float32)
        )
        wdq = self.node("DequantizeLinear", [wq, fs, wz_name], "w_dq", axis=0, block_size=BLOCK)
        return self.op("MatMul", [x, wdq], out_scale)

    def int8_matmul(self, x: str, k: int, n: int, out_scale: float) -> str:
        """x [.., k] @ W [k, n] with W int8, per-channel scales (the lm_head)."""
        w = self.rng.integers(-127, 128, size=(k, n), dtype=np.int8)
        wi = self.const("w8", w)
        s = self.const("w8_scale", np.full((n,), 1e-3, np.float32))
        z = self.const("w8_zp", np.zeros((n,), np.int8))
        wdq = self.node("DequantizeLinear", [wi, s, z], "w8_dq", axis=1)
        return self.op("MatMul", [x, wdq], out_scale)

    def rmsnorm(self, x: str, hidden: int, eps: float) -> str:
        w = self.const("norm_w", np.full((hidden,), MID16 + 1000, np.uint16))
        wf = self.deq(w, 1e-4)
        return self.op("SimplifiedLayerNormalization", [x, wf], 0.05, axis=-1, epsilon=eps)

    def rope(self, x: str, cos: str, sin: str, half: int, scale: float) -> str:
        """Rotate-half RoPE over the last axis: (x1 cos - x2 sin, x2 cos + x1 sin)."""
        x1 = self.op(
            "Slice",
            [
                x,
                self.const("b", np.array([0], np.int64)),
                self.const("e", np.array([half], np.int64)),
                self.const("a", np.array([-1], np.int64)),
            ],
        )
        x2 = self.op(
            "Slice",
            [
                x,
                self.const("b", np.array([half], np.int64)),
                self.const("e", np.array([2 * half], np.int64)),
                self.const("a", np.array([-1], np.int64)),
            ],
        )
        a = self.op("Sub", [self.op("Mul", [x1, cos], scale), self.op("Mul", [x2, sin], scale)], scale)
        b = self.op("Add", [self.op("Mul", [x2, cos], scale), self.op("Mul", [x1, sin], scale)], scale)
        return self.op("Concat", [a, b], scale, axis=-1)


def _layer(
    b: _Builder,
    s: LayerShape,
    x: str,
    mask: str,
    cos: str,
    sin: str,
    i: int,
    outputs: list[onnx.ValueInfoProto],
    inputs: list[onnx.ValueInfoProto],
) -> str:
    n, h, hd, kvh = s.seq, s.hidden, s.head_dim, s.kv_heads
    rep = s.heads // kvh
    past = s.context - s.seq
    kv_scale = 0.05
    pk = f"past_key_{i}_in"
    pv = f"past_value_{i}_in"
    inputs += [
        helper.make_tensor_value_info(pk, U8, [kvh, 1, hd, past]),
        helper.make_tensor_value_info(pv, U8, [kvh, 1, past, hd]),
    ]
    outputs += [
        helper.make_tensor_value_info(f"past_key_{i}_out", U8, [kvh, 1, hd, n]),
        helper.make_tensor_value_info(f"past_value_{i}_out", U8, [kvh, 1, n, hd]),
    ]

    xn = b.rmsnorm(x, h, s.rms_eps)
    q = b.lpbq_matmul(xn, h, s.heads * hd, 0.05)
    k = b.lpbq_matmul(xn, h, kvh * hd, 0.05)
    v = b.lpbq_matmul(xn, h, kvh * hd, kv_scale)
    q = b.transpose(b.reshape(q, [1, n, s.heads, hd]), [0, 2, 1, 3])  # [1, heads, n, hd]
    q = b.rope(q, cos, sin, hd // 2, 0.05)
    k = b.transpose(b.reshape(k, [1, n, kvh, hd]), [0, 2, 1, 3])  # [1, kvh, n, hd]
    k = b.rope(k, cos, sin, hd // 2, kv_scale)
    k_new = b.node("Transpose", [k], "k_t", perm=[1, 0, 3, 2])  # [kvh, 1, hd, n]
    k_new = b.qdq(k_new, kv_scale, 8, out_q=f"past_key_{i}_out")
    v_new = b.node("Transpose", [b.reshape(v, [1, n, kvh, hd])], "v_t", perm=[2, 0, 1, 3])  # [kvh, 1, n, hd]
    v_new = b.qdq(v_new, kv_scale, 8, out_q=f"past_value_{i}_out")
    kp, vp = b.deq(pk, kv_scale, 8), b.deq(pv, kv_scale, 8)  # the past, as Genie feeds it
    if s.kv_concat:  # one KV tensor over the whole context (copies the cache each execution)
        kp = b.op("Concat", [kp, k_new], kv_scale, 8, axis=3)  # [kvh, 1, hd, ctx]
        vp = b.op("Concat", [vp, v_new], kv_scale, 8, axis=2)  # [kvh, 1, ctx, hd]
    if not s.single_head_attention():
        # heads of a KV group together: one [kvh, 1, rep*n, ctx] score tensor, few ops (the token generator)
        qg = b.reshape(q, [kvh, 1, rep * n, hd])

        def grouped_mask(scores: str) -> str:
            return b.reshape(
                b.op("Add", [b.reshape(scores, [kvh, rep, n, s.context]), mask], 0.5),
                [kvh, 1, rep * n, s.context],
            )

        ctx = _attend(b, qg, kp, None if s.kv_concat else k_new, vp, v_new, past, n, grouped_mask)
        ctx = b.reshape(b.transpose(b.reshape(ctx, [1, s.heads, n, hd]), [0, 2, 1, 3]), [1, n, s.heads * hd])
        return _mlp(b, s, x, ctx)

    # single-head attention, as Qualcomm's LLM exports lay it out for HTP (MHA -> SHA): each head's scores
    # [1, 1, n, ctx] stay small enough for VTCM where one [kvh, rep*n, ctx] tensor would spill to DDR
    def group(t: str) -> list[str]:
        return [b.op("Slice", [t, *b.axis_range(g, g + 1, 0)]) for g in range(kvh)]

    gkp, gvp = group(kp), group(vp)
    gkn: list[str | None] = [None] * kvh if s.kv_concat else list(group(k_new))
    gvn = gvp if s.kv_concat else group(v_new)
    heads = []
    for hh in range(s.heads):
        qh = b.op("Slice", [q, *b.axis_range(hh, hh + 1, 1)])  # [1, 1, n, hd]
        g = hh // rep
        heads.append(
            _attend(b, qh, gkp[g], gkn[g], gvp[g], gvn[g], past, n, lambda sc: b.op("Add", [sc, mask], 0.5))
        )  # [1, 1, n, hd]
    ctx = b.op("Concat", heads, 0.05, axis=1)  # [1, heads, n, hd]
    ctx = b.reshape(b.transpose(ctx, [0, 2, 1, 3]), [1, n, s.heads * hd])
    return _mlp(b, s, x, ctx)


def _attend(
    b: _Builder,
    q: str,
    k_past: str,
    k_new: str | None,
    v_past: str,
    v_new: str,
    past: int,
    n: int,
    add_mask: Callable[[str], str],
) -> str:
    """softmax(q K^T + mask) V. `k_new` None: k_past / v_past hold the whole context already (concatenated).
    Otherwise over the past and the new entries WITHOUT concatenating the KV cache: the scores of both are
    concatenated (a [.., rows, ctx] tensor) and the probabilities split again. Which is faster depends on the
    shapes (3B, AR-1, context 4096: 4.4 ms per layer concatenated vs 3.0 split; 1B: 1.7 vs 2.2)."""
    if k_new is None:
        probs = b.op("Softmax", [add_mask(b.op("MatMul", [q, k_past], 0.5))], UNIT, axis=-1)
        return b.op("MatMul", [probs, v_past], 0.05)
    scores = b.op("Concat", [b.op("MatMul", [q, k_past], 0.5), b.op("MatMul", [q, k_new], 0.5)], 0.5, axis=3)
    probs = b.op("Softmax", [add_mask(scores)], UNIT, axis=-1)
    p_past = b.op("Slice", [probs, *b.axis_range(0, past, 3)])
    p_new = b.op("Slice", [probs, *b.axis_range(past, past + n, 3)])
    return b.op("Add", [b.op("MatMul", [p_past, v_past], 0.05), b.op("MatMul", [p_new, v_new], 0.05)], 0.05)


def _mlp(b: _Builder, s: LayerShape, x: str, ctx: str) -> str:
    """o_proj + residual, then the SwiGLU MLP + residual."""
    h = s.hidden
    attn = b.lpbq_matmul(ctx, s.heads * s.head_dim, h, 0.05)
    x = b.op("Add", [x, attn], 0.1)
    xn = b.rmsnorm(x, h, s.rms_eps)
    gate = b.lpbq_matmul(xn, h, s.intermediate, 0.05)
    up = b.lpbq_matmul(xn, h, s.intermediate, 0.05)
    act = b.op("Mul", [gate, b.op("Sigmoid", [gate], UNIT)], 0.05)
    down = b.lpbq_matmul(b.op("Mul", [act, up], 0.05), s.intermediate, h, 0.05)
    return b.op("Add", [x, down], 0.1)


def build(s: LayerShape, seed: int = 0) -> onnx.ModelProto:
    """The synthetic graph for `s` (decoder layers, or final norm + lm_head when s.vocab)."""
    if s.seq < 1 or s.context <= s.seq:
        raise ValueError(f"need 1 <= seq < context, not seq {s.seq}, context {s.context}")
    b = _Builder(seed)
    hidden_in = helper.make_tensor_value_info("hidden_in", U16, [1, s.seq, s.hidden])
    inputs: list[onnx.ValueInfoProto] = [hidden_in]
    outputs: list[onnx.ValueInfoProto] = []
    x = b.deq("hidden_in", 0.1)
    if s.vocab:
        xn = b.rmsnorm(x, s.hidden, s.rms_eps)
        logits = b.int8_matmul(xn, s.hidden, s.vocab, 0.01)
        last = b.nodes[-1]  # the DQ after the logits' Q: drop it, the Q's output is the graph output
        b.nodes.pop()
        q_node = b.nodes[-1]
        q_node.output[0] = "logits"
        del last, logits
        outputs.append(helper.make_tensor_value_info("logits", U16, [1, s.seq, s.vocab]))
    else:
        inputs += [
            helper.make_tensor_value_info("attention_mask", U16, [1, 1, s.seq, s.context]),
            helper.make_tensor_value_info("position_cos", U16, [1, 1, s.seq, s.head_dim // 2]),
            helper.make_tensor_value_info("position_sin", U16, [1, 1, s.seq, s.head_dim // 2]),
        ]
        mask = b.deq("attention_mask", 0.02)
        cos = b.deq("position_cos", 1.0 / 32767)
        sin = b.deq("position_sin", 1.0 / 32767)
        for i in range(s.layers):
            x = _layer(b, s, x, mask, cos, sin, i, outputs, inputs)
        # the last layer's output leaves quantized: rename its Q
        b.nodes.pop()
        b.nodes[-1].output[0] = "hidden_out"
        outputs.insert(0, helper.make_tensor_value_info("hidden_out", U16, [1, s.seq, s.hidden]))
    graph = helper.make_graph(b.nodes, f"hexstudio_predict_{s.key()}", inputs, outputs, b.inits)
    model = helper.make_model(
        graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="hexstudio"
    )
    model.ir_version = 10
    return model


def save(model: onnx.ModelProto, path: Path) -> None:
    """Write with the weights in a side file (a layer at 8B shapes is ~0.9 GB of float weights)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save_model(
        model,
        str(path),
        save_as_external_data=True,
        all_tensors_to_one_file=True,
        location=path.name + ".data",
        size_threshold=1024,
    )


def feeds(s: LayerShape, seed: int = 1) -> dict[str, np.ndarray]:
    """Random quantized inputs for one execution."""
    rng = np.random.default_rng(seed)

    def u16(*dims: int) -> np.ndarray:
        return rng.integers(MID16 - 2000, MID16 + 2000, size=dims, dtype=np.uint16)

    out: dict[str, np.ndarray] = {"hidden_in": u16(1, s.seq, s.hidden)}
    if s.vocab:
        return out
    out["attention_mask"] = np.full((1, 1, s.seq, s.context), MID16, np.uint16)
    out["position_cos"] = u16(1, 1, s.seq, s.head_dim // 2)
    out["position_sin"] = u16(1, 1, s.seq, s.head_dim // 2)
    past = s.context - s.seq
    for i in range(s.layers):
        out[f"past_key_{i}_in"] = rng.integers(
            100, 156, size=(s.kv_heads, 1, s.head_dim, past), dtype=np.uint8
        )
        out[f"past_value_{i}_in"] = rng.integers(
            100, 156, size=(s.kv_heads, 1, past, s.head_dim), dtype=np.uint8
        )
    return out
