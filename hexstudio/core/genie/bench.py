"""`hexstudio bench`: a benchmark protocol worth comparing, for every runtime a board has.

Per runtime: load the bundle once (the init is timed `init_runs` times, each a fresh load), then for each
prompt length and context fill, warm-up runs (discarded) and N measured runs, each on a cleared KV cache
(as geniex-bench and llama-bench do), the cache first filled to the wanted fraction of the context when
the fill is not 0. Per cell: the median, sample standard deviation (n-1, 0 for one run), min and max of
TTFT (ms), prefill and decode rates (tok/s) - the statistics geniex-bench reports (docs/genie.md).
Every cell names the runtime and version that produced it and whether it is simulated. Published
figures (Qualcomm AI Hub's model pages and qai-hub-models' perf.yaml; a user's EVK measurement) are shown
beside them, each with its source, labeled as published, never as measured.

The measuring is behind `BenchRunner`, so the statistics can be checked on a runner with known timings.
"""

from __future__ import annotations

import math
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from hexstudio.core.genie.profile import Kpis
from hexstudio.core.units import fmt_ms, fmt_rate

METRICS = ("ttft_ms", "prompt_tok_s", "gen_tok_s")
# Published figures, for comparison only; never shown as measured here. Each row names where it comes from:
# Qualcomm AI Hub's model pages, whose figures are the perf.yaml files of qai-hub-models (Genie runtime, W4A16,
# context 4096; TTFT from one 128-token prompt pass to a full 4,096-token context), or a user's own measurement
# on an IQ-9075 EVK (no public benchmark). `gen_tok_s` is in tok/s and `ttft_ms` in ms, numbers only: the
# conditions a figure was measured under are in `conditions`.
AIHUB_PERF = "https://github.com/quic/ai-hub-models/blob/main/qai_hub_models/models/{0}/perf.yaml"
AIHUB_PAGE = "https://aihub.qualcomm.com/models/{0}"
AIHUB_CONDITIONS = "W4A16, context 4096; TTFT from a 128-token prompt to a full 4,096-token context"
USER_SOURCE = "a user's own measurement on their EVK (not a public benchmark)"


def _aihub(model: str, device: str, gen: str, ttft: str, slug: str) -> dict[str, Any]:
    return {
        "model": model,
        "device": device,
        "runtime": "genie",
        "gen_tok_s": gen,
        "ttft_ms": ttft,
        "conditions": AIHUB_CONDITIONS,
        "source": f"Qualcomm AI Hub, {AIHUB_PAGE.format(slug)}",
        "url": AIHUB_PERF.format(slug),
    }


PUBLISHED: tuple[dict[str, Any], ...] = (
    _aihub("Llama 3.1 8B", "Snapdragon 8 Elite QRD", "13.05–14.14", "143–4,945", "llama_v3_1_8b_instruct"),
    _aihub("Llama 3.1 8B", "X Elite CRD", "7.41–9.36", "208–7,262", "llama_v3_1_8b_instruct"),
    _aihub("Llama 3.1 8B", "SA8255P ADP (v73)", "7.93", "330–10,551", "llama_v3_1_8b_instruct"),
    {
        "model": "Llama 3.1 8B / Nemotron Nano 8B",
        "device": "IQ-9075 EVK",
        "runtime": "genie",
        "gen_tok_s": "9.50 / 10.03",
        "ttft_ms": "183.5",
        "conditions": "TTFT at a 29-token prompt",
        "source": USER_SOURCE,
        "url": None,
    },
    _aihub("Llama 3.2 3B", "SA8775P ADP (v73)", "17.47", "110–3,508", "llama_v3_2_3b_instruct"),
    {
        "model": "Qwen3-4B",
        "device": "IQ-9075 EVK",
        "runtime": "genie",
        "gen_tok_s": "16.4",
        "ttft_ms": "353",
        "conditions": "TTFT median; prompt processing 948 tok/s",
        "source": USER_SOURCE,
        "url": None,
    },
)


def published_line(p: dict[str, Any]) -> str:
    """One published figure in words, every number with its unit: "Llama 3.1 8B on X Elite CRD: decode
    7.41–9.36 tok/s, TTFT 208–7,262 ms (W4A16, …) — Qualcomm AI Hub, https://…"."""
    cond = f" ({p['conditions']})" if p.get("conditions") else ""
    return (
        f"{p['model']} on {p['device']}: decode {p['gen_tok_s']} tok/s, TTFT {p['ttft_ms']} ms{cond} — "
        f"{p['source']}"
    )


def stats(values: Sequence[float | None]) -> dict[str, Any]:
    """median, sample stdev (n-1; 0 for one value), min, max, mean, n of the values that are numbers."""
    v = sorted(float(x) for x in values if isinstance(x, (int, float)) and math.isfinite(float(x)))
    n = len(v)
    if n == 0:
        return {"n": 0, "median": None, "stdev": None, "min": None, "max": None, "mean": None}
    median = v[n // 2] if n % 2 else 0.5 * (v[n // 2 - 1] + v[n // 2])
    mean = sum(v) / n
    sd = math.sqrt(sum((x - mean) ** 2 for x in v) / (n - 1)) if n > 1 else 0.0
    return {
        "n": n,
        "median": round(median, 4),
        "stdev": round(sd, 4),
        "min": round(v[0], 4),
        "max": round(v[-1], 4),
        "mean": round(mean, 4),
    }


class BenchRunner(Protocol):
    """One runtime on one board with one bundle loaded."""

    runtime: str
    runtime_version: str | None
    simulated: bool
    context_length: int

    async def load(self) -> float: ...  # a fresh load; returns its init time (ms)
    async def measure(self, prompt_tokens: int, fill_tokens: int, gen_tokens: int) -> Kpis: ...
    async def close(self) -> None: ...


@dataclass
class BenchPlan:
    prompt_lengths: tuple[int, ...] = (32, 128)
    context_fills: tuple[float, ...] = (0.0, 0.5)  # fraction of the context already in the KV cache
    warmup: int = 1
    runs: int = 3
    gen_tokens: int = 32
    init_runs: int = 2


@dataclass
class BenchCell:
    runtime: str
    prompt_tokens: int
    fill_tokens: int
    runs: list[dict[str, Any]]
    stats: dict[str, dict[str, Any]] = field(default_factory=dict)


async def bench_runtime(
    runner: BenchRunner, plan: BenchPlan, on_progress: Callable[[str], None] | None = None
) -> dict[str, Any]:
    say = on_progress or (lambda _m: None)
    inits = []
    for i in range(max(1, plan.init_runs)):
        inits.append(await runner.load())
        say(f"{runner.runtime}: load {i + 1}/{plan.init_runs}: {inits[-1]:.0f} ms")
    cells: list[BenchCell] = []
    for fill in plan.context_fills:
        for plen in plan.prompt_lengths:
            fill_tokens = int(fill * runner.context_length)
            if fill_tokens + plen + plan.gen_tokens > runner.context_length:
                say(
                    f"{runner.runtime}: skipped prompt {plen} at fill {fill:.0%}: does not fit the context "
                    f"({runner.context_length} tokens)"
                )
                continue
            runs: list[dict[str, Any]] = []
            for i in range(plan.warmup + plan.runs):
                k = await runner.measure(plen, fill_tokens, plan.gen_tokens)
                if i >= plan.warmup:
                    runs.append(
                        {
                            "ttft_ms": k.ttft_ms,
                            "prompt_tok_s": k.prompt_tok_s,
                            "gen_tok_s": k.gen_tok_s,
                            "prompt_tokens": k.prompt_tokens,
                            "generated_tokens": k.generated_tokens,
                            "source": k.source,
                        }
                    )
            cell = BenchCell(
                runner.runtime, plen, fill_tokens, runs, {m: stats([r[m] for r in runs]) for m in METRICS}
            )
            cells.append(cell)
            s = cell.stats
            say(
                f"{runner.runtime}: prompt {plen} fill {fill_tokens}: TTFT {fmt_ms(s['ttft_ms']['median'], 'ms')}, "
                f"decode {fmt_rate(s['gen_tok_s']['median'], 'tok/s')} (median of {len(runs)})"
            )
    return {
        "runtime": runner.runtime,
        "runtime_version": runner.runtime_version,
        "simulated": runner.simulated,
        "source": "simulated" if runner.simulated else "device",
        "context_length": runner.context_length,
        "init_ms": stats(inits),
        "init_runs": inits,
        "cells": [asdict(c) for c in cells],
    }


async def run_bench(
    runners: Sequence[Callable[[], Awaitable[BenchRunner]]],
    plan: BenchPlan,
    on_progress: Callable[[str], None] | None = None,
) -> dict[str, Any]:
    results = []
    for make in runners:
        r = await make()
        try:
            results.append(await bench_runtime(r, plan, on_progress))
        finally:
            await r.close()
    return {
        "protocol": {
            **asdict(plan),
            "statistics": "median, sample stdev (n-1), min, max over the measured runs; "
            "warm-up runs discarded; KV cache cleared before each run",
        },
        "created": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "runtimes": results,
        "published": [dict(p, label="published (not measured here)") for p in PUBLISHED],
    }


# -- the runner over ChatSession (both runtimes) -----------------------------------------------------
FILLER = (
    "The quick brown fox jumps over the lazy dog while the river runs past old stone bridges and "
    "green hills under a wide blue sky. "
)


class SessionRunner:
    """BenchRunner through the runtime interface (ChatSession): one text prompt of about N tokens (counted
    with the bundle's tokenizer), the KV cache cleared before each run, and filled first when asked."""

    def __init__(self, board: Any, bundle_dir: str, runtime: str) -> None:
        self.board, self.bundle_dir, self.runtime = board, bundle_dir, runtime
        self.runtime_version: str | None = None
        self.simulated = bool(board.simulated)
        self.context_length = 0
        self._s: Any = None

    async def load(self) -> float:
        from hexstudio.core.genie.conversation import Conversation
        from hexstudio.core.genie.session import ChatSession

        if self._s is not None:
            await self._s.close()

        class _Raw(Conversation):
            def prompt_for(self, user: str) -> str:
                self.dropped_turns = 0
                return user

        s = ChatSession(
            self.board,
            self.bundle_dir,
            _Raw(template="qa"),
            mode="persistent",
            max_tokens=32,
            runtime=self.runtime,
        )
        t0 = time.monotonic()
        await s.open()
        self._s = s
        self.runtime_version = s.runtime_version
        self.simulated = s.simulated
        self.context_length = s.conversation.context_length
        return float(s.init_ms if s.init_ms is not None else (time.monotonic() - t0) * 1000)

    def _text(self, tokens: int) -> str:
        count = self._s.conversation.count_tokens
        text = ""
        while count(text) < tokens:
            text += FILLER
        words = text.split(" ")
        while len(words) > 1 and count(" ".join(words)) > tokens:
            words.pop()
        return " ".join(words)

    async def measure(self, prompt_tokens: int, fill_tokens: int, gen_tokens: int) -> Kpis:
        s = self._s
        s.max_tokens = gen_tokens
        await s.reset()
        if fill_tokens:
            s.max_tokens = 1
            await s.send(self._text(fill_tokens))
            s.max_tokens = gen_tokens
        r = await s.send(self._text(prompt_tokens))
        if r.kpis is None:
            raise RuntimeError(f"{self.runtime}: no KPIs for a bench run ({r.error or r.state})")
        return r.kpis

    async def close(self) -> None:
        if self._s is not None:
            await self._s.close()
            self._s = None


def report_text(doc: dict[str, Any]) -> str:
    lines = []
    for rt in doc["runtimes"]:
        label = "SIMULATED (CPU, not a device result)" if rt["simulated"] else "measured on the device"
        i = rt["init_ms"]
        lines.append(f"{rt['runtime']} [{rt['runtime_version'] or '?'}] — {label}")
        lines.append(f"  init: median {fmt_ms(i['median'])} ms ± {fmt_ms(i['stdev'])} (n={i['n']})")
        lines.append(
            f"  {'prompt':>6} {'fill':>6}  {'TTFT ms':>18}  {'prefill tok/s':>18}  {'decode tok/s':>18}"
        )
        for c in rt["cells"]:

            def fmt(m: str, c: dict[str, Any] = c) -> str:
                s = c["stats"][m]
                f = fmt_ms if m.endswith("_ms") else fmt_rate
                return f"{f(s['median'])} ± {f(s['stdev'])}" if s["median"] is not None else "-"

            lines.append(
                f"  {c['prompt_tokens']:>6} {c['fill_tokens']:>6}  {fmt('ttft_ms'):>18}  "
                f"{fmt('prompt_tok_s'):>18}  {fmt('gen_tok_s'):>18}"
            )
    lines.append("Published figures (not measured here), each with its source:")
    for p in doc["published"]:
        lines.append(f"  {published_line(p)}")
    lines.append("median ± sample standard deviation over the measured runs; warm-up discarded.")
    return "\n".join(lines)
