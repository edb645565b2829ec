"""Two slow tests, one with a written reason and one without: run by tests/core/test_slow_policy.py with the
threshold lowered (HEXSTUDIO_SLOW_TEST_S). Not collected by the suite (no test_ prefix)."""

from __future__ import annotations

import time

import pytest


@pytest.mark.slow(reason="a probe of the policy")
def test_slow_with_a_reason() -> None:
    time.sleep(0.3)
    assert True


def test_slow_without_a_reason() -> None:
    time.sleep(0.3)
    assert True
