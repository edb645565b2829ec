"""Local compile: the deployment graphs into real QNN context binaries with QNN 2.51 (onnxruntime-qnn).

Two forms, as the consumer can load them (docs/compile.md):
- **shared** (a real board): one context binary per part holding the prompt processor and the token
  generator, sharing weights (what AI Hub's link job makes);
- **single** (the x86 HTP simulator: "Shared weights buffer isn't supported on this platform"): one
  context binary per graph.

Each part compiles in a child process (`python -m hexstudio.workers.qnn.compile --part ...`): QNN's prepare runs
there, its memory is returned when it ends, a crash inside Qualcomm's library fails that part with its
log instead of killing the worker, and its stderr (onnxruntime's "Unsupported nodes in QNN EP: {...}")
becomes the message. Every binary is read back through libQnnSystem (hexstudio.workers.qnn.context_info) and
checked against the graph it came from.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.shared.bundle.genie_model import variant_of
from hexstudio.shared.bundle.qnn_findings import spec_of
from hexstudio.shared.errors import ActionableError
from hexstudio.workers.qnn.context_info import ContextInfo, GraphInfoDoc, read_context_info
from hexstudio.workers.qnn.ep import HtpTarget, session_options
from hexstudio.workers.qnn.libs import find_qnn_libs, with_workers_on_path

UNSUPPORTED_RE = re.compile(r"Unsupported nodes in QNN EP: (.*)")
REFUSED_NODE_RE = re.compile(r"failed for node `([^`]+)` of type `([^`]+)` with error code (\d+)")
CPU_FALLBACK = "fallback to CPU EP has been explicitly disabled"


class LocalCompileError(ActionableError):
    """The local compile failed: `code`, QNN's own words in `message`, what to do in `hint`."""

    def __init__(self, code: str, message: str, hint: str) -> None:
        super().__init__(message, hint, code=code)


@dataclass
class GraphToCompile:
    name: str  # prompt_ar128_cl512_1_of_2
    kind: str  # prompt_processor | token_generator
    part: int
    parts: int
    onnx: Path  # the HTP graph (hexstudio.workers.qnn.htp_graph), at an ordered_path


@dataclass
class CompiledPart:
    part: int
    bins: list[Path]  # 1 (shared) or one per graph (single)
    graphs: dict[str, str] = field(default_factory=dict)  # our graph name -> QNN graph name
    infos: list[ContextInfo] = field(default_factory=list)
    seconds: float = 0.0
    peak_rss_bytes: int = 0


def _compile_in_process(
    graphs: list[tuple[str, Path]], out: Path, target: HtpTarget, shared: bool
) -> list[str]:
    """Create one session per graph with context output on: the EP writes <out>/<name>_qnn.bin (one file at
    the last session when shared). Returns the .bin files written."""
    import onnxruntime as ort

    out.mkdir(parents=True, exist_ok=True)
    for k, (name, path) in enumerate(graphs):
        last = k == len(graphs) - 1
        so = session_options(
            target,
            context_file=out / f"{name}.onnx",
            share=shared and len(graphs) > 1,
            stop_share=shared and len(graphs) > 1 and last,
        )
        sess = ort.InferenceSession(os.fspath(path), so)
        del sess
    return sorted(str(p) for p in out.glob("*.bin"))


def compile_part(
    graphs: list[GraphToCompile], out: Path, target: HtpTarget, shared: bool, timeout: float = 6 * 3600
) -> CompiledPart:
    """Compile one part's graphs in a child process; raise LocalCompileError with QNN's own words."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    spec = {
        "graphs": [[g.name, os.fspath(g.onnx)] for g in graphs],
        "out": os.fspath(out),
        "soc_model": target.soc_model,
        "dsp_arch": target.dsp_arch,
        "shared": shared,
    }
    libs = find_qnn_libs()
    python = libs.python if libs is not None else sys.executable  # this env, or the installer's side env
    env = with_workers_on_path(dict(os.environ))
    t0 = time.monotonic()
    try:
        proc = subprocess.run(
            [python, "-m", "hexstudio.workers.qnn.compile", "--part", json.dumps(spec)],
            capture_output=True,
            text=True,
            timeout=timeout,
            check=False,
            env=env,
        )
    except subprocess.TimeoutExpired as exc:
        # subprocess.run killed the child; what it logged so far is kept for the person reading why
        err = exc.stderr.decode("utf-8", "replace") if isinstance(exc.stderr, bytes) else exc.stderr or ""
        (out / "compile.log").write_text(err[-200_000:], encoding="utf-8")
        names = ", ".join(g.name for g in graphs)
        raise LocalCompileError(
            "local_compile_timeout",
            f"QNN's compile of {names} ran past its limit of {timeout / 3600:g} h and was stopped.",
            f"Its log so far is {out}/compile.log. A machine swapping under the model's size compiles this slowly: "
            "compile with fewer programs open, on a bigger machine, or on AI Hub (compile_target aihub).",
        ) from None
    seconds = time.monotonic() - t0
    (out / "compile.log").write_text(proc.stderr[-200_000:], encoding="utf-8")
    result: dict[str, Any] = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{"):
            try:
                result = json.loads(line)
            except ValueError:
                pass
    if proc.returncode != 0 or not result.get("bins"):
        names = ", ".join(g.name for g in graphs)
        unsupported = UNSUPPORTED_RE.findall(proc.stderr)
        refused = dict.fromkeys(
            f"{n} ({t}, QNN error {c})" for n, t, c in REFUSED_NODE_RE.findall(proc.stderr)
        )
        if unsupported or refused or CPU_FALLBACK in proc.stderr:
            what = unsupported[-1].strip() if unsupported else ", ".join(refused) or "see the log"
            raise LocalCompileError(
                "htp_unsupported_nodes",
                f"QNN HTP cannot run every node of {names}: {what[:600]}. Nothing ran on the CPU "
                "instead (CPU fallback is off, as on the board).",
                f"This is a HexStudio bug in the graph rewrite (hexstudio/workers/qnn/htp_graph.py): report it with {out}/compile.log.",
            )
        lines = proc.stderr.strip().splitlines()
        tail = str(result.get("error") or (lines[-1] if lines else f"exit code {proc.returncode}"))
        raise LocalCompileError(
            "local_compile_failed",
            f"QNN could not compile {names} (exit {proc.returncode}): {tail[:600]}",
            f"The full log is {out}/compile.log. A killed process (exit -9) usually means the machine ran out of "
            "memory: close other programs or compile on a bigger machine.",
        )
    bins = result["bins"] if isinstance(result.get("bins"), list) else []
    peak = result.get("peak_rss_bytes")
    part = CompiledPart(
        part=graphs[0].part,
        bins=[Path(str(b)) for b in bins],
        seconds=seconds,
        peak_rss_bytes=int(peak) if isinstance(peak, int) else 0,
    )
    return part


def graph_variant(graph: GraphInfoDoc) -> tuple[int, int]:
    """(AR, CL) of a compiled graph as Genie determines it (hexstudio.shared.bundle.genie_model.variant_of: from the
    I/O shapes first, then the name): QNN names the graphs itself, so ours are matched by what Genie will see."""
    return variant_of(graph.name, spec_of(asdict(graph)))


def read_back(part: CompiledPart, graphs: list[GraphToCompile]) -> None:
    """QnnSystemContext_getBinaryInfo of each .bin; our graph names mapped to QNN's by AR (prompt vs token)."""
    libs = find_qnn_libs()
    if libs is None:
        raise LocalCompileError("qnn_missing", "libQnnSystem.so is missing.", "Reinstall onnxruntime-qnn.")
    part.infos = [read_context_info(b, libs.system) for b in part.bins]
    qnn_graphs = [g for info in part.infos for g in info.graphs]
    if len(qnn_graphs) != len(graphs):
        raise LocalCompileError(
            "context_binary_mismatch",
            f"Part {part.part}'s context binaries hold {len(qnn_graphs)} graphs; {len(graphs)} "
            "were compiled.",
            "Report it with the compile folder.",
        )
    for g in graphs:
        want = variant_of(g.name, {})  # our names carry ar{N}_cl{M}
        match = [qg for qg in qnn_graphs if graph_variant(qg) == want]
        if len(match) != 1:
            raise LocalCompileError(
                "context_binary_mismatch",
                f"Cannot tell which compiled graph of part {part.part} is {g.name}.",
                "Report it with the compile folder.",
            )
        part.graphs[g.name] = match[0].name


def _child(spec_json: str) -> int:
    spec = json.loads(spec_json)
    target = HtpTarget(int(spec["soc_model"]), str(spec["dsp_arch"]))
    try:
        bins = _compile_in_process(
            [(n, Path(p)) for n, p in spec["graphs"]], Path(spec["out"]), target, bool(spec["shared"])
        )
    except Exception as exc:
        print(json.dumps({"error": f"{type(exc).__name__}: {exc}"}))
        return 1
    try:
        import resource

        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    except (ImportError, OSError):
        peak = 0
    print(json.dumps({"bins": bins, "peak_rss_bytes": peak}))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hexstudio.workers.qnn.compile")
    ap.add_argument(
        "--part", required=True, help="JSON: graphs [[name, onnx]], out, soc_model, dsp_arch, shared"
    )
    return _child(ap.parse_args(argv).part)


if __name__ == "__main__":
    sys.exit(main())
