"""`hexstudio --worker preflight --spec FILE` (how a frozen build starts its workers) behaves exactly like
`python -m hexstudio.workers.preflight --spec FILE`: the same events (timing aside), the same outputs, the same exit
code, for a good spec and for broken ones."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.paths import BUILTIN_MODEL_DIR, BUILTIN_MODEL_ID
from hexstudio.shared import modelinfo

HEXSTUDIO = Path(sys.executable).parent / "hexstudio"
VOLATILE = {"t", "seconds", "free_bytes", "mem_available_bytes"}


def hexstudio_cmd() -> list[str]:
    return [str(HEXSTUDIO)] if HEXSTUDIO.is_file() else [sys.executable, "-m", "hexstudio"]


def run_both(
    spec_a: Path | str, spec_b: Path | str, extra: tuple[str, ...] = ()
) -> tuple[subprocess.CompletedProcess[str], subprocess.CompletedProcess[str]]:
    kw: dict[str, Any] = {
        "capture_output": True,
        "text": True,
        "timeout": 180,
        "cwd": Path(__file__).parents[2],
    }
    direct = subprocess.run(
        [sys.executable, "-m", "hexstudio.workers.preflight", *extra, "--spec", str(spec_a)], **kw
    )
    via = subprocess.run([*hexstudio_cmd(), "--worker", "preflight", *extra, "--spec", str(spec_b)], **kw)
    return direct, via


def normal(obj: Any) -> Any:
    """Drop what differs between two runs by nature (times, free bytes, the run's own folders) and
    mask the numbers inside messages."""
    if isinstance(obj, dict):
        drop = VOLATILE | (
            {"measured"} if str(obj.get("id", "")).startswith("disk_") else set()
        )  # free bytes
        return {k: normal(v) for k, v in obj.items() if k not in drop}
    if isinstance(obj, list):
        return [normal(v) for v in obj]
    if isinstance(obj, str):
        return re.sub(r"\d+(\.\d+)?", "N", obj)
    if isinstance(obj, float):
        return "N"
    return obj


def events(out: str, folder: Path | None = None) -> list[dict[str, Any]]:
    if folder is not None:  # each run has its own workspace folder
        out = out.replace(json.dumps(str(folder))[1:-1], "<workspace>")
    return [normal(json.loads(line)) for line in out.splitlines() if line.strip()]


def make_spec(tmp: Path, name: str, **changes: Any) -> Path:
    run_dir = tmp / name / "runs" / "r1"
    model_dir = run_dir / "artifacts" / "model"
    model_dir.mkdir(parents=True)
    info = modelinfo.inspect_folder(BUILTIN_MODEL_DIR)
    (model_dir / "model.json").write_text(
        json.dumps(
            {
                "model": BUILTIN_MODEL_ID,
                "source": "builtin",
                "info": info,
                "resolved": {"context_length": 512},
                "estimates": modelinfo.estimate(info, 512),
            }
        )
    )
    spec = {
        "schema": 1,
        "stage": "preflight",
        "run_dir": str(run_dir),
        "out_dir": str(run_dir / "artifacts" / "preflight.partial"),
        "upstream": {"model": str(model_dir)},
        "settings": {"aimet_smoke": False},
        "inputs": {},
    }
    spec.update(changes)
    path = tmp / f"{name}.json"
    path.write_text(json.dumps(spec))
    return path


def test_same_events_outputs_and_exit_code(tmp_path: Path) -> None:
    a, b = make_spec(tmp_path, "direct"), make_spec(tmp_path, "via")
    direct, via = run_both(a, b)
    assert direct.returncode == via.returncode == 0, direct.stderr + via.stderr
    ev = events(direct.stdout, tmp_path / "direct")
    assert ev == events(via.stdout, tmp_path / "via")
    assert ev[-1]["type"] == "done" and ev[-1]["ok"] is True
    assert {"type": "artifact", "v": 1, "path": "preflight.json", "kind": "json", "role": "preflight"} in ev
    dir_a, dir_b = (Path(json.loads(s.read_text())["out_dir"]) for s in (a, b))
    assert (
        sorted(p.name for p in dir_a.iterdir())
        == sorted(p.name for p in dir_b.iterdir())
        == ["preflight.json"]
    )
    out_a, out_b = (
        json.loads((d / "preflight.json").read_text().replace(str(tmp_path / n), "<workspace>"))
        for d, n in ((dir_a, "direct"), (dir_b, "via"))
    )
    assert normal(out_a) == normal(out_b)
    assert out_a["checks"] and [c["id"] for c in out_a["checks"]] == [c["id"] for c in out_b["checks"]]
    assert out_a["needs"]["hf_downloaded"] is True  # it follows the Model stage: no download left to count
    assert direct.stderr == via.stderr


@pytest.mark.parametrize("case", ["missing_spec", "no_upstream", "bad_schema"])
def test_same_failure(tmp_path: Path, case: str) -> None:
    if case == "missing_spec":
        a = b = tmp_path / "nope.json"
    elif case == "no_upstream":
        a, b = make_spec(tmp_path, "a", upstream={}), make_spec(tmp_path, "b", upstream={})
    else:
        a, b = make_spec(tmp_path, "a", schema=99), make_spec(tmp_path, "b", schema=99)
    direct, via = run_both(a, b)
    assert direct.returncode == via.returncode == 1
    ev = events(direct.stdout, tmp_path / "a")
    assert ev == events(via.stdout, tmp_path / "b")
    assert [e["type"] for e in ev][-2:] == ["error", "done"]
    code = {"missing_spec": "spec_missing", "no_upstream": "missing_upstream", "bad_schema": "spec_invalid"}[
        case
    ]
    assert ev[-2]["code"] == code


def test_same_usage_error_without_spec() -> None:
    kw: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 60}
    direct = subprocess.run([sys.executable, "-m", "hexstudio.workers.preflight"], **kw)
    via = subprocess.run([*hexstudio_cmd(), "--worker", "preflight"], **kw)
    assert direct.returncode == via.returncode == 2
    assert direct.stderr == via.stderr and "--spec" in via.stderr


def test_unknown_and_malformed_worker_names() -> None:
    kw: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 60}
    r = subprocess.run([*hexstudio_cmd(), "--worker", "nosuch", "--spec", "x"], **kw)
    assert r.returncode == 2 and "there is no worker 'nosuch'" in r.stderr
    r = subprocess.run([*hexstudio_cmd(), "--worker", "../etc", "--spec", "x"], **kw)
    assert r.returncode == 2 and "not a worker name" in r.stderr


def test_frozen_build_runs_python_snippets_like_python_c(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """The preflight probe starts `sys.executable -c CODE`; in a frozen build sys.executable is hexstudio."""
    from hexstudio.__main__ import main

    monkeypatch.setattr(sys, "frozen", True, raising=False)
    monkeypatch.setattr(sys, "argv", ["hexstudio"])
    code = "import sys, json; print(json.dumps(sys.argv)); raise SystemExit(3)"
    assert main(["-c", code, "extra"]) == 3
    assert json.loads(capsys.readouterr().out) == ["-c", "extra"]
    assert main(["-c", "print(__name__)"]) == 0
    assert capsys.readouterr().out.strip() == "__main__"


FROZEN = os.environ.get("HEXSTUDIO_FROZEN_BIN")  # dist/hexstudio/hexstudio from packaging/hexstudio.spec


@pytest.mark.skipif(not FROZEN, reason="set HEXSTUDIO_FROZEN_BIN to a PyInstaller build (docs/packaging.md)")
@pytest.mark.parametrize("case", ["ok", "missing_spec", "no_upstream"])
def test_frozen_build_runs_the_preflight_worker(tmp_path: Path, case: str) -> None:
    """A real PyInstaller build: the same protocol and exit codes. (A HEXSTUDIO_PYI_SLIM build has no ML
    stack, so its package checks differ from this environment's; the failures must match exactly.)"""
    assert FROZEN
    if case == "missing_spec":
        a = b = tmp_path / "nope.json"
    elif case == "no_upstream":
        a, b = make_spec(tmp_path, "a", upstream={}), make_spec(tmp_path, "b", upstream={})
    else:
        a, b = make_spec(tmp_path, "a"), make_spec(tmp_path, "b")
    kw: dict[str, Any] = {"capture_output": True, "text": True, "timeout": 180}
    direct = subprocess.run([sys.executable, "-m", "hexstudio.workers.preflight", "--spec", str(a)], **kw)
    frozen = subprocess.run([FROZEN, "--worker", "preflight", "--spec", str(b)], **kw)
    assert direct.returncode == frozen.returncode, frozen.stderr
    ev_a, ev_b = events(direct.stdout, tmp_path / "a"), events(frozen.stdout, tmp_path / "b")
    if case == "ok":
        assert ev_b[-1] == {"v": 1, "type": "done", "ok": True, "summary": ev_b[-1]["summary"]}
        assert [e["type"] for e in ev_a if e["type"] != "warning"] == [
            e["type"] for e in ev_b if e["type"] != "warning"
        ]
        doc = json.loads(Path(json.loads(b.read_text())["out_dir"], "preflight.json").read_text())
        assert set(doc["probe"]["recipes"]) == {
            "validated",
            "current",
        }  # the recipes (package data) are bundled
    else:
        assert ev_a == ev_b


def test_pyinstaller_spec_names_files_that_exist() -> None:
    root = Path(__file__).resolve().parents[2]
    text = (root / "packaging" / "hexstudio.spec").read_text()
    compile(text, "hexstudio.spec", "exec")  # valid Python
    for rel in [*re.findall(r'\("([a-z/]+)", "[a-z/]+"\)', text), "packaging/pyinstaller_entry.py"]:
        assert (root / rel).exists(), rel
    assert (
        'collect_submodules("hexstudio.workers")' in text
    )  # workers are started by name: all must be bundled


def test_the_windows_own_flags_open_the_window_without_gui(monkeypatch: pytest.MonkeyPatch) -> None:
    """`hexstudio --startup-check`, as the window's help writes it (`hexstudio [gui] ... [--startup-check]`),
    reached the CLI, which refused the flag."""
    import hexstudio.ui.launch as launch
    from hexstudio.__main__ import main

    seen: list[list[str]] = []
    monkeypatch.setattr(launch, "launch_gui", lambda argv: seen.append(list(argv)) or 0)
    assert main(["--startup-check"]) == 0
    assert main(["--workspace", "/tmp/ws", "--startup-check"]) == 0
    assert main(["gui", "--help"]) == 0
    assert seen == [["--startup-check"], ["--workspace", "/tmp/ws", "--startup-check"], ["--help"]]
