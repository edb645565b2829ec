"""The spec a worker runs from, declared once: the studio writes it, every worker reads it.

One JSON file per stage attempt (runs/ID/specs/<stage>.json), written by the pipeline's stage launcher
(hexstudio/core/stage_api.py) and read by hexstudio/workers/runtime.py's `worker_main`:

    {"schema": 1, "stage": "quantize",
     "run_dir": "/abs/runs/ID",
     "out_dir": "/abs/runs/ID/artifacts/quantize.partial",   # the worker writes ONLY here
     "upstream": {"model": "/abs/runs/ID/artifacts/model"},  # the completed stages' folders it reads
     "settings": {...},                                       # run.json's settings (what the run set)
     "inputs": {"model": "builtin:tiny-llama", "board": "sim"},
     "evaluate": {...}}             # the Evaluate stage's host legs only (EvalWork); "predict": the predictor's

Typed on both sides: `settings` is read as RunSettings (every setting with its default, checked: a worker
never reads a setting from a dict or falls back to a default of its own), `evaluate` as EvalWork, `predict` as PredictWork. A worker
host's copy of the spec (hexstudio/core/remote/stage.py) is the same document with its paths mapped.

Standard library and hexstudio.shared only: copied to remote worker hosts.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError
from hexstudio.shared.predict import ModelShape, Target
from hexstudio.shared.run_settings import BadSettings, RunSettings, TypedSettings, typed_settings

SPEC_SCHEMA = 1


class SpecError(ActionableError):
    """The spec cannot be read: code, message and what to do."""

    def __init__(self, code: str, message: str, hint: str | None = None) -> None:
        super().__init__(message, hint, code=code)


@dataclass(frozen=True)
class StageInputs:
    """What the run was started on: the model reference and the board's name."""

    model: str | None = None
    board: str | None = None
    revision: str | None = None
    extra: Mapping[str, Any] = field(default_factory=dict)  # a stage's own declared inputs (predict's shape)

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"model": self.model, "board": self.board}
        if self.revision is not None:
            out["revision"] = self.revision
        return {**out, **self.extra}

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> StageInputs:
        rest = {k: v for k, v in data.items() if k not in ("model", "board", "revision")}
        rev = data.get("revision")
        return cls(
            model=None if data.get("model") is None else str(data["model"]),
            board=None if data.get("board") is None else str(data["board"]),
            revision=None if rev is None else str(rev),
            extra=rest,
        )


@dataclass(frozen=True)
class EvalCase:
    """One case of the Evaluate stage's plan as a host leg runs it."""

    key: str
    kind: str  # "nll" (a passage's likelihood) or "generate" (a prompt's reply)
    legs: tuple[str, ...]
    prompt: str | None = None
    text: str | None = None
    max_tokens: int | None = None

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {"key": self.key, "kind": self.kind, "legs": list(self.legs)}
        for k in ("prompt", "text", "max_tokens"):
            if getattr(self, k) is not None:
                out[k] = getattr(self, k)
        return out

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvalCase:
        mt = d.get("max_tokens")
        return cls(
            key=str(d["key"]),
            kind=str(d["kind"]),
            legs=tuple(str(x) for x in d.get("legs") or ()),
            prompt=None if d.get("prompt") is None else str(d["prompt"]),
            text=None if d.get("text") is None else str(d["text"]),
            max_tokens=None if mt is None else int(mt),
        )


@dataclass(frozen=True)
class EvalWork:
    """The Evaluate stage's host legs: which legs, which cases, and the journal that survives a restart."""

    legs: tuple[str, ...]
    cases: tuple[EvalCase, ...]
    journal: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "legs": list(self.legs),
            "cases": [c.to_json() for c in self.cases],
            "journal": str(self.journal),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> EvalWork:
        return cls(
            legs=tuple(str(x) for x in d.get("legs") or ()),
            cases=tuple(EvalCase.from_json(c) for c in d.get("cases") or ()),
            journal=Path(str(d["journal"])),
        )


@dataclass(frozen=True)
class PredictPlan:
    """A prediction request resolved (hexstudio.core.services.predict.plan): the shapes, the target and the
    settings the worker gets."""

    model: str
    shape: ModelShape
    target: Target
    context_length: int
    ar_n: int
    parts: int
    two_layers: bool

    def work(self, cache_dir: Path) -> PredictWork:
        """The predictor worker's request: this plan, with where its timings are cached."""
        return PredictWork(
            **{f.name: getattr(self, f.name) for f in fields(PredictPlan)}, cache_dir=cache_dir
        )


@dataclass(frozen=True)
class PredictWork(PredictPlan):
    """The speed predictor's request (hexstudio/workers/predict.py): a model's shape on a target."""

    cache_dir: Path

    def to_json(self) -> dict[str, Any]:
        return {
            "model": self.model,
            "shape": asdict(self.shape),
            "target": self.target.to_json(),
            "context_length": self.context_length,
            "ar_n": self.ar_n,
            "parts": self.parts,
            "two_layers": self.two_layers,
            "cache_dir": str(self.cache_dir),
        }

    @classmethod
    def from_json(cls, d: Mapping[str, Any]) -> PredictWork:
        return cls(
            model=str(d["model"]),
            shape=ModelShape(**d["shape"]),
            target=Target.from_json(dict(d["target"])),
            context_length=int(d["context_length"]),
            ar_n=int(d["ar_n"]),
            parts=int(d["parts"]),
            two_layers=bool(d.get("two_layers", True)),
            cache_dir=Path(str(d["cache_dir"])),
        )


@dataclass(frozen=True)
class WorkerSpec:
    stage: str
    run_dir: Path
    out_dir: Path
    upstream: Mapping[str, Path] = field(default_factory=dict)
    typed: TypedSettings = field(default_factory=lambda: typed_settings({}))
    inputs: StageInputs = field(default_factory=StageInputs)
    evaluate: EvalWork | None = None
    predict: PredictWork | None = None

    @property
    def settings(self) -> RunSettings:
        """The run's settings, typed, defaults filled in."""
        return self.typed.values

    @property
    def hooks(self) -> Mapping[str, Any]:
        """Keys of the run's settings that are no run setting (a test worker's knobs)."""
        return self.typed.hooks

    def is_set(self, name: str) -> bool:
        """Whether the run set this setting itself (else it holds its default)."""
        return name in self.typed.given

    @classmethod
    def build(
        cls,
        stage: str,
        run_dir: Path,
        out_dir: Path,
        settings: Mapping[str, Any],
        upstream: Mapping[str, Path] | None = None,
        inputs: StageInputs | None = None,
        evaluate: EvalWork | None = None,
        predict: PredictWork | None = None,
    ) -> WorkerSpec:
        """The studio's side: a spec from run.json's settings (checked: BadSettings names a bad one)."""
        return cls(
            stage=stage,
            run_dir=Path(run_dir),
            out_dir=Path(out_dir),
            upstream={k: Path(v) for k, v in (upstream or {}).items()},
            typed=typed_settings(settings),
            inputs=inputs or StageInputs(),
            evaluate=evaluate,
            predict=predict,
        )

    def to_json(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "schema": SPEC_SCHEMA,
            "stage": self.stage,
            "run_dir": str(self.run_dir),
            "out_dir": str(self.out_dir),
            "upstream": {k: str(v) for k, v in self.upstream.items()},
            "settings": self.typed.to_json(),
            "inputs": self.inputs.to_json(),
        }
        if self.evaluate is not None:
            out["evaluate"] = self.evaluate.to_json()
        if self.predict is not None:
            out["predict"] = self.predict.to_json()
        return out

    def write(self, path: Path) -> Path:
        """Write the spec atomically (a reader never sees half of it); returns `path`."""
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as fh:
                json.dump(self.to_json(), fh, indent=2)
            os.replace(tmp, path)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return path

    @classmethod
    def from_json(cls, data: Mapping[str, Any], where: str = "the spec") -> WorkerSpec:
        if data.get("schema") != SPEC_SCHEMA:
            raise SpecError(
                "spec_invalid",
                f"Spec schema {data.get('schema')!r} is not {SPEC_SCHEMA}.",
                "The studio and its workers come from different versions: reinstall.",
            )
        try:
            typed = typed_settings(dict(data.get("settings") or {}))
        except BadSettings as exc:
            raise SpecError(
                "bad_setting",
                f"The run's settings are not usable: {exc}",
                "Change the setting (hexstudio run --resume RUN --set NAME=VALUE, or the stage's page) "
                "and start the stage again.",
            ) from None
        try:
            ev, pr = data.get("evaluate"), data.get("predict")
            return cls(
                stage=str(data["stage"]),
                run_dir=Path(data["run_dir"]),
                out_dir=Path(data["out_dir"]),
                upstream={k: Path(v) for k, v in (data.get("upstream") or {}).items()},
                typed=typed,
                inputs=StageInputs.from_json(dict(data.get("inputs") or {})),
                evaluate=EvalWork.from_json(ev) if isinstance(ev, Mapping) else None,
                predict=PredictWork.from_json(pr) if isinstance(pr, Mapping) else None,
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise SpecError("spec_invalid", f"{where} lacks or has a bad {exc}.") from None

    @classmethod
    def load(cls, path: str | Path) -> WorkerSpec:
        p = Path(path)
        try:
            data = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SpecError(
                "spec_missing",
                f"Spec file {p} does not exist.",
                "Start workers through the studio or `hexstudio run`.",
            ) from None
        except json.JSONDecodeError as exc:
            raise SpecError("spec_invalid", f"Spec file {p} is not valid JSON: {exc.msg}.") from None
        if not isinstance(data, dict):
            raise SpecError("spec_invalid", f"Spec file {p} is not a JSON object.")
        return cls.from_json(data, f"Spec file {p}")

    def upstream_dir(self, stage: str) -> Path:
        try:
            return self.upstream[stage]
        except KeyError:
            raise SpecError(
                "missing_upstream",
                f"The {self.stage} stage needs the {stage} stage's output.",
                f"Run the {stage} stage first.",
            ) from None
