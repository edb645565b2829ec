"""Plausible ranges for every number HexStudio reads from a model's config.json, checked before anything is
sized from it (issue 27: `"hidden_size": 1000000000000` made `model inspect`, preflight and the Model stage
grow until the kernel killed them: the part plan and the rope tables were sized from it).

A config.json comes from anyone's repository (inspect-before-download reads it from the Hub), so it is input,
not truth. The ranges are wide: about 4-60x beyond the largest published dense decoders (Llama 3.1 405B:
hidden 16,384, 126 layers, 128 heads, FFN 53,248; vocabularies up to ~262k; contexts up to 10M), so no real
model is refused, and small enough that no size computed from them can exhaust memory or time.

Stdlib only; hexstudio.shared.modelinfo and hexstudio.shared.rope call `check_config` first.
"""

from __future__ import annotations

import math
from typing import Any

from hexstudio.shared.errors import ActionableError

# field: (lowest, highest) for whole numbers
INT_RANGES: dict[str, tuple[int, int]] = {
    "hidden_size": (1, 65_536),
    "num_hidden_layers": (1, 1_024),
    "num_attention_heads": (1, 1_024),
    "num_key_value_heads": (1, 1_024),
    "head_dim": (1, 2_048),
    "intermediate_size": (1, 1_048_576),
    "vocab_size": (1, 4_194_304),
    "max_position_embeddings": (1, 16_777_216),
}
# rope values (top level, rope_scaling, rope_parameters)
ROPE_FLOAT_RANGES: dict[str, tuple[float, float]] = {
    "rope_theta": (1e-3, 1e12),
    "factor": (1e-3, 1e4),
    "low_freq_factor": (1e-3, 1e4),
    "high_freq_factor": (1e-3, 1e4),
    "attention_factor": (1e-3, 1e4),
    "beta_fast": (1e-3, 1e4),
    "beta_slow": (1e-3, 1e4),
    "mscale": (1e-3, 1e4),
    "mscale_all_dim": (0, 1e4),
    "partial_rotary_factor": (1e-3, 1.0),
}
ROPE_INT_RANGES: dict[str, tuple[int, int]] = {"original_max_position_embeddings": (1, 16_777_216)}
MAX_FACTOR_LIST = 4_096  # short_factor / long_factor: one value per rotary frequency (head_dim / 2)
MAX_TOKEN_IDS = 1_024  # eos_token_id lists


class ConfigBoundsError(ActionableError, ValueError):
    """A number in config.json outside what any real model has: refused before anything is sized from it."""

    code = "config_out_of_range"


def _refuse(where: str, value: Any, what: str) -> ConfigBoundsError:
    shown = repr(value)
    if len(shown) > 40:
        shown = shown[:37] + "..."
    return ConfigBoundsError(
        f"config.json's {where} is {shown}: {what}. No real model has that, so HexStudio "
        "refuses it before sizing anything from it.",
        "Check that this is the model you meant and that its config.json is the one its "
        "authors published (download it again); a hand-edited or crafted config.json cannot "
        "be deployed.",
    )


def _int(where: str, v: Any, lo: int, hi: int) -> None:
    if isinstance(v, bool) or not isinstance(v, int):
        if isinstance(v, float) and v.is_integer() and lo <= v <= hi:
            return  # 4096.0: some exporters write whole numbers as floats
        raise _refuse(where, v, "it must be a whole number")
    if not lo <= v <= hi:
        raise _refuse(where, v, f"it must be from {lo:,} to {hi:,}")


def _float(where: str, v: Any, lo: float, hi: float) -> None:
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        raise _refuse(where, v, "it must be a number")
    if not math.isfinite(v) or not lo <= v <= hi:
        raise _refuse(where, v, f"it must be a finite number from {lo:g} to {hi:g}")


def _rope_block(where: str, block: Any) -> None:
    if block is None:
        return
    if not isinstance(block, dict):
        raise _refuse(where, block, "it must be an object")
    if "full_attention" in block and isinstance(block["full_attention"], dict):
        _rope_block(f"{where}.full_attention", block["full_attention"])
    for k, v in block.items():
        if v is None:
            continue
        if k in ROPE_FLOAT_RANGES:
            _float(f"{where}.{k}", v, *ROPE_FLOAT_RANGES[k])
        elif k in ROPE_INT_RANGES:
            _int(f"{where}.{k}", v, *ROPE_INT_RANGES[k])
        elif k in ("short_factor", "long_factor"):
            if not isinstance(v, list) or len(v) > MAX_FACTOR_LIST:
                raise _refuse(
                    f"{where}.{k}",
                    v if not isinstance(v, list) else f"a list of {len(v)}",
                    f"it must be a list of at most {MAX_FACTOR_LIST} numbers",
                )
            for i, x in enumerate(v):
                _float(f"{where}.{k}[{i}]", x, 1e-6, 1e6)


def check_config(cfg: dict[str, Any]) -> None:
    """Raises ConfigBoundsError for the first number in `cfg` out of its plausible range (or of a wrong type),
    naming the field, the value and the range. Fields absent or null are left to the callers' defaults."""
    for k, (lo, hi) in INT_RANGES.items():
        v = cfg.get(k)
        if v is not None:
            _int(k, v, lo, hi)
    heads, kvh = cfg.get("num_attention_heads"), cfg.get("num_key_value_heads")
    if isinstance(heads, int) and isinstance(kvh, int) and kvh > heads:
        raise _refuse("num_key_value_heads", kvh, f"it must not exceed num_attention_heads ({heads})")
    if isinstance(heads, int) and isinstance(kvh, int) and kvh > 0 and heads % kvh:
        # grouped-query attention shares each KV head among heads/kv_heads query heads
        raise _refuse("num_key_value_heads", kvh, f"it must divide num_attention_heads ({heads}) evenly")
    if (
        cfg.get("head_dim") is None
        and isinstance(heads, int)
        and isinstance(cfg.get("hidden_size"), int)
        and cfg["hidden_size"] < heads
    ):
        raise _refuse("hidden_size", cfg["hidden_size"], f"it is smaller than num_attention_heads ({heads})")
    v = cfg.get("rope_theta")
    if v is not None:
        _float("rope_theta", v, *ROPE_FLOAT_RANGES["rope_theta"])
    v = cfg.get("partial_rotary_factor")
    if v is not None:
        _float("partial_rotary_factor", v, *ROPE_FLOAT_RANGES["partial_rotary_factor"])
    _rope_block("rope_scaling", cfg.get("rope_scaling"))
    _rope_block("rope_parameters", cfg.get("rope_parameters"))
    for k in ("bos_token_id", "eos_token_id", "pad_token_id"):
        v = cfg.get(k)
        ids = v if isinstance(v, list) else [v]
        if isinstance(v, list) and len(v) > MAX_TOKEN_IDS:
            raise _refuse(k, f"a list of {len(v)}", f"it must list at most {MAX_TOKEN_IDS} token ids")
        for x in ids:
            if x is not None:
                _int(k, x, -1, 4_194_304)
    archs = cfg.get("architectures")
    if archs is not None and not (isinstance(archs, list) and all(isinstance(a, str) for a in archs)):
        raise _refuse("architectures", archs, "it must be a list of class names")
    for k in ("model_type",):
        if cfg.get(k) is not None and not isinstance(cfg[k], str):
            raise _refuse(k, cfg[k], "it must be a string")
