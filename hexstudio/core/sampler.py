"""Samples RSS of a whole process tree (psutil) and per-process GPU memory (NVML when present)."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import psutil


@dataclass
class ResourceSample:
    t: float
    rss_bytes: int
    vram_bytes: int | None
    processes: int

    def as_json(self) -> dict[str, Any]:
        return {
            "t": round(self.t, 3),
            "rss": self.rss_bytes,
            "vram": self.vram_bytes,
            "procs": self.processes,
        }


class _Nvml:
    """Per-process GPU memory through NVML, or nothing when there is no NVIDIA driver."""

    def __init__(self) -> None:
        self.ok = False
        self._handles: list[Any] = []
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nv = pynvml
            self._handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
            self.ok = bool(self._handles)
        except Exception:
            self.ok = False

    def vram_for(self, pids: set[int]) -> int | None:
        """GPU memory used by these processes; None (unknown) when NVML gives no per-process figures: no
        driver, the process queries unsupported or empty everywhere (as under WSL2), or our process is
        listed without its usage. 0 only when NVML lists processes and none of ours is among them."""
        if not self.ok:
            return None
        return vram_from_process_lists(self._process_lists(), pids)

    def _process_lists(self) -> list[list[Any]]:
        lists = []
        for h in self._handles:
            for getter in ("nvmlDeviceGetComputeRunningProcesses", "nvmlDeviceGetGraphicsRunningProcesses"):
                try:
                    lists.append(list(getattr(self._nv, getter)(h)))
                except Exception:
                    continue
        return lists


def vram_from_process_lists(
    lists: list[list[Any]], pids: set[int], visible: Callable[[int], bool] = psutil.pid_exists
) -> int | None:
    """Sum usedGpuMemory of `pids` over NVML's process lists (objects with .pid and .usedGpuMemory). A
    listed process this machine cannot see makes "none of ours" unknown, not 0: in a container NVML gives the
    host's pids (the driver ignores pid namespaces), so our own processes are listed under other numbers."""
    seen_any = False
    total = 0
    unknown = False
    ours = False
    for procs in lists:
        for p in procs:
            seen_any = True
            if p.pid not in pids:
                continue
            ours = True
            used = getattr(p, "usedGpuMemory", None)
            if used is None:  # NVML_VALUE_NOT_AVAILABLE (pynvml gives None): no per-process accounting
                unknown = True
            else:
                total += int(used)
    if not seen_any or (unknown and total == 0):
        return None
    if not ours and not all(visible(int(p.pid)) for procs in lists for p in procs):
        return None
    return total


@dataclass
class TreeSampler:
    """Call `sample()` periodically; keeps peaks and a bounded series."""

    root_pid: int
    max_points: int = 20000
    samples: list[ResourceSample] = field(default_factory=list)
    peak_rss: int = 0
    peak_vram: int | None = None
    _nvml: _Nvml | None = None
    tree_refresh_s: float = 1.0
    _procs: dict[int, psutil.Process] = field(default_factory=dict)
    _tree_at: float = -1e9

    def __post_init__(self) -> None:
        self._nvml = _Nvml()
        try:
            self._root: psutil.Process | None = psutil.Process(self.root_pid)
        except psutil.Error:
            self._root = None

    def _tree(self) -> list[psutil.Process]:
        """The root and its descendants. Finding descendants scans every process on the machine,
        so it is refreshed once a second; RSS is read from the known processes at every sample."""
        if self._root is None:
            return []
        now = time.monotonic()
        if now - self._tree_at < self.tree_refresh_s and self._procs:
            return list(self._procs.values())
        self._tree_at = now
        try:
            kids = self._root.children(recursive=True)
        except psutil.Error:
            kids = []
        procs = [self._root, *kids]
        # Reuse Process objects so psutil can keep per-process state cheaply.
        live: dict[int, psutil.Process] = {}
        for p in procs:
            live[p.pid] = self._procs.get(p.pid, p)
        self._procs = live
        return list(live.values())

    def sample(self) -> ResourceSample | None:
        procs = self._tree()
        if not procs:
            return None
        rss = 0
        n = 0
        for p in procs:
            try:
                rss += p.memory_info().rss
                n += 1
            except psutil.Error:
                continue
        if n == 0:
            return None
        vram = self._nvml.vram_for({p.pid for p in procs}) if self._nvml else None
        s = ResourceSample(time.time(), rss, vram, n)
        self.peak_rss = max(self.peak_rss, rss)
        if vram is not None:
            self.peak_vram = max(self.peak_vram or 0, vram)
        if len(self.samples) >= self.max_points:
            # keep every other point: bounded memory, whole history at lower resolution
            self.samples = self.samples[::2]
        self.samples.append(s)
        return s


async def sample_periodically(
    sampler: TreeSampler, hz: float, on_sample: Callable[[ResourceSample], None] | None = None
) -> None:
    """Run until cancelled; sample at `hz` (4 Hz or more for the job dock)."""
    period = 1.0 / hz
    next_t = time.monotonic()
    while True:
        s = sampler.sample()
        if s is not None and on_sample is not None:
            with contextlib.suppress(Exception):
                on_sample(s)
        next_t += period
        delay = next_t - time.monotonic()
        if delay < 0:  # we fell behind (busy loop): do not try to catch up in a burst
            next_t = time.monotonic()
            delay = 0
        await asyncio.sleep(delay)
