"""keyboard-interactive logins: the stored password goes to the password prompt only (connect.password_answers)."""

from __future__ import annotations

from hexstudio.core.device.connect import password_answers


def test_the_password_answers_only_a_password_prompt() -> None:
    """A board whose sshd asks a verification code besides the password got the password typed into the code
    prompt too, where PAM logs it as a wrong code; now the code prompt gets nothing and is named."""
    other: list[str] = []
    answer = password_answers("s3cret", other)
    assert answer("", "", [("Password: ", False)]) == ["s3cret"]
    assert answer("", "", [("alice@evk's password: ", False)]) == ["s3cret"]
    assert answer("", "", [("Kennwort: ", False)]) == ["s3cret"]  # a lone hidden prompt in another language
    assert other == []
    assert answer("", "", [("Verification code: ", False)]) == [""]
    assert answer("", "", [("Passcode or option (1-3): ", False)]) == [""]
    assert answer("", "", [("Password: ", False), ("One-time PIN: ", False)]) == ["s3cret", ""]
    assert answer("", "", [("Username: ", True)]) == [""]  # an echoed prompt is never the password
    assert other == ["Verification code:", "Passcode or option (1-3):", "One-time PIN:", "Username:"]
    assert answer("", "", []) == []  # a banner-only round
