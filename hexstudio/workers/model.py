"""Model stage: resolve the model (built-in, Hugging Face id or local folder), check its files,
inspect it and fix the run's context length, AR-N and parts.

Writes model.json (docs/CONTRACTS.md §1). The built-in model is copied into hf/; a Hugging
Face download stays in the hub cache (16 GB is not copied); a local folder is referenced.
"""

from __future__ import annotations

import fnmatch
import json
import shutil
import struct
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.shared import modelinfo
from hexstudio.shared.artifacts import ModelDoc
from hexstudio.shared.data import BUILTIN_MODELS, builtin_model_dir
from hexstudio.shared.hub import HubError, hub_error, hub_token, model_spec_problem
from hexstudio.shared.protocol import Emitter
from hexstudio.shared.run_settings import (
    AUTO,
    ResolvedSettings,
    RunSettings,
    genie_cl_problem,
    resolve_settings,
)
from hexstudio.workers.runtime import WorkerError, WorkerSpec, worker_main

BUILTIN_ID = "builtin:tiny-llama"
BUILTIN_DIR = builtin_model_dir()  # package data (importlib.resources)


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
        if not isinstance(header, dict):
            raise ValueError("its header is not a JSON object")
        # every tensor's [begin, end) in the data: a header without them describes no tensor
        spans = [
            v.get("data_offsets") if isinstance(v, dict) else None
            for k, v in header.items()
            if k != "__metadata__"
        ]
        if not all(isinstance(o, list) and len(o) == 2 and all(isinstance(x, int) for x in o) for o in spans):
            raise ValueError("a tensor in its header has no valid data_offsets")
    except (ValueError, json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise WorkerError(
            "corrupt_weights",
            f"{path.name} is not a valid safetensors file: {exc}.",
            f"Delete {path} and download the model again (a partial download looks like this).",
        ) from None
    end = max((int(o[1]) for o in spans), default=0)  # type: ignore[index]
    if 8 + n + end != size:
        raise WorkerError(
            "corrupt_weights",
            f"{path.name} is truncated or padded: its header describes {8 + n + end:,} bytes but "
            f"the file has {size:,}.",
            f"Delete {path} and download the model again.",
        )
    return sum(1 for k in header if k != "__metadata__")


# floating dtypes of safetensors: (bytes per value, the exponent bits that are all ones for NaN/Inf)
_FLOAT_BITS = {
    "F32": (4, 0x7F800000),
    "F16": (2, 0x7C00),
    "BF16": (2, 0x7F80),
    "F64": (8, 0x7FF0000000000000),
}
NAN_SCAN_CHUNK = 64 << 20


def check_finite(path: Path) -> None:
    """Raise WorkerError naming the first tensor holding a NaN or an infinity. Reads the file once, a block at
    a time, comparing exponent bits (no float conversion): a model with such weights quantizes to garbage."""
    import numpy as np

    with open(path, "rb") as fh:
        (n,) = struct.unpack("<Q", fh.read(8))
        header = json.loads(fh.read(n))
    base = 8 + n
    uint = {2: np.uint16, 4: np.uint32, 8: np.uint64}
    mm = np.memmap(path, dtype=np.uint8, mode="r")
    for name, t in sorted(
        header.items(), key=lambda kv: kv[1]["data_offsets"][0] if kv[0] != "__metadata__" else -1
    ):
        if name == "__metadata__" or t.get("dtype") not in _FLOAT_BITS:
            continue
        width, mask = _FLOAT_BITS[t["dtype"]]
        start, end = (base + int(o) for o in t["data_offsets"])
        step = NAN_SCAN_CHUNK - NAN_SCAN_CHUNK % width
        for off in range(start, end, step):
            block = np.asarray(mm[off : min(end, off + step)]).view(uint[width])
            bad = np.flatnonzero((block & uint[width](mask)) == uint[width](mask))
            if bad.size:
                raise WorkerError(
                    "non_finite_weights",
                    f"{path.name}: tensor {name} holds NaN or infinite values (first at element "
                    f"{(off - start) // width + int(bad[0]):,} of {t.get('shape')}).",
                    "These weights are broken (a bad conversion or fine-tune): quantizing them gives "
                    "garbage. Use the original model files, or fix the checkpoint and run again.",
                )
    del mm


def check_tokenizer(folder: Path) -> None:
    path = folder / "tokenizer.json"
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise WorkerError(
            "corrupt_tokenizer",
            f"{path} cannot be read as JSON ({exc}).",
            "Download the model again (tokenizer.json was cut short or damaged).",
        ) from None
    if not isinstance(doc, dict) or not isinstance(doc.get("model"), dict):
        raise WorkerError(
            "corrupt_tokenizer",
            f"{path} is not a Hugging Face fast tokenizer (no 'model' object).",
            "Download the model's tokenizer.json again; HexStudio and Genie need the fast tokenizer.",
        )


def check_weights(folder: Path) -> dict[str, Any]:
    files = sorted(folder.glob("*.safetensors"))
    index = folder / "model.safetensors.index.json"
    if index.is_file():
        # the shards the index names are the model (a consolidated.safetensors beside them is the same again)
        try:
            wanted = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        except (OSError, json.JSONDecodeError, KeyError) as exc:
            raise WorkerError(
                "corrupt_weights", f"{index.name} cannot be read ({exc}).", "Download the model again."
            ) from None
        missing = [w for w in wanted if not (folder / w).is_file()]
        files = [f for f in files if f.name in wanted]
        if missing:
            raise WorkerError(
                "missing_weights",
                f"{len(missing)} weight file(s) listed in {index.name} are "
                f"missing: {', '.join(missing[:5])}.",
                "The download was interrupted: run the Model stage again to resume it.",
            )
    if not files and any(folder.glob("*.bin")):
        raise WorkerError(
            "missing_weights",
            f"No *.safetensors weights in {folder}, only .bin ones.",
            "HexStudio reads safetensors weights only. Convert .bin weights with transformers "
            "(save_pretrained(safe_serialization=True)) or download the safetensors revision.",
        )
    if not files:  # most often a download that stopped before its weights (an offline cache has them missing)
        raise WorkerError(
            "missing_weights",
            f"No *.safetensors weights in {folder}.",
            "A Hugging Face download that stopped before its weights resumes when you run the Model stage again "
            "(online). A local folder needs the model's *.safetensors files beside its config.json.",
        )
    tensors = sum(check_safetensors(f) for f in files)
    for f in files:
        check_finite(f)
    return {
        "files": [f.name for f in files],
        "tensors": tensors,
        "bytes": sum(f.stat().st_size for f in files),
    }


ALLOW_PATTERNS = ["*.json", "*.safetensors", "*.jinja", "tokenizer*", "*.txt"]
# the repo lookup's time-out (huggingface_hub sets none: a proxy that never answers would hang the stage)
LOOKUP_TIMEOUT_S = 30.0
# no byte arriving for this long ends the download with a network error (it resumes from where it stopped)
STALL_S = 600.0


def allow_patterns(info: Any) -> list[str]:
    """What to fetch from the repo listed as `info` (None: not listed). A repo with Hugging Face shards
    (model*.safetensors) can also hold its authors' own format of the same weights (Mistral's
    consolidated.safetensors, as large again): only the shards are fetched."""
    names = [str(f.rfilename) for f in getattr(info, "siblings", None) or []]
    weights = [n for n in names if n.endswith(".safetensors") and "/" not in n]
    shards = [n for n in weights if n.startswith("model")]
    return list(ALLOW_PATTERNS) if len(shards) == len(weights) else _shards_only(shards)


def _shards_only(shards: list[str]) -> list[str]:
    """The patterns with these weight files by name in place of "*.safetensors" (none: the plain patterns)."""
    return [p for p in ALLOW_PATTERNS if p != "*.safetensors"] + shards if shards else list(ALLOW_PATTERNS)


def offline_patterns(cache: Path, model_id: str, revision: str | None) -> list[str]:
    """What to take from the cache when the repo cannot be listed (offline): a cached snapshot with a shard index
    takes those shards by name, else the plain patterns. With "*.safetensors", huggingface_hub held the cached
    listing's consolidated.safetensors (never fetched: allow_patterns) against the snapshot and called a complete
    model incomplete."""
    from huggingface_hub.file_download import repo_folder_name

    repo = cache / repo_folder_name(repo_id=model_id, repo_type="model")
    ref = repo / "refs" / (revision or "main")
    commit = ref.read_text().strip() if ref.is_file() else (revision or "")
    try:
        doc = json.loads((repo / "snapshots" / commit / "model.safetensors.index.json").read_text())
        shards = sorted({str(v) for v in doc["weight_map"].values()})
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return list(ALLOW_PATTERNS)
    return _shards_only(shards) if commit else list(ALLOW_PATTERNS)


def _expected_blobs(info: Any, patterns: list[str]) -> dict[str, int]:
    """blob name in the cache (LFS sha256, else git blob id) -> size, for the files snapshot_download fetches."""
    out: dict[str, int] = {}
    for f in getattr(info, "siblings", None) or []:
        name = str(f.rfilename)
        if not any(fnmatch.fnmatch(name, p) for p in patterns):
            continue
        lfs = getattr(f, "lfs", None)
        sha = (lfs.get("sha256") if isinstance(lfs, dict) else getattr(lfs, "sha256", None)) if lfs else None
        blob = sha or getattr(f, "blob_id", None)
        size = getattr(f, "size", None) or (
            (lfs.get("size") if isinstance(lfs, dict) else getattr(lfs, "size", 0)) if lfs else 0
        )
        if blob:
            out[str(blob)] = int(size or 0)
    return out


def _bytes_present(blobs_dir: Path, expected: dict[str, int]) -> int:
    done = 0
    for blob, size in expected.items():
        for cand in (blobs_dir / blob, blobs_dir / f"{blob}.incomplete"):
            try:
                done += min(size, cand.stat().st_size) if size else cand.stat().st_size
                break
            except OSError:
                continue
    return done


def download(
    model_id: str,
    revision: str | None,
    em: Emitter,
    *,
    snapshot: Callable[..., str] | None = None,
    repo_info: Callable[..., Any] | None = None,
    cache_dir: Path | None = None,
    poll_s: float = 0.5,
    stall_s: float = STALL_S,
) -> tuple[Path, str | None]:
    """snapshot_download in a thread while this one reports bytes: the repo listing gives each file's size
    and blob name, and the cache's blobs/ folder (with its .incomplete files) how much has arrived.
    `snapshot`, `repo_info` and `cache_dir` are for tests (a local fake of the hub)."""
    from huggingface_hub import constants

    if snapshot is None or repo_info is None:
        from huggingface_hub import HfApi, snapshot_download
        from huggingface_hub.utils import disable_progress_bars

        disable_progress_bars()  # tqdm's \r-redrawn bars would flood the stage log; we report bytes instead
        snapshot = snapshot or snapshot_download
        repo_info = repo_info or HfApi().model_info
    from huggingface_hub.file_download import repo_folder_name

    cache = Path(cache_dir or constants.HF_HUB_CACHE)
    token = hub_token()
    at = f" at revision {revision}" if revision else ""
    em.progress(0.02, f"looking up {model_id}{at} on Hugging Face")
    try:
        info = repo_info(
            model_id, revision=revision, files_metadata=True, token=token, timeout=LOOKUP_TIMEOUT_S
        )
    except Exception as exc:
        mapped = hub_error(exc, model_id, revision, cache, has_token=bool(token))
        if mapped is None:
            raise
        # offline but already cached: let snapshot_download find the local copy
        if mapped.code not in ("offline", "network"):
            raise mapped from None
        info = None
    patterns = allow_patterns(info) if info is not None else offline_patterns(cache, model_id, revision)
    expected = _expected_blobs(info, patterns) if info is not None else {}
    total = sum(expected.values())
    blobs_dir = cache / repo_folder_name(repo_id=model_id, repo_type="model") / "blobs"
    result: dict[str, Any] = {}

    def fetch() -> None:
        try:
            result["path"] = snapshot(
                model_id, revision=revision, token=token, allow_patterns=patterns, cache_dir=str(cache)
            )
        except BaseException as exc:  # handed to the main thread
            result["error"] = exc

    start = _bytes_present(blobs_dir, expected)
    em.progress(
        0.05,
        f"downloading {model_id}: {total / 1e9:.2f} GB in {len(expected)} files"
        + (f", {start / 1e9:.2f} GB already here (resumes where it stopped)" if start else "")
        if total
        else f"downloading {model_id} from Hugging Face (resumes where it stopped)",
    )
    th = threading.Thread(target=fetch, name="hf-download", daemon=True)
    t0 = time.monotonic()
    th.start()
    last, moved = -1, time.monotonic()
    while th.is_alive():
        th.join(poll_s)
        if not total:
            continue
        done = _bytes_present(blobs_dir, expected)
        if done == last and time.monotonic() - moved > stall_s:
            # the worker's exit ends the download thread; what arrived stays in the cache
            raise HubError(
                "network",
                f"The download of {model_id} stalled: no data arrived for {stall_s:.0f} s "
                f"({done / 1e9:.2f} of {total / 1e9:.2f} GB here).",
                "Check the network (a proxy or VPN that stopped answering), then run the Model stage again: "
                "it resumes where it stopped.",
            )
        if done != last:
            last, moved = done, time.monotonic()
            rate = (done - start) / max(time.monotonic() - t0, 1e-6)
            em.progress(
                0.05 + 0.5 * done / total,
                f"downloading {model_id}: {done / 1e9:.2f} of {total / 1e9:.2f} GB ({rate / 1e6:.1f} MB/s)",
                done_bytes=done,
                total_bytes=total,
            )
    if "error" in result:
        failure: BaseException = result["error"]
        mapped = hub_error(failure, model_id, revision, cache, total or None, has_token=bool(token))
        if mapped is None:
            raise failure
        raise mapped from None
    if total:
        em.progress(0.55, f"downloaded {model_id}: {total / 1e9:.2f} GB", done_bytes=total, total_bytes=total)
    path = Path(result["path"])
    return path, path.name


def resolve_source(model: str, spec: WorkerSpec, em: Emitter) -> tuple[str, Path, str | None]:
    if model in BUILTIN_MODELS:
        src = builtin_model_dir(model)
        if not (src / "config.json").is_file():
            raise WorkerError(
                "builtin_missing",
                f"The built-in model {model} is missing from {src}.",
                "Reinstall HexStudio, or rebuild it with tools/builtin_model/train_tiny_llama.py.",
            )
        dest = spec.out_dir / "hf"
        shutil.copytree(src, dest, ignore=shutil.ignore_patterns("training.json"))
        return "builtin", dest, None
    problem = model_spec_problem(model)  # asked when the run was made too; a folder may have gone since
    if problem is not None:
        raise WorkerError("unknown_builtin" if model.startswith("builtin:") else "model_not_found", *problem)
    p = Path(model).expanduser()
    if p.is_dir():
        return "local", p.resolve(), None
    path, rev = download(model, requested_revision(spec), em)
    return "huggingface", path, rev


def requested_revision(spec: WorkerSpec) -> str | None:
    """The revision asked for (`--revision`: a branch, tag or commit); None means the hub's default (main)."""
    rev = spec.inputs.revision or spec.settings.revision
    return str(rev) if rev else None


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    model = spec.inputs.model or BUILTIN_ID
    em.progress(0.0, f"resolving {model}")
    source, hf_dir, revision = resolve_source(model, spec, em)
    if source != "huggingface" and requested_revision(spec):
        em.warning(
            f"revision '{requested_revision(spec)}' applies to Hugging Face ids only; the {source} model "
            "is used as it is.",
            hint="Drop --revision, or give the model's Hugging Face id.",
            code="revision_ignored",
        )
    em.progress(0.6, "inspecting config.json")
    try:
        info = modelinfo.inspect_folder(hf_dir)
    except modelinfo.ModelInfoError as exc:
        raise WorkerError("bad_config", str(exc)) from None
    if info.get("error"):  # a number out of any real model's range (hexstudio.shared.config_bounds)
        raise WorkerError(info["error"]["code"], info["error"]["message"], info["error"].get("hint"))
    if not info["supported"]:
        raise WorkerError(
            "unsupported_architecture",
            info["reason"],
            "Pick a dense Llama-family model (Llama 3.x, Nemotron-Nano-8B, Qwen2/Qwen3 dense).",
        )
    if not info["files"]["tokenizer"]:
        raise WorkerError(
            "missing_tokenizer",
            f"{hf_dir} has no tokenizer.json.",
            "Genie needs tokenizer.json (the fast tokenizer). Download it with the model.",
        )
    check_tokenizer(hf_dir)
    em.progress(0.7, "checking the weight files (headers, sizes, no NaN or infinity)")
    weights = check_weights(hf_dir)
    # "auto" context length and parts, as preflight and `hexstudio model inspect` resolve them
    r, plan = resolve_settings(info, spec.settings, builtin=source == "builtin", board_name=spec.inputs.board)
    context_length, ar_n, parts = r["context_length"], r["ar_n"], r["parts"]
    err = (
        modelinfo.check_context(info, context_length, ar_n)
        or genie_cl_problem(context_length, ar_n)  # as Quantize refuses it, told before the download is used
        or modelinfo.validation_room(context_length)
    )
    if err:
        raise WorkerError("bad_context_length", err, "Change the context length in the run settings.")
    for line in plan["explanation"]:
        em.log(f"parts: {line}")
    if spec.settings.parts != AUTO:
        em.log(f"parts: {parts} as set (the plan above would pick {plan['parts']})")
    if not 1 <= parts <= info["num_layers"]:
        raise WorkerError("bad_parts", f"parts must be between 1 and the layer count ({info['num_layers']}).")
    est = stage_estimate(info, spec.settings, r)
    # a copy inside this stage's folder is recorded relative to model.json (the folder is renamed when
    # the stage completes); a download or a local folder by its absolute path
    rel = hf_dir.relative_to(spec.out_dir).as_posix() if hf_dir.is_relative_to(spec.out_dir) else str(hf_dir)
    # revision: the commit the files came from (a download: the snapshot's commit hash); requested_revision:
    # what was asked for (`--revision`), None for the default branch
    doc: ModelDoc = {
        "model": model,
        "source": source,
        "revision": revision,
        "requested_revision": requested_revision(spec) if source == "huggingface" else None,
        "hf_dir": rel,
        "info": info,
        "weights": weights,
        "resolved": {"context_length": context_length, "ar_n": ar_n, "parts": parts},
        "part_plan": plan,
        "estimates": est,
    }
    (spec.out_dir / "model.json").write_text(json.dumps(doc, indent=2))
    em.artifact("model.json", kind="json", role="model")
    for key in ("num_parameters", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "vocab_size"):
        em.metric(key, info[key])
    em.metric("context_length", context_length)
    em.metric("parts", parts)
    em.metric("quantize_peak_rss_estimate_bytes", est["quantize_peak_rss_bytes"], unit="bytes")
    em.progress(1.0, f"{info['architecture']}, {info['num_parameters']:,} parameters, {parts} part(s)")
    return {
        "architecture": info["architecture"],
        "source": source,
        "context_length": context_length,
        "parts": parts,
    }


def stage_estimate(info: dict[str, Any], settings: RunSettings, r: ResolvedSettings) -> dict[str, Any]:
    """Memory and disk each stage needs (modelinfo.estimate) for the model `info` under the run's settings, with
    `r` the resolved ones (resolve_settings): the Model stage records it, and Preflight checks against it again
    with the settings as they are then (calibration samples and length are Preflight's and Quantize's inputs,
    not the Model stage's)."""
    from hexstudio.shared.run_settings import extra_ar_sizes, extra_context_lengths

    context_length, ar_n, parts = r["context_length"], r["ar_n"], r["parts"]
    try:
        more_cls = extra_context_lengths(settings.context_lengths, context_length, ar_n)
    except ValueError as exc:
        raise WorkerError(
            "bad_context_lengths", str(exc), "Fix context_lengths (or leave it empty)."
        ) from None
    try:  # checked here, before an hour of quantizing
        more_ars = extra_ar_sizes(settings.ar_sizes, ar_n, [context_length, *more_cls])
    except ValueError as exc:
        raise WorkerError("bad_ar_sizes", str(exc), "Fix ar_sizes (or leave it empty).") from None
    return modelinfo.estimate(
        info,
        context_length,
        ar_n,
        parts,
        r["calibration_samples"],
        r["calibration_seq_len"],
        context_variants=1 + len(more_cls),
        ar_variants=len(more_ars),
        calibration_unit=settings.calibration_unit,
    )


if __name__ == "__main__":
    raise SystemExit(worker_main("model", run))
