"""A worker's temporary files live in its run folder (issue 27 #5): the qai_hub client left
/tmp/tmp*.aimet/*.aimet.zip behind, world-readable. A real worker process (worker_main) whose run makes
temporary files as libraries do (tempfile in Python, $TMPDIR in a child) and leaves them: they are in
run_dir/tmp/<stage>, private to the user while it runs, and gone when it ends, done or failed."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKER = r"""
import json, os, stat, subprocess, sys, tempfile
from hexstudio.workers.runtime import WorkerError, worker_main

def run(spec, em):
    d = tempfile.mkdtemp(suffix=".aimet")                  # what qai_hub does for an upload
    open(os.path.join(d, "model.aimet.zip"), "wb").write(b"weights")
    fd, f = tempfile.mkstemp(); os.close(fd)                # left behind on purpose
    subprocess.run(["sh", "-c", 'echo x > "$TMPDIR/from-child"'], check=True)
    mode = stat.S_IMODE(os.stat(os.environ["TMPDIR"]).st_mode)
    em.log(json.dumps({"dir": d, "file": f, "tmpdir": os.environ["TMPDIR"], "mode": mode}))
    if spec.hooks.get("fail"):
        raise WorkerError("boom", "failed on purpose")
    return {}

sys.exit(worker_main("compile", run))
"""


def _run_worker(
    code: str, tmp_path: Path, stage: str, settings: dict[str, Any] | None = None, **env: str
) -> subprocess.CompletedProcess[str]:
    """`code` (a worker_main script) on a spec for `stage` of the run tmp_path/run, as the pipeline starts a
    worker but with no parent to watch; `env` added to this environment."""
    run_dir = tmp_path / "run"
    doc: dict[str, Any] = {
        "schema": 1,
        "stage": stage,
        "run_dir": str(run_dir),
        "out_dir": str(run_dir / "artifacts" / stage),
    }
    if settings is not None:
        doc["settings"] = settings
    spec = tmp_path / "spec.json"
    spec.write_text(json.dumps(doc))
    base = {k: v for k, v in os.environ.items() if k not in ("HEXSTUDIO_PARENT_PID", "HEXSTUDIO_LIVENESS")}
    return subprocess.run(
        [sys.executable, "-c", code, "--spec", str(spec)],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
        env={**base, "PYTHONPATH": str(REPO), **env},
        stdin=subprocess.DEVNULL,
    )


@pytest.mark.parametrize("fail", [False, True], ids=["done", "failed"])
def test_temporary_files_stay_in_the_run_and_are_removed(tmp_path: Path, fail: bool) -> None:
    run_dir = tmp_path / "run"
    r = _run_worker(WORKER, tmp_path, "compile", {"fail": fail}, TMPDIR=str(tmp_path / "sys"))
    events = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{")]
    logged = [json.loads(e["message"]) for e in events if e.get("type") == "log"]
    assert logged, (r.stdout, r.stderr)
    where = logged[0]
    tmp = run_dir / "tmp" / "compile"
    assert where["tmpdir"] == str(tmp) and where["mode"] == 0o700, where
    assert Path(where["dir"]).parent == tmp and Path(where["file"]).parent == tmp
    assert not (run_dir / "tmp").exists(), list((run_dir / "tmp").rglob("*"))
    assert not (tmp_path / "sys").exists() or not any((tmp_path / "sys").iterdir())
    assert events[-1]["type"] == "done" and events[-1]["ok"] is (not fail)


FULL = r"""
import sys
from hexstudio.workers.runtime import worker_main

def run(spec, em):
    with open("/dev/full", "wb") as fh:   # a real ENOSPC, as a disk filling during quantize gives
        fh.write(b"x" * 65536)
        fh.flush()

sys.exit(worker_main("quantize", run))
"""


@pytest.mark.skipif(not Path("/dev/full").exists(), reason="no /dev/full here")
def test_a_full_disk_is_said_as_such_not_as_a_bug(tmp_path: Path) -> None:
    r = _run_worker(FULL, tmp_path, "quantize")
    errors = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{") and '"error"' in ln]
    assert errors and errors[0]["code"] == "disk_full", r.stdout
    assert (
        "disk is full" in errors[0]["message"]
        and "HexStudio bug" not in errors[0]["message"] + errors[0].get("hint", "")
        and "df -h" in errors[0]["hint"]
    )


REFUSED = r"""
import errno, sys
from hexstudio.workers.runtime import worker_main

def run(spec, em):
    how = spec.hooks["how"]
    if how == "denied":   # a run folder a sudo run made root's
        raise PermissionError(errno.EACCES, "Permission denied", "/ws/runs/r/artifacts/quantize.partial/q.onnx")
    try:                  # torch.save on a full disk: its own error over the OSError
        raise OSError(errno.ENOSPC, "No space left on device", "/ws/runs/r/q.pt")
    except OSError as exc:
        raise RuntimeError("[enforce fail at inline_container.cc] PytorchStreamWriter failed writing file") from exc

sys.exit(worker_main("quantize", run))
"""


@pytest.mark.parametrize(
    ("how", "code", "words"),
    [("denied", "not_writable", "refused access to"), ("wrapped", "disk_full", "the disk is full")],
)
def test_a_refused_write_is_said_as_such_not_as_a_bug(
    tmp_path: Path, how: str, code: str, words: str
) -> None:
    """A PermissionError (a root-owned run folder) and a library's error over a full disk were "a HexStudio bug"."""
    r = _run_worker(REFUSED, tmp_path, "quantize", {"how": how})
    errors = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{") and '"error"' in ln]
    assert errors and errors[0]["code"] == code, r.stdout + r.stderr
    assert words in errors[0]["message"] and "HexStudio bug" not in errors[0]["message"] + errors[0]["hint"]
    if how == "denied":  # the folder to take back, not the workspace's name
        assert "sudo chown -R $USER /ws/runs/r/artifacts/quantize.partial" in errors[0]["hint"], errors[0]


ORT_OOM = r"""
import sys
import numpy as np
import onnxruntime as ort
from onnx import TensorProto, helper
from hexstudio.workers.runtime import worker_main

def run(spec, em):
    # a real failed allocation in onnxruntime's arena (16 TiB): its own exception type, not MemoryError
    value = helper.make_tensor("v", TensorProto.FLOAT, [1], [1.0])
    node = helper.make_node("ConstantOfShape", ["x"], ["y"], value=value)
    graph = helper.make_graph(
        [node], "g", [helper.make_tensor_value_info("x", TensorProto.INT64, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    session.run(None, {"x": np.array([1 << 42], dtype=np.int64)})

sys.exit(worker_main("quantize", run))
"""


def test_a_failed_allocation_in_onnxruntime_is_out_of_memory_not_a_bug(tmp_path: Path) -> None:
    """onnxruntime (and torch on CUDA) raise their own exceptions when an allocation fails: the worker said
    "This is a HexStudio bug" for a GPU or arena out of memory during quantize."""
    r = _run_worker(ORT_OOM, tmp_path, "quantize")
    errors = [json.loads(ln) for ln in r.stdout.splitlines() if ln.startswith("{") and '"error"' in ln]
    assert errors and errors[0]["code"] == "out_of_memory", r.stdout
    e = errors[0]
    assert e["message"].startswith("The quantize worker ran out of host memory (Failed to allocate memory")
    assert "HexStudio bug" not in e["message"] + e["hint"] and "wsl --shutdown" in e["hint"]


def test_torch_and_cuda_failed_allocations_are_named_for_the_gpu() -> None:
    from hexstudio.workers.runtime import out_of_memory_in

    class OutOfMemoryError(RuntimeError):  # torch.OutOfMemoryError's name and text
        pass

    gpu = out_of_memory_in(OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert gpu == ("GPU", "out of memory. Tried to allocate 2.00 GiB")
    ort_cuda = out_of_memory_in(RuntimeError("CUDA failure 2: out of memory ; GPU=0 ; expr=cudaMalloc"))
    assert ort_cuda is not None and ort_cuda[0] == "GPU"
    assert out_of_memory_in(RuntimeError("shape mismatch")) is None


def test_an_arena_failure_names_the_gpu_only_where_it_may_be_in_use(monkeypatch: pytest.MonkeyPatch) -> None:
    """onnxruntime's arena says "Failed to allocate memory" on the CPU and on the GPU alike, and was named host
    memory on the GPU; a host failure whose text held a path like /home/gpu-box was named GPU memory."""
    import hexstudio.workers.runtime as rt

    arena = RuntimeError(
        "[ONNXRuntimeError] : 6 : RUNTIME_EXCEPTION : bfc_arena.cc:376 AllocateRawInternal Failed to allocate "
        "memory for requested buffer of size 4294967296"
    )
    monkeypatch.setattr(rt, "_cuda_in_use", lambda: True)
    assert rt.out_of_memory_in(arena) == (
        "GPU or host",
        "Failed to allocate memory for requested buffer of size 4294967296",
    )
    monkeypatch.setattr(rt, "_cuda_in_use", lambda: False)
    assert rt.out_of_memory_in(arena)[0] == "host"  # type: ignore[index]
    path = MemoryError("std::bad_alloc while reading /home/gpu-box/cuda-models/model.onnx")
    assert rt.out_of_memory_in(RuntimeError(str(path)))[0] == "host"  # type: ignore[index]
