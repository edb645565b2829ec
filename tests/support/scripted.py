"""The board's chat helper replaced by the scripted one (tests/eval/scripted_helper.py), for every runtime: the
session, the server and the chat page then run for real against a dialog that answers from a script."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

SCRIPTED_HELPER = Path(__file__).parents[1] / "eval" / "scripted_helper.py"


def use_scripted_helper(monkeypatch: pytest.MonkeyPatch, script: dict[str, str]) -> None:
    """Every runtime's helper command becomes the scripted helper answering from `script` ({"substring of the
    prompt": "reply"}; scripted_helper.py lists the special replies)."""
    from hexstudio.core.genie.runtime import BoardRuntime

    argv = [sys.executable, str(SCRIPTED_HELPER), json.dumps(script)]
    for cls in (BoardRuntime, *BoardRuntime.__subclasses__()):
        monkeypatch.setattr(
            cls, "helper_argv", lambda self, board, sampler, remote, bundle: (list(argv), None)
        )
