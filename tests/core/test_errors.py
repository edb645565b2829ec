"""One actionable-error base for every layer, and one error shape for the CLI and the worker protocol."""

from __future__ import annotations

import ast
import json
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from hexstudio.shared.errors import ERROR_KEYS, ActionableError, error_fields, fields_of

REPO = Path(__file__).resolve().parents[2]
EXCEPTION_ROOTS = {
    "Exception",
    "ValueError",
    "RuntimeError",
    "KeyError",
    "LookupError",
    "TypeError",
    "OSError",
    "IOError",
    "ArithmeticError",
    "BaseException",
}
# Signals, not failures: they stop work on request and are never shown to a person as an error.
NOT_ERRORS = {
    "Cancelled": "hexstudio/workers/runtime.py: SIGINT/SIGTERM turned into an exception inside a worker",
    "_NeedPassphrase": "hexstudio/core/device/connect.py: an encrypted key and nobody to ask, handled right there",
    "ConfigRefused": "hexstudio/workers/board/genie_session.py: copied to the board alone (standard library only); "
    "said as the helper's error event, or as genie-t2t-run's line, right there",
}


def _exception_classes() -> dict[str, tuple[str, list[str]]]:
    """Every class in hexstudio/ that is an exception: name -> (file, base names)."""
    classes: dict[str, tuple[str, list[str]]] = {}
    for root in ("hexstudio",):
        for path in sorted((REPO / root).rglob("*.py")):
            tree = ast.parse(path.read_text(encoding="utf-8"))
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef):
                    bases = [
                        b.id if isinstance(b, ast.Name) else b.attr if isinstance(b, ast.Attribute) else ""
                        for b in node.bases
                    ]
                    classes[node.name] = (str(path.relative_to(REPO)), bases)
    found: dict[str, tuple[str, list[str]]] = {}
    changed = True
    while changed:
        changed = False
        for name, (f, bases) in classes.items():
            if name not in found and any(
                b in EXCEPTION_ROOTS or b in found or b == "ActionableError" for b in bases
            ):
                found[name] = (f, bases)
                changed = True
    return found


def test_every_error_class_derives_from_the_one_base() -> None:
    found = _exception_classes()
    assert {
        "WorkerError",
        "BoardError",
        "ConnectionDropped",
        "CliError",
        "SessionError",
        "SettingsError",
        "BundleError",
        "RopeError",
        "StageError",
        "ProtocolError",
    } <= set(found)

    def reaches_base(name: str, seen: frozenset[str] = frozenset()) -> bool:
        if name == "ActionableError":
            return True
        if name not in found or name in seen:
            return False
        return any(reaches_base(b, seen | {name}) for b in found[name][1])

    outside = sorted(
        f"{f}: {n}"
        for n, (f, _b) in found.items()
        if n != "ActionableError" and n not in NOT_ERRORS and not reaches_base(n)
    )
    assert outside == [], (
        "error classes not derived from hexstudio.shared.errors.ActionableError:\n" + "\n".join(outside)
    )


def test_the_named_classes_really_are_actionable_errors() -> None:
    """The same, imported: the classes the issue names, with their texts and constructors unchanged."""
    from hexstudio.cli.common import EXIT_USAGE, CliError
    from hexstudio.core.device.errors import BoardError, ConnectionDropped
    from hexstudio.core.genie.session import SessionError
    from hexstudio.core.runs import RunBusy
    from hexstudio.core.settings import SettingsError
    from hexstudio.shared.bundle import BundleError
    from hexstudio.shared.bundle.safepath import UnsafePath
    from hexstudio.shared.protocol import ProtocolError
    from hexstudio.shared.rope import RopeError
    from hexstudio.workers.runtime import WorkerError

    w = WorkerError("spec_invalid", "Spec file x is not valid JSON.", "Reinstall.")
    assert (w.code, w.message, w.hint, str(w)) == (
        "spec_invalid",
        "Spec file x is not valid JSON.",
        "Reinstall.",
        "Spec file x is not valid JSON.",
    )
    b = ConnectionDropped("The connection dropped.", "Push again.")
    assert isinstance(b, BoardError) and b.code == "connection_dropped" and b.hint == "Push again."
    assert BoardError("x").code == "board_error" and SessionError("m", "h").fields() == {
        "code": "session_error",
        "message": "m",
        "hint": "h",
    }
    assert (
        isinstance(BundleError("bad"), ValueError) and str(BundleError("bad")) == "bad"
    )  # still a ValueError
    assert isinstance(RopeError("r"), ValueError) and isinstance(ProtocolError("p"), ValueError)
    assert SettingsError("newer").message == "newer"
    u = UnsafePath("bundle.json files[3]", "../x", "it climbs out")
    assert isinstance(u, ValueError) and u.code == "unsafe_path" and "refused path '../x'" in u.message
    assert u.hint and str(u) == u.message
    busy = RunBusy("r1", 42)
    assert busy.message == "Run r1 is being run by PID 42 on this machine." and "kill -INT 42" in (
        busy.hint or ""
    )
    assert str(busy) == f"{busy.message} {busy.hint}"
    c = CliError("Unknown setting.", "Use --set KEY=VALUE.", exit_code=EXIT_USAGE)
    assert (c.code, c.exit_code) == ("usage", EXIT_USAGE)
    assert CliError("x", None, code=EXIT_USAGE).exit_code == EXIT_USAGE  # the older spelling still works
    assert CliError("x").code == "cli_error" and CliError("x").exit_code == 1
    for exc in (w, b, u, busy, c):  # a process pool sends them back whole
        back = pickle.loads(pickle.dumps(exc))
        assert type(back) is type(exc) and back.fields() == exc.fields() and str(back) == str(exc)


def test_fields_shape() -> None:
    assert error_fields("c", "m") == {"code": "c", "message": "m"}
    assert tuple(error_fields("c", "m", "h")) == ERROR_KEYS
    assert fields_of(KeyError("k")) == {"code": "internal_error", "message": "KeyError: 'k'"}
    assert fields_of(ActionableError("m", "h", code="x")) == {"code": "x", "message": "m", "hint": "h"}


def test_cli_json_error_and_worker_error_event_have_the_same_shape(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from hexstudio.cli.main import main
    from hexstudio.shared.protocol import parse_event

    # the CLI: a command that fails with --json
    f = tmp_path / "profile.json"
    f.write_text('{"header": {"artifact_type": "GENIE_PROFILE"}, "compo')
    assert main(["genie", "profile", str(f), "--json"]) == 1
    doc = json.loads(capsys.readouterr().out)
    assert doc["ok"] is False and isinstance(doc["error"], dict)
    cli_error = doc["error"]
    # a real worker failing the same way (its spec file is missing)
    r = subprocess.run(
        [sys.executable, "-m", "hexstudio.workers.model", "--spec", str(tmp_path / "missing.json")],
        capture_output=True,
        text=True,
        cwd=REPO,
        timeout=120,
    )
    events = [parse_event(ln) for ln in r.stdout.splitlines() if ln.strip()]
    ev = next(e for e in events if e["type"] == "error")
    worker_error = {k: v for k, v in ev.items() if k not in ("v", "type", "t")}
    assert set(cli_error) == set(worker_error) == set(ERROR_KEYS), (cli_error, worker_error)
    assert worker_error["code"] == "spec_missing" and "not JSON" in cli_error["message"]


def test_the_base_is_light() -> None:
    """hexstudio/shared/errors.py is imported by the GUI process and copied to remote worker hosts: stdlib only."""
    code = (
        "import sys; import hexstudio.shared.errors; "
        "bad = [m for m in sys.modules if m.split('.')[0] in ('PySide6', 'torch', 'onnx', 'onnxruntime', "
        "'numpy', 'transformers') or m.startswith(('hexstudio.core', 'hexstudio.ui', 'hexstudio.cli', "
        "'hexstudio.serve'))]; print(bad); raise SystemExit(1 if bad else 0)"
    )
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=REPO, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr
