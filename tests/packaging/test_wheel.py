"""The wheel carries everything HexStudio reads at run time (issue 21 item 7).

`pip install .` (not editable) or pipx gives a working studio: the built-in model, the recipes, the shipped
suites, the report templates, the schemas, the board helpers and the desktop entry are package data found
through importlib.resources, never through a checkout. This test builds the wheel from the package sources
alone, installs it (not editable) into a fresh venv, and runs the flow there with the working directory
outside the checkout.

The heavy packages (torch, aimet-onnx, onnxruntime, transformers, Qt, ...) are lent from the test
environment through a .pth file written AFTER the wheel is installed, so pip never sees the checkout's
editable install; the `hexstudio` the new venv imports is the wheel's (asserted), and it is the wheel's one
top-level package (issue 30).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import sysconfig
import venv
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

# Package data a working install needs, relative to site-packages (each read through importlib.resources).
SHIPPED = [
    "hexstudio/shared/data/builtin_model/tiny-llama/config.json",
    "hexstudio/shared/data/builtin_model/tiny-llama/model.safetensors",
    "hexstudio/shared/data/builtin_model/tiny-llama/tokenizer.json",
    "hexstudio/shared/data/builtin_model/tiny-llama/chat_template.jinja",
    "hexstudio/shared/data/builtin_model/text/calibration.txt",
    "hexstudio/shared/data/builtin_model/text/validation.txt",
    "hexstudio/shared/data/builtin_model/PROVENANCE.md",
    "hexstudio/shared/data/recipes/validated.txt",
    "hexstudio/shared/data/recipes/current.txt",
    "hexstudio/shared/data/quantsim/htp_llm_v73.json",
    "hexstudio/workers/remote/probe.py",
    "hexstudio/core/eval/shipped_suites/tool_calling.jsonl",
    "hexstudio/core/reports/templates/report.html.j2",
    "hexstudio/core/schemas/run.schema.json",
    "hexstudio/core/schemas/report.schema.json",
    "hexstudio/workers/board/genie_session.py",
    "hexstudio/workers/board/geniex_session.py",
    "hexstudio/workers/board/helper_io.py",  # the helpers' companion modules, pushed beside them
    "hexstudio/shared/genie_paths.py",
    "hexstudio/core/desktop_files/hexstudio.desktop",
    "hexstudio/core/desktop_files/hexstudio.png",
    "hexstudio/core/desktop_files/HexStudio.cmd",
]


def _pip(*args: str, cwd: Path) -> None:
    """This interpreter's `pip ARGS` in `cwd`; a failure fails the test with the tail of pip's output. Without
    PYTHONPATH: a checkout on it would read to pip as hexstudio already installed."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    p = subprocess.run(
        [sys.executable, "-m", "pip", *args], capture_output=True, text=True, timeout=600, cwd=cwd, env=env
    )
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]


def _build_wheel(tmp: Path) -> Path:
    """The wheel, built from a copy of the package sources only (no stale build/, no checkout leftovers)."""
    src = tmp / "src"
    skip = shutil.ignore_patterns("__pycache__", "*.pyc", "train.txt")
    shutil.copytree(ROOT / "hexstudio", src / "hexstudio", ignore=skip)
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy2(ROOT / name, src / name)
    out = tmp / "wheelhouse"
    _pip("wheel", "--no-deps", "--no-build-isolation", "--no-index", "-q", "-w", str(out), str(src), cwd=tmp)
    (wheel,) = out.glob("hexstudio-*.whl")
    return wheel


def _top_level(wheel: Path) -> tuple[set[str], set[str]]:
    """(top_level.txt's names, the first path part of every file RECORD lists outside the .dist-info)."""
    with zipfile.ZipFile(wheel) as z:
        info = next(n.split("/")[0] for n in z.namelist() if n.endswith(".dist-info/RECORD"))
        top = set(z.read(f"{info}/top_level.txt").decode().split())
        record = z.read(f"{info}/RECORD").decode().splitlines()
    roots = {row.split(",")[0].split("/")[0] for row in record if row}
    return top, roots - {info}


def _env(tmp: Path, venv_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME", "VIRTUAL_ENV")}
    env.update(
        HEXSTUDIO_WORKSPACE=str(tmp / "ws"),
        HEXSTUDIO_CONFIG_DIR=str(tmp / "config"),
        PATH=f"{venv_dir / 'bin'}{os.pathsep}{env.get('PATH', '')}",
        PYTHONNOUSERSITE="1",
    )
    return env


@pytest.mark.slow
def test_wheel_installed_not_editable_runs_the_flow(tmp_path: Path) -> None:
    wheel = _build_wheel(tmp_path)
    # issue 30: one import package into site-packages, `hexstudio` (no generic `app` or `workers`)
    top, roots = _top_level(wheel)
    assert top == {"hexstudio"}, top
    assert roots == {"hexstudio"}, roots
    venv_dir = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False).create(venv_dir)
    py = venv_dir / "bin" / "python"
    _pip("--python", str(py), "install", "--no-deps", "--no-index", "-q", str(wheel), cwd=tmp_path)
    site = Path(
        subprocess.check_output(
            [str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
            text=True,
            cwd=tmp_path,
        ).strip()
    )
    missing = [rel for rel in SHIPPED if not (site / rel).is_file()]
    assert not missing, f"not in the wheel: {missing}"
    assert not list(site.glob("**/train.txt")) and not (site / "resources").exists()
    # now lend the heavy packages (after the install: pip never saw the checkout's editable hexstudio)
    lent = {sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]}
    (site / "_hexstudio_test_lent.pth").write_text("".join(f"{d}\n" for d in sorted(lent)))

    env = _env(tmp_path, venv_dir)
    cwd = tmp_path / "elsewhere"
    cwd.mkdir()
    where = subprocess.run(
        [
            str(py),
            "-c",
            "import hexstudio, hexstudio.workers, hexstudio.shared.data as d, hexstudio.core.paths as p; "
            "print(hexstudio.__file__); print(hexstudio.workers.__file__); print(d.builtin_model_dir()); "
            "print(p.WORKERS_ROOT)",
        ],
        capture_output=True,
        text=True,
        timeout=120,
        env=env,
        cwd=cwd,
    )
    assert where.returncode == 0, where.stderr[-3000:]
    for line in where.stdout.split():
        assert Path(line).resolve().is_relative_to(site.resolve()), (line, "is not the wheel's copy")
        assert not Path(line).resolve().is_relative_to(ROOT), line

    exe = str(venv_dir / "bin" / "hexstudio")
    run = subprocess.run(
        [
            exe,
            "run",
            "--model",
            "builtin:tiny-llama",
            "--board",
            "sim",
            "--until",
            "validate",
            "--json",
            "--set",
            "calibration_samples=4",
        ],
        capture_output=True,
        text=True,
        timeout=900,
        env=env,
        cwd=cwd,
    )
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    out = json.loads(run.stdout)
    assert out["ok"], out
    doc = json.loads((Path(out["run_dir"]) / "run.json").read_text())
    assert all(doc["stages"][s]["state"] == "done" for s in ("model", "preflight", "quantize", "validate")), {
        s: v["state"] for s, v in doc["stages"].items()
    }
    assert doc["stages"]["validate"]["metrics"]["verdict"]["value"] == "pass"
    assert Path(out["run_dir"]).resolve().is_relative_to(tmp_path.resolve())

    # the other shipped data, each through the installed CLI: recipes (preflight), suites, report templates
    pre = subprocess.run(
        [exe, "preflight", "--model", "builtin:tiny-llama", "--json"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )
    checks = {c["id"]: c for c in json.loads(pre.stdout)["checks"]}
    assert checks["recipe_current"]["status"] in ("ok", "warn"), checks["recipe_current"]
    suites = subprocess.run(
        [exe, "eval", "list", "--json"], capture_output=True, text=True, timeout=120, env=env, cwd=cwd
    )
    assert {"tool_calling", "greedy_parity"} <= {s["name"] for s in json.loads(suites.stdout)["suites"]}, (
        suites
    )
    html = cwd / "report.html"
    rep = subprocess.run(
        [exe, "report", out["run_id"], "--format", "html", "--out", str(html)],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=cwd,
    )
    assert rep.returncode == 0 and "<html" in html.read_text(encoding="utf-8").lower(), rep.stderr[-2000:]
