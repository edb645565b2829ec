"""The studio's one logging setup, for the GUI and the CLI alike.

Everything goes to <config>/logs/studio.log (rotated at 2 MB, 3 kept), through stdlib `logging`:
- HexStudio's own loggers ("hexstudio.*": jobs, boards, pushes, AI Hub, the GUI, the CLI) at INFO, DEBUG
  with `--verbose`; other libraries' warnings and errors (asyncio's "Task exception was never retrieved",
  qasync, paramiko) too;
- uncaught exceptions in any thread (sys.excepthook, threading.excepthook), with their traceback;
- the asyncio loop's exception handler (`asyncio_exception_handler`), with the traceback;
- Qt's own messages (hexstudio/ui/qt_log.py installs qInstallMessageHandler).
Each run's stage logs stay in <run>/logs/; this file is about the studio process itself.

No secret reaches the file: every line (traceback included) passes through `RedactFilter`, which replaces
the values of the secrets this process has read from or written to the keyring (hexstudio.core.secrets) and
anything that looks like a token or password assignment (hexstudio.core.reports.redact).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import sys
import threading
import traceback
from collections.abc import Callable
from logging.handlers import RotatingFileHandler
from pathlib import Path
from types import TracebackType
from typing import Any

from hexstudio.core import secrets
from hexstudio.core.paths import config_dir
from hexstudio.core.reports.redact import scrub_secret_text

LOG_NAME = "studio.log"
MAX_BYTES = 2_000_000
BACKUPS = 3
FORMAT = "%(asctime)s %(process)d %(levelname)s %(name)s: %(message)s"
ROOT = "hexstudio"  # HexStudio's loggers are hexstudio.<area>: logging.getLogger("hexstudio.board")
_LOGGED = "_hexstudio_logged"  # set on an exception once its traceback is in the log

log = logging.getLogger(ROOT)


def log_dir() -> Path:
    """<config>/logs: the studio's own log (studio.log) and the launcher's output (launch.log); each run's
    stage logs are in <run>/logs/."""
    return config_dir() / "logs"


def log_path() -> Path:
    return log_dir() / LOG_NAME


def scrub_text(text: str) -> str:
    """`text` without the secrets this process knows and without token/password assignments."""
    return scrub_secret_text(text, secrets.seen_secret_values())


class RedactFilter(logging.Filter):
    """Scrubs a record's message and traceback before a handler writes it (see scrub_text)."""

    def filter(self, record: logging.LogRecord) -> bool:
        try:
            record.msg = scrub_text(record.getMessage())
            record.args = None
            if record.exc_info and not record.exc_text:
                record.exc_text = logging.Formatter().formatException(record.exc_info)
            if record.exc_text:
                record.exc_text = scrub_text(record.exc_text)
            if record.stack_info:
                record.stack_info = scrub_text(record.stack_info)
        except Exception:  # never lose a record to the filter itself
            record.msg, record.args = "(a log record that could not be formatted)", None
        return True


class _StudioFileHandler(RotatingFileHandler):
    """The handler setup_logging installs on the root logger (found again by its type)."""


class _StudioStderrHandler(logging.StreamHandler):  # type: ignore[type-arg,unused-ignore]
    """--verbose: the same records on stderr."""


def setup_logging(component: str, *, verbose: bool = False) -> Path | None:
    """Send the log to <config>/logs/studio.log; `component` ("gui", "cli") names the process in it.
    Installs the exception hooks. Called again (a test with another config folder, a CLI command run
    in-process after another), it moves the handler to the current file. Returns the log file, or None when
    it cannot be written (a read-only home): logging then goes nowhere, the program still runs."""
    root = logging.getLogger()
    path = log_path()
    current = [h for h in root.handlers if isinstance(h, _StudioFileHandler)]
    target: Path | None = path
    if not (current and Path(current[0].baseFilename) == path.absolute()):
        for h in current:
            root.removeHandler(h)
            h.close()
        try:
            path.parent.mkdir(parents=True, exist_ok=True)
            handler = _StudioFileHandler(path, maxBytes=MAX_BYTES, backupCount=BACKUPS, encoding="utf-8")
        except OSError:
            target = None
        else:
            handler.setFormatter(logging.Formatter(FORMAT))
            handler.addFilter(RedactFilter())
            root.addHandler(handler)
    for old in [h for h in root.handlers if isinstance(h, _StudioStderrHandler)]:
        root.removeHandler(old)
    if verbose:
        stderr = _StudioStderrHandler(sys.stderr)
        stderr.setFormatter(logging.Formatter("%(levelname)s %(name)s: %(message)s"))
        stderr.addFilter(RedactFilter())
        root.addHandler(stderr)
    log.setLevel(logging.DEBUG if verbose else logging.INFO)
    logging.getLogger("paramiko").setLevel(logging.WARNING)  # its INFO lines are per packet type: noise
    install_exception_hooks()
    log.debug("%s logging to %s", component, target)
    return target


def close_logging() -> None:
    """Take the studio's handlers off the root logger (tests; the end of an in-process run)."""
    root = logging.getLogger()
    for h in [h for h in root.handlers if isinstance(h, (_StudioFileHandler, _StudioStderrHandler))]:
        root.removeHandler(h)
        h.close()


def mark_logged(exc: BaseException) -> None:
    """The traceback of `exc` is in the log: the exception hook will not write it twice."""
    try:
        setattr(exc, _LOGGED, True)
    except (AttributeError, TypeError):
        pass


def log_exception(logger: logging.Logger, what: str, exc: BaseException) -> None:
    """`what` with the traceback of `exc`, once."""
    if not getattr(exc, _LOGGED, False):
        logger.error("%s", what, exc_info=(type(exc), exc, exc.__traceback__))
        mark_logged(exc)


# -- exception hooks ------------------------------------------------------------------------------------------

_prev_excepthook: Callable[[type[BaseException], BaseException, TracebackType | None], Any] | None = None
_prev_threading_hook: Callable[[threading.ExceptHookArgs], Any] | None = None


def _excepthook(etype: type[BaseException], value: BaseException, tb: TracebackType | None) -> None:
    if not issubclass(etype, KeyboardInterrupt) and not getattr(value, _LOGGED, False):
        log.critical("uncaught exception", exc_info=(etype, value, tb))
        mark_logged(value)
    prev = _prev_excepthook or sys.__excepthook__
    if prev is sys.__excepthook__:  # Python's own prints the traceback raw, and the launcher keeps stderr
        _print_scrubbed("", etype, value, tb)
    else:
        prev(etype, value, tb)


def _threading_hook(args: threading.ExceptHookArgs) -> None:
    if args.exc_value is not None and not getattr(args.exc_value, _LOGGED, False):
        name = args.thread.name if args.thread is not None else "?"
        log.critical(
            "uncaught exception in thread %s",
            name,
            exc_info=(args.exc_type, args.exc_value, args.exc_traceback),
        )
        mark_logged(args.exc_value)
    prev = _prev_threading_hook or threading.__excepthook__
    if prev is threading.__excepthook__:
        if args.exc_type is not SystemExit:  # which threading's own hook passes over too
            name = args.thread.name if args.thread is not None else "?"
            _print_scrubbed(
                f"Exception in thread {name}:\n", args.exc_type, args.exc_value, args.exc_traceback
            )
    else:
        prev(args)


def _print_scrubbed(
    head: str, etype: type[BaseException], value: BaseException | None, tb: TracebackType | None
) -> None:
    """What Python's own hooks print on stderr, scrubbed as the log is: the desktop launcher writes stderr to
    <config>/logs/launch.log."""
    if sys.stderr is not None:  # pythonw
        with contextlib.suppress(Exception):
            sys.stderr.write(head + scrub_text("".join(traceback.format_exception(etype, value, tb))))
            sys.stderr.flush()


def install_exception_hooks() -> None:
    """sys.excepthook and threading.excepthook write the traceback to the log, then do what they did before
    (print it on stderr, scrubbed where that was Python's own hook). Installing twice is the same as once."""
    global _prev_excepthook, _prev_threading_hook
    if sys.excepthook is not _excepthook:
        _prev_excepthook = sys.excepthook
        sys.excepthook = _excepthook
    if threading.excepthook is not _threading_hook:
        _prev_threading_hook = threading.excepthook
        threading.excepthook = _threading_hook


def asyncio_exception_handler(loop: asyncio.AbstractEventLoop, context: dict[str, Any]) -> None:
    """The event loop's exception handler (the GUI's qasync loop): a task that failed and was never awaited,
    a callback that raised; written to the log with its traceback."""
    exc = context.get("exception")
    parts = [str(context.get("message") or "exception in the event loop")]
    for key in ("task", "future", "handle"):
        if context.get(key) is not None:
            parts.append(f"{key}: {context[key]!r}")
    if isinstance(exc, BaseException):
        if not getattr(exc, _LOGGED, False):
            logging.getLogger(f"{ROOT}.asyncio").error(
                "; ".join(parts), exc_info=(type(exc), exc, exc.__traceback__)
            )
            mark_logged(exc)
    else:
        logging.getLogger(f"{ROOT}.asyncio").error("; ".join(parts))


def install_asyncio_handler(loop: asyncio.AbstractEventLoop) -> None:
    loop.set_exception_handler(asyncio_exception_handler)
