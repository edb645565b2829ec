"""genie_config.json for a run's quantized graphs, checked before anything is written or uploaded: the
compile stage's simulation bundle and its AI Hub bundle both take it from here (docs/genie.md)."""

from __future__ import annotations

from typing import Any

from workers.runtime import WorkerError
from workers.shared import bundle as gb
from workers.shared.bundle.genie_schema import genie_config_errors


def checked_genie_config(hf_config: dict[str, Any], q: dict[str, Any], ctx_bins: list[str],
                         settings: dict[str, Any], simulated: bool = False) -> dict[str, Any]:
    """genie_config.json for the quantize stage's graphs, checked before anything is written: the context
    size against the context length baked into the graphs (their `_cl<N>_` names), the rope settings
    against config.json. A failed check is a WorkerError with what to do."""
    try:
        compiled = gb.compiled_context_length([str(g["name"]) for g in q["graphs"]])
        cfg = gb.genie_config(hf_config, int(q["context_length"]), ctx_bins, int(q["head_dim"]),
                              settings.get("sampler"), simulated=simulated)
        gb.check_genie_config(cfg, hf_config, compiled)
    except gb.BundleError as exc:
        raise WorkerError("bundle_check", str(exc), "Fix what the message names, then run the Compile stage "
                          "again (nothing was uploaded).") from None
    errors = genie_config_errors(cfg)
    if errors:     # a bug of ours: never hand Genie a config it refuses
        raise WorkerError("genie_config_invalid", f"The genie_config.json HexStudio wrote fails Genie's schema: "
                          f"{errors[0]}", "This is a HexStudio bug: report it with the run folder.")
    pe = cfg["dialog"]["engine"]["model"].get("positional-encoding")
    if q.get("positional_encoding") is not None and pe != q["positional_encoding"]:
        raise WorkerError("rope_changed", "The rope Genie would compute from this genie_config.json differs from the "
                          f"one the graphs were calibrated and validated with ({pe} vs {q['positional_encoding']}).",
                          "Run the Quantize stage again (--force).")
    return cfg
