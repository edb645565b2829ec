"""keyboard-interactive logins: the stored password goes to the password prompt only (connect.password_answers)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.connect import password_answers


def test_the_password_answers_only_a_password_prompt() -> None:
    """A board whose sshd asks a verification code besides the password got the password typed into the code
    prompt too, where PAM logs it as a wrong code; now the code prompt gets nothing and is named."""
    other: list[str] = []
    answer = password_answers("s3cret", other)
    assert answer("", "", [("Password: ", False)]) == ["s3cret"]
    assert answer("", "", [("alice@evk's password: ", False)]) == ["s3cret"]
    assert answer("", "", [("Kennwort: ", False)]) == ["s3cret"]  # a lone hidden prompt in another language
    # the user@host a prompt names is not read for its meaning ("hotplug" holds "otp", "vscode" "code")
    for prompt in (
        "Password for dev@vscode-box:",
        "(ubuntu@hotplug-evk) Password:",
        "tokenizer@evk's password:",
    ):
        assert answer("", "", [(prompt, False)]) == ["s3cret"], prompt
    assert other == []
    assert answer("", "", [("Verification code: ", False)]) == [""]
    assert answer("", "", [("Passcode or option (1-3): ", False)]) == [""]
    assert answer("", "", [("Password: ", False), ("One-time PIN: ", False)]) == ["s3cret", ""]
    assert answer("", "", [("Username: ", True)]) == [""]  # an echoed prompt is never the password
    assert other == ["Verification code:", "Passcode or option (1-3):", "One-time PIN:", "Username:"]
    assert answer("", "", []) == []  # a banner-only round


def test_a_connection_cancelled_while_it_opens_is_closed_once_made(monkeypatch: pytest.MonkeyPatch) -> None:
    """Cancel during a worker host's connect: the thread making the connection cannot be stopped, and the
    connection it returned was held by no one, open (with its jump hosts or ProxyCommand) until the studio quit."""
    import asyncio
    import threading
    import time

    from hexstudio.core.device import connect

    closed = threading.Event()

    class Client:
        def close(self) -> None:
            closed.set()

    class Transport:
        client = Client()

    def slow_connect(*_a: Any, **_k: Any) -> Transport:
        time.sleep(0.5)
        return Transport()

    monkeypatch.setattr(connect, "connect_ssh_sync", slow_connect)

    async def main() -> None:
        task = asyncio.ensure_future(connect.connect_ssh("box", {"host": "h"}))
        await asyncio.sleep(0.1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        for _ in range(50):
            if closed.is_set():
                break
            await asyncio.sleep(0.05)

    asyncio.run(main())
    assert closed.is_set()


def test_paths_and_commands_a_user_writes_are_taken_as_meant(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """A relative workspace made the simulator board's home relative, refused as "not an absolute path, check the
    board user's home"; a password file saved on Windows stored its \\r; a genie_command written as one string was
    run as its letters; the scp line shown for a manual upload left a user name with a backslash unquoted."""
    import io
    import sys

    from hexstudio.cli.ssh import read_password
    from hexstudio.core.device.board import _argv
    from hexstudio.core.paths import default_workspace

    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HEXSTUDIO_WORKSPACE", "ws")
    assert default_workspace() == tmp_path / "ws"
    monkeypatch.setattr(sys, "stdin", io.StringIO("s3cret\r\n"))
    assert read_password("p", from_stdin=True, command="hexstudio board password evk") == "s3cret"
    assert _argv("/opt/qairt/bin/genie-t2t-run --profile x") == [
        "/opt/qairt/bin/genie-t2t-run",
        "--profile",
        "x",
    ]
    assert _argv(["genie-t2t-run"]) == ["genie-t2t-run"]
