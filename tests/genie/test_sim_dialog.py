"""The simulator board's dialog (hexstudio/workers/genie_sim/t2t.py) against what Qualcomm's Genie does, on a fake
model: its sampler's defaults, a full context, and genie-t2t-run's output."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from hexstudio.core.genie.transcript import parse_transcript
from hexstudio.workers.genie_sim import t2t


class Pair:
    """A model that answers token `favourite` (or `eos` after `reply` tokens) and counts the tokens it ran."""

    def __init__(self, capacity: int, reply: int = 1000, favourite: int = 3, eos: int = 1) -> None:
        self.capacity, self.n_past, self.steps = capacity, 0, 0
        self.reply, self.favourite, self.eos, self.given = reply, favourite, eos, 0

    def _logits(self) -> np.ndarray:
        logits = np.zeros(8, np.float32)
        logits[self.eos if self.given >= self.reply else self.favourite] = 5.0
        self.given += 1
        return logits

    def prefill(self, ids: list[int]) -> np.ndarray:
        self.n_past += len(ids)
        return self._logits()

    def step(self, token: int) -> np.ndarray:
        self.n_past += 1
        self.steps += 1
        return self._logits()

    def reset(self) -> None:
        self.n_past = 0


class Tok:
    class Enc:
        def __init__(self, n: int) -> None:
            self.ids = [5] * n

    def encode(self, text: str, add_special_tokens: bool = False) -> Enc:
        return self.Enc(len(text.split()))

    def decode(self, ids: list[int]) -> str:
        return "x" * len(ids)


SimDialog = t2t.SimDialog  # the class itself, where a test swaps the name for a factory


def dialog(
    pair: Pair, cfg: dict[str, Any] | None = None, sampler: dict[str, Any] | None = None
) -> t2t.SimDialog:
    d = object.__new__(SimDialog)
    d.pair, d.tok, d.cfg = pair, Tok(), cfg or {}
    d.sampler = {}
    d.apply_sampler(sampler or {})
    d.eos, d.eos_between, d.bos, d.queries, d.init_us = {1}, 1, None, 0, 0.0
    return d


def test_genies_sampler_is_greedy_only_when_asked() -> None:
    """A sampler that left keys out was greedy and seeded 42 on the twin (Genie: temp 0.1, top-k 0 = every token,
    top-p 0.8, a clock seed), and top-k 0 kept one token: a bundle sampled on a board was deterministic here."""
    logits = np.array([2.0, 1.9, 1.8, 0.0])
    rng = np.random.default_rng(0)
    for sampler in ({}, {"temp": 0.8}, {"temp": 0.8, "top-k": 0, "top-p": 1.0}):
        drawn = {t2t.sample(logits, sampler, rng) for _ in range(200)}
        assert len(drawn) > 1, (sampler, drawn)
    assert {t2t.sample(logits, {"temp": 0.8, "top-k": 1}, rng) for _ in range(50)} == {0}
    assert {t2t.sample(logits, {"temp": 0.0, "top-k": 0}, rng) for _ in range(50)} == {0}
    d = dialog(Pair(64), sampler={"seed": -1})  # Genie's "the clock's seed", not a crash
    assert d.sampler["seed"] == -1


def test_a_reply_the_context_cuts_is_context_full_with_or_without_a_budget() -> None:
    """Without max-num-tokens (the board's command line never passes one) a reply that filled the context came
    back "complete", exit 0; Genie throws "Context limit exceeded" and genie-t2t-run exits 1."""
    for cfg in ({}, {"max-num-tokens": 100}):
        q = dialog(Pair(10), cfg).query("a b c d e", None, lambda *_: None)
        assert q["state"] == "context_full" and q["generated"] == 5, (cfg, q)
    q = dialog(Pair(64), {"max-num-tokens": 4}).query("a b c d e", None, lambda *_: None)
    assert q["state"] == "complete" and q["generated"] == 4  # the budget, not the context, ended it


def test_genie_t2t_runs_output_for_an_empty_reply_and_a_full_context(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """genie-t2t-run prints [BEGIN] with the first token, so a reply that is EOS at once shows only [END] (the
    parser left it "not started", a failed query); a full context writes no profile (Genie's exception path)."""
    pairs = iter([Pair(64, reply=0), Pair(8)])
    monkeypatch.setattr(t2t, "SimDialog", lambda _config: dialog(next(pairs)))
    cfg = tmp_path / "genie_config.json"
    cfg.write_text(json.dumps({"dialog": {}}))
    assert t2t.main(["-c", str(cfg), "-p", "a b"]) == 0
    out = capsys.readouterr().out
    assert "[BEGIN]" not in out and out.rstrip().endswith("[END]"), out
    t = parse_transcript(out, 0)
    assert t.state == "complete" and t.text == "", t
    profile = tmp_path / "profile.json"
    assert t2t.main(["-c", str(cfg), "-p", "a b c", "--profile", str(profile)]) == 1
    assert not profile.exists() and "Failed to query." in capsys.readouterr().err
