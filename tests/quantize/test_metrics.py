from __future__ import annotations

from collections import Counter

import numpy as np

from hexstudio.workers import metrics


def test_kl_and_top1() -> None:
    a = np.array([[2.0, 0.0, 0.0], [0.0, 3.0, 0.0]])
    assert metrics.kl_divergence(a, a) == 0.0 and metrics.top1_agreement(a, a) == 1.0
    b = a[:, ::-1].copy()
    assert metrics.kl_divergence(a, b) > 0.5 and metrics.top1_agreement(a, b) == 0.5


def test_perplexity_of_a_certain_model_is_one() -> None:
    logits = np.full((3, 4), -50.0)
    logits[np.arange(3), [1, 2, 3]] = 50.0
    assert abs(metrics.perplexity(logits, [1, 2, 3]) - 1.0) < 1e-9


def test_salad_detects_script_mixing_repetition_and_rare_tokens() -> None:
    ref = Counter([1, 2, 3, 4, 5, 6])
    clean = metrics.salad("The cat sat on the mat.", [1, 2, 3, 4, 5, 6], ref)
    assert clean["score"] == 0.0
    mixed = metrics.salad("The кот 猫 sat.", [1, 2, 3], ref)
    assert mixed["script_mixing"] > 0.2
    assert metrics.salad("x", [7, 7, 7, 7, 7, 7], ref)["repetition"] > 0.7
    assert metrics.salad("x", [90, 91, 92], ref)["rare_token_rate"] == 1.0


def test_judge_and_sequence_agreement() -> None:
    assert metrics.sequence_agreement([1, 2, 3, 4], [1, 2, 9, 4]) == (0.75, 2)
    r = metrics.judge(
        {"top1_agreement": 0.9, "kl_divergence": 0.5}, {"top1_agreement": 0.8, "kl_divergence": 0.1}
    )
    assert (
        r["verdict"] == "fail"
        and r["checks"]["top1_agreement"]["ok"]
        and not r["checks"]["kl_divergence"]["ok"]
    )


def test_threshold_overrides_from_settings() -> None:
    import pytest

    from hexstudio.workers.runtime import WorkerError
    from hexstudio.workers.validate import thresholds_from

    thr = thresholds_from({"kl_divergence": "0.05"})
    assert thr["kl_divergence"] == 0.05 and thr["top1_agreement"] == 0.80
    with pytest.raises(WorkerError, match="Unknown validation threshold"):
        thresholds_from({"kl": 1})
