"""Gather everything a run report shows from a run folder (run.json, stage artifacts, logs).

The result is plain JSON (schema: app/core/schemas/report.schema.json); HTML, PDF and compare all
render from it. Every KPI carries its source: "device", "simulated", "emulated" or "reference"."""

from __future__ import annotations

import json
import platform
from pathlib import Path
from typing import Any

from app.core.manifest import RunManifest, now_iso
from app.core.reports.redact import scrub
from app.core.stages import STAGES

REPORT_VERSION = 1

# The by-hand deployment of Llama-3.1-Nemotron-Nano-8B on the IQ-9075 EVK (shared/facts/workstation.md)
REFERENCE_KPIS = {"init_ms": 4060.0, "prompt_tokens": 29, "prompt_tok_s": 158.05, "ttft_ms": 183.5,
                  "generated_tokens": 31, "gen_tok_s": 10.03, "gen_time_ms": 3090.0}
KPI_LABELS = {"init_ms": ("Init", "ms"), "prompt_tokens": ("Prompt", "tokens"),
              "prompt_tok_s": ("Prompt processing", "tok/s"), "ttft_ms": ("Time to first token", "ms"),
              "generated_tokens": ("Generated", "tokens"), "gen_tok_s": ("Generation", "tok/s"),
              "gen_time_ms": ("Generation time", "ms")}
SETTING_KEYS = ("context_length", "ar_n", "parts", "calibration_samples", "calibration_seq_len", "calibration_text",
                "weight_bits", "activation_bits", "kv_bits", "device", "qairt_version", "compile_target",
                "benchmark_prompt")
NEXT_STEP = {
    "model": "Check the model id or folder on the Model page (`hexstudio model inspect M`), then run again.",
    "preflight": "Fix the failing checks on the Preflight page (or override the gate), then resume the run.",
    "quantize": "Read the quantize log; lower calibration samples or context length if memory ran out, then resume.",
    "validate": "Look at the metrics that failed; more calibration samples usually help. Override only knowingly.",
    "compile": "Read the AI Hub job's failure reason (its web address is in the log), then resume: finished jobs "
               "are not submitted again.",
    "board": "Run the doctor on the Board page and apply its fixes, then resume.",
    "chat": "Run `hexstudio explain --file` on the chat log for the cause, fix the board, then resume.",
    "report": "Run `hexstudio report RUN --format json` to see the error in full.",
}


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        data: dict[str, Any] = json.loads(path.read_text(encoding="utf-8"))
        return data
    except (OSError, json.JSONDecodeError):
        return None


def _resources(run_dir: Path, stage: str, max_points: int = 400) -> list[list[float]]:
    path = run_dir / "logs" / f"{stage}.resources.jsonl"
    rows: list[list[float]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return rows
    t0 = None
    for ln in lines:
        try:
            s = json.loads(ln)
        except json.JSONDecodeError:
            continue
        t0 = s["t"] if t0 is None else t0
        rows.append([round(float(s["t"]) - t0, 3), float(s.get("rss") or 0), float(s.get("vram") or 0)])
    step = max(1, len(rows) // max_points)
    return rows[::step]


def token_rate_series(chunks: list[dict[str, Any]], window_s: float = 1.0) -> list[list[float]]:
    """tokens/s over a sliding window, one point per chunk (a chunk is one streamed token)."""
    out: list[list[float]] = []
    times = [float(c["t"]) for c in chunks]
    j = 0
    for i, t in enumerate(times):
        while times[j] < t - window_s:
            j += 1
        span = t - times[j]
        if i > j and span > 0:
            out.append([round(t, 3), round((i - j) / span, 2)])
    return out


def _stage_rows(m: RunManifest) -> list[dict[str, Any]]:
    rows = []
    for s in STAGES:
        st = m.stage(s.name).data
        out = st.get("outcome") or {}
        gate = st.get("gate") or {}
        rows.append({"name": s.name, "title": s.title, "state": st.get("state", "pending"),
                     "started": st.get("started"), "ended": st.get("ended"), "duration_s": st.get("duration_s"),
                     "peak_rss_bytes": st.get("peak_rss_bytes"), "peak_vram_bytes": st.get("peak_vram_bytes"),
                     "outcome": {"kind": out.get("kind"), "code": out.get("code"), "message": out.get("message"),
                                 "hint": out.get("hint")} if out else None,
                     "gate": {"passed": gate.get("passed"), "reason": gate.get("reason"),
                              "override": gate.get("override")} if gate else None,
                     "warnings": [w.get("message") for w in st.get("warnings") or []]})
    return rows


def _status(stages: list[dict[str, Any]]) -> tuple[str, dict[str, Any] | None]:
    for s in stages:
        if s["state"] in ("failed", "interrupted", "cancelled"):
            out = s.get("outcome") or {}
            return "failed", {"stage": s["name"], "state": s["state"], "code": out.get("code"),
                              "message": out.get("message") or f"{s['title']} did not complete ({s['state']}).",
                              "hint": out.get("hint"), "next_step": NEXT_STEP.get(s["name"], "")}
        if s["state"] == "done" and s.get("gate") and not s["gate"].get("passed") and not s["gate"].get("override"):
            return "failed", {"stage": s["name"], "state": "gate", "code": "gate_not_passed",
                              "message": f"{s['title']} gate not passed: {s['gate'].get('reason')}", "hint": None,
                              "next_step": NEXT_STEP.get(s["name"], "")}
    done = [s for s in stages if s["name"] != "report"]
    if all(s["state"] == "done" for s in done):
        return "complete", None
    return "in_progress", None


def _recipe_rows(versions: dict[str, Any], python: str) -> list[dict[str, Any]]:
    try:
        from workers import recipes
    except ImportError:  # pragma: no cover
        return []
    try:
        all_recipes = recipes.load_recipes()
    except Exception:
        return []
    rows: dict[str, dict[str, Any]] = {}
    for rname, rec in all_recipes.items():
        for r in recipes.compare(rec, python, versions):
            row = rows.setdefault(r["package"], {"package": r["package"], "installed": r["installed"]})
            row[rname] = {"pinned": r["pinned"], "match": r["match"]}
    return list(rows.values())


def build_report(run_dir: Path, *, redact_hosts: bool = False, extra_secrets: list[str] | None = None) -> dict[str, Any]:
    m = RunManifest.load(run_dir)
    art = run_dir / "artifacts"
    model_doc = _read_json(art / "model" / "model.json") or {}
    info = model_doc.get("info") or {}
    stages = _stage_rows(m)
    status, failure = _status(stages)
    env = dict(m.data.get("environment") or {})
    versions = dict(m.data.get("versions") or {})
    settings = m.settings
    resolved = model_doc.get("resolved") or {}
    rep: dict[str, Any] = {
        "report_version": REPORT_VERSION, "generated": now_iso(),
        "generator": f"HexStudio {versions.get('hexstudio', '?')}",
        "run": {"run_id": m.run_id, "created": m.data.get("created"), "updated": m.data.get("updated"),
                "status": status, "failure": failure},
        "model": {"id": m.inputs.get("model"), "revision": model_doc.get("revision"),
                  "source": model_doc.get("source"), "architecture": info.get("architecture"),
                  "num_parameters": info.get("num_parameters"), "num_layers": info.get("num_layers"),
                  "hidden_size": info.get("hidden_size"), "vocab_size": info.get("vocab_size")},
        "settings": {k: resolved.get(k, settings.get(k)) for k in SETTING_KEYS if k in settings or k in resolved},
        "environment": {**{k: env.get(k) for k in ("host", "os", "wsl", "python", "cpu_count", "memory_bytes",
                                                   "swap_bytes", "gpus")},
                        "versions": versions, "recipes": _recipe_rows(versions, str(env.get("python") or
                                                                                  platform.python_version()))},
        "stages": stages,
        "validation": None, "compile": None, "bundle": None, "board": None, "chat": None,
        "kpis": [], "series": {"resources": {}, "token_rate": []},
        "events": [{"t": e.get("t"), "kind": e.get("kind"), "message": e.get("message")}
                   for e in m.data.get("events") or []],
    }
    v = _read_json(art / "validate" / "validation.json")
    if v:
        rep["validation"] = {"verdict": v.get("verdict"), "summary": v.get("summary"),
                             "checks": v.get("checks") or {}, "calibration_graph": v.get("calibration_graph")}
    b = _read_json(art / "compile" / "bundle" / "bundle.json")
    if b:
        rep["compile"] = {"simulated": bool(b.get("simulated")), "emulated": bool(b.get("emulated")),
                          "device": b.get("device"), "qairt_version": b.get("qairt_version"),
                          "context_length": b.get("context_length"), "parts": b.get("parts"),
                          "jobs": b.get("aihub_jobs") or []}
        rep["bundle"] = {"files": b.get("files") or []}
    bd = _read_json(art / "board" / "board.json")
    if bd:
        rep["board"] = {"name": bd.get("board"), "label": bd.get("label"), "simulated": bool(bd.get("simulated")),
                        "doctor": bd.get("doctor") or [], "push": bd.get("push") or {}}
    ch = _read_json(art / "chat" / "chat.json")
    if ch:
        source = str(ch.get("source") or ("simulated" if (bd or {}).get("simulated") else "device"))
        rep["chat"] = {"source": source, "prompt": ch.get("prompt"), "reply": ch.get("reply"),
                       "state": ch.get("state")}
        k = ch.get("kpis") or {}
        for key, (label, unit) in KPI_LABELS.items():
            rep["kpis"].append({"name": key, "label": label, "unit": unit, "value": k.get(key), "source": source,
                                "reference": REFERENCE_KPIS[key]})
        rep["series"]["token_rate"] = token_rate_series(ch.get("chunks") or [])
    for s in STAGES:
        series = _resources(run_dir, s.name)
        if series:
            rep["series"]["resources"][s.name] = series
    secrets = list(extra_secrets or [])
    try:
        from app.core.secrets import board_password_key, known_secret_values, sudo_password_key
        from app.core.settings import Settings

        names = [board_password_key(n) for n in Settings.load().boards] + \
                [sudo_password_key(n) for n in Settings.load().boards]
        secrets += known_secret_values() + known_secret_values(names)
    except Exception:
        pass
    hide: list[str] = []
    if redact_hosts:
        hide = [str(env.get("host") or "")]
        if bd and isinstance(bd.get("label"), str) and "@" in bd["label"]:
            user_host = bd["label"].split("//")[-1].split(":")[0]
            hide += user_host.split("@")
        rep["environment"]["host"] = "[host]" if env.get("host") else None
    out: dict[str, Any] = scrub(rep, secrets, hide)
    return out
