"""The chat helpers HexStudio pushes to a board (hexstudio.workers.board) run there from <home>/hexstudio/bin/
with the board's python3 and nothing of HexStudio's installed: each program needs only the companion modules
pushed beside it (helper_files), and those import nothing but the standard library."""

from __future__ import annotations

import ast
import io
import json
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from hexstudio.workers.board import HELPERS, helper_files, helper_io
from tests.support.board_helpers import board_python, push_helper

GOOD_CONFIG = {
    "dialog": {
        "version": 1,
        "type": "basic",
        "context": {"version": 1, "size": 256},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
    }
}


def _imports(tree: ast.AST) -> list[tuple[ast.stmt, str]]:
    """(statement, module) of every import in `tree`."""
    out: list[tuple[ast.stmt, str]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out += [(node, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            out.append((node, "." * node.level + (node.module or "")))
    return out


def _stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module == "__future__"


@pytest.mark.parametrize("name", list(HELPERS))
def test_a_helper_needs_nothing_of_hexstudio_but_its_companions(name: str) -> None:
    program, *companions = helper_files(name)
    for f in companions:
        bad = [m for _, m in _imports(ast.parse(f.read_text(encoding="utf-8"))) if not _stdlib(m)]
        assert not bad, f"{f.name} imports {bad}: it must run on a board with the standard library only"
    # the program imports HexStudio only as its companions, with their bare names as the fallback on the board
    tree = ast.parse(program.read_text(encoding="utf-8"))
    bare = {f.name.removesuffix(".py") for f in companions}
    guarded: dict[str, set[str]] = {"package": set(), "bare": set()}
    for node in tree.body:
        if isinstance(node, ast.Try):
            assert [h.type.id for h in node.handlers if isinstance(h.type, ast.Name)] == ["ImportError"]
            guarded["package"] |= {m.rpartition(".")[2] for _, m in _imports(ast.Module(node.body, []))}
            guarded["bare"] |= {m for h in node.handlers for _, m in _imports(h)}
    assert guarded == {"package": bare, "bare": bare}, guarded
    unguarded = [
        m
        for node in tree.body
        if not isinstance(node, ast.Try)
        for _, m in _imports(node)
        if m.split(".")[0] in ("hexstudio", *bare)
    ]
    assert unguarded == [], unguarded


def test_a_pushed_genie_helper_runs_from_its_folder_alone(tmp_path: Path) -> None:
    helper = push_helper("genie_session", tmp_path / "bin")
    assert sorted(p.name for p in helper.parent.iterdir()) == [
        "genie_paths.py",
        "genie_session.py",
        "helper_io.py",
    ]
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    (bundle / "tokenizer.json").write_text("{}")
    (bundle / "genie_config.json").write_text(json.dumps(GOOD_CONFIG))
    run = [*board_python(helper, "--config", "genie_config.json"), "--lib", "/nonexistent/libGenie.so"]
    # a good config: its paths pass the board's checks (genie_paths), then libGenie is missing here
    r = subprocess.run(run, cwd=bundle, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["code"] == "lib_not_found", r.stdout
    # a folder where a file is named: refused by the rules it shares with the studio, in the studio's words
    (bundle / "tokenizer.json").unlink()
    (bundle / "tokenizer.json").mkdir()
    r = subprocess.run(run, cwd=bundle, capture_output=True, text=True, timeout=60, stdin=subprocess.DEVNULL)
    ev = json.loads(r.stdout)
    assert r.returncode == 2 and ev["code"] == "unsafe_path", r.stdout
    assert "it is a folder, not a regular file" in ev["message"] and "tokenizer.path" in ev["message"]


def test_a_pushed_geniex_helper_runs_from_its_folder_alone(tmp_path: Path) -> None:
    helper = push_helper("geniex_session", tmp_path / "bin")
    assert sorted(p.name for p in helper.parent.iterdir()) == ["geniex_session.py", "helper_io.py"]
    r = subprocess.run(
        board_python(helper, "--bundle", str(tmp_path)),
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert r.returncode == 2 and "Traceback" not in r.stderr, r.stderr
    assert json.loads(r.stdout)["code"] == "geniex_missing", r.stdout  # no geniex without site-packages


# what the helper needs of a geniex package around a stand-in _Model (each test's: its generate())
GENIEX_AROUND_A_MODEL = """
_Model.close = lambda self: None

class AutoModelForCausalLM:
    @staticmethod
    def from_pretrained(path, device_map=None):
        return _Model()

def get_plugin_version(name):
    return "test"
"""

FAILING_GENIEX = """
class _Model:
    def generate(self, prompt, **kw):
        raise ValueError("top_p must be in (0, 1]")
"""


def _one_geniex_query(tmp_path: Path, geniex_source: str, bundle: Path) -> list[dict[str, Any]]:
    """The pushed GenieX helper, run in `bundle` with `geniex_source` as its geniex package (a stand-in beside it,
    on sys.path[0]), asked one query: its events."""
    helper = push_helper("geniex_session", tmp_path / "bin")
    (helper.parent / "geniex.py").write_text(geniex_source + GENIEX_AROUND_A_MODEL)
    query = json.dumps({"op": "query", "id": "q1", "prompt": "Hi", "max_tokens": 4})
    r = subprocess.run(
        board_python(helper, "--bundle", "."),
        input=query + "\n" + json.dumps({"op": "quit"}) + "\n",
        capture_output=True,
        text=True,
        timeout=60,
        cwd=bundle,
    )
    assert r.returncode == 0 and "Traceback" not in r.stderr, r.stderr
    return [json.loads(line) for line in r.stdout.splitlines()]


def test_a_geniex_generate_that_raises_ends_its_query_with_the_reason(tmp_path: Path) -> None:
    """GenieX's generate() raised: the helper's error event carries no query id, so the studio read only the end,
    and the user saw "geniex generate failed (status 1)". The end carries the reason now."""
    events = _one_geniex_query(tmp_path, FAILING_GENIEX, tmp_path)
    end = next(e for e in events if e.get("event") == "end")
    assert end["id"] == "q1" and end["state"] == "failed", events
    assert end["message"] == "ValueError: top_p must be in (0, 1]", end


RECORDING_GENIEX = """
import json

class _Out:
    profile = None

class _Stream:
    output = _Out()
    def __iter__(self):
        return iter(["ok"])

class _Model:
    def generate(self, prompt, **kw):
        with open("generate-kwargs.json", "w") as f:
            json.dump(kw, f)
        return _Stream()
"""


def test_geniex_without_a_sampler_uses_the_bundles_own(tmp_path: Path) -> None:
    """The studio sends no sampler when "the bundle's" is chosen. Genie then reads genie_config.json's; GenieX
    takes one per generate(), and the helper passed temperature 0, top-k 0, top-p 0, seed 0 under that label."""
    bundle = tmp_path / "bundle"
    bundle.mkdir()
    sampler = {"version": 1, "seed": 42, "temp": 0.7, "top-k": 40, "top-p": 0.9}
    (bundle / "genie_config.json").write_text(
        json.dumps({"dialog": {"sampler": sampler, "context": {"size": 512}}})
    )
    _one_geniex_query(tmp_path, RECORDING_GENIEX, bundle)
    kw = json.loads((bundle / "generate-kwargs.json").read_text())
    assert (kw["temperature"], kw["top_k"], kw["top_p"], kw["seed"]) == (0.7, 40, 0.9, 42), kw


def test_the_command_reader(monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    """ "abort" reaches its callback at once, other commands are queued in order, None at the end of input; a
    line that is not a JSON object is answered with bad_request and reading goes on."""
    lines = ['{"op": "query", "id": 1}', "", "not json", "[1, 2]", '{"op": "abort"}', '{"op": "quit"}']
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    aborted = threading.Event()
    ops = helper_io.read_commands(aborted.set)
    got = [ops.get(timeout=10) for _ in range(3)]
    assert got == [{"op": "query", "id": 1}, {"op": "quit"}, None] and aborted.is_set()
    events = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    assert events == [
        {"event": "error", "code": "bad_request", "message": "not a JSON line"},
        {"event": "error", "code": "bad_request", "message": "not a JSON object"},
    ]


def test_the_simulators_command_loop_answers_over_the_same_channel(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """hexstudio.workers.genie_sim.commands.serve_commands (the simulator's helpers) reads and answers through
    helper_io as the board's helpers do."""
    from hexstudio.workers.genie_sim.commands import serve_commands

    lines = ['{"op": "reset"}', '{"op": "sampler", "sampler": {"temp": 0}}', '{"op": "query", "id": 7}', "{}"]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    resets: list[bool] = []

    def query(msg: dict[str, Any], on_text: Any, aborted: Any) -> dict[str, Any]:
        on_text("hi")
        return {"state": "aborted" if aborted() else "complete"}

    assert serve_commands(lambda: resets.append(True), lambda v: {**v, "seed": 1}, query) == 0
    events = [json.loads(ln) for ln in capsys.readouterr().out.splitlines()]
    for ev in events:
        ev.pop("mono", None)
    assert resets == [True] and events == [
        {"event": "reset"},
        {"event": "sampler", "applied": True, "sampler": {"temp": 0, "seed": 1}},
        {"event": "text", "id": 7, "text": "hi", "tokens": 1},
        {"event": "end", "id": 7, "state": "complete"},
        {"event": "error", "code": "bad_request", "message": "unknown op None"},
    ]
