"""Run the deployment pair as the board does: the prompt processor over AR-N blocks of the
prompt, then the token generator one token at a time on the KV cache (docs/CONTRACTS.md §2).

numpy + onnxruntime only: used by validation on the workstation and by the simulator board.

    pair = DeploymentPair.from_graphs(graphs, base_dir, variant="sim", context_length=512, ar_n=128)
    logits = pair.prefill(token_ids)   # logits [V] at the last prompt token
    logits = pair.step(token_id)       # one AR-1 step
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np

MASK_VALUE = -1000.0


def step_inputs(n_past: int, s: int, capacity: int) -> tuple[np.ndarray, np.ndarray]:
    """attention_mask [1,1,S,CL] and position_ids [1,S] for S new tokens after n_past cached ones.
    Columns: [CL-S past slots (the first n_past valid) | S current (causal)]."""
    past_len = capacity - s
    pos: np.ndarray = (n_past + np.arange(s, dtype=np.int32))[None]
    mask: np.ndarray = np.full((1, 1, s, capacity), MASK_VALUE, np.float32)
    mask[0, 0, :, :n_past] = 0.0
    mask[0, 0, :, past_len:][np.tril(np.ones((s, s), bool))] = 0.0
    return mask, pos


class ContextFull(RuntimeError):
    """The KV cache holds context_length tokens: no room for more."""


class PartChain:
    """The parts of one graph kind (prompt processor or token generator), run in order."""

    def __init__(self, sessions: list[Any], layers: list[list[int]], seq_len: int) -> None:
        self.sessions = sessions
        self.layers = layers
        self.seq_len = seq_len
        self.input_names = [[i.name for i in s.get_inputs()] for s in sessions]

    def run(self, first_input: np.ndarray, mask: np.ndarray, pos: np.ndarray,
            past: dict[int, tuple[np.ndarray, np.ndarray]]) -> tuple[np.ndarray, dict[int, tuple[np.ndarray, np.ndarray]]]:
        x = first_input
        new: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        for sess, layers, names in zip(self.sessions, self.layers, self.input_names, strict=True):
            feed: dict[str, np.ndarray] = {names[0]: x, names[1]: mask, names[2]: pos}
            for j, li in enumerate(layers):
                feed[names[3 + 2 * j]] = past[li][0]
                feed[names[4 + 2 * j]] = past[li][1]
            outs = sess.run(None, feed)  # by position: quantized graphs rename their outputs
            x = outs[0]
            for j, li in enumerate(layers):
                new[li] = (outs[1 + 2 * j], outs[2 + 2 * j])
        return x, new


class DeploymentPair:
    def __init__(self, prompt: PartChain, token: PartChain, context_length: int, num_kv_heads: int,
                 head_dim: int, layers: list[int]) -> None:
        self.prompt = prompt
        self.token = token
        self.capacity = context_length
        self.ar_n = prompt.seq_len
        self.layers = layers
        self._k: dict[int, np.ndarray] = {li: np.zeros((1, num_kv_heads, head_dim, context_length), np.float32) for li in layers}
        self._v: dict[int, np.ndarray] = {li: np.zeros((1, num_kv_heads, context_length, head_dim), np.float32) for li in layers}
        self.n_past = 0

    # -- construction -------------------------------------------------------
    @classmethod
    def from_graphs(cls, graphs: Sequence[dict[str, Any]], base_dir: str | Path, variant: str = "sim",
                    context_length: int | None = None, ar_n: int | None = None,
                    intra_op_threads: int = 1, providers: list[str] | None = None) -> DeploymentPair:
        import onnxruntime as ort

        key = {"sim": "sim_onnx", "float": "float_onnx", "quantsim": "sim_onnx"}[variant]
        base = Path(base_dir)
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = intra_op_threads
        opts.inter_op_num_threads = 1
        opts.log_severity_level = 3
        chains: dict[str, PartChain] = {}
        for kind in ("prompt_processor", "token_generator"):
            gs = sorted((g for g in graphs if g["kind"] == kind), key=lambda g: g["part"])
            if not gs:
                raise ValueError(f"no {kind} graphs in the graph list")
            sessions = [ort.InferenceSession(str(base / g[key]), opts, providers=providers or ["CPUExecutionProvider"])
                        for g in gs]
            chains[kind] = PartChain(sessions, [list(g["layers"]) for g in gs], int(gs[0]["seq_len"]))
        p = chains["prompt_processor"]
        # shapes from the first part's past_key input: [1, KVH, HD, CL - S]
        first = p.sessions[0].get_inputs()[3].shape
        kvh, hd = int(first[1]), int(first[2])
        cl = context_length or int(first[3]) + p.seq_len
        if ar_n is not None and ar_n != p.seq_len:
            raise ValueError(f"the prompt processor graphs have AR-{p.seq_len}, not AR-{ar_n}")
        layers = sorted(li for ls in p.layers for li in ls)
        return cls(p, chains["token_generator"], cl, kvh, hd, layers)

    # -- running ------------------------------------------------------------
    def reset(self) -> None:
        self.n_past = 0

    def _run(self, chain: PartChain, ids: list[int]) -> np.ndarray:
        s = chain.seq_len
        m = len(ids)
        past_len = self.capacity - s
        if self.n_past + s > self.capacity or self.n_past > past_len:
            raise ContextFull(f"the context holds {self.n_past} of {self.capacity} tokens; no room for a "
                              f"{s}-token block")
        x: np.ndarray = np.zeros((1, s), np.int32)
        x[0, :m] = ids
        mask, pos = step_inputs(self.n_past, s, self.capacity)
        past = {li: (self._k[li][..., :past_len], self._v[li][:, :, :past_len]) for li in self.layers}
        logits, new = chain.run(x, mask, pos, past)
        for li, (k, v) in new.items():
            self._k[li][..., self.n_past:self.n_past + m] = k[..., :m]
            self._v[li][:, :, self.n_past:self.n_past + m] = v[:, :, :m]
        self.n_past += m
        return np.asarray(logits[0, m - 1], dtype=np.float32)

    def prefill(self, token_ids: Sequence[int]) -> np.ndarray:
        """Feed a prompt in AR-N blocks (the last one padded); returns logits at its last token.
        Tokens that no longer fit a whole AR-N block near the end of the context go through AR-1."""
        ids = list(token_ids)
        if not ids:
            raise ValueError("empty prompt")
        if self.n_past + len(ids) > self.capacity:
            raise ContextFull(f"the prompt ({len(ids)} tokens) does not fit: {self.n_past} of "
                              f"{self.capacity} context tokens are used")
        logits: np.ndarray | None = None
        i = 0
        while i < len(ids):
            if self.n_past + self.ar_n <= self.capacity:
                block = ids[i:i + self.ar_n]
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

    def generate(self, prompt_ids: Sequence[int], max_new_tokens: int, eos_ids: Sequence[int] = ()) -> list[int]:
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

Call = tuple[int, str, list[int], int]   # (sequence index, "prompt_processor"|"token_generator", token ids, n_past)


class PartSessions:
    """onnxruntime sessions of ONE part at a time: asking for another part closes the open ones.
    `opens` counts session creations (the price of holding one part in memory)."""

    def __init__(self, graphs: Sequence[dict[str, Any]], base_dir: str | Path, variant: str = "sim",
                 intra_op_threads: int = 1, providers: list[str] | None = None) -> None:
        key = {"sim": "sim_onnx", "float": "float_onnx", "quantsim": "sim_onnx"}[variant]
        base = Path(base_dir)
        self.graphs = {(g["kind"], int(g["part"])): g for g in graphs}
        self.paths = {k: base / str(g[key]) for k, g in self.graphs.items()}
        self.parts = sorted({p for _, p in self.graphs})
        for kind in ("prompt_processor", "token_generator"):
            missing = [p for p in self.parts if (kind, p) not in self.graphs]
            if missing:
                raise ValueError(f"no {kind} graph for part(s) {missing}")
        self.layers = {p: list(self.graphs[("prompt_processor", p)]["layers"]) for p in self.parts}
        self.seq_len = {kind: int(self.graphs[(kind, self.parts[0])]["seq_len"])
                        for kind in ("prompt_processor", "token_generator")}
        self.threads = intra_op_threads
        self.providers = providers or ["CPUExecutionProvider"]
        self._part: int | None = None
        self._open: dict[str, tuple[Any, list[str]]] = {}
        self.opens = 0
        self.open_seconds = 0.0

    def session(self, kind: str, part: int) -> tuple[Any, list[str]]:
        import time

        import onnxruntime as ort

        if part != self._part:
            self.close()
            self._part = part
        if kind not in self._open:
            t0 = time.monotonic()
            opts = ort.SessionOptions()
            opts.intra_op_num_threads = self.threads
            opts.inter_op_num_threads = 1
            opts.log_severity_level = 3
            sess = ort.InferenceSession(str(self.paths[(kind, part)]), opts, providers=self.providers)
            self._open[kind] = (sess, [i.name for i in sess.get_inputs()])
            self.opens += 1
            self.open_seconds += time.monotonic() - t0
        return self._open[kind]

    def close(self) -> None:
        self._open.clear()
        self._part = None


class KVState:
    """One sequence's KV cache for every layer, [1,KVH,HD,CL] keys and [1,KVH,CL,HD] values."""

    def __init__(self, layers: Sequence[int], num_kv_heads: int, head_dim: int, context_length: int) -> None:
        self.k: dict[int, np.ndarray] = {li: np.zeros((1, num_kv_heads, head_dim, context_length), np.float32)
                                         for li in layers}
        self.v: dict[int, np.ndarray] = {li: np.zeros((1, num_kv_heads, context_length, head_dim), np.float32)
                                         for li in layers}
        self.n_past = 0


def prefill_calls(seq: int, ids: Sequence[int], n_past: int, ar_n: int, capacity: int) -> tuple[list[Call], int]:
    """The calls DeploymentPair.prefill makes: AR-N blocks, AR-1 near the end of the context."""
    calls: list[Call] = []
    i = 0
    ids = list(ids)
    if n_past + len(ids) > capacity:
        raise ContextFull(f"the prompt ({len(ids)} tokens) does not fit: {n_past} of {capacity} context tokens "
                          "are used")
    while i < len(ids):
        if n_past + ar_n <= capacity:
            block = ids[i:i + ar_n]
            calls.append((seq, "prompt_processor", block, n_past))
        else:
            block = [ids[i]]
            calls.append((seq, "token_generator", block, n_past))
        i += len(block)
        n_past += len(block)
    return calls, n_past


def run_part_major(ps: PartSessions, calls: Sequence[Call], states: dict[int, KVState], capacity: int,
                   last_only: bool = True) -> list[np.ndarray]:
    """Run `calls` through every part, part by part (one part's sessions open at a time), carrying
    each call's hidden state to the next part and writing the new KV entries into `states`.
    Calls of one sequence must come in order. Returns each call's last-part output: the logits at
    its last token [V] (last_only) or the whole output [S, V]."""
    xs: list[np.ndarray] = []
    for ci, (_, kind, ids, _) in enumerate(calls):
        s = ps.seq_len[kind]
        if not 0 < len(ids) <= s:
            raise ValueError(f"call {ci}: {len(ids)} tokens for a {s}-token graph")
        x: np.ndarray = np.zeros((1, s), np.int32)
        x[0, :len(ids)] = ids
        xs.append(x)
    for part in ps.parts:
        layers = ps.layers[part]
        for ci, (si, kind, ids, n_past) in enumerate(calls):
            sess, names = ps.session(kind, part)
            s = ps.seq_len[kind]
            m = len(ids)
            past_len = capacity - s
            if n_past + s > capacity or n_past > past_len:
                raise ContextFull(f"the context holds {n_past} of {capacity} tokens; no room for a {s}-token block")
            mask, pos = step_inputs(n_past, s, capacity)
            st = states[si]
            feed: dict[str, np.ndarray] = {names[0]: xs[ci], names[1]: mask, names[2]: pos}
            for j, li in enumerate(layers):
                feed[names[3 + 2 * j]] = st.k[li][..., :past_len]
                feed[names[4 + 2 * j]] = st.v[li][:, :, :past_len]
            outs = sess.run(None, feed)  # by position: quantized graphs rename their outputs
            for j, li in enumerate(layers):
                st.k[li][..., n_past:n_past + m] = outs[1 + 2 * j][..., :m]
                st.v[li][:, :, n_past:n_past + m] = outs[2 + 2 * j][:, :, :m]
            xs[ci] = outs[0] if part != ps.parts[-1] or not last_only else \
                np.asarray(outs[0][0, m - 1], np.float32)
            del outs
    ps.close()
    for si, _, ids, n_past in calls:
        states[si].n_past = max(states[si].n_past, n_past + len(ids))
    return [x if last_only else np.asarray(x[0], np.float32) for x in xs]


def greedy_part_major(ps: PartSessions, prompts: Sequence[Sequence[int]], max_new_tokens: int,
                      eos_ids: Sequence[int], capacity: int, num_kv_heads: int, head_dim: int) -> list[list[int]]:
    """DeploymentPair.generate for several prompts at once, part-major: the prompts are prefilled
    part by part, then every greedy step runs all still-active sequences through part 1, then
    part 2, ... (each part's token generator is opened once per step)."""
    all_layers = [li for p in ps.parts for li in ps.layers[p]]
    states = {i: KVState(all_layers, num_kv_heads, head_dim, capacity) for i in range(len(prompts))}
    calls: list[Call] = []
    last_call: dict[int, int] = {}
    for i, pr in enumerate(prompts):
        if not pr:
            raise ValueError("empty prompt")
        c, _ = prefill_calls(i, pr, 0, ps.seq_len["prompt_processor"], capacity)
        calls += c
        last_call[i] = len(calls) - 1
    outs = run_part_major(ps, calls, states, capacity)
    logits = {i: outs[last_call[i]] for i in range(len(prompts))}
    gen: dict[int, list[int]] = {i: [] for i in range(len(prompts))}
    active = set(range(len(prompts)))
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
        for sc, lg in zip(step, run_part_major(ps, step, states, capacity), strict=True):
            logits[sc[0]] = lg
    return [gen[i] for i in range(len(prompts))]
