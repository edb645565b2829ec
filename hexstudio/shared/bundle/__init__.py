"""The Genie bundle writer: genie_config.json, htp_backend_ext_config.json, tool-versions.yaml and
bundle.json (docs/CONTRACTS.md §3; shapes from facts/genie.md). Pure Python: hexstudio.core imports it
for `hexstudio bundle config`."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any

from hexstudio.shared.bundle.dialog_tokens import DialogTokens, genie_bos, genie_eos
from hexstudio.shared.errors import ActionableError

# AI Hub device attributes HexStudio knows offline (facts/board.md). The live list comes from AI Hub.
KNOWN_DEVICES: dict[str, dict[str, Any]] = {
    "Dragonwing IQ-9075 EVK": {
        "soc_model": 77,
        "dsp_arch": "v73",
        "chipset": "qualcomm-qcs9075",
        "os": "qc_linux",
        "weight_sharing": True,
    },
    "SA8255P ADP": {
        "soc_model": 52,
        "dsp_arch": "v73",
        "chipset": "qualcomm-sa8255p",
        "os": "android",
        "weight_sharing": True,
    },
    "Snapdragon 8 Gen 2 QRD": {
        "soc_model": 43,
        "dsp_arch": "v73",
        "chipset": "qualcomm-snapdragon-8gen2",
        "os": "android",
        "weight_sharing": True,
    },
    "Snapdragon 8 Gen 3 QRD": {
        "soc_model": 57,
        "dsp_arch": "v75",
        "chipset": "qualcomm-snapdragon-8gen3",
        "os": "android",
        "weight_sharing": True,
    },
    "Snapdragon 8 Elite QRD": {
        "soc_model": 69,
        "dsp_arch": "v79",
        "chipset": "qualcomm-snapdragon-8-elite",
        "os": "android",
        "weight_sharing": True,
    },
    "Snapdragon X Elite CRD": {
        "soc_model": 60,
        "dsp_arch": "v73",
        "chipset": "qualcomm-snapdragon-x-elite",
        "os": "windows",
        "weight_sharing": True,
    },
}
SIMULATOR_DEVICE = {
    "name": "HexStudio simulator",
    "soc_model": 0,
    "dsp_arch": "sim",
    "attributes": ["simulated"],
}


class BundleError(ActionableError, ValueError):
    """A check before writing failed; the message says what to change."""


def genie_sampler_keys(sampler: dict[str, Any]) -> dict[str, Any]:
    """A sampler in genie_config.json's spelling (top-k, top-p) from the run settings' (top_k, top_p)."""
    return {k.replace("_", "-"): v for k, v in sampler.items()}


def run_sampler_keys(sampler: dict[str, Any]) -> dict[str, Any]:
    """A sampler in the run settings' spelling (top_k, top_p) from genie_config.json's (top-k, top-p)."""
    return {k.replace("-", "_"): v for k, v in sampler.items()}


def version_tuple(v: str) -> tuple[int, ...]:
    """A QAIRT/QNN version's numbers (major, minor, patch) for comparing: "2.42.0.251225" -> (2, 42, 0)."""
    return tuple(int(x) for x in re.findall(r"\d+", v)[:3])


def arch_number(dsp_arch: str) -> int:
    try:
        return int(str(dsp_arch).lstrip("v"))
    except ValueError:
        return 0


def device_info(name: str) -> dict[str, Any]:
    if name not in KNOWN_DEVICES:
        raise BundleError(
            f"Unknown device '{name}'. Known offline: {', '.join(KNOWN_DEVICES)}. "
            "Online, the device list comes from AI Hub (hexstudio bundle devices)."
        )
    return {"name": name, **KNOWN_DEVICES[name]}


def check_device(dev: dict[str, Any], lpbq: bool = True) -> None:
    """Refuse a device the bundle cannot run on. LPBQ (int4 blockwise) weights need v69+; the Genie bundle's
    weight sharing needs v73+ and the device's `htp-supports-weight-sharing` (facts/aihub.md)."""
    if dev.get("dsp_arch") == "sim":
        return
    n = arch_number(dev["dsp_arch"])
    if lpbq and n < 69:
        raise BundleError(
            f"{dev['name']} ({dev['dsp_arch']}) cannot run LPBQ (int4 blockwise) weights, which this "
            "W4A16 model uses: that needs Hexagon v69 or newer. Use a v73+ device such as the "
            "Dragonwing IQ-9075 EVK."
        )
    if n < 73 or not dev.get("weight_sharing", True):
        raise BundleError(
            f"{dev['name']} ({dev['dsp_arch']}) does not support weight sharing, which the Genie "
            "bundle needs (prompt processor and token generator share one set of weights): use a "
            "Hexagon v73 or newer device."
        )


_CL_RE = re.compile(r"_cl(\d+)(?:_|$)")


def compiled_context_length(graph_names: list[str]) -> int:
    """The largest context length baked into the graphs, from their names (`prompt_ar128_cl4096_1_of_5`): what
    genie_config's context size must be (Genie runs the smaller CL variants of a bundle first and switches up).
    Raises BundleError when a name carries none, or when a context length lacks a graph the others have (every
    CL needs every kind of every part)."""
    found: dict[str, int] = {}
    for name in graph_names:
        m = _CL_RE.search(name)
        if m is None:
            raise BundleError(
                f"Graph '{name}' does not name its context length (`_cl<N>_`), so the bundle's "
                "context size cannot be checked against it. Re-run the Quantize stage."
            )
        found[name] = int(m.group(1))
    values = sorted(set(found.values()))
    if not values:
        raise BundleError(
            "There are no graphs to check the context length against. Re-run the Quantize stage."
        )
    by_cl = {v: sorted(_CL_RE.sub("_cl*_", n) for n, c in found.items() if c == v) for v in values}
    full = by_cl[values[-1]]
    for v, names in by_cl.items():
        if names != full:
            missing = sorted(set(full) - set(names)) or sorted(set(names) - set(full))
            raise BundleError(
                f"The graphs for context length {v} are not the same set as for {values[-1]} "
                f"({', '.join(n.replace('_cl*_', f'_cl{v}_') for n in missing)}): Genie needs every "
                "graph at every context length. Re-run the Quantize stage."
            )
    return values[-1]


def rope_settings(hf_config: dict[str, Any]) -> tuple[float, dict[str, Any] | None]:
    """(rope theta, rope scaling or None) from either config.json layout (hexstudio.shared.rope.rope_settings)."""
    from hexstudio.shared import rope

    return rope.rope_settings(hf_config)


def genie_positional_encoding(hf_config: dict[str, Any], context_size: int) -> dict[str, Any]:
    """genie_config.json's `model.positional-encoding` for this model at `context_size` tokens: every value
    from the model's own config.json, checked numerically against the model's rope (hexstudio.shared.rope). Raises
    BundleError for a rope Genie cannot reproduce."""
    from hexstudio.shared import rope

    try:
        return rope.genie_positional_encoding(hf_config, context_size)
    except (rope.RopeError, KeyError, TypeError, ValueError) as exc:
        raise BundleError(str(exc)) from None


def ctx_bin_name(model: str, part: int, parts: int) -> str:
    """A context binary's name as the compile writes it: `<model>_part_{i}_of_{n}.bin` as qai-hub-models names
    them, the part zero-padded to the count's width (part_label: `_part_03_of_12`)."""
    return f"{model}_part_{part_label(part, parts)}.bin"


def model_slug(name: str) -> str:
    """A file-name-safe model name (`meta-llama/Llama-3.1-8B-Instruct` -> `llama_3_1_8b_instruct`)."""
    base = name.rstrip("/").rsplit("/", 1)[-1] or "model"
    return re.sub(r"[^a-z0-9]+", "_", base.lower()).strip("_") or "model"


def _token_id(v: Any, what: str) -> int:
    if isinstance(v, bool) or not isinstance(v, int):
        raise BundleError(
            f"config.json's {what} is {v!r}, not a token id: Genie needs a number there. Fix the "
            "model's config.json."
        )
    return v


def genie_config(
    hf_config: dict[str, Any],
    context_length: int,
    ctx_bins: list[str],
    kv_dim: int,
    sampler: dict[str, Any] | None = None,
    simulated: bool = False,
    tokens: DialogTokens | None = None,
) -> dict[str, Any]:
    """genie_config.json as Genie 1.13 accepts it (hexstudio/shared/bundle/genie_schema.py) and qai-hub-models writes it
    (qai_hub_models/utils/llm_helpers.py): version 1 in every section, every mandatory key, the sampler always,
    bos-token a number (-1: none), eos-token a number or an array, kv-dim = head_dim, and the model's own rope as
    `model.positional-encoding` (hexstudio.shared.rope; never pos-id-dim/rope-theta under QnnHtp). A simulation bundle
    gets the same config (backend QnnHtp): bundle.json marks it simulated. With the tokenizer's `tokens`, the
    eos ids are reordered and a BOS it never adds dropped (dialog_tokens.py). Raises BundleError for a rope Genie
    cannot express or a config.json without an eos token."""
    del simulated  # the simulator board reads the very same config
    eos = hf_config.get("eos_token_id")
    if eos is None or eos == []:
        raise BundleError(
            "config.json has no eos_token_id: Genie needs one to stop a reply. Fix the model's "
            "config.json (its generation_config.json usually names it)."
        )
    eos_out: int | list[int] = (
        [_token_id(e, "eos_token_id") for e in eos]
        if isinstance(eos, list)
        else _token_id(eos, "eos_token_id")
    )
    # the turn's end first, no BOS the tokenizer never adds (hexstudio/shared/bundle/dialog_tokens.py)
    eos_out = genie_eos(eos_out, tokens)
    bos = hf_config.get("bos_token_id")
    bos_out = -1 if bos is None else genie_bos(_token_id(bos, "bos_token_id"), tokens)
    sampler = sampler or {"seed": 42, "temp": 0.0, "top_k": 1, "top_p": 1.0}
    pe = genie_positional_encoding(hf_config, context_length)
    return {
        "dialog": {
            "version": 1,
            "type": "basic",
            "context": {
                "version": 1,
                "size": int(context_length),
                "n-vocab": int(hf_config["vocab_size"]),
                "bos-token": bos_out,
                "eos-token": eos_out,
            },
            # the four keys Genie needs, in its spelling (a KeyError for a sampler without one of them)
            "sampler": {
                "version": 1,
                **genie_sampler_keys({k: sampler[k] for k in ("seed", "temp", "top_k", "top_p")}),
            },
            "tokenizer": {"version": 1, "path": "tokenizer.json"},
            "engine": {
                "version": 1,
                "n-threads": 3,
                "backend": {
                    "version": 1,
                    "type": "QnnHtp",
                    "QnnHtp": {
                        "version": 1,
                        "use-mmap": True,
                        "spill-fill-bufsize": 0,
                        "mmap-budget": 0,
                        "poll": True,
                        "cpu-mask": "0xe0",
                        "kv-dim": int(kv_dim),
                        "allow-async-init": False,
                    },
                    "extensions": "htp_backend_ext_config.json",
                },
                "model": {
                    "version": 1,
                    "type": "binary",
                    "binary": {"version": 1, "ctx-bins": list(ctx_bins)},
                    "positional-encoding": pe,
                },
            },
        }
    }


def genie_rope(cfg: dict[str, Any]) -> dict[str, Any]:
    """The rope settings a genie_config.json carries: {"theta", "dim", "scaling"} from either place."""
    engine = cfg["dialog"]["engine"]
    pe = engine["model"].get("positional-encoding")
    if pe is not None:
        return {"theta": pe.get("rope-theta"), "dim": pe.get("rope-dim"), "scaling": pe.get("rope-scaling")}
    htp = engine["backend"].get("QnnHtp") or {}
    return {"theta": htp.get("rope-theta"), "dim": htp.get("pos-id-dim"), "scaling": None}


def check_genie_config(cfg: dict[str, Any], hf_config: dict[str, Any], compiled_context: int) -> None:
    """The checks before a bundle is written: Genie's schema (its own messages), the context size against the
    context length the graphs were exported/compiled with (from their names or shapes, never the config's own
    value), kv-dim against head_dim, and the rope Genie computes from the config against the model's, numerically
    (hexstudio.shared.rope.rope_mismatch)."""
    from hexstudio.shared import rope
    from hexstudio.shared.bundle.genie_schema import dialog_create_errors, genie_config_errors

    problems = genie_config_errors(cfg) + [i.message for i in dialog_create_errors(cfg)]
    if problems:
        raise BundleError(
            "genie_config.json would be refused by Genie: "
            + "; ".join(problems)
            + ". Write it again with `hexstudio bundle config`."
        )
    d = cfg["dialog"]
    if d["context"]["size"] != compiled_context:
        raise BundleError(
            f"genie_config context size {d['context']['size']} differs from the compiled context "
            f"length {compiled_context}: Genie would produce garbage or crash. Recompile at "
            f"{d['context']['size']}, or write the config with context size {compiled_context}."
        )
    kv = d["engine"]["backend"]["QnnHtp"].get("kv-dim")
    hd = rope.head_dim_of(hf_config)
    if kv != hd:
        raise BundleError(
            f"genie_config kv-dim {kv} differs from the model's head_dim {hd}: Genie would refuse the "
            "KV tensors' shapes. Write the config again."
        )
    htp = d["engine"]["backend"]["QnnHtp"]
    pe = d["engine"]["model"].get("positional-encoding") or {
        "type": "rope",
        "rope-dim": htp.get("pos-id-dim", 64),
        "rope-theta": htp.get("rope-theta", 10000),
    }
    diff = rope.rope_mismatch(pe, hf_config, int(d["context"]["size"]))
    if diff is not None:
        raise BundleError(
            f"The bundle's rope settings differ from the model's config.json ({diff}): the model would "
            "produce degenerate output. Write genie_config.json again from the Hugging Face config "
            "(hexstudio bundle config shows what it should hold)."
        )


def part_label(part: int, parts: int) -> str:
    """`3_of_5`, zero-padded to the count's width (`03_of_12`): Genie orders a group's graphs by name."""
    return f"{part:0{len(str(parts))}d}_of_{parts}"


def htp_ext_config(dev: dict[str, Any]) -> dict[str, Any]:
    return {
        "devices": [
            {
                "soc_model": dev["soc_model"],
                "dsp_arch": dev["dsp_arch"],
                "cores": [{"core_id": 0, "perf_profile": "burst", "rpc_control_latency": 100}],
            }
        ],
        "memory": {"mem_type": "shared_buffer"},
        "context": {"weight_sharing_enabled": True},
    }


def bundle_qairt_version(bundle_dir: Path) -> str | None:
    """`qairt:` of the bundle's tool-versions.yaml (None when absent, empty or a simulation bundle's)."""
    p = Path(bundle_dir) / "tool-versions.yaml"
    if not p.is_file():
        return None
    for line in p.read_text(errors="replace").splitlines():
        k, _, v = line.partition(":")
        if k.strip() == "qairt":
            v = v.strip().strip("'\"")
            return None if not v or v == "simulator" else v
    return None


def sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while chunk := fh.read(1 << 20):
            h.update(chunk)
    return h.hexdigest()


MODEL_FILES = ("tokenizer.json", "tokenizer_config.json", "config.json")


def copy_model_files(hf_dir: Path, bundle_dir: Path) -> None:
    """The model's tokenizer and configs beside the binaries (Genie reads tokenizer.json; the checks and GenieX read
    the others). BundleError when there is no tokenizer.json: Genie cannot run without one."""
    for f in MODEL_FILES:
        if (hf_dir / f).is_file():
            shutil.copy2(hf_dir / f, bundle_dir / f)
    if not (bundle_dir / "tokenizer.json").is_file():
        raise BundleError(
            f"{hf_dir} has no tokenizer.json: Genie needs one. Use a model with a fast tokenizer "
            "(tokenizer.json)."
        )


def write_manifest(bundle_dir: Path, meta: dict[str, Any]) -> dict[str, Any]:
    """bundle.json, written last (atomically): every other file with sha256 and size."""
    files = []
    for p in sorted(bundle_dir.rglob("*")):
        if p.is_file() and p.name != "bundle.json":
            files.append(
                {
                    "path": p.relative_to(bundle_dir).as_posix(),
                    "sha256": sha256_file(p),
                    "size": p.stat().st_size,
                }
            )
    doc = {"bundle_version": 1, **meta, "files": files}
    tmp = bundle_dir / ".bundle.json.tmp"
    tmp.write_text(json.dumps(doc, indent=2))
    os.replace(tmp, bundle_dir / "bundle.json")
    return doc


def verify_bundle(bundle_dir: Path) -> list[str]:
    """Problems found (empty when every file matches bundle.json)."""
    try:
        doc = json.loads((bundle_dir / "bundle.json").read_text())
    except FileNotFoundError:
        return [
            f"{bundle_dir} has no bundle.json (HexStudio writes one with every bundle it compiles): give the "
            "Compile stage's bundle folder, runs/<RUN>/artifacts/compile/bundle."
        ]
    except (OSError, json.JSONDecodeError) as exc:
        return [f"bundle.json unreadable: {exc}"]
    from hexstudio.shared.bundle.safepath import UnsafePath, check_bundle_files, resolve_under

    try:  # every path is checked before any is opened (issue 18: a crafted bundle must not reach outside)
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
