"""VRAM is 'not measured' (None), never 0, when NVML has no per-process figures; reports say so."""

from __future__ import annotations

import asyncio
import re
from dataclasses import dataclass

from hexstudio.core.pipeline import Pipeline
from hexstudio.core.runs import Workspace
from hexstudio.core.sampler import TreeSampler, vram_from_process_lists
from tests.core.conftest import fake_stages


@dataclass
class Proc:  # the shape of pynvml's process records
    pid: int
    usedGpuMemory: int | None


def test_no_process_lists_is_unknown_not_zero() -> None:
    assert vram_from_process_lists([], {10}) is None
    assert vram_from_process_lists([[], []], {10}) is None  # WSL2: the queries answer, with nothing in them


def test_our_process_without_its_usage_is_unknown() -> None:
    assert vram_from_process_lists([[Proc(10, None), Proc(99, 5 << 30)]], {10}) is None


def test_per_process_figures_are_summed_over_our_tree() -> None:
    lists = [[Proc(10, 3 << 30), Proc(99, 5 << 30)], [Proc(11, 1 << 30)]]
    assert vram_from_process_lists(lists, {10, 11}) == 4 << 30


def test_listed_processes_none_of_ours_is_a_measured_zero() -> None:
    assert vram_from_process_lists([[Proc(99, 5 << 30)]], {10}, visible=lambda pid: True) == 0


def test_in_a_container_processes_listed_under_host_pids_are_unknown_not_zero() -> None:
    """NVML gives host pids in a Docker/LXD container: none matched ours, and a quantize using gigabytes of
    VRAM was recorded as a measured 0 B."""
    host_pids = [[Proc(812345, 9 << 30)]]
    assert vram_from_process_lists(host_pids, {10}, visible=lambda pid: pid != 812345) is None


def test_sampler_without_nvml_records_none() -> None:
    import os

    s = TreeSampler(os.getpid())
    s._nvml = None
    sample = s.sample()
    assert sample is not None and sample.vram_bytes is None and sample.as_json()["vram"] is None
    assert s.peak_vram is None


def test_report_says_not_measured_for_unknown_vram(workspace: Workspace) -> None:
    from hexstudio.core.reports.collect import build_report
    from hexstudio.core.reports.render import to_html

    m = workspace.create_run("builtin:tiny-llama", "sim", {"mode": "ok"})
    assert asyncio.run(Pipeline(m, stages=fake_stages()).run(until="model")).ok
    m.stage("model").data["peak_vram_bytes"] = None  # as on a machine without per-process NVML figures
    m.save()
    rep = build_report(m.run_dir)
    row = next(r for r in rep["stages"] if r["name"] == "model")
    assert row["peak_vram_bytes"] is None
    html = to_html(rep)
    model_row = re.search(r"<tr><td>Model</td>.*?</tr>", html, re.S)
    assert model_row and "not measured" in model_row.group(0) and ">0 B<" not in model_row.group(0)
