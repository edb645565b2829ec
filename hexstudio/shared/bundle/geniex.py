"""metadata.json for GenieX's qairt plugin, derived from a Genie bundle (docs/genie.md, "GenieX").

GenieX loads the same context binaries and genie_config.json as Genie, but it also needs
`metadata.json` (geniex-qairt-plugin core/src/llm/llm_spec_loader.cpp, models/dispatch.h):
`model_id`, whose prefix picks the plugin's pipeline, and `model_files`, the graphs' I/O shapes keyed by
graph name. A bundle written for Genie carries the same graph specs in metadata.yaml (or, simulated,
in its context binaries), so HexStudio derives metadata.json from them and writes it beside the
bundle's files: switching a board to GenieX needs no new push.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError
from hexstudio.shared.families import family_of_model_type

# model_id prefixes the plugin's LLM dispatcher knows (models/dispatch.h), in its order
FAMILY_PREFIXES = ("qwen3_", "qwen2_5_", "falcon_v3_", "llama_v3_", "phi_3_5_")
# The simulated GenieX (hexstudio/workers/genie_sim/geniex.py), as the simulator board's doctor reports it too
CLI_VERSION = "v0.7.0"  # the simulated CLI's version (labeled simulated wherever shown)
QAIRT_PLUGIN_VERSION = "v2.45.0.260326"  # geniex-qairt-plugin core/include/version.h GENIEX_QAIRT_VERSION
GENERATOR = "HexStudio (derived from the Genie bundle's graph specs)"


class GenieXMetadataError(ActionableError, ValueError):
    def __init__(self, message: str, hint: str) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint


def model_id_for(slug: str, hf_config: dict[str, Any] | None) -> str:
    """The model_id GenieX dispatches on: the bundle's model slug when it already names a family the
    plugin knows, else the slug behind the prefix of its model family's pipeline (ModelFamily.geniex_prefix,
    found by config.json's model_type)."""
    if slug.startswith(FAMILY_PREFIXES):
        return slug
    mt = str((hf_config or {}).get("model_type") or "").lower()
    fam = family_of_model_type(mt)
    prefix = fam.geniex_prefix if fam is not None else None
    if prefix is None:
        raise GenieXMetadataError(
            f"GenieX's qairt plugin has no pipeline for a '{mt or 'unknown'}' model (it knows Llama 3, Qwen 2.5, "
            "Qwen 3, Falcon 3 and Phi 3.5, chosen by metadata.json's model_id).",
            "Run this model with the Genie runtime (runtime: genie).",
        )
    return prefix + slug


def slug_of(ctx_bins: list[str]) -> str:
    """`<model>_part_1_of_n.bin` -> `<model>` (qai-hub-models' names)."""
    first = ctx_bins[0].rsplit("/", 1)[-1] if ctx_bins else "model"
    head, sep, _ = first.rpartition("_part_")
    return head if sep else first.rsplit(".", 1)[0]


def geniex_metadata(bundle: Path) -> dict[str, Any]:
    """metadata.json for the bundle folder `bundle` (which needs genie_config.json, the graph specs in
    metadata.yaml or simulated context binaries, and config.json for the architecture)."""
    from hexstudio.shared.bundle.check import load_graph_specs

    try:
        cfg = json.loads((bundle / "genie_config.json").read_text(encoding="utf-8"))["dialog"]
        bins = list(cfg["engine"]["model"]["binary"]["ctx-bins"])
        size = int(cfg["context"]["size"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise GenieXMetadataError(
            f"genie_config.json cannot be read for GenieX ({exc}).",
            "Push the bundle again (`hexstudio board push`).",
        ) from None
    specs, source = load_graph_specs(bundle, bins, size)
    shaped = {
        k: v
        for k, v in specs.items()
        if any(isinstance(t, dict) and t.get("shape") for t in (v.get("inputs") or {}).values())
    }
    if not shaped:
        raise GenieXMetadataError(
            "The bundle carries no graph I/O shapes (no metadata.yaml), which GenieX's metadata.json needs.",
            "Keep the metadata.yaml that the compile stage writes beside the context binaries.",
        )
    try:
        hf = json.loads((bundle / "config.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        hf = None
    files = {
        name: {
            "inputs": {
                t: {"shape": list(s.get("shape") or [])} for t, s in (spec.get("inputs") or {}).items()
            },
            "outputs": {
                t: {"shape": list(s.get("shape") or [])} for t, s in (spec.get("outputs") or {}).items()
            },
        }
        for name, spec in sorted(shaped.items())
    }
    return {
        "model_id": model_id_for(slug_of(bins), hf),
        "model_files": files,
        "generator": GENERATOR,
        "graph_specs_from": source,
    }


def chat_template_problem(tokenizer_config: Any, where: str) -> str | None:
    """GenieX's qairt pipeline applies the model's chat template itself, from tokenizer_config.json beside the
    bundle, and refuses to create the pipeline when it has none (geniex-qairt-plugin
    core/src/pipeline/llm_pipeline.cpp: resolveTokenizerConfigPath, has_chat_template). The plugin's own
    log line when `tokenizer_config` (the parsed file, or None when missing or unreadable) lacks one."""
    tmpl = tokenizer_config.get("chat_template") if isinstance(tokenizer_config, dict) else None
    if (isinstance(tmpl, str) and tmpl.strip()) or (isinstance(tmpl, list) and tmpl):
        return None
    return f"LLMPipeline: tokenizer_config.json at '{where}' has no chat_template"
