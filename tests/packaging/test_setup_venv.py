"""packaging/setup-venv.sh (what `./dev setup` and `./dev studio` run) after a venv creation that failed
half-way: on Debian/Ubuntu without python3.X-venv, `python -m venv` leaves bin/python without pip."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _fake(path: Path, body: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"#!/bin/sh\n{body}\n")
    path.chmod(0o755)


def _fake_venv(venv: Path, body: str) -> None:
    """A virtual environment's bin/python (and its pyvenv.cfg, which `python -m venv` writes first)."""
    _fake(venv / "bin" / "python", body)
    (venv / "pyvenv.cfg").write_text("home = /usr/bin\n")


def _setup_venv(venv: Path, python: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ROOT / "packaging" / "setup-venv.sh"), str(venv)],
        env={**os.environ, "PYTHON": str(python)},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_a_venv_left_without_pip_is_made_again_and_a_failed_creation_says_what_to_install(
    tmp_path: Path,
) -> None:
    """The venv was skipped because bin/python existed, and every later run failed with "No module named pip",
    with nothing saying to delete it."""
    venv = tmp_path / ".venv"
    _fake_venv(venv, 'echo "No module named pip" >&2; exit 1')
    # a Python whose venv module fails as it does without python3.X-venv
    py = tmp_path / "python3"
    _fake(
        py,
        'echo "The virtual environment was not created successfully because ensurepip is not available." >&2; exit 1',
    )
    r = _setup_venv(venv, py)
    assert r.returncode == 1
    assert "has no pip" in r.stdout and "apt-get install python3-venv" in r.stderr, (r.stdout, r.stderr)
    assert not venv.exists()  # the next run starts clean


def test_a_venv_that_does_not_run_from_here_is_made_again(tmp_path: Path) -> None:
    """A checkout moved elsewhere (or a Python removed) left .venv's scripts naming a place that is gone: every
    `./dev` command exited 127, and nothing made the venv again."""
    venv = tmp_path / ".venv"
    _fake_venv(venv, "exit 0")  # runs, and has pip
    (venv / "bin" / "pip").write_text("#!/old/checkout/.venv/bin/python\n")
    py = tmp_path / "python3"
    _fake(py, 'echo "ensurepip is not available" >&2; exit 1')
    r = _setup_venv(venv, py)
    assert "does not run from here" in r.stdout, (r.stdout, r.stderr)
    assert r.returncode == 1 and not venv.exists()  # made again (here the fake Python cannot), never trusted


def _validated_setup(tmp_path: Path, pip_error: str) -> subprocess.CompletedProcess[str]:
    """setup-validated-venv.sh with a Python 3.10 whose venv's pip fails with `pip_error`."""
    venv_py = tmp_path / "venv-python"
    _fake(venv_py, f'echo "{pip_error}" >&2; exit 1')
    py310 = tmp_path / "python3.10"
    _fake(
        py310,
        'if [ "$1" = -c ]; then case "$2" in *print*) echo "$0";; esac; exit 0; fi\n'
        f'if [ "$1" = -m ] && [ "$2" = venv ]; then mkdir -p "$3/bin"; touch "$3/pyvenv.cfg"; cp {venv_py} "$3/bin/python"; exit 0; fi\n'
        "exit 1",
    )
    return subprocess.run(
        ["bash", str(ROOT / "packaging" / "setup-validated-venv.sh"), str(tmp_path / "v")],
        env={**os.environ, "PYTHON310": str(py310), "TORCH_CPU_INDEX": "http://127.0.0.1:9/"},
        capture_output=True,
        text=True,
        timeout=60,
    )


def test_the_validated_tier_skips_only_when_the_wheels_cannot_be_had(tmp_path: Path) -> None:
    """Every pip failure in setting up the validated tier was "cannot be installed here" (exit 3, the tier
    skipped, CI green): a broken pin or a dependency conflict hid the tier for good."""
    offline = _validated_setup(tmp_path / "a", "ERROR: No matching distribution found for torch==2.13.0")
    assert offline.returncode == 3 and "pip could not get the wheels" in offline.stderr, offline.stderr
    broken = _validated_setup(tmp_path / "b", "ERROR: ResolutionImpossible: conflicting dependencies")
    assert broken.returncode == 1, (broken.returncode, broken.stderr)
    assert "failed at torch 2.13.0" in broken.stderr and "ResolutionImpossible" in broken.stderr
    assert not (tmp_path / "b" / "v").exists()


def test_a_venv_in_a_folder_with_a_space_or_behind_a_symlink_is_kept(tmp_path: Path) -> None:
    """The check for a moved venv compared the scripts' #! line with the folder's path as given: pip writes a
    `#!/bin/sh` + `exec "..."` form for a path with a space, and a checkout reached through a symlink names its
    real path there; both working venvs were deleted and installed again on every run."""
    spaced = tmp_path / "my projects" / ".venv"
    _fake_venv(spaced, "exit 0")
    (spaced / "bin" / "pip").write_text(f"#!/bin/sh\n'''exec' \"{spaced}/bin/python\" \"$0\" \"$@\"\n' '''\n")
    real = tmp_path / "data" / "src" / ".venv"
    _fake_venv(real, "exit 0")
    (real / "bin" / "pip").write_text(f"#!{real}/bin/python\n")
    (tmp_path / "src").symlink_to(real.parent)
    # a path too long for a #! line: the same form, the path without quotes
    long = tmp_path / ("x" * 120) / ".venv"
    _fake_venv(long, "exit 0")
    sh_form = "#!/bin/sh\n" + "'''exec' " + f"{long}/bin/python" + ' "$0" "$@"\n' + "' '''\n"
    (long / "bin" / "pip").write_text(sh_form)
    for venv in (spaced, tmp_path / "src" / ".venv", long):
        r = _setup_venv(venv, tmp_path / "no-python")
        assert "does not run from here" not in r.stdout and (venv / "bin" / "python").exists(), (
            venv,
            r.stdout,
        )


def test_a_folder_that_is_no_venv_is_never_removed(tmp_path: Path) -> None:
    """`setup-venv.sh ~/projects` (a folder given by mistake) took it for a broken venv and removed it with
    everything in it; the validated tier's script removed any folder whose stamp did not match."""
    folder = tmp_path / "projects"
    (folder / "mine").mkdir(parents=True)
    (folder / "notes.txt").write_text("keep me")
    for script in ("setup-venv.sh", "setup-validated-venv.sh"):
        r = subprocess.run(
            ["bash", str(ROOT / "packaging" / script), str(folder)],
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert r.returncode == 2 and "not a Python virtual environment" in r.stderr, (script, r.stderr)
        assert (folder / "notes.txt").read_text() == "keep me" and (folder / "mine").is_dir()
