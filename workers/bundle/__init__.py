"""The Genie bundle writer: genie_config.json, htp_backend_ext_config.json, tool-versions.yaml and
bundle.json (docs/CONTRACTS.md §3; shapes from facts/genie.md). Pure Python: app.core imports it
for `hexstudio bundle config`."""

from __future__ import annotations

import hashlib
import json
import os
import re
from pathlib import Path
from typing import Any

# AI Hub device attributes HexStudio knows offline (facts/board.md). The live list comes from AI Hub.
KNOWN_DEVICES: dict[str, dict[str, Any]] = {
    "Dragonwing IQ-9075 EVK": {"soc_model": 77, "dsp_arch": "v73", "chipset": "qualcomm-qcs9075",
                               "os": "qc_linux", "weight_sharing": True},
    "SA8255P ADP": {"soc_model": 52, "dsp_arch": "v73", "chipset": "qualcomm-sa8255p", "os": "android",
                    "weight_sharing": True},
    "Snapdragon 8 Gen 2 QRD": {"soc_model": 43, "dsp_arch": "v73", "chipset": "qualcomm-snapdragon-8gen2",
                               "os": "android", "weight_sharing": True},
    "Snapdragon 8 Gen 3 QRD": {"soc_model": 57, "dsp_arch": "v75", "chipset": "qualcomm-snapdragon-8gen3",
                               "os": "android", "weight_sharing": True},
    "Snapdragon 8 Elite QRD": {"soc_model": 69, "dsp_arch": "v79", "chipset": "qualcomm-snapdragon-8-elite",
                               "os": "android", "weight_sharing": True},
    "Snapdragon X Elite CRD": {"soc_model": 60, "dsp_arch": "v73", "chipset": "qualcomm-snapdragon-x-elite",
                               "os": "windows", "weight_sharing": True},
}
SIMULATOR_DEVICE = {"name": "HexStudio simulator", "soc_model": 0, "dsp_arch": "sim", "attributes": ["simulated"]}


class BundleError(ValueError):
    """A check before writing failed; the message says what to change."""


def arch_number(dsp_arch: str) -> int:
    try:
        return int(str(dsp_arch).lstrip("v"))
    except ValueError:
        return 0


def device_info(name: str) -> dict[str, Any]:
    if name not in KNOWN_DEVICES:
        raise BundleError(f"Unknown device '{name}'. Known offline: {', '.join(KNOWN_DEVICES)}. "
                          "Online, the device list comes from AI Hub (hexstudio bundle devices).")
    return {"name": name, **KNOWN_DEVICES[name]}


def check_device(dev: dict[str, Any], lpbq: bool = True) -> None:
    """Refuse a device the bundle cannot run on. LPBQ (int4 blockwise) weights need v69+; the Genie bundle's
    weight sharing needs v73+ and the device's `htp-supports-weight-sharing` (facts/aihub.md)."""
    if dev.get("dsp_arch") == "sim":
        return
    n = arch_number(dev["dsp_arch"])
    if lpbq and n < 69:
        raise BundleError(f"{dev['name']} ({dev['dsp_arch']}) cannot run LPBQ (int4 blockwise) weights, which this "
                          "W4A16 model uses: that needs Hexagon v69 or newer. Use a v73+ device such as the "
                          "Dragonwing IQ-9075 EVK.")
    if n < 73 or not dev.get("weight_sharing", True):
        raise BundleError(f"{dev['name']} ({dev['dsp_arch']}) does not support weight sharing, which the Genie "
                          "bundle needs (prompt processor and token generator share one set of weights): use a "
                          "Hexagon v73 or newer device.")


_CL_RE = re.compile(r"_cl(\d+)(?:_|$)")


def compiled_context_length(graph_names: list[str]) -> int:
    """The context length baked into the graphs, from their names (`prompt_ar128_cl4096_1_of_5`). Raises
    BundleError when a name carries none or the graphs disagree."""
    found: dict[str, int] = {}
    for name in graph_names:
        m = _CL_RE.search(name)
        if m is None:
            raise BundleError(f"Graph '{name}' does not name its context length (`_cl<N>_`), so the bundle's "
                              "context size cannot be checked against it. Re-run the Quantize stage.")
        found[name] = int(m.group(1))
    values = sorted(set(found.values()))
    if not values:
        raise BundleError("There are no graphs to check the context length against. Re-run the Quantize stage.")
    if len(values) > 1:
        raise BundleError("The graphs were exported for different context lengths ("
                          + ", ".join(f"{n}: {v}" for n, v in found.items())
                          + "): they cannot form one Genie bundle. Re-run the Quantize stage.")
    return values[0]


# Rope scaling Genie can express (facts/genie.md): the Hugging Face field -> Genie's spelling. Every field
# is required: a value that is not copied from the model's config.json gives degenerate output.
GENIE_ROPE_FIELDS: dict[str, dict[str, tuple[str, type]]] = {
    "llama3": {"factor": ("factor", float), "low_freq_factor": ("low-freq-factor", float),
               "high_freq_factor": ("high-freq-factor", float),
               "original_max_position_embeddings": ("original-max-position-embeddings", int)},
}
# keys of a rope block that are not scaling parameters (transformers 5 keeps theta beside them)
_ROPE_NON_SCALING = {"rope_type", "type", "rope_theta", "partial_rotary_factor"}


def rope_settings(hf_config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope theta, rope scaling or None) from either config.json layout: transformers <5 (`rope_theta` and
    `rope_scaling` at the top level) or transformers 5 (`rope_parameters` holding both). A scaling of type
    "default" (or none) means no scaling."""
    params = hf_config.get("rope_parameters")
    if isinstance(params, dict) and "full_attention" in params and isinstance(params["full_attention"], dict):
        params = params["full_attention"]   # per-layer-type layout: the decoder layers' entry
    params = params if isinstance(params, dict) else {}
    theta = hf_config.get("rope_theta") or params.get("rope_theta") or 10000.0
    scaling = hf_config.get("rope_scaling") or params or None
    if scaling is not None:
        rope_type = scaling.get("rope_type", scaling.get("type"))
        if rope_type in (None, "default") and not (set(scaling) - _ROPE_NON_SCALING):
            scaling = None
    return float(theta), (dict(scaling) if scaling else None)


def genie_rope_scaling(hf_config: dict[str, Any]) -> dict[str, Any] | None:
    """The model's rope scaling in Genie's spelling, every field copied; None without scaling. Raises
    BundleError for a rope type Genie cannot express or a field the config lacks."""
    _, rs = rope_settings(hf_config)
    if rs is None:
        return None
    rope_type = rs.get("rope_type", rs.get("type"))
    fields = GENIE_ROPE_FIELDS.get(str(rope_type))
    if fields is None:
        raise BundleError(
            f"This model's config.json uses rope scaling of type '{rope_type}' ({_rope_text(rs)}), which a Genie "
            f"bundle cannot express: Genie's rope-scaling knows {', '.join(GENIE_ROPE_FIELDS)} only, and dropping "
            "or approximating it gives degenerate output on the board. Choose a model without rope scaling or with "
            "llama3 rope scaling (Llama 3.x, Llama-3.1-Nemotron-Nano-8B).")
    missing = [k for k in fields if rs.get(k) is None]
    if missing:
        raise BundleError(f"This model's {rope_type} rope scaling in config.json lacks {', '.join(missing)} "
                          f"({_rope_text(rs)}). HexStudio copies these values and never guesses them: fix the "
                          "model's config.json (as published by its authors).")
    unknown = sorted(set(rs) - set(fields) - _ROPE_NON_SCALING)
    if unknown:
        raise BundleError(f"This model's {rope_type} rope scaling has field(s) {', '.join(unknown)} that Genie's "
                          f"rope-scaling cannot carry ({_rope_text(rs)}); the bundle would not match the model.")
    out: dict[str, Any] = {"rope-type": str(rope_type)}
    for k, (genie_key, cast) in fields.items():
        out[genie_key] = cast(rs[k])
    return out


def _rope_text(rs: dict[str, Any]) -> str:
    return ", ".join(f"{k}={v}" for k, v in rs.items())


def genie_config(hf_config: dict[str, Any], context_length: int, ctx_bins: list[str], kv_dim: int,
                 sampler: dict[str, Any] | None = None, simulated: bool = False) -> dict[str, Any]:
    """genie_config.json as AI Hub exports it for a Llama-family model (facts/genie.md). With rope scaling
    the model block carries `positional-encoding` (theta and every scaling field copied); without it
    `pos-id-dim` and `rope-theta` go under QnnHtp, as facts/genie.md says. Raises BundleError for a rope
    scaling Genie cannot express."""
    eos = hf_config.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else [eos]
    sampler = sampler or {"seed": 42, "temp": 0.0, "top_k": 1, "top_p": 1.0}
    theta, _ = rope_settings(hf_config)
    scaling = genie_rope_scaling(hf_config)
    backend: dict[str, Any] = {
        "type": "QnnHtp",
        "QnnHtp": {"use-mmap": True, "spill-fill-bufsize": 0, "mmap-budget": 0, "poll": True,
                   "cpu-mask": "0xe0", "kv-dim": kv_dim, "allow-async-init": False},
        "extensions": "htp_backend_ext_config.json",
    }
    model: dict[str, Any] = {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": ctx_bins}}
    if scaling is not None:
        model["positional-encoding"] = {"type": "rope", "rope-dim": kv_dim // 2, "rope-theta": theta,
                                        "rope-scaling": scaling}
    else:
        backend["QnnHtp"].update({"pos-id-dim": kv_dim // 2, "rope-theta": theta})
    cfg: dict[str, Any] = {"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": context_length, "n-vocab": int(hf_config["vocab_size"]),
                    "bos-token": hf_config.get("bos_token_id"), "eos-token": eos_list},
        "sampler": {"version": 1, "seed": sampler["seed"], "temp": sampler["temp"], "top-k": sampler["top_k"],
                    "top-p": sampler["top_p"]},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {"version": 1, "n-threads": 3, "backend": backend, "model": model},
    }}
    if simulated:
        cfg["dialog"]["engine"]["backend"]["type"] = "HexStudioSimulator"
    return cfg


def genie_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope settings a genie_config.json carries: {"theta", "dim", "scaling"} from either place."""
    engine = cfg["dialog"]["engine"]
    pe = engine["model"].get("positional-encoding")
    if pe is not None:
        return {"theta": pe.get("rope-theta"), "dim": pe.get("rope-dim"), "scaling": pe.get("rope-scaling")}
    htp = engine["backend"].get("QnnHtp") or {}
    return {"theta": htp.get("rope-theta"), "dim": htp.get("pos-id-dim"), "scaling": None}


def check_genie_config(cfg: dict[str, Any], hf_config: dict[str, Any], compiled_context: int) -> None:
    """The checks before a bundle is written. `compiled_context`: the context length the graphs were
    exported/compiled with (from their names or shapes), never the config's own value."""
    d = cfg["dialog"]
    if d["context"]["size"] != compiled_context:
        raise BundleError(f"genie_config context size {d['context']['size']} differs from the compiled context "
                          f"length {compiled_context}: Genie would produce garbage or crash. Recompile at "
                          f"{d['context']['size']}, or write the config with context size {compiled_context}.")
    theta, _ = rope_settings(hf_config)
    got = genie_rope(cfg)
    diffs = []
    if got["theta"] is None or float(got["theta"]) != theta:
        diffs.append(f"rope-theta {got['theta']} (config.json: {theta})")
    ws: dict[str, Any] = genie_rope_scaling(hf_config) or {}
    gs: dict[str, Any] = got["scaling"] or {}
    for k in sorted(set(ws) | set(gs)):
        if ws.get(k) != gs.get(k):
            diffs.append(f"{k} {gs.get(k)} (config.json: {ws.get(k)})")
    if diffs:
        raise BundleError("The bundle's rope settings differ from the model's config.json (" + "; ".join(diffs)
                          + "): the model would produce degenerate output. Write genie_config.json again from "
                          "the Hugging Face config (hexstudio bundle config shows what it should hold).")


def htp_ext_config(dev: dict[str, Any]) -> dict[str, Any]:
    return {"devices": [{"soc_model": dev["soc_model"], "dsp_arch": dev["dsp_arch"],
                         "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}]}],
            "memory": {"mem_type": "shared_buffer"}, "context": {"weight_sharing_enabled": True}}


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


def write_manifest(bundle_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """bundle.json, written last (atomically): every other file with sha256 and size."""
    files = []
    for p in sorted(bundle_dir.rglob("*")):
        if p.is_file() and p.name != "bundle.json":
            files.append({"path": p.relative_to(bundle_dir).as_posix(), "sha256": sha256_file(p),
                          "size": p.stat().st_size})
    doc = {"bundle_version": 1, **meta, "files": files}
    tmp = bundle_dir / ".bundle.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2))
    os.replace(tmp, bundle_dir / "bundle.json")
    return doc


def verify_bundle(bundle_dir: Path) -> list[str]:
    """Problems found (empty when every file matches bundle.json)."""
    try:
        doc = json.loads((bundle_dir / "bundle.json").read_text())
    except (OSError, json.JSONDecodeError) as exc:
        return [f"bundle.json unreadable: {exc}"]
    from workers.bundle.safepath import UnsafePath, check_bundle_files, resolve_under

    try:   # every path is checked before any is opened (issue 18: a crafted bundle must not reach outside)
        files = check_bundle_files(doc.get("files") if isinstance(doc, dict) else None)
        for i, f in enumerate(files):
            resolve_under(bundle_dir, f["path"], f"bundle.json files[{i}]")
    except UnsafePath as exc:
        return [str(exc)]
    bad = []
    for f in doc["files"]:
        p = bundle_dir / f["path"]
        if not p.is_file():
            bad.append(f"missing {f['path']}")
        elif p.stat().st_size != f["size"] or sha256_file(p) != f["sha256"]:
            bad.append(f"changed {f['path']}")
    return bad
