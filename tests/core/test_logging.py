"""The studio log (<config>/logs/studio.log): a crash in the CLI, in a thread and in an asyncio task lands there
with its traceback; --verbose; secrets never reach it. (The GUI's side: tests/gui/test_logging_gui.py.)"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CANARY = "canary-log-secret-5c1a77"


def _run(code: str, config: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "HEXSTUDIO_CONFIG_DIR": str(config), "PYTHONPATH": str(REPO)}
    return subprocess.run(
        [sys.executable, "-c", textwrap.dedent(code), *args],
        capture_output=True,
        text=True,
        cwd=REPO,
        env=env,
        timeout=120,
    )


def _log(config: Path) -> str:
    return (config / "logs" / "studio.log").read_text(encoding="utf-8")


def test_a_cli_crash_lands_in_the_log_with_its_traceback(tmp_path: Path) -> None:
    """A command that raises (a bug): exit 1, one sentence on stderr (what failed, that it is a bug, where the
    traceback is: no traceback reaches the person, issue 27), the traceback in the log, secrets scrubbed."""
    cfg = tmp_path / "cfg"
    r = _run(
        f"""
        import sys
        from hexstudio.core import secrets
        import hexstudio.cli.runs_cmd as runs_cmd
        secrets.set_secret(secrets.AIHUB_TOKEN, "{CANARY}")
        def boom(args):
            secrets.get_secret(secrets.AIHUB_TOKEN)
            raise RuntimeError("boom in the CLI with token={CANARY} and {CANARY}")
        runs_cmd.cmd_list = boom
        from hexstudio.__main__ import main
        raise SystemExit(main(["runs", "list"]))
        """,
        cfg,
    )
    assert r.returncode == 1, r.stderr
    assert "RuntimeError: boom in the CLI" in r.stderr and "studio.log" in r.stderr
    assert "Traceback" not in r.stderr and "HexStudio bug" in r.stderr and CANARY not in r.stderr
    text = _log(cfg)
    assert "hexstudio runs list: started" in text and "hexstudio runs list: crashed" in text
    assert (
        "Traceback (most recent call last)" in text
        and "in boom" in text
        and "RuntimeError: boom in the CLI" in text
    )
    assert text.count("RuntimeError: boom in the CLI") == 1  # logged once, not again by the exception hook
    assert CANARY not in text


def test_cli_error_is_logged_and_verbose_goes_to_stderr(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    r = _run(
        """
        from hexstudio.__main__ import main
        raise SystemExit(main(["runs", "show", "no-such-run", "--json", "--verbose"]))
        """,
        cfg,
    )
    assert r.returncode == 1
    doc = json.loads(r.stdout)
    assert doc["ok"] is False and set(doc["error"]) >= {"code", "message"}
    assert "hexstudio.cli" in r.stderr  # --verbose after the command: the log's lines on stderr too
    text = _log(cfg)
    assert "hexstudio runs show: failed:" in text and "no-such-run" in text


def test_a_trailing_dash_v_is_taken_as_the_crash_message_says(tmp_path: Path) -> None:
    """The crash message says "run again with -v"; `hexstudio runs show X -v` was refused as an unknown argument
    (only --verbose was taken after the command)."""
    r = _run(
        """
        from hexstudio.__main__ import main
        raise SystemExit(main(["runs", "show", "no-such-run", "-v"]))
        """,
        tmp_path / "cfg",
    )
    assert r.returncode == 1 and "unrecognized arguments" not in r.stderr, r.stderr
    assert "hexstudio.cli" in r.stderr and "No run" in r.stderr


def test_thread_and_asyncio_task_crashes_land_in_the_log(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    r = _run(
        """
        import asyncio, gc, threading
        from hexstudio.core import logs
        logs.setup_logging("cli")

        def worker():
            raise ValueError("boom in a thread")
        t = threading.Thread(target=worker, name="helper")
        t.start(); t.join()

        async def failing():
            raise KeyError("boom in a task")

        async def main():
            asyncio.ensure_future(failing())    # never awaited: its exception goes to the loop's handler
            await asyncio.sleep(0.05)
            gc.collect()

        asyncio.run(main())
        gc.collect()

        async def handled():   # the GUI's handler, installed on a loop
            logs.install_asyncio_handler(asyncio.get_running_loop())
            asyncio.ensure_future(failing())
            await asyncio.sleep(0.05)
            gc.collect()
        asyncio.run(handled())
        """,
        cfg,
    )
    assert r.returncode == 0, r.stderr
    text = _log(cfg)
    assert "uncaught exception in thread helper" in text and "ValueError: boom in a thread" in text
    assert text.count("KeyError: 'boom in a task'") == 2, text  # asyncio's default handler, then ours
    assert "Task exception was never retrieved" in text and "in failing" in text
    assert "hexstudio.asyncio" in text


def test_uncaught_exception_hook(tmp_path: Path) -> None:
    cfg = tmp_path / "cfg"
    r = _run(
        """
        from hexstudio.core import logs
        logs.setup_logging("cli")
        def inner():
            raise OSError("boom at the top")
        inner()
        """,
        cfg,
    )
    assert r.returncode == 1 and "OSError: boom at the top" in r.stderr  # still printed, as before
    text = _log(cfg)
    assert "uncaught exception" in text and "in inner" in text and "OSError: boom at the top" in text


def test_what_python_prints_of_a_crash_is_scrubbed_too(tmp_path: Path) -> None:
    """The desktop launcher writes the studio's stderr to launch.log: the uncaught-exception hooks printed the raw
    traceback there (Python's own hooks), secrets and all, while studio.log had them scrubbed. A secret under 4
    characters was not scrubbed at all."""
    cfg = tmp_path / "cfg"
    r = _run(
        f"""
        import threading
        from hexstudio.core import logs, secrets
        logs.setup_logging("cli")
        secrets.remember_secret("{CANARY}")
        secrets.remember_secret("x7q")  # a 3-character sudo password: whole words only

        def worker():
            raise ValueError("in a thread: {CANARY}")
        t = threading.Thread(target=worker, name="helper")
        t.start(); t.join()
        raise OSError("at the top: password x7q, {CANARY}")
        """,
        cfg,
    )
    assert r.returncode == 1
    for text in (r.stderr, _log(cfg)):
        assert CANARY not in text and " x7q" not in text, text
        assert "ValueError: in a thread: [redacted]" in text
        assert "OSError: at the top: password [redacted], [redacted]" in text
    assert "Exception in thread helper:" in r.stderr  # as threading's own hook says it


def test_log_rotates_and_follows_the_config_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import logging
    from logging.handlers import RotatingFileHandler

    from hexstudio.core import logs

    try:
        monkeypatch.setenv("HEXSTUDIO_CONFIG_DIR", str(tmp_path / "a"))
        assert logs.setup_logging("cli") == tmp_path / "a" / "logs" / "studio.log"
        monkeypatch.setenv("HEXSTUDIO_CONFIG_DIR", str(tmp_path / "b"))
        path = logs.setup_logging("cli")
        assert path == tmp_path / "b" / "logs" / "studio.log"
        handlers = [h for h in logging.getLogger().handlers if isinstance(h, RotatingFileHandler)]
        assert len(handlers) == 1 and handlers[0].maxBytes == logs.MAX_BYTES and handlers[0].backupCount == 3
        logging.getLogger("hexstudio.test").info("password=hunter22 and Bearer abc.def")
        text = path.read_text()
        assert "hunter22" not in text and "abc.def" not in text and "[redacted]" in text
    finally:
        logs.close_logging()


def test_a_broken_stage_action_says_what_failed_not_not_implemented(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ImportError inside a stage's module is that stage's failure, named, with the traceback in the log;
    "not implemented" is kept for a module that is not there at all."""
    import asyncio
    import dataclasses

    from hexstudio.core import logs
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace
    from hexstudio.core.stages import get_stage

    (tmp_path / "broken_stage_action.py").write_text("import no_such_package_for_hexstudio_tests\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        logs.setup_logging("cli")
        m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim")
        report = get_stage("report")
        broken = dataclasses.replace(report, action="broken_stage_action:run", worker=None)
        res = asyncio.run(Pipeline(m, stages=(broken,)).run(only="report"))
        outcome = m.stage("report").data["outcome"]
        assert not res.ok and outcome["kind"] == "failed" and outcome["code"] == "import_failed", outcome
        assert "no_such_package_for_hexstudio_tests" in outcome["message"]
        missing = dataclasses.replace(report, action="no_such_module_for_hexstudio_tests:run", worker=None)
        asyncio.run(Pipeline(m, stages=(missing,)).run(only="report"))
        assert m.stage("report").data["outcome"]["kind"] == "not_implemented"
        text = logs.log_path().read_text()
        assert "ModuleNotFoundError: No module named 'no_such_package_for_hexstudio_tests'" in text
        assert "report stage started" in text and "report stage ended: failed (code import_failed" in text
    finally:
        logs.close_logging()
