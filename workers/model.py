"""Model stage: resolve the model (built-in, Hugging Face id or local folder), check its files,
inspect it and fix the run's context length, AR-N and parts.

Writes model.json (docs/CONTRACTS.md §1). The built-in model is copied into hf/; a Hugging
Face download stays in the hub cache (16 GB is not copied); a local folder is referenced.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
from pathlib import Path
from typing import Any

from workers import modelinfo
from workers.protocol import Emitter
from workers.runtime import WorkerError, WorkerSpec, worker_main

BUILTIN_ID = "builtin:tiny-llama"
BUILTIN_DIR = Path(__file__).resolve().parents[1] / "resources" / "builtin_model" / "tiny-llama"
DEFAULT_CONTEXT = {"builtin": 512, "other": 4096}


def check_safetensors(path: Path) -> int:
    """Validate a .safetensors file's header and size without loading it; returns tensor count."""
    size = path.stat().st_size
    try:
        with open(path, "rb") as fh:
            head = fh.read(8)
            if len(head) < 8:
                raise ValueError("shorter than its 8-byte header length")
            (n,) = struct.unpack("<Q", head)
            if n > size - 8 or n > 100 * 1024 * 1024:
                raise ValueError("its header length points past the end of the file")
            header = json.loads(fh.read(n))
    except (ValueError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WorkerError("corrupt_weights", f"{path.name} is not a valid safetensors file: {exc}.",
                          f"Delete {path} and download the model again (a partial download looks like this).") \
            from None
    end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    if 8 + n + end != size:
        raise WorkerError("corrupt_weights",
                          f"{path.name} is truncated or padded: its header describes {8 + n + end:,} bytes but "
                          f"the file has {size:,}.",
                          f"Delete {path} and download the model again.")
    return sum(1 for k in header if k != "__metadata__")


def check_weights(folder: Path) -> dict[str, Any]:
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        try:
            wanted = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise WorkerError("corrupt_weights", f"{index.name} cannot be read ({exc}).",
                              "Download the model again.") from None
        missing = [w for w in wanted if not (folder / w).is_file()]
        if missing:
            raise WorkerError("missing_weights", f"{len(missing)} weight file(s) listed in {index.name} are "
                              f"missing: {', '.join(missing[:5])}.",
                              "The download was interrupted: run the Model stage again to resume it.")
    if not files:
        raise WorkerError("missing_weights", f"No *.safetensors weights in {folder}.",
                          "HexStudio reads safetensors weights only. Convert .bin weights with transformers "
                          "(save_pretrained(safe_serialization=True)) or download the safetensors revision.")
    tensors = sum(check_safetensors(f) for f in files)
    return {"files": [f.name for f in files], "tensors": tensors,
            "bytes": sum(f.stat().st_size for f in files)}


def download(model_id: str, revision: str | None, em: Emitter) -> tuple[Path, str | None]:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import (
        GatedRepoError,
        LocalEntryNotFoundError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    em.progress(0.05, f"downloading {model_id} from Hugging Face (resumes where it stopped)")
    token = os.environ.get("HF_TOKEN") or None
    try:
        path = snapshot_download(model_id, revision=revision, token=token,
                                 allow_patterns=["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt"])
    except GatedRepoError:
        raise WorkerError("gated_model", f"{model_id} is a gated model: its licence must be accepted first.",
                          f"Open https://huggingface.co/{model_id}, accept the licence with your account, then "
                          "store your Hugging Face token in HexStudio (Settings) or run `hf auth login`.") from None
    except RepositoryNotFoundError:
        raise WorkerError("model_not_found", f"Hugging Face has no model '{model_id}' (or it is private).",
                          "Check the spelling (owner/name), or log in if it is private.") from None
    except RevisionNotFoundError:
        raise WorkerError("revision_not_found", f"{model_id} has no revision '{revision}'.",
                          "Use a branch, tag or commit that exists.") from None
    except LocalEntryNotFoundError:
        raise WorkerError("offline", f"{model_id} is not in the local Hugging Face cache and the hub cannot "
                          "be reached.", "Connect to the internet (or unset HF_HUB_OFFLINE), or point "
                          "HexStudio at a local folder with the model.") from None
    return Path(path), Path(path).name


def resolve_source(model: str, spec: WorkerSpec, em: Emitter) -> tuple[str, Path, str | None]:
    if model == BUILTIN_ID:
        if not (BUILTIN_DIR / "config.json").is_file():
            raise WorkerError("builtin_missing", f"The built-in model is missing from {BUILTIN_DIR}.",
                              "Reinstall HexStudio, or rebuild it with resources/builtin_model/train_tiny_llama.py.")
        dest = spec.out_dir / "hf"
        shutil.copytree(BUILTIN_DIR, dest, ignore=shutil.ignore_patterns("training.json"))
        return "builtin", dest, None
    if model.startswith("builtin:"):
        raise WorkerError("unknown_builtin", f"There is no built-in model '{model}'.",
                          f"The built-in model is {BUILTIN_ID}.")
    p = Path(model).expanduser()
    if p.is_dir():
        return "local", p.resolve(), None
    if model.startswith(("/", ".", "~")) or model.count("/") != 1:
        raise WorkerError("model_not_found", f"'{model}' is neither a folder nor a Hugging Face id (owner/name).",
                          f"Give {BUILTIN_ID}, a Hugging Face id like meta-llama/Llama-3.1-8B-Instruct, or a "
                          "folder holding config.json and *.safetensors.")
    path, rev = download(model, spec.settings.get("revision"), em)
    return "huggingface", path, rev


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    model = str(spec.inputs.get("model") or BUILTIN_ID)
    em.progress(0.0, f"resolving {model}")
    source, hf_dir, revision = resolve_source(model, spec, em)
    em.progress(0.6, "inspecting config.json")
    try:
        info = modelinfo.inspect_folder(hf_dir)
    except modelinfo.ModelInfoError as exc:
        raise WorkerError("bad_config", str(exc)) from None
    if not info["supported"]:
        raise WorkerError("unsupported_architecture", info["reason"],
                          "Pick a dense Llama-family model (Llama 3.x, Nemotron-Nano-8B, Qwen2/Qwen3 dense).")
    if not info["files"]["tokenizer"]:
        raise WorkerError("missing_tokenizer", f"{hf_dir} has no tokenizer.json.",
                          "Genie needs tokenizer.json (the fast tokenizer). Download it with the model.")
    em.progress(0.7, "checking the weight files")
    weights = check_weights(hf_dir)
    s = spec.settings
    ctx = s.get("context_length", "auto")
    context_length = int(DEFAULT_CONTEXT["builtin" if source == "builtin" else "other"] if ctx in (None, "auto")
                         else ctx)
    ar_n = int(s.get("ar_n", 128))
    err = modelinfo.check_context(info, context_length, ar_n)
    if err:
        raise WorkerError("bad_context_length", err, "Change the context length in the run settings.")
    parts_setting = s.get("parts", "auto")
    parts = modelinfo.default_parts(info) if parts_setting in (None, "auto") else int(parts_setting)
    if not 1 <= parts <= info["num_layers"]:
        raise WorkerError("bad_parts", f"parts must be between 1 and the layer count ({info['num_layers']}).")
    est = modelinfo.estimate(info, context_length, ar_n, parts, int(s.get("calibration_samples", 8)),
                             int(s.get("calibration_seq_len", 128)))
    # a copy inside this stage's folder is recorded relative to model.json (the folder is renamed when
    # the stage completes); a download or a local folder by its absolute path
    rel = hf_dir.relative_to(spec.out_dir).as_posix() if hf_dir.is_relative_to(spec.out_dir) else str(hf_dir)
    doc = {"model": model, "source": source, "revision": revision, "hf_dir": rel, "info": info,
           "weights": weights, "resolved": {"context_length": context_length, "ar_n": ar_n, "parts": parts},
           "estimates": est}
    (spec.out_dir / "model.json").write_text(json.dumps(doc, indent=2))
    em.artifact("model.json", kind="json", role="model")
    for key in ("num_parameters", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "vocab_size"):
        em.metric(key, info[key])
    em.metric("context_length", context_length)
    em.metric("parts", parts)
    em.metric("quantize_peak_rss_estimate_bytes", est["quantize_peak_rss_bytes"], unit="bytes")
    em.progress(1.0, f"{info['architecture']}, {info['num_parameters']:,} parameters, {parts} part(s)")
    return {"architecture": info["architecture"], "source": source, "context_length": context_length,
            "parts": parts}


if __name__ == "__main__":
    raise SystemExit(worker_main("model", run))
