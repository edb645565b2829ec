"""Validation metrics, numpy only: logit agreement, KL divergence, perplexity, and a token-salad
detector (script mixing, repetition, rare-token rate). Used by hexstudio/workers/validate.py."""

from __future__ import annotations

import unicodedata
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np

# Defaults calibrated on the built-in model (docs/quantize.md): a healthy W4A16 run sits well
# inside them; a 2-bit or scrambled quantization falls far outside. the setting `thresholds` overrides.
DEFAULT_THRESHOLDS: dict[str, float] = {
    "top1_agreement": 0.80,  # minimum: fraction of positions whose argmax matches float
    "kl_divergence": 0.10,  # maximum: mean KL(float || quantized) in nats
    # maximum: the same, on later turns through the prompt processor over a filled KV cache (validate.py)
    "continuation_kl_divergence": 0.10,
    "greedy_agreement": 0.30,  # minimum: fraction of greedy-continuation positions identical
    "perplexity_ratio": 1.15,  # maximum: quantized / float perplexity on held-out text
    "salad_score": 0.25,  # maximum: token-salad score of the quantized continuation above float's
}
HIGHER_IS_BETTER = {"top1_agreement", "greedy_agreement", "htp_logits_argmax_agreement"}


def log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def kl_divergence(p_logits: np.ndarray, q_logits: np.ndarray) -> float:
    """Mean KL(P || Q) over rows (nats)."""
    lp, lq = log_softmax(p_logits), log_softmax(q_logits)
    return float(np.mean(np.sum(np.exp(lp) * (lp - lq), axis=-1)))


def top1_agreement(a: np.ndarray, b: np.ndarray) -> float:
    return float(np.mean(np.argmax(a, axis=-1) == np.argmax(b, axis=-1)))


def perplexity(logits: np.ndarray, targets: Sequence[int]) -> float:
    lp = log_softmax(logits)
    nll = -lp[np.arange(len(targets)), np.asarray(targets)]
    return float(np.exp(np.mean(nll)))


def sequence_agreement(a: Sequence[int], b: Sequence[int]) -> tuple[float, int]:
    """(fraction of positions equal, index of the first difference or len)."""
    n = max(len(a), len(b), 1)
    same = sum(1 for x, y in zip(a, b, strict=False) if x == y)
    first = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    return same / n, first


def _script(ch: str) -> str | None:
    if not ch.isalpha():
        return None
    try:
        return unicodedata.name(ch).split(" ")[0]  # LATIN, CYRILLIC, CJK, ARABIC, ...
    except ValueError:
        return "UNKNOWN"


def salad(
    text: str, tokens: Sequence[int], reference_counts: Counter[int] | None = None, rare_below: int = 1
) -> dict[str, float]:
    """Token-salad indicators in [0, 1]: script mixing (letters outside the dominant script),
    repetition (repeated 3-grams of tokens), rare-token rate (tokens seen fewer than `rare_below`
    times in the reference text); score = their maximum."""
    scripts = Counter(s for s in (_script(c) for c in text) if s)
    letters = sum(scripts.values())
    mixing = 1.0 - (scripts.most_common(1)[0][1] / letters) if letters else 0.0
    grams = [tuple(tokens[i : i + 3]) for i in range(max(0, len(tokens) - 2))]
    repetition = 1.0 - len(set(grams)) / len(grams) if grams else 0.0
    rare = 0.0
    if reference_counts is not None and tokens:
        rare = sum(1 for t in tokens if reference_counts.get(t, 0) < rare_below) / len(tokens)
    return {
        "script_mixing": round(mixing, 4),
        "repetition": round(repetition, 4),
        "rare_token_rate": round(rare, 4),
        "score": round(max(mixing, repetition, rare), 4),
    }


def judge(values: dict[str, float], thresholds: dict[str, float]) -> dict[str, Any]:
    """Each metric against its threshold: {name: {value, threshold, ok, direction}} and the verdict."""
    checks: dict[str, Any] = {}
    for name, thr in thresholds.items():
        if name not in values:
            continue
        v = values[name]
        ok = v >= thr if name in HIGHER_IS_BETTER else v <= thr
        checks[name] = {
            "value": v,
            "threshold": thr,
            "ok": bool(ok),
            "direction": "min" if name in HIGHER_IS_BETTER else "max",
        }
    return {
        "checks": checks,
        "verdict": "pass" if checks and all(c["ok"] for c in checks.values()) else "fail",
    }
