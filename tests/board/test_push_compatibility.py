"""What a push says of a bundle before anything is sent (hexstudio.core.device.push.check_compatibility)."""

from __future__ import annotations

import pytest

from hexstudio.core.device.board import Board, BoardError
from hexstudio.core.device.push import check_compatibility


def board(simulated: bool) -> Board:
    return Board("evk" if not simulated else "sim", transport=None, simulated=simulated)


LOCAL = {"compile_target": "local", "binaries": "qnn", "device": {"dsp_arch": "v73"}}


def test_binaries_without_shared_weights_are_pushed_to_a_board_with_a_warning() -> None:
    """The simulator's form (one binary per graph) loads every weight twice on a board; nothing said so."""
    warnings = check_compatibility({**LOCAL, "context_binary_form": "single"}, board(False))
    assert any("share no weights" in w and "twice the memory" in w for w in warnings), warnings
    assert not any(
        "share no weights" in w
        for w in check_compatibility({**LOCAL, "context_binary_form": "shared"}, board(False))
    )
    assert check_compatibility({**LOCAL, "context_binary_form": "single"}, board(True)) == []


def test_shared_weights_are_refused_on_the_simulator_board() -> None:
    with pytest.raises(BoardError, match="share weights"):
        check_compatibility({**LOCAL, "context_binary_form": "shared", "weight_sharing": True}, board(True))
