"""genie_config.json for a run's quantized graphs, checked before anything is written or uploaded: the
compile stage's simulation bundle and its AI Hub bundle both take it from here (docs/genie.md)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from hexstudio.shared import bundle as gb
from hexstudio.shared.bundle.dialog_tokens import dialog_tokens
from hexstudio.shared.bundle.genie_schema import genie_config_errors
from hexstudio.shared.bundle.speculative import (
    DRAFT_DIR,
    REFUSED,
    DraftHost,
    SpeculativeError,
    config_name,
    dialog_config,
    dialog_problem,
    draft_engine,
    speculative_of,
)
from hexstudio.shared.run_settings import RunSettings
from hexstudio.workers.documents import output_invalid
from hexstudio.workers.runtime import WorkerError


def checked_genie_config(
    hf_config: dict[str, Any],
    hf_dir: Path,
    q: dict[str, Any],
    ctx_bins: list[str],
    settings: RunSettings,
    simulated: bool = False,
) -> dict[str, Any]:
    """genie_config.json for the quantize stage's graphs, checked before anything is written: the context
    size against the context length baked into the graphs (their `_cl<N>_` names), the rope settings
    against config.json; BOS and EOS as the tokenizer in `hf_dir` has them. A failed check is a WorkerError
    with what to do."""
    try:
        compiled = gb.compiled_context_length(
            [str(g["name"]) for g in [*q["graphs"], *(q.get("variants") or [])]]
        )
        cfg = gb.genie_config(
            hf_config,
            int(q["context_length"]),
            ctx_bins,
            int(q["head_dim"]),
            # Genie's greedy default: the run's sampler is the Chat stage's (a copy on the board), so a change of it
            # never compiles again
            simulated=simulated,
            tokens=dialog_tokens(hf_dir),
        )
        gb.check_genie_config(cfg, hf_config, compiled)
    except gb.BundleError as exc:
        raise WorkerError(
            "bundle_check",
            str(exc),
            "Fix what the message names, then run the Compile stage again (nothing was uploaded).",
        ) from None
    errors = genie_config_errors(cfg)
    if errors:  # a bug of ours: never hand Genie a config it refuses
        raise WorkerError(
            "genie_config_invalid",
            f"The genie_config.json HexStudio wrote fails Genie's schema: {errors[0]}",
            "This is a HexStudio bug: report it with the run folder.",
        )
    pe = cfg["dialog"]["engine"]["model"].get("positional-encoding")
    if q.get("positional_encoding") is not None and pe != q["positional_encoding"]:
        raise output_invalid(
            "quantize",
            "The rope Genie would compute from this genie_config.json differs from the "
            f"one the graphs were calibrated and validated with ({pe} vs {q['positional_encoding']}).",
            "rope_changed",
        )
    return cfg


def check_speculative(
    hf_config: dict[str, Any],
    q: dict[str, Any],
    settings: RunSettings,
    tokenizer: bytes | None = None,
    *,
    clamps_small_tables: bool = True,
    host: DraftHost | None = None,
) -> list[str]:
    """The speculative dialogs the run asks for, each one this model can have; else a WorkerError naming why.
    Called before the compile starts (nothing is compiled or uploaded for a request that cannot be met); with the
    model's tokenizer.json, an spd draft bundle is checked against it then too, and with `host` (what the bundle is
    compiled for) against the context, device and QAIRT its binaries must load beside. `clamps_small_tables`: the compile
    clamps lade's seed ids into a small embedding (the local one does; AI Hub compiles the graph as exported)."""
    types, lade, spd = speculative_of(settings)
    if "spd" in types and spd.draft != "self" and tokenizer is not None:
        try:
            draft_engine(Path(spd.draft).expanduser(), tokenizer, int(hf_config.get("vocab_size") or 0), host)
        except SpeculativeError as exc:
            raise WorkerError(
                "spd_draft",
                str(exc),
                "Set spd_draft to the draft run's artifacts/compile/bundle "
                "folder (compiled locally or on AI Hub), or to self; nothing was compiled.",
            ) from None
    ar_sizes = sorted({int(q["ar_n"]), 1})
    n_vocab = int(hf_config.get("vocab_size") or 0)
    for t in types:
        if t in REFUSED:
            raise WorkerError("dialog_unsupported", REFUSED[t], "Remove it from speculative_dialogs.")
        # lade's seed ids matter only where the compile keeps a small embedding as exported
        vocab = n_vocab if t != "lade" or not clamps_small_tables else None
        problem = dialog_problem(t, lade, spd, ar_sizes, vocab)
        if problem is not None:
            raise WorkerError(
                "dialog_unsupported",
                problem,
                f"Remove {t} from speculative_dialogs, or change what "
                "the message names; nothing was compiled.",
            )
    return types


def write_dialog_configs(
    bdir: Path,
    cfg: dict[str, Any],
    hf_config: dict[str, Any],
    q: dict[str, Any],
    settings: RunSettings,
    *,
    runs_on: tuple[dict[str, Any], str | None],
    clamps_small_tables: bool = True,
) -> list[str]:
    """genie_config.json (basic) and one genie_config.<type>.json per speculative dialog the run asks for (see
    check_speculative), each checked against Genie's schema as HexStudio knows it. `runs_on`: the device and the
    QAIRT version the bundle is compiled for (an spd draft's binaries must load beside it). Returns the files
    written."""
    _, lade, spd = speculative_of(settings)
    variants: dict[str, dict[str, Any]] = {}
    draft: tuple[dict[str, Any], list[Path]] | None = None
    for t in check_speculative(hf_config, q, settings, clamps_small_tables=clamps_small_tables):
        if t == "spd" and spd.draft != "self":
            try:
                device, qairt = runs_on
                host = DraftHost.on(cfg["dialog"]["context"]["size"], device, qairt)
                draft = draft_engine(
                    Path(spd.draft).expanduser(),
                    (bdir / "tokenizer.json").read_bytes(),
                    int(cfg["dialog"]["context"]["n-vocab"]),
                    host,
                )
            except (SpeculativeError, OSError) as exc:
                raise WorkerError(
                    "spd_draft",
                    str(exc),
                    "Set spd_draft to the draft run's artifacts/compile/bundle "
                    "folder (compiled locally or on AI Hub), or to self.",
                ) from None
        variant = dialog_config(
            cfg, t, lade=lade, spd=spd, draft_engine=draft[0] if t == "spd" and draft else None
        )
        errors = genie_config_errors(variant)
        if errors:
            raise WorkerError(
                "genie_config_invalid",
                f"The {t} dialog config HexStudio wrote fails Genie's schema: {errors[0]}",
                "This is a HexStudio bug: report it with the run folder.",
            )
        variants[config_name(t)] = variant
    (bdir / "genie_config.json").write_text(json.dumps(cfg, indent=4))
    if draft is not None:  # the draft model's context binaries, under draft/
        (bdir / DRAFT_DIR).mkdir(exist_ok=True)
        for b in draft[1]:
            shutil.copy2(b, bdir / DRAFT_DIR / b.name)
    for name, variant in variants.items():
        (bdir / name).write_text(json.dumps(variant, indent=4))
    return ["genie_config.json", *variants]
