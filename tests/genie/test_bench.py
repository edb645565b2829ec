"""`hexstudio bench`: the statistics on a runner with known timings, and both runtimes on the simulator board."""

from __future__ import annotations

import asyncio
import json
import math
import statistics

import pytest

from hexstudio.core.genie.bench import BenchPlan, report_text, run_bench, stats
from hexstudio.core.genie.profile import Kpis
from tests.genie.conftest import SimWorkspace


class KnownRunner:
    """Timings from a script: the first `warmup` runs of each cell are absurd (they must be discarded)."""

    def __init__(self, runtime: str, ttfts: list[float], warmup: int) -> None:
        self.runtime, self.runtime_version, self.simulated, self.context_length = (
            runtime,
            "test 1.0",
            True,
            1000,
        )
        self.ttfts, self.warmup, self.calls, self.loads = ttfts, warmup, 0, [900.0, 1100.0, 1000.0]
        self.seen: list[tuple[int, int, int]] = []

    async def load(self) -> float:
        return self.loads.pop(0)

    async def measure(self, prompt_tokens: int, fill_tokens: int, gen_tokens: int) -> Kpis:
        i = self.calls % (self.warmup + len(self.ttfts))
        self.calls += 1
        self.seen.append((prompt_tokens, fill_tokens, gen_tokens))
        ttft = 1e6 if i < self.warmup else self.ttfts[i - self.warmup]
        return Kpis(
            init_ms=None,
            prompt_tokens=prompt_tokens,
            prompt_tok_s=prompt_tokens / (ttft / 1000),
            ttft_ms=ttft,
            generated_tokens=gen_tokens,
            gen_tok_s=gen_tokens / (ttft / 100),
            gen_time_ms=ttft * 10,
            source="simulated",
        )

    async def close(self) -> None:
        pass


def test_stats_match_the_definitions() -> None:
    xs = [120.0, 100.0, 130.0, 110.0]
    s = stats(xs)
    assert s["median"] == statistics.median(xs) == 115.0
    assert math.isclose(s["stdev"], statistics.stdev(xs), rel_tol=1e-4)  # sample (n-1), as geniex-bench
    assert (s["min"], s["max"], s["n"]) == (100.0, 130.0, 4)
    assert stats([42.0])["stdev"] == 0.0 and stats([None])["median"] is None


def test_bench_protocol_on_a_runner_with_known_timings() -> None:
    ttfts = [100.0, 140.0, 120.0]
    plan = BenchPlan(
        prompt_lengths=(10, 50), context_fills=(0.0, 0.5), warmup=2, runs=3, gen_tokens=20, init_runs=3
    )
    r = KnownRunner("genie", ttfts, warmup=2)

    async def make() -> KnownRunner:
        return r

    doc = asyncio.run(run_bench([make], plan))
    rt = doc["runtimes"][0]
    assert rt["runtime"] == "genie" and rt["runtime_version"] == "test 1.0" and rt["source"] == "simulated"
    assert rt["init_ms"]["median"] == 1000.0 and math.isclose(rt["init_ms"]["stdev"], 100.0)
    assert [(c["prompt_tokens"], c["fill_tokens"]) for c in rt["cells"]] == [
        (10, 0),
        (50, 0),
        (10, 500),
        (50, 500),
    ]
    assert r.calls == 4 * (2 + 3) and (50, 500, 20) in r.seen
    for c in rt["cells"]:
        s = c["stats"]["ttft_ms"]
        assert s["median"] == 120.0 and math.isclose(s["stdev"], 20.0) and s["n"] == 3  # warm-ups discarded
        assert (s["min"], s["max"]) == (100.0, 140.0)
        d = c["stats"]["gen_tok_s"]
        assert math.isclose(d["median"], 20 / 1.2, rel_tol=1e-3)
        assert math.isclose(d["stdev"], statistics.stdev([20 / t * 100 for t in ttfts]), rel_tol=1e-3)
    text = report_text(doc)
    assert "120 ± 20" in text and "SIMULATED" in text and "not measured here" in text
    assert all(p["label"].startswith("published") for p in doc["published"])


def test_bench_cli_on_the_simulator_board_both_runtimes(
    sim_workspace: SimWorkspace, capsys: pytest.CaptureFixture[str]
) -> None:
    argv = ["bench", "--board", "sim", "--run", sim_workspace.run_dir.name, "--runs", "2", "--warmup", "1"]
    argv += ["--prompt-lengths", "16", "--fills", "0,0.25", "--gen-tokens", "6", "--init-runs", "1", "--json"]
    rc = sim_workspace.cli(*argv)
    assert rc == 0
    doc = json.loads(capsys.readouterr().out)
    assert [r["runtime"] for r in doc["runtimes"]] == ["genie", "geniex"]
    for rt in doc["runtimes"]:
        assert rt["simulated"] and rt["source"] == "simulated" and rt["runtime_version"]
        assert len(rt["cells"]) == 2 and rt["cells"][1]["fill_tokens"] > 0
        for c in rt["cells"]:
            assert c["stats"]["gen_tok_s"]["n"] == 2 and c["stats"]["ttft_ms"]["median"] > 0
    stored = sim_workspace.run_dir / "artifacts" / "bench" / "bench.json"
    assert json.loads(stored.read_text())["runtimes"][1]["runtime"] == "geniex"


def test_published_figures_name_their_units_and_public_source() -> None:
    """Issue 32: "TTFT 183.5 at 29 prompt tokens ms" and a citation of a facts/ folder not in the repository.
    Every published figure prints a number then its unit, its conditions apart, and cites its public source."""
    import re

    from hexstudio.core.genie.bench import PUBLISHED, published_line

    doc = {"runtimes": [], "published": [dict(p, label="published (not measured here)") for p in PUBLISHED]}
    text = report_text(doc)
    assert "facts/" not in text
    number = r"[\d.,]+(?:[–/ ]+[\d.,]+)*"
    for p in PUBLISHED:
        line = published_line(p)
        assert line in text
        assert re.search(rf"decode {number} tok/s, TTFT {number} ms", line), line
        assert re.fullmatch(number, p["gen_tok_s"]) and re.fullmatch(number, p["ttft_ms"]), p
        if p["url"]:
            assert p["url"].startswith(
                "https://github.com/quic/ai-hub-models/blob/main/qai_hub_models/models/"
            )
            assert p["url"].endswith("/perf.yaml") and "https://aihub.qualcomm.com/models/" in line
        else:
            assert "a user's own measurement" in line
