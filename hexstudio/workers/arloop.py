"""Run the deployment pair as Genie does on the board: the prompt processor over AR-N blocks of the
prompt, then the token generator one token at a time on the KV cache (docs/CONTRACTS.md §2), every
input fed BY NAME the way Genie's HTP engine feeds it (docs/genie.md):

- `input_ids` [1, AR]: the block's tokens from slot 0 (right-padded);
- `attention_mask` [1, 1, AR, CL]: row i attends the n_past cached slots (left-aligned from slot 0) and
  the new-token columns (the last AR) up to i; padded rows are fully masked;
- `position_ids_cos` / `position_ids_sin` [1, 1, AR, rope-dim]: rows of the tables Genie computes from
  genie_config.json's positional-encoding (hexstudio/shared/rope.py), position 0 for padded rows;
- `past_key_{l}_in` [KVH, 1, HD, CL-AR] / `past_value_{l}_in` [KVH, 1, CL-AR, HD]: the cache; the
  graph's `past_*_out` (only this step's entries) are copied in after each step;
- parts chained by tensor name: part k+1 reads the tensor part k writes under the same name.

`GenieFeeds(quant=...)` adds what Genie does to quantized I/O (the simulator board, Genie's twin): the
mask written as all-ones (attend) / zero (masked) in the mask tensor's encoding, cos AND sin quantized
with cos's encoding by truncation, the cache cleared with the mid value and each new KV entry stored in
the `_out` tensor's encoding and read back in the `_in` tensor's. With identical encodings (what
quantize produces) this is exact; with untied ones it reproduces the board's corruption.

numpy + onnxruntime only: used by validation on the workstation and by the simulator board.

    pair = DeploymentPair.from_graphs(graphs, base_dir, positional_encoding=pe, variant="sim",
                                      context_length=512, ar_n=128)
    logits = pair.prefill(token_ids)   # logits [V] at the last prompt token
    logits = pair.step(token_id)       # one AR-1 step
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from hexstudio.shared.errors import ActionableError
from hexstudio.shared.rope import genie_rope_tables

MASK_VALUE = -1000.0  # a float mask's "masked" value, as Genie writes it (nsp-model.cpp)
STANDARD_INPUTS = ("attention_mask", "position_ids_cos", "position_ids_sin")
_FIRST_INT = re.compile(r"(\d+)")
Quant = tuple[float, int, int]  # (scale, offset, bitwidth), AIMET's convention: real = (q + offset) * scale


def layer_of(name: str) -> int:
    """The layer a KV tensor belongs to: the first integer in its name, as Genie reads it."""
    m = _FIRST_INT.search(name)
    if m is None:
        raise ValueError(f"KV tensor {name!r} has no layer number in its name")
    return int(m.group(1))


def is_kv(name: str) -> bool:
    return name.startswith("past_") and (name.endswith("_in") or name.endswith("_out"))


class ContextFull(ActionableError, RuntimeError):
    """The KV cache holds context_length tokens: no room for more."""


class GenieFeeds:
    """What Genie writes into the inputs at each step. `quant`: the graphs' I/O encodings by tensor name
    (the simulator board); without it the inputs are the float values Genie writes for float tensors."""

    def __init__(
        self, positional_encoding: dict[str, Any], context_length: int, quant: dict[str, Quant] | None = None
    ) -> None:
        self.cos, self.sin = genie_rope_tables(positional_encoding, context_length)
        self.rope_dim = int(self.cos.shape[1])
        self.quant = dict(quant or {})
        q = self.quant.get("attention_mask")
        if q is None:
            self.attend, self.masked = 0.0, MASK_VALUE
        else:  # Genie writes attend as all-ones and masked as 0, whatever the encoding
            scale, off, bw = q
            self.attend, self.masked = ((1 << bw) - 1 + off) * scale, off * scale
        qc = self.quant.get("position_ids_cos")
        if qc is not None:  # both tables quantized with cos's encoding, by truncation (no rounding)
            self.cos = self._as_seen(np.trunc(self.cos / qc[0] - qc[1]), "position_ids_cos")
            self.sin = self._as_seen(np.trunc(self.sin / qc[0] - qc[1]), "position_ids_sin")

    def _as_seen(self, q: np.ndarray, name: str) -> np.ndarray:
        """Integer values written into `name`, as the graph reads them (its own encoding)."""
        scale, off, _ = self.quant.get(name, self.quant["position_ids_cos"])
        return ((q + off) * scale).astype(np.float32)

    def mask(self, n_past: int, m: int, s: int, capacity: int) -> np.ndarray:
        past_len = capacity - s
        mask: np.ndarray = np.full((1, 1, s, capacity), self.masked, np.float32)
        mask[0, 0, :m, :n_past] = self.attend
        rows: np.ndarray = np.tril(np.ones((s, s), bool))
        rows[m:] = False
        mask[0, 0, :, past_len:][rows] = self.attend
        return mask

    def rope(self, n_past: int, m: int, s: int) -> tuple[np.ndarray, np.ndarray]:
        pos: np.ndarray = np.zeros(s, np.int64)
        pos[:m] = n_past + np.arange(m)
        return self.cos[pos][None, None], self.sin[pos][None, None]

    def kv_clear_value(self, name_in: str) -> float:
        q = self.quant.get(name_in)
        if q is None:
            return 0.0
        scale, off, bw = q
        return float((1 << (bw - 1)) + off) * scale  # Genie clears a quantized cache with the mid value

    def kv_store(self, name_out: str, name_in: str, v: np.ndarray) -> np.ndarray:
        """New cache entries produced in `name_out`'s encoding, as `name_in` reads them back."""
        qo, qi = self.quant.get(name_out), self.quant.get(name_in)
        if qo is None or qi is None or qo == qi:
            return v
        q = np.clip(np.round(v / qo[0]) - qo[1], 0, (1 << qo[2]) - 1)
        return ((q + qi[1]) * qi[0]).astype(np.float32)


class GraphIO:
    """One graph's input and output names, sorted into what Genie feeds and reads."""

    def __init__(self, inputs: list[str], outputs: list[str]) -> None:
        self.inputs, self.outputs = inputs, outputs
        carried = [n for n in inputs if n not in STANDARD_INPUTS and not is_kv(n)]
        if len(carried) != 1:
            raise ValueError(
                f"a graph must read exactly one of input_ids or the previous part's output; these "
                f"inputs are neither mask, rope nor KV: {carried}"
            )
        self.carried_in = carried[0]
        outs = [n for n in outputs if not is_kv(n)]
        if len(outs) != 1:
            raise ValueError(
                f"a graph must write exactly one of logits or the next part's input besides its KV "
                f"outputs: {outs}"
            )
        self.carried_out = outs[0]
        self.kv_in = {n: layer_of(n) for n in inputs if is_kv(n)}
        self.kv_out = {n: layer_of(n) for n in outputs if is_kv(n)}


def check_chain(ios: Sequence[GraphIO], kind: str) -> None:
    """Genie wires parts by tensor name: what part k writes must be what part k+1 reads."""
    if ios[0].carried_in != "input_ids":
        raise ValueError(f"the first {kind} part reads {ios[0].carried_in!r}, not input_ids")
    if ios[-1].carried_out != "logits":
        raise ValueError(f"the last {kind} part writes {ios[-1].carried_out!r}, not logits")
    for k in range(len(ios) - 1):
        if ios[k].carried_out != ios[k + 1].carried_in:
            raise ValueError(
                f"{kind} part {k + 1} writes {ios[k].carried_out!r} but part {k + 2} reads "
                f"{ios[k + 1].carried_in!r}: Genie chains parts by tensor name, so they do not connect"
            )


def _io_of(sess: Any) -> GraphIO:
    return GraphIO([i.name for i in sess.get_inputs()], [o.name for o in sess.get_outputs()])


class KVCache:
    """One sequence's cache for every layer in Genie's layout: keys [KVH,1,HD,CL], values [KVH,1,CL,HD]."""

    def __init__(
        self,
        layers: Sequence[int],
        num_kv_heads: int,
        head_dim: int,
        context_length: int,
        feeds: GenieFeeds | None = None,
    ) -> None:
        self.k: dict[int, np.ndarray] = {}
        self.v: dict[int, np.ndarray] = {}
        for li in layers:
            fk = feeds.kv_clear_value(f"past_key_{li}_in") if feeds else 0.0
            fv = feeds.kv_clear_value(f"past_value_{li}_in") if feeds else 0.0
            self.k[li] = np.full((num_kv_heads, 1, head_dim, context_length), fk, np.float32)
            self.v[li] = np.full((num_kv_heads, 1, context_length, head_dim), fv, np.float32)
        self.n_past = 0


KVState = KVCache  # the name validation uses


def feed_graph(
    io: GraphIO, x: np.ndarray, feeds: GenieFeeds, cache: KVCache, n_past: int, m: int, s: int, capacity: int
) -> dict[str, np.ndarray]:
    past_len = capacity - s
    cos, sin = feeds.rope(n_past, m, s)
    feed: dict[str, np.ndarray] = {
        io.carried_in: x,
        "attention_mask": feeds.mask(n_past, m, s, capacity),
        "position_ids_cos": cos,
        "position_ids_sin": sin,
    }
    for n, li in io.kv_in.items():
        feed[n] = cache.k[li][..., :past_len] if "key" in n else cache.v[li][:, :, :past_len]
    return {n: v for n, v in feed.items() if n in io.inputs}


def store_kv(
    io: GraphIO, outs: dict[str, np.ndarray], feeds: GenieFeeds, cache: KVCache, n_past: int, m: int
) -> None:
    for n, li in io.kv_out.items():
        val = feeds.kv_store(n, n[: -len("_out")] + "_in", outs[n])
        if "key" in n:
            cache.k[li][..., n_past : n_past + m] = val[..., :m]
        else:
            cache.v[li][:, :, n_past : n_past + m] = val[:, :, :m]


class PartChain:
    """The parts of one graph kind (prompt processor or token generator), run in order."""

    def __init__(self, sessions: list[Any], seq_len: int, kind: str = "graph") -> None:
        self.sessions = sessions
        self.seq_len = seq_len
        self.ios = [_io_of(s) for s in sessions]
        check_chain(self.ios, kind)

    def run(
        self, first_input: np.ndarray, feeds: GenieFeeds, cache: KVCache, n_past: int, m: int, capacity: int
    ) -> np.ndarray:
        x = first_input
        for sess, io in zip(self.sessions, self.ios, strict=True):
            outs = dict(
                zip(
                    io.outputs,
                    sess.run(io.outputs, feed_graph(io, x, feeds, cache, n_past, m, self.seq_len, capacity)),
                    strict=True,
                )
            )
            store_kv(io, outs, feeds, cache, n_past, m)
            x = outs[io.carried_out]
        return x


def _session(path: Path, threads: int, providers: list[str] | None) -> Any:
    import onnxruntime as ort

    opts = ort.SessionOptions()
    opts.intra_op_num_threads = threads
    opts.inter_op_num_threads = 1
    opts.log_severity_level = 3
    return ort.InferenceSession(str(path), opts, providers=providers or ["CPUExecutionProvider"])


VARIANT_KEY = {"sim": "sim_onnx", "float": "float_onnx", "quantsim": "sim_onnx"}


class DeploymentPair:
    def __init__(
        self,
        prompt: PartChain,
        token: PartChain,
        context_length: int,
        num_kv_heads: int,
        head_dim: int,
        layers: list[int],
        feeds: GenieFeeds,
    ) -> None:
        self.prompt = prompt
        self.token = token
        self.capacity = context_length
        self.ar_n = prompt.seq_len
        self.layers = layers
        self.feeds = feeds
        self.kvh, self.hd = num_kv_heads, head_dim
        self.cache = KVCache(layers, num_kv_heads, head_dim, context_length, feeds)

    @property
    def n_past(self) -> int:
        return self.cache.n_past

    # -- construction -------------------------------------------------------
    @classmethod
    def from_graphs(
        cls,
        graphs: Sequence[dict[str, Any]],
        base_dir: str | Path,
        *,
        positional_encoding: dict[str, Any],
        variant: str = "sim",
        context_length: int | None = None,
        ar_n: int | None = None,
        intra_op_threads: int = 1,
        providers: list[str] | None = None,
        quant: dict[str, Quant] | None = None,
        paths: dict[str, Path] | None = None,
        session_factory: Callable[[Path], Any] | None = None,
    ) -> DeploymentPair:
        """`paths`: graph name -> ONNX file, instead of the graph entries' `<variant>_onnx` keys.
        `session_factory(path)`: an object with onnxruntime's get_inputs/get_outputs/run (e.g. an HTP graph on
        Qualcomm's simulator, hexstudio/workers/qnn/htp_session.py) instead of a CPU session."""
        base = Path(base_dir)
        chains: dict[str, PartChain] = {}
        for kind in ("prompt_processor", "token_generator"):
            gs = sorted((g for g in graphs if g["kind"] == kind), key=lambda g: g["part"])
            if not gs:
                raise ValueError(f"no {kind} graphs in the graph list")
            files = [paths[g["name"]] if paths else base / g[VARIANT_KEY[variant]] for g in gs]
            sessions = [
                session_factory(f)
                if session_factory is not None
                else _session(f, intra_op_threads, providers)
                for f in files
            ]
            chains[kind] = PartChain(sessions, int(gs[0]["seq_len"]), kind)
        p = chains["prompt_processor"]
        shape = next(i.shape for i in p.sessions[0].get_inputs() if is_kv(i.name) and "key" in i.name)
        kvh, hd = int(shape[0]), int(shape[2])  # [KVH, 1, HD, CL - S]
        cl = context_length or int(shape[3]) + p.seq_len
        if ar_n is not None and ar_n != p.seq_len:
            raise ValueError(f"the prompt processor graphs have AR-{p.seq_len}, not AR-{ar_n}")
        layers = sorted({li for io in p.ios for li in io.kv_in.values()})
        return cls(
            p, chains["token_generator"], cl, kvh, hd, layers, GenieFeeds(positional_encoding, cl, quant)
        )

    # -- running ------------------------------------------------------------
    def reset(self) -> None:
        self.cache = KVCache(self.layers, self.kvh, self.hd, self.capacity, self.feeds)

    def _run(self, chain: PartChain, ids: list[int]) -> np.ndarray:
        s = chain.seq_len
        m = len(ids)
        n_past = self.cache.n_past
        if n_past + s > self.capacity or n_past > self.capacity - s:
            raise ContextFull(
                f"the context holds {n_past} of {self.capacity} tokens; no room for a {s}-token block"
            )
        x: np.ndarray = np.zeros((1, s), np.int32)
        x[0, :m] = ids
        logits = chain.run(x, self.feeds, self.cache, n_past, m, self.capacity)
        self.cache.n_past += m
        return np.asarray(logits[0, m - 1], dtype=np.float32)

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Feed a prompt in AR-N blocks (the last one padded); returns logits at its last token.
        Tokens that no longer fit a whole AR-N block near the end of the context go through AR-1."""
        ids = list(token_ids)
        if not ids:
            raise ValueError("empty prompt")
        if self.n_past + len(ids) > self.capacity:
            raise ContextFull(
                f"the prompt ({len(ids)} tokens) does not fit: {self.n_past} of "
                f"{self.capacity} context tokens are used"
            )
        logits: np.ndarray | None = None
        i = 0
        while i < len(ids):
            if self.n_past + self.ar_n <= self.capacity:
                block = ids[i : i + self.ar_n]
                logits = self._run(self.prompt, block)
                i += len(block)
            else:
                logits = self._run(self.token, [ids[i]])
                i += 1
        assert logits is not None
        return logits

    def step(self, token_id: int) -> np.ndarray:
        if self.n_past >= self.capacity:
            raise ContextFull(f"the context is full ({self.capacity} tokens)")
        return self._run(self.token, [int(token_id)])

    def generate(
        self, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] = ()
    ) -> list[int]:
        """Greedy continuation (for validation)."""
        logits = self.prefill(prompt_ids)
        out: list[int] = []
        for _ in range(max_new_tokens):
            tok = int(np.argmax(logits))
            out.append(tok)
            if tok in eos_ids or self.n_past >= self.capacity:
                break
            logits = self.step(tok)
        return out


# -- part-major runs: at most one part's sessions open at a time (validation of large models) --------

Call = tuple[
    int, str, list[int], int
]  # (sequence index, "prompt_processor"|"token_generator", token ids, n_past)


class PartSessions:
    """onnxruntime sessions of ONE part at a time: asking for another part closes the open ones.
    `opens` counts session creations (the price of holding one part in memory)."""

    def __init__(
        self,
        graphs: Sequence[dict[str, Any]],
        base_dir: str | Path,
        *,
        positional_encoding: dict[str, Any],
        context_length: int,
        variant: str = "sim",
        intra_op_threads: int = 1,
        providers: list[str] | None = None,
        quant: dict[str, Quant] | None = None,
    ) -> None:
        key = VARIANT_KEY[variant]
        base = Path(base_dir)
        self.graphs = {(g["kind"], int(g["part"])): g for g in graphs}
        self.paths = {k: base / str(g[key]) for k, g in self.graphs.items()}
        self.parts = sorted({p for _, p in self.graphs})
        for kind in ("prompt_processor", "token_generator"):
            missing = [p for p in self.parts if (kind, p) not in self.graphs]
            if missing:
                raise ValueError(f"no {kind} graph for part(s) {missing}")
        self.layers = {p: list(self.graphs[("prompt_processor", p)]["layers"]) for p in self.parts}
        self.seq_len = {
            kind: int(self.graphs[(kind, self.parts[0])]["seq_len"])
            for kind in ("prompt_processor", "token_generator")
        }
        self.feeds = GenieFeeds(positional_encoding, context_length, quant)
        self.threads = intra_op_threads
        self.providers = providers or ["CPUExecutionProvider"]
        self._part: int | None = None
        self._open: dict[str, tuple[Any, GraphIO]] = {}
        self.opens = 0
        self.open_seconds = 0.0

    def session(self, kind: str, part: int) -> tuple[Any, GraphIO]:
        import time

        if part != self._part:
            self.close()
            self._part = part
        if kind not in self._open:
            t0 = time.monotonic()
            sess = _session(self.paths[(kind, part)], self.threads, self.providers)
            self._open[kind] = (sess, _io_of(sess))
            self.opens += 1
            self.open_seconds += time.monotonic() - t0
        return self._open[kind]

    def close(self) -> None:
        self._open.clear()
        self._part = None

    def cache(self, num_kv_heads: int, head_dim: int, context_length: int) -> KVCache:
        return KVCache(
            [li for p in self.parts for li in self.layers[p]],
            num_kv_heads,
            head_dim,
            context_length,
            self.feeds,
        )


def prefill_calls(
    seq: int, ids: Sequence[int], n_past: int, ar_n: int, capacity: int
) -> tuple[list[Call], int]:
    """The calls DeploymentPair.prefill makes: AR-N blocks, AR-1 near the end of the context."""
    calls: list[Call] = []
    i = 0
    ids = list(ids)
    if n_past + len(ids) > capacity:
        raise ContextFull(
            f"the prompt ({len(ids)} tokens) does not fit: {n_past} of {capacity} context tokens are used"
        )
    while i < len(ids):
        if n_past + ar_n <= capacity:
            block = ids[i : i + ar_n]
            calls.append((seq, "prompt_processor", block, n_past))
        else:
            block = [ids[i]]
            calls.append((seq, "token_generator", block, n_past))
        i += len(block)
        n_past += len(block)
    return calls, n_past


def run_part_major(
    ps: PartSessions, calls: Sequence[Call], states: dict[int, KVCache], capacity: int, last_only: bool = True
) -> list[np.ndarray]:
    """Run `calls` through every part, part by part (one part's sessions open at a time), carrying
    each call's output to the next part (by tensor name) and writing the new KV entries into `states`.
    Calls of one sequence must come in order. Returns each call's last-part output: the logits at
    its last token [V] (last_only) or the whole output [S, V]."""
    xs: list[np.ndarray] = []
    for ci, (_, kind, ids, _) in enumerate(calls):
        s = ps.seq_len[kind]
        if not 0 < len(ids) <= s:
            raise ValueError(f"call {ci}: {len(ids)} tokens for a {s}-token graph")
        x: np.ndarray = np.zeros((1, s), np.int32)
        x[0, : len(ids)] = ids
        xs.append(x)
    for part in ps.parts:
        for ci, (si, kind, ids, n_past) in enumerate(calls):
            sess, io = ps.session(kind, part)
            s = ps.seq_len[kind]
            m = len(ids)
            if n_past + s > capacity or n_past > capacity - s:
                raise ContextFull(
                    f"the context holds {n_past} of {capacity} tokens; no room for a {s}-token block"
                )
            st = states[si]
            outs = dict(
                zip(
                    io.outputs,
                    sess.run(io.outputs, feed_graph(io, xs[ci], ps.feeds, st, n_past, m, s, capacity)),
                    strict=True,
                )
            )
            store_kv(io, outs, ps.feeds, st, n_past, m)
            out = outs[io.carried_out]
            xs[ci] = out if part != ps.parts[-1] or not last_only else np.asarray(out[0, m - 1], np.float32)
            del outs, out
    ps.close()
    for si, _, ids, n_past in calls:
        states[si].n_past = max(states[si].n_past, n_past + len(ids))
    return [x if last_only else np.asarray(x[0], np.float32) for x in xs]


# -- unit-major runs: one run unit (a decoder layer, the embedding, an lm_head chunk) open at a time ---------


class SlimKV:
    """One sequence's KV cache holding only the filled slots of each layer ([KVH,1,HD,n] keys, [KVH,1,n,HD]
    values); a layer's full Genie-layout arrays exist only while its unit runs (`full` / `keep`)."""

    def __init__(self, layers: Sequence[int], num_kv_heads: int, head_dim: int, feeds: GenieFeeds) -> None:
        self.kvh, self.hd, self.feeds = num_kv_heads, head_dim, feeds
        self.k: dict[int, np.ndarray] = {
            li: np.zeros((num_kv_heads, 1, head_dim, 0), np.float32) for li in layers
        }
        self.v: dict[int, np.ndarray] = {
            li: np.zeros((num_kv_heads, 1, 0, head_dim), np.float32) for li in layers
        }
        self.n_past = 0

    def full(self, li: int, capacity: int) -> KVCache:
        c = KVCache([li], self.kvh, self.hd, capacity, self.feeds)
        n = self.k[li].shape[-1]
        c.k[li][..., :n] = self.k[li]
        c.v[li][:, :, :n] = self.v[li]
        return c

    def keep(self, li: int, c: KVCache, filled: int) -> None:
        self.k[li] = np.ascontiguousarray(c.k[li][..., :filled])
        self.v[li] = np.ascontiguousarray(c.v[li][:, :, :filled])


def trim_heap() -> None:
    """Hand the heap pages freed by a closed session back to the OS (glibc's malloc_trim; a no-op elsewhere):
    without it the RSS keeps the last unit's arena and KV buffers as free heap into the next unit."""
    global _MALLOC_TRIM
    if _MALLOC_TRIM is None:
        import ctypes
        import ctypes.util

        _MALLOC_TRIM = False
        name = ctypes.util.find_library("c")
        try:
            _MALLOC_TRIM = ctypes.CDLL(name).malloc_trim if name else False
        except (OSError, AttributeError):  # not glibc
            pass
    if _MALLOC_TRIM:
        _MALLOC_TRIM(0)


_MALLOC_TRIM: Any = None


class UnitSessions:
    """The run units of every (kind, part) graph (hexstudio.workers.quant.rununits: dicts with path, inputs, outputs,
    columns), with at most one unit position's sessions open (one per kind). `opens` counts session
    creations."""

    def __init__(
        self,
        units: dict[tuple[str, int], list[dict[str, Any]]],
        graphs: Sequence[dict[str, Any]],
        *,
        positional_encoding: dict[str, Any],
        context_length: int,
        intra_op_threads: int = 1,
        providers: list[str] | None = None,
        quant: dict[str, Quant] | None = None,
    ) -> None:
        self.units = units
        gmap = {(g["kind"], int(g["part"])): g for g in graphs}
        self.parts = sorted({p for _, p in units})
        for p in self.parts:
            shapes = [
                [(u["level"], tuple(u["columns"] or ())) for u in units[(k, p)]]
                for k in ("prompt_processor", "token_generator")
            ]
            if shapes[0] != shapes[1]:
                raise ValueError(
                    f"part {p}: the prompt processor and token generator cut into different units"
                )
        self.layers = {p: list(gmap[("prompt_processor", p)]["layers"]) for p in self.parts}
        self.seq_len = {
            kind: int(gmap[(kind, self.parts[0])]["seq_len"])
            for kind in ("prompt_processor", "token_generator")
        }
        self.carried_out = {
            p: next(o for o in gmap[("prompt_processor", p)]["outputs"] if not is_kv(o)) for p in self.parts
        }
        self.feeds = GenieFeeds(positional_encoding, context_length, quant)
        self.threads = intra_op_threads
        self.providers = providers or ["CPUExecutionProvider"]
        self._at: tuple[int, int] | None = None
        self._open: dict[str, Any] = {}
        self.opens = 0
        self.open_seconds = 0.0

    def session(self, kind: str, part: int, j: int) -> Any:
        import time

        if self._at != (part, j):
            self.close()
            self._at = (part, j)
        if kind not in self._open:
            t0 = time.monotonic()
            self._open[kind] = _session(
                Path(self.units[(kind, part)][j]["path"]), self.threads, self.providers
            )
            self.opens += 1
            self.open_seconds += time.monotonic() - t0
        return self._open[kind]

    def close(self) -> None:
        if self._open:
            self._open.clear()
            trim_heap()
        self._at = None

    def cache(self, num_kv_heads: int, head_dim: int) -> SlimKV:
        return SlimKV([li for p in self.parts for li in self.layers[p]], num_kv_heads, head_dim, self.feeds)


def run_unit_major(
    us: UnitSessions,
    calls: Sequence[Call],
    states: dict[int, SlimKV],
    capacity: int,
    last_only: bool = True,
    capture: dict[int, dict[str, np.ndarray]] | None = None,
) -> list[np.ndarray]:
    """run_part_major one run unit at a time: every call goes through the part's first unit, then its
    second, ... (one unit's sessions open), each call's tensors between units kept by name (only those a
    later unit reads), each layer's KV cache in its full layout only while its unit runs. Same feeds, KV
    handling and results as run_part_major. `capture`: call index -> a dict filled with every tensor the
    units output for that call (the layers' hidden states for the float-fidelity check)."""
    envs: list[dict[str, np.ndarray]] = []
    for ci, (_, kind, ids, n_past) in enumerate(calls):
        s = us.seq_len[kind]
        if not 0 < len(ids) <= s:
            raise ValueError(f"call {ci}: {len(ids)} tokens for a {s}-token graph")
        if n_past + s > capacity or n_past > capacity - s:
            raise ContextFull(
                f"the context holds {n_past} of {capacity} tokens; no room for a {s}-token block"
            )
        x: np.ndarray = np.zeros((1, s), np.int32)
        x[0, : len(ids)] = ids
        envs.append({"input_ids": x})
    last_part = us.parts[-1]
    chunks: dict[tuple[int, str], list[np.ndarray]] = {}  # lm_head column chunks until the last one
    for part in us.parts:
        kinds = sorted({c[1] for c in calls})
        plan = us.units[(kinds[0], part)]
        carried = us.carried_out[part]
        for j in range(len(plan)):
            later = {n for k in kinds for u in us.units[(k, part)][j + 1 :] for n in u["inputs"]} | {carried}
            layers = sorted(
                {layer_of(n) for k in kinds for n in us.units[(k, part)][j]["inputs"] if is_kv(n)}
            )
            full: dict[tuple[int, int], KVCache] = {}
            filled: dict[tuple[int, int], int] = {}
            for ci, (si, kind, ids, n_past) in enumerate(calls):
                u = us.units[(kind, part)][j]
                sess = us.session(kind, part, j)
                s, m = us.seq_len[kind], len(ids)
                env = envs[ci]
                for li in layers:
                    if (si, li) not in full:
                        full[(si, li)] = states[si].full(li, capacity)
                        filled[(si, li)] = states[si].k[li].shape[-1]
                past_len = capacity - s
                feed: dict[str, np.ndarray] = {}
                for n in u["inputs"]:
                    if n == "attention_mask":
                        feed[n] = us.feeds.mask(n_past, m, s, capacity)
                    elif n in ROPE_NAMES:
                        cos, sin = us.feeds.rope(n_past, m, s)
                        feed[n] = cos if n == "position_ids_cos" else sin
                    elif is_kv(n):
                        c = full[(si, layer_of(n))]
                        li = layer_of(n)
                        feed[n] = c.k[li][..., :past_len] if "key" in n else c.v[li][:, :, :past_len]
                    else:
                        feed[n] = env[n]
                outs = dict(zip(u["outputs"], sess.run(u["outputs"], feed), strict=True))
                for n, val in outs.items():
                    if is_kv(n):
                        li = layer_of(n)
                        c = full[(si, li)]
                        v = us.feeds.kv_store(n, n[: -len("_out")] + "_in", val)
                        if "key" in n:
                            c.k[li][..., n_past : n_past + m] = v[..., :m]
                        else:
                            c.v[li][:, :, n_past : n_past + m] = v[:, :, :m]
                        filled[(si, li)] = max(filled[(si, li)], n_past + m)
                        continue
                    # what is kept past this unit is a copy that owns its memory: onnxruntime's outputs are views
                    # into the session's memory arena, and a kept view holds the whole arena (the unit's KV
                    # inputs and activations) alive after the session closes: +0.6 GiB per layer at 8B shapes
                    if capture is not None and ci in capture:
                        capture[ci][n] = np.array(val)
                    if part == last_part and n == carried and last_only:
                        val = np.array(val[0, m - 1], np.float32)
                    else:
                        val = np.array(val)
                    if u.get("columns"):
                        pending = chunks.setdefault((ci, n), [])
                        pending.append(val)
                        if u["columns"][1] == _vocab_end(us.units[(kind, part)], j):
                            env[n] = np.concatenate(chunks.pop((ci, n)), axis=-1)
                    else:
                        env[n] = val
                del outs
                for n in [n for n in env if n not in later]:
                    del env[n]
            for (si, li), c in full.items():
                states[si].keep(li, c, filled[(si, li)])
            del full
        us.close()
    for si, _, ids, n_past in calls:
        states[si].n_past = max(states[si].n_past, n_past + len(ids))
    carried = us.carried_out[last_part]
    return [env[carried] if last_only else np.asarray(env[carried][0], np.float32) for env in envs]


ROPE_NAMES = ("position_ids_cos", "position_ids_sin")


def _vocab_end(units: Sequence[dict[str, Any]], j: int) -> int:
    """The last column the lm_head chunks around unit j compute (its group's end)."""
    end = int(units[j]["columns"][1])
    for u in units[j + 1 :]:
        if not u.get("columns"):
            break
        end = int(u["columns"][1])
    return end


def greedy_batch(
    sessions: PartSessions | UnitSessions,
    prompts: Sequence[Sequence[int]],
    max_new_tokens: int,
    eos_ids: Sequence[int],
    capacity: int,
    num_kv_heads: int,
    head_dim: int,
) -> list[list[int]]:
    """DeploymentPair.generate for several prompts at once: prefill every prompt in AR-N blocks, then
    step all still-active sequences together until EOS, a full context or max_new_tokens. Part-major
    with PartSessions (every step runs the active sequences through part 1, then part 2, ...: each
    part's token generator opened once per step), unit-major with UnitSessions (one run unit at a
    time); both give the same tokens."""
    n = len(prompts)
    run: Callable[[Sequence[Call]], list[np.ndarray]]
    states: Mapping[int, KVCache] | Mapping[int, SlimKV]
    if isinstance(sessions, PartSessions):
        full = {i: sessions.cache(num_kv_heads, head_dim, capacity) for i in range(n)}
        states, run = full, lambda calls: run_part_major(sessions, calls, full, capacity)
    else:
        slim = {i: sessions.cache(num_kv_heads, head_dim) for i in range(n)}
        states, run = slim, lambda calls: run_unit_major(sessions, calls, slim, capacity)
    calls: list[Call] = []
    last_call: dict[int, int] = {}
    for i, pr in enumerate(prompts):
        if not pr:
            raise ValueError("empty prompt")
        c, _ = prefill_calls(i, pr, 0, sessions.seq_len["prompt_processor"], capacity)
        calls += c
        last_call[i] = len(calls) - 1
    outs = run(calls)
    logits = {i: outs[last_call[i]] for i in range(n)}
    gen: dict[int, list[int]] = {i: [] for i in range(n)}
    active = set(range(n))
    for it in range(max_new_tokens):
        step: list[Call] = []
        for i in sorted(active):
            tok = int(np.argmax(logits[i]))
            gen[i].append(tok)
            if tok in eos_ids or states[i].n_past >= capacity:
                continue
            step.append((i, "token_generator", [tok], states[i].n_past))
        active = {sc[0] for sc in step}
        if not step or it == max_new_tokens - 1:
            break
        for sc, lg in zip(step, run(step), strict=True):
            logits[sc[0]] = lg
    return [gen[i] for i in range(n)]
