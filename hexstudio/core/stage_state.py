"""A stage's state in a run, from run.json alone: its input hash (what its results depend on), its output
digest, and whether a completed stage is still current ("stale" when its inputs changed). The pipeline
writes these; the status views (hexstudio.core.status, the CLI, the studio) read them.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

from hexstudio.core.atomic import sha256_file
from hexstudio.core.manifest import RunManifest
from hexstudio.core.stages import Stage, get_stage
from hexstudio.shared.run_settings import SETTINGS


def output_digest(artifacts: list[dict[str, Any]]) -> str:
    h = hashlib.sha256()
    for a in sorted(artifacts, key=lambda a: a["path"]):
        h.update(f"{a['path']}\0{a['sha256']}\n".encode())
    return h.hexdigest()


def summary_digest(summary: dict[str, Any], inputs: str) -> str:
    """The output digest of a stage declared digest_from_summary: what it did (its summary) from what inputs."""
    payload = json.dumps({"summary": summary, "inputs": inputs}, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()


# Settings added after runs existed: absent from a run means their default, and they are left out of its input hash
# so a run made before them keeps its completed stages current (a run that sets one hashes it).
HASHED_WHEN_SET = frozenset(
    {
        "speculative_dialogs",
        "spd_draft_len",
        "dialog_type",
        "context_lengths",
        "spd_draft",
        "lade_window",
        "lade_ngram",
        "lade_gcap",
        "quantsim_config",
        "ar_sizes",
        "aihub_compile_options",
    }
)

# Settings that became inputs of more stages after runs existed (every run holds them): left out of those stages'
# hash while at the value the stage assumed before, so a run made before keeps those stages current
HASHED_WHEN_CHANGED: dict[tuple[str, str], Any] = {
    # the Model stage's estimate and the Preflight check plan for one QuantSim per part (issue 30's review)
    ("model", "calibration_unit"): "layer",
    ("preflight", "calibration_unit"): "layer",
    # Preflight measures the machine the heavy stages run on (issue 30's review): unset is this machine
    ("preflight", "worker_host"): None,
    # read by the Chat stage (its prompt, runtime and reply length) and by the "auto" parts rule, undeclared until
    # a review found `--resume --set runtime=geniex` keeping the Chat result measured on genie
    ("chat", "prompt_template"): "auto",
    ("chat", "runtime"): None,
    ("chat", "benchmark_max_tokens"): 32,
    ("model", "board_ram_bytes"): None,
    ("preflight", "board_ram_bytes"): None,
    # Preflight fails a run that compiles locally on a machine short of the local compile (stop 50's review)
    ("preflight", "compile_target"): "auto",
}


def _hashed(stage: str, key: str, settings: dict[str, Any]) -> bool:
    if (stage, key) in HASHED_WHEN_CHANGED:
        return key in settings and settings[key] != HASHED_WHEN_CHANGED[(stage, key)]
    return key in settings or key not in HASHED_WHEN_SET


_FILE_DIGESTS: dict[tuple[str, int, int], str] = {}  # (path, size, mtime_ns) -> sha256: read once per version


def _file_digest(value: Any) -> str | None:
    """A file setting's (calibration_text, validation_text, spd_draft) contents as its input: the sha256 of the
    file it names (of a bundle folder: of its bundle.json, which holds every file's sha256), "missing" when there
    is none there, None for "builtin" or "self" (nothing to read)."""
    if not isinstance(value, str) or value.strip() in ("", "builtin", "self"):
        return None
    p = Path(value).expanduser()
    if p.is_dir():
        p = p / "bundle.json"
    try:
        st = p.stat()
    except OSError:
        return "missing"
    key = (str(p.absolute()), st.st_size, st.st_mtime_ns)
    if key not in _FILE_DIGESTS:
        try:
            _FILE_DIGESTS[key] = sha256_file(p)
        except OSError:
            return "unreadable"
    return _FILE_DIGESTS[key]


def _user_suites(m: RunManifest, settings: dict[str, Any]) -> dict[str, str]:
    """The contents of the suites a run evaluates that the user added to its workspace (`hexstudio eval add`; one
    of a shipped suite's name replaces it): an edited suite makes Evaluate stale. Shipped suites add nothing, so a
    run on them keeps the hash it had."""
    from hexstudio.core.eval.suites import DEFAULT_SUITES, user_dir

    folder = user_dir(m.run_dir.parent.parent)
    names = settings.get("eval_suites") or DEFAULT_SUITES
    return {
        n: d
        for n in names
        if isinstance(n, str) and (d := _file_digest(str(folder / f"{n}.jsonl"))) not in (None, "missing")
    }


def input_hash(m: RunManifest, stage: Stage) -> str:
    settings = m.settings
    payload: dict[str, Any] = {
        "stage": stage.name,
        "version": stage.version,
        "model": m.inputs.get("model"),
        "board": m.inputs.get("board"),
        "settings": {k: settings.get(k) for k in stage.inputs if _hashed(stage.name, k, settings)},
        "upstream": {n: m.stage(n).data.get("output_digest") for n in stage.needs},
    }
    # a file setting's contents, not only its path: an edited calibration or validation text makes the stage stale
    # (added only where a file is named, so a run on the built-in texts keeps the hash it had)
    files = {
        k: d
        for k in stage.inputs
        if k in SETTINGS and SETTINGS[k].file and (d := _file_digest(settings.get(k))) is not None
    }
    if files:
        payload["files"] = files
    if "eval_suites" in stage.inputs and (suites := _user_suites(m, settings)):
        payload["suites"] = suites
    if stage.reads:
        payload["reads"] = {
            n: [m.stage(n).data.get("state"), m.stage(n).data.get("output_digest")] for n in stage.reads
        }
    return hashlib.sha256(json.dumps(payload, sort_keys=True, default=str).encode()).hexdigest()


def hash_tree(
    root: Path, kinds: dict[str, dict[str, Any]] | None = None, stage: str | None = None
) -> list[dict[str, Any]]:
    """Every file under `root` with its sha256 and size, as run.json lists a stage's artifacts (under
    artifacts/<stage>/: `stage` when `root` is not yet that folder, e.g. the attempt's <stage>.partial)."""
    kinds = kinds or {}
    out = []
    for p in sorted(root.rglob("*")):
        if p.is_file() and not p.is_symlink():
            rel = p.relative_to(root).as_posix()
            out.append(
                {
                    "path": f"artifacts/{stage or root.name}/{rel}",
                    "sha256": sha256_file(p),
                    "size": p.stat().st_size,
                    "kind": kinds.get(rel, {}).get("kind"),
                    "role": kinds.get(rel, {}).get("role"),
                }
            )
    return out


def stage_is_current(m: RunManifest, stage: Stage, verify: bool = False) -> bool:
    st = m.stage(stage.name)
    if st.state != "done" or st.data.get("input_hash") != input_hash(m, stage):
        return False
    for a in st.artifacts:
        p = m.run_dir / a["path"]
        if not p.is_file() or p.stat().st_size != a["size"]:
            return False
        if verify and sha256_file(p) != a["sha256"]:
            return False
    return True


def display_state(m: RunManifest, name: str, stage: Stage | None = None) -> str:
    """pending | running | done | failed | stale (done, but its inputs changed) | interrupted | cancelled."""
    st = m.stage(name)
    if st.state == "done" and not stage_is_current(m, stage or get_stage(name)):
        return "stale"
    return st.state


__all__ = [
    "HASHED_WHEN_SET",
    "display_state",
    "hash_tree",
    "input_hash",
    "output_digest",
    "stage_is_current",
    "summary_digest",
]
