"""Reading the documents earlier stages wrote, typed (hexstudio.shared.artifacts), with the failure a
person can act on: which stage to run again."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TypeVar

from hexstudio.shared.artifacts import ModelDoc, load_json
from hexstudio.workers.runtime import WorkerError, WorkerSpec

D = TypeVar("D")


def read_doc(path: Path, doc_type: type[D], stage: str) -> D:
    """`path` (written by `stage`) as `doc_type`; WorkerError `<stage>_output_missing` / `_invalid`."""
    try:
        return load_json(path, doc_type)
    except FileNotFoundError:
        raise WorkerError(
            f"{stage}_output_missing", f"{path} does not exist.", f"Run the {stage} stage again."
        ) from None
    except (json.JSONDecodeError, ValueError) as exc:
        why = (
            f"is not valid JSON: {exc.msg}" if isinstance(exc, json.JSONDecodeError) else f"is damaged: {exc}"
        )
        raise output_invalid(stage, f"{path} {why}.") from None


def output_invalid(stage: str, problem: str, code: str | None = None) -> WorkerError:
    """The error for an output of the earlier stage `stage` this worker cannot use: `problem` says what is wrong,
    the hint runs that stage again; the code is `<stage>_output_invalid` unless a more telling one is given."""
    return WorkerError(code or f"{stage}_output_invalid", problem, f"Run the {stage} stage again (--force).")


def model_doc(spec: WorkerSpec) -> ModelDoc:
    """The Model stage's model.json."""
    return read_doc(spec.upstream_dir("model") / "model.json", ModelDoc, "model")
