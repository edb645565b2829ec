"""Model services: a model's config.json (built-in, folder or Hugging Face id, before any download) and what
it is, whether HexStudio supports it and what each stage will cost (`hexstudio model inspect`, the Model
page's Inspect)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from hexstudio.core.hf import fetch_config
from hexstudio.core.paths import BUILTIN_MODEL_ID
from hexstudio.core.services import ServiceError
from hexstudio.shared import modelinfo
from hexstudio.shared.data import BUILTIN_MODELS, builtin_model_dir
from hexstudio.shared.hub import model_spec_problem
from hexstudio.shared.run_settings import AUTO, DEFAULTS, genie_cl_problem, resolve_settings


def model_config(model: str, revision: str | None = None) -> dict[str, Any]:
    """config.json only: a user can check a model before downloading its weights (a Hugging Face id at
    `revision`, with HexStudio's one Hugging Face token: hexstudio.core.hf)."""
    if model in BUILTIN_MODELS:
        return modelinfo.read_config(builtin_model_dir(model))
    if model.startswith("builtin:"):  # not a Hugging Face id: the Hub would be asked, and blamed
        message, hint = model_spec_problem(model) or (f"There is no built-in model '{model}'.", "")
        raise ServiceError(message, hint)
    if Path(model).expanduser().is_dir():
        try:
            return modelinfo.read_config(Path(model).expanduser())
        except modelinfo.ModelInfoError as exc:
            raise ServiceError(str(exc)) from None
    local = Path(model).expanduser()
    if model.startswith(("/", "./", "../", "~")) or local.exists() or model.count("/") > 1 or "\\" in model:
        # a path, not a Hugging Face id (those are `name` or `owner/name`): say so, not a hub error
        what = "is a file, not a model folder" if local.exists() else "does not exist"
        raise ServiceError(
            f"The model folder {local} {what}.",
            "Give a folder holding config.json, the tokenizer files and *.safetensors, or a Hugging "
            f"Face id such as meta-llama/Llama-3.2-1B-Instruct (or {BUILTIN_MODEL_ID}).",
        )
    return fetch_config(model, revision)  # HubConfigError says what to do


def inspect(
    model: str,
    context_length: int | None,
    ar_n: int | None,
    parts: int | None,
    board_ram_gib: float | None = None,
    revision: str | None = None,
) -> dict[str, Any]:
    if revision and (model.startswith("builtin:") or Path(model).expanduser().is_dir()):
        raise ServiceError(
            f"--revision names a revision of a Hugging Face model; {model} is "
            + ("a built-in model" if model.startswith("builtin:") else "a folder on this machine")
            + ", which has none.",
            "Leave --revision out, or give a Hugging Face id (owner/name).",
        )
    info = modelinfo.inspect_config(model_config(model, revision))
    out: dict[str, Any] = {"model": model, "revision": revision, **info}
    if not info["supported"]:
        return out
    # "auto" (an option left out) resolved as the Model stage resolves it
    asked = {
        "context_length": context_length or AUTO,
        "parts": parts or AUTO,
        "ar_n": ar_n or DEFAULTS.ar_n,
        "board_ram_bytes": int(board_ram_gib * 1024**3) if board_ram_gib else None,
    }
    r, plan = resolve_settings(info, asked, builtin=model.startswith("builtin:"))
    err = modelinfo.check_context(info, r["context_length"], r["ar_n"]) or genie_cl_problem(
        r["context_length"], r["ar_n"]
    )
    if err:
        raise ServiceError(err)
    if bad := modelinfo.check_parts(info, r["parts"]):
        raise ServiceError(*bad)
    out["context_length"] = r["context_length"]
    out["ar_n"] = r["ar_n"]
    out["part_plan"] = plan
    out["parts"] = r["parts"]
    out["estimates"] = modelinfo.estimate(info, r["context_length"], r["ar_n"], r["parts"])
    return out
