"""The Genie bundle writer: genie_config.json, htp_backend_ext_config.json, tool-versions.yaml and
bundle.json (docs/CONTRACTS.md §3; shapes from facts/genie.md). Pure Python: app.core imports it
for `hexstudio bundle config`."""

from __future__ import annotations

import hashlib
import json
import os
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
    if dev.get("dsp_arch") == "sim":
        return
    n = arch_number(dev["dsp_arch"])
    if n < 73 or not dev.get("weight_sharing", True):
        raise BundleError(f"{dev['name']} ({dev['dsp_arch']}) does not support weight sharing, which the Genie "
                          "bundle needs (prompt processor and token generator share one set of weights): use a "
                          "Hexagon v73 or newer device.")
    if lpbq and n < 69:
        raise BundleError(f"{dev['name']} ({dev['dsp_arch']}) cannot run LPBQ (int4 blockwise) weights: v69+.")


def genie_config(hf_config: dict[str, Any], context_length: int, ctx_bins: list[str], kv_dim: int,
                 sampler: dict[str, Any] | None = None, simulated: bool = False) -> dict[str, Any]:
    """genie_config.json as AI Hub exports it for a Llama-family model (facts/genie.md)."""
    eos = hf_config.get("eos_token_id")
    eos_list = eos if isinstance(eos, list) else [eos]
    sampler = sampler or {"seed": 42, "temp": 0.0, "top_k": 1, "top_p": 1.0}
    rope: dict[str, Any] = {"type": "rope", "rope-dim": kv_dim // 2,
                            "rope-theta": float(hf_config.get("rope_theta", 10000.0))}
    rs = hf_config.get("rope_scaling")
    if rs:
        rope["rope-scaling"] = {
            "rope-type": rs.get("rope_type", rs.get("type")), "factor": float(rs["factor"]),
            "low-freq-factor": float(rs.get("low_freq_factor", 1.0)),
            "high-freq-factor": float(rs.get("high_freq_factor", 4.0)),
            "original-max-position-embeddings": int(rs.get("original_max_position_embeddings", 8192)),
        }
    backend: dict[str, Any] = {
        "type": "QnnHtp",
        "QnnHtp": {"use-mmap": True, "spill-fill-bufsize": 0, "mmap-budget": 0, "poll": True,
                   "cpu-mask": "0xe0", "kv-dim": kv_dim, "allow-async-init": False},
        "extensions": "htp_backend_ext_config.json",
    }
    cfg: dict[str, Any] = {"dialog": {
        "version": 1, "type": "basic",
        "context": {"version": 1, "size": context_length, "n-vocab": int(hf_config["vocab_size"]),
                    "bos-token": hf_config.get("bos_token_id"), "eos-token": eos_list},
        "sampler": {"version": 1, "seed": sampler["seed"], "temp": sampler["temp"], "top-k": sampler["top_k"],
                    "top-p": sampler["top_p"]},
        "tokenizer": {"version": 1, "path": "tokenizer.json"},
        "engine": {"version": 1, "n-threads": 3, "backend": backend,
                   "model": {"version": 1, "type": "binary", "binary": {"version": 1, "ctx-bins": ctx_bins},
                             "positional-encoding": rope}},
    }}
    if simulated:
        cfg["dialog"]["engine"]["backend"]["type"] = "HexStudioSimulator"
    return cfg


def check_genie_config(cfg: dict[str, Any], hf_config: dict[str, Any], compiled_context: int) -> None:
    d = cfg["dialog"]
    if d["context"]["size"] != compiled_context:
        raise BundleError(f"genie_config context size {d['context']['size']} differs from the compiled context "
                          f"length {compiled_context}: Genie would produce garbage or crash. Recompile or fix it.")
    rs = hf_config.get("rope_scaling")
    got = d["engine"]["model"]["positional-encoding"].get("rope-scaling")
    if rs and (not got or float(got["factor"]) != float(rs["factor"])
               or got["rope-type"] != rs.get("rope_type", rs.get("type"))):
        raise BundleError("The bundle's rope scaling differs from the model's config.json: the model would "
                          "produce degenerate output. Copy rope_scaling from the Hugging Face config.")


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
    bad = []
    for f in doc["files"]:
        p = bundle_dir / f["path"]
        if not p.is_file():
            bad.append(f"missing {f['path']}")
        elif p.stat().st_size != f["size"] or sha256_file(p) != f["sha256"]:
            bad.append(f"changed {f['path']}")
    return bad
