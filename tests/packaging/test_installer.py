"""packaging/install-workstation.sh: the plan it prints for recorded machines (--dry-run), its state
checks against fake environments, and the dependency list kept in step with pyproject.toml."""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

from tests.packaging.conftest import INSTALLER, ROOT, RTX_5090, pip_lines, run_installer


def installs(out: str) -> list[list[str]]:
    """argv of every `pip install` the installer printed, in order."""
    return [
        shlex.split(c) for c in pip_lines(out) if " install " in f" {c} " and " uninstall " not in f" {c} "
    ]


def test_dry_run_for_an_sm120_workstation(tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    r = run_installer("--dry-run", "--venv", str(venv), gpu=RTX_5090)
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "compute capability 12.0 (sm_120)" in out
    ins = installs(out)
    # torch first, a CUDA 12.8 build with sm_120 kernels, from the PyTorch index
    torch = ins[0]
    assert "torch==2.7.1+cu128" in torch and "torchvision==0.22.1+cu128" in torch
    assert torch[torch.index("--index-url") + 1] == "https://download.pytorch.org/whl/cu128"
    # HexStudio, then aimet-onnx (no deps: it would drag in another torch), then onnxruntime-gpu LAST
    assert any(a.startswith("-e") or a == "-e" for a in ins[1])
    assert ins[-2][-2:] == ["--no-deps", "aimet-onnx==2.26.0"]
    assert ins[-1][-1] == "onnxruntime-gpu==1.23.2"
    # never the CPU onnxruntime, and nothing installed after onnxruntime-gpu
    assert not any(re.fullmatch(r"onnxruntime(==.*|>=.*)?", a) for argv in ins for a in argv)
    assert "torch==2.13.0" not in out
    # the libpython hook and the launcher, and the smoke test at the end
    assert f"+ write {venv}/bin/hexstudio-env.sh" in out and "LD_LIBRARY_PATH" in out
    assert "hexstudio libpython hook" in out
    assert "SMOKE_TEST" in out and "sm_120" in out.split("[7/7]")[1]
    assert not venv.exists(), "--dry-run must not change anything"


def test_dry_run_for_a_cpu_only_machine(tmp_path: Path) -> None:
    r = run_installer("--dry-run", "--venv", str(tmp_path / "v"), gpu="none")
    assert r.returncode == 0, r.stderr
    ins = installs(r.stdout)
    # PyTorch's CPU index: PyPI's Linux torch is the CUDA build (about 3 GB of nvidia packages)
    assert ins[0][-1] == "torch==2.13.0"
    assert ins[0][ins[0].index("--index-url") + 1] == "https://download.pytorch.org/whl/cpu"
    assert ins[1][-1].endswith("[ml]") and str(ROOT / "packaging" / "constraints" / "dev.txt") in ins[1]
    assert ins[-2][-1] == "aimet-onnx==2.42.0" and ins[-1][-1] == "onnxruntime==1.32.0"
    assert "onnxruntime-gpu==" not in r.stdout
    assert "the CPU stack" in r.stdout


def test_older_gpus_get_a_build_with_their_kernels(tmp_path: Path) -> None:
    ampere = run_installer(
        "--dry-run", "--venv", str(tmp_path / "a"), gpu="NVIDIA RTX A6000, 8.6, 49140 MiB, 550.1"
    )
    assert "torch==2.7.1+cu128" in installs(ampere.stdout)[0]
    pascal = run_installer(
        "--dry-run", "--venv", str(tmp_path / "p"), gpu="Tesla P100, 6.0, 16280 MiB, 550.1"
    )
    assert "torch==2.7.1+cu126" in installs(pascal.stdout)[0]
    assert "whl/cu126" in pascal.stdout
    kepler = run_installer("--dry-run", "--venv", str(tmp_path / "k"), gpu="Tesla K80, 3.7, 11441 MiB, 470.1")
    assert kepler.returncode != 0 and "older than any current torch build" in kepler.stderr


def test_unreadable_nvidia_smi_output_is_an_error_with_a_fix(tmp_path: Path) -> None:
    r = run_installer(
        "--dry-run", "--venv", str(tmp_path / "v"), gpu="NVIDIA GeForce RTX 5090, [N/A], 32607 MiB"
    )
    assert r.returncode != 0 and "compute capability" in r.stderr and "--cpu" in r.stderr


def test_cpu_onnxruntime_gpu_leftover_is_removed_before_installing_the_one_we_keep(fake_venv) -> None:
    venv, add = fake_venv
    add("torch", "2.13.0+cpu")
    add("aimet-onnx", "2.42.0")
    add("onnxruntime-gpu", "1.23.2")
    add("onnxruntime", "1.32.0")
    r = run_installer("--dry-run", "--venv", str(venv), gpu="none")
    assert r.returncode == 0, r.stderr
    lines = pip_lines(r.stdout)
    rm = next(i for i, c in enumerate(lines) if "uninstall -y onnxruntime-gpu onnxruntime" in c)
    assert lines[rm + 1].endswith("onnxruntime==1.32.0") and rm + 1 == len(lines) - 1
    assert (
        "torch 2.13.0+cpu already installed" in r.stdout and "aimet-onnx 2.42.0 already installed" in r.stdout
    )


def test_second_run_has_nothing_to_install(fake_venv) -> None:
    venv, add = fake_venv
    for d, v in (
        ("torch", "2.13.0+cpu"),
        ("aimet-onnx", "2.42.0"),
        ("onnxruntime", "1.32.0"),
        ("onnxruntime-qnn", "2.7.0"),
        ("mmh3", "5.3.1"),
    ):
        add(d, v)
    (venv / "bin" / "hexstudio").write_text("#!/bin/sh\n")
    (venv / "bin" / "hexstudio").chmod(0o755)
    digest = hashlib.sha256(
        b"".join(
            p.read_bytes()
            for p in (
                ROOT / "pyproject.toml",
                ROOT / "hexstudio" / "shared" / "data" / "recipes" / "current.txt",
                ROOT / "packaging" / "constraints" / "dev.txt",
            )
        )
    ).hexdigest()[:16]
    (venv / ".hexstudio-install.stamp").write_text(f"cpu 0 {digest}\n")
    r = run_installer("--dry-run", "--venv", str(venv), "--no-desktop", gpu="none")
    assert r.returncode == 0, r.stderr
    assert pip_lines(r.stdout) == [], pip_lines(r.stdout)
    assert "already installed for this pyproject.toml and recipe" in r.stdout
    assert "onnxruntime 1.32.0 already installed (and onnxruntime-gpu is not)" in r.stdout


def test_existing_env_with_the_wrong_python_for_the_gpu_recipe_is_refused(fake_venv) -> None:
    venv, _ = fake_venv  # this machine's Python (3.11), the validated recipe wants 3.10
    r = run_installer("--dry-run", "--venv", str(venv), gpu=RTX_5090)
    assert r.returncode != 0
    assert "needs Python 3.10" in r.stderr and "--venv" in r.stderr


def test_ml_dependency_list_matches_pyproject() -> None:
    # (no tomllib: it is 3.11+ and HexStudio supports 3.10)
    block = re.search(r"^ml = \[(.*?)^\]", (ROOT / "pyproject.toml").read_text(), re.S | re.M)
    assert block
    extra = re.findall(r'"([^"]+)"', re.sub(r"#.*", "", block.group(1)))

    def name(req: str) -> str:
        return re.split(r"[<>=!~ ;\[]", req, maxsplit=1)[0].lower().replace("_", "-")

    # torch and onnxruntime are the GPU steps' own; Qualcomm's x86 runtime (onnxruntime-qnn, with mmh3) goes where
    # Python 3.11+ and onnxruntime >= 1.24.2 can hold it: this venv on a CPU recipe, else a side environment.
    # mmh3 is in this venv as well: the compile worker runs here and names the HTP graphs with it (a GPU-recipe
    # venv without it failed every local compile with ModuleNotFoundError, "a HexStudio bug").
    qnn = {"onnxruntime-qnn", "mmh3"}
    want = {name(r) for r in extra} - {"torch", "onnxruntime", "onnxruntime-qnn"}
    assert "mmh3" in want
    m = re.search(r"ML_DEPS=\((.*?)\)", INSTALLER.read_text(), re.S)
    assert m
    have = {name(r) for r in shlex.split(m.group(1))}
    assert have == want
    mq = re.search(r"QNN_DEPS=\((.*?)\)", INSTALLER.read_text(), re.S)
    assert mq and {name(r) for r in shlex.split(mq.group(1))} == qnn


def test_help_and_unknown_options() -> None:
    r = run_installer("--help", gpu="none")
    assert r.returncode == 0 and "--dry-run" in r.stdout
    r = run_installer("--frobnicate", gpu="none")
    assert r.returncode == 2 and "unknown option" in r.stderr


@pytest.mark.slow
def test_real_cpu_run_installs_verifies_and_second_run_does_nothing(tmp_path: Path) -> None:
    """The installer for real on this CPU-only machine, into a new environment. A from-scratch install
    downloads ~2.5 GB and takes ~3 minutes (measured: docs/packaging.md), so the heavy packages are
    lent from the test environment through a .pth file: pip sees them as installed and the installer
    must still create the environment, install HexStudio into it, write the hook, the launcher and the
    menu entry, and pass the real AIMET smoke test. The second run must change nothing."""
    venv, home = tmp_path / "venv", tmp_path / "home"
    home.mkdir()
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=180)
    site = next((venv / "lib").glob("python3*/site-packages"))
    (site / "_hexstudio_test_overlay.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    env = {"HOME": str(home), "PIP_CACHE_DIR": str(Path.home() / ".cache" / "pip"), "XDG_DATA_HOME": ""}
    first = run_installer("--venv", str(venv), gpu="none", env=env, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    out = first.stdout
    assert "torch 2.13.0" in out and "already installed" in out  # lent, so not reinstalled
    assert "AIMET smoke test passed" in out
    assert (venv / "bin" / "hexstudio").is_file()
    hook = (venv / "bin" / "hexstudio-env.sh").read_text()
    libdir = sysconfig.get_config_var("LIBDIR")
    assert f'export LD_LIBRARY_PATH="{libdir}' in hook
    assert "hexstudio libpython hook" in (venv / "bin" / "activate").read_text()
    entry = home / ".local" / "share" / "applications" / "hexstudio.desktop"
    assert f"Exec={venv}/bin/hexstudio-launch" in entry.read_text()
    assert (home / ".local" / "bin" / "hexstudio-launch").resolve() == (
        venv / "bin" / "hexstudio-launch"
    ).resolve()
    assert "mode=cpu" in (venv / ".hexstudio-workstation").read_text()
    # the launcher sets the hook and starts HexStudio's CLI
    r = subprocess.run(
        [str(venv / "bin" / "hexstudio-launch"), "--version"],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "HOME": str(home)},
    )
    assert r.returncode == 0 and r.stdout.startswith("hexstudio ")
    second = run_installer("--venv", str(venv), gpu="none", env=env, timeout=900)
    assert second.returncode == 0, second.stderr
    assert pip_lines(second.stdout) == []
    assert "nothing to do" in second.stdout and "AIMET smoke test passed" in second.stdout


@pytest.mark.slow
@pytest.mark.skipif(
    not (os.environ.get("HEXSTUDIO_TEST_FULL_INSTALL") or os.environ.get("CI")),
    reason="installs the whole CPU stack from the package index (~6 min): runs on CI, or set "
    "HEXSTUDIO_TEST_FULL_INSTALL=1",
)
def test_real_cpu_install_from_scratch(tmp_path: Path) -> None:
    """The installer into an empty folder, everything from the package index (opt-in)."""
    venv, home = tmp_path / "venv", tmp_path / "home"
    home.mkdir()
    env = {"HOME": str(home), "PIP_CACHE_DIR": str(Path.home() / ".cache" / "pip"), "XDG_DATA_HOME": ""}
    r = run_installer("--venv", str(venv), gpu="none", env=env, timeout=1800)
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    assert "AIMET smoke test passed" in r.stdout
    versions = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            (
                "import importlib.metadata as m; print(m.version('torch'), m.version('onnxruntime'), "
                "m.version('aimet-onnx'))"
            ),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    ).stdout.split()
    assert versions[0].startswith("2.13.0") and versions[1:] == ["1.32.0", "2.42.0"]


def test_gpu_mode_removes_a_cpu_onnxruntime_then_installs_onnxruntime_gpu_last(fake_venv) -> None:
    """The main trap: a CPU onnxruntime already in the environment would shadow onnxruntime-gpu."""
    venv, add = fake_venv
    site = next((venv / "lib").glob("python3*/site-packages"))
    # this machine has no Python 3.10: the fake environment reports 3.10, as the validated GPU recipe needs
    (site / "sitecustomize.py").write_text(
        "import sys\n"
        "class _V(tuple):\n"
        "    major = property(lambda s: s[0])\n"
        "    minor = property(lambda s: s[1])\n"
        "sys.version_info = _V((3, 10, 16, 'final', 0))\n"
    )
    add("torch", "2.7.1+cu128")
    add("aimet-onnx", "2.26.0")
    add("onnxruntime", "1.23.2")
    r = run_installer("--dry-run", "--venv", str(venv), "--no-desktop", gpu=RTX_5090)
    assert r.returncode == 0, r.stderr
    assert "would shadow onnxruntime-gpu" in r.stdout
    lines = pip_lines(r.stdout)
    rm = next(i for i, c in enumerate(lines) if " uninstall -y " in c)
    assert {"onnxruntime", "onnxruntime-gpu"} <= set(lines[rm].split()[lines[rm].split().index("-y") + 1 :])
    assert (
        lines[-1].endswith("onnxruntime-gpu==1.23.2") and rm == len(lines) - 2
    )  # removed, then the GPU one last
    assert not any(
        c.endswith("onnxruntime==1.23.2") or " onnxruntime==" in c for c in lines
    )  # never the CPU one
    assert "mode=cuda" in r.stdout and "torch 2.7.1+cu128 already installed" in r.stdout
