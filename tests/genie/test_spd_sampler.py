"""spd's sampler (the speculative review): Genie asserts temp > 0 in spd's draft sampler, so a greedy request
cannot say so with its temperature. It became temp 1 with "greedy": true and top-k kept, which Genie's basic
sampler reads as sampling at temperature 1 (qualla sampler.cpp sets greedy again from temp <= 0 or top-k == 1):
spd answered with random text where basic was greedy. And a sampled request kept a greedy bundle's "greedy":
true."""

from __future__ import annotations

from hexstudio.shared.bundle.speculative import spd_sampler
from hexstudio.workers.board.genie_session import dialog_sampler, greedy


def test_a_greedy_request_stays_greedy_under_either_reading_of_genies_sampler() -> None:
    asked = {"seed": 42, "temp": 0.0, "top-k": 40, "top-p": 0.95}
    for values in (spd_sampler(asked, genie_keys=True), dialog_sampler({"type": "spd"}, asked)):
        assert values["temp"] > 0  # Genie's spd draft sampler asserts it
        assert greedy(values), values  # the basic sampler's own rule: top-k 1
        assert values["greedy"] is True  # and the key, where a Genie honours it
    ours = spd_sampler({"seed": 42, "temp": 0.0, "top_k": 40, "top_p": 0.95})
    assert ours["top_k"] == 1 and "top-k" not in ours and ours["temp"] == 1.0


def test_a_sampled_request_is_never_greedy() -> None:
    asked = {"seed": 42, "temp": 0.6, "top-k": 40, "top-p": 0.95}
    for values in (spd_sampler(asked, genie_keys=True), dialog_sampler({"type": "spd"}, asked)):
        assert values["temp"] == 0.6 and values["top-k"] == 40 and values["greedy"] is False
        assert not greedy(values)
    bundle = {"temp": 1.0, "top-k": 1, "greedy": True}  # a greedy bundle's spd config
    assert {**bundle, **spd_sampler(asked, genie_keys=True)}["greedy"] is False
    # other dialogs take the values as they are
    assert dialog_sampler({"type": "basic"}, asked) == asked
