"""Gather everything a run report shows from a run folder (run.json, stage artifacts, logs).

The result is plain JSON (schema: hexstudio/core/schemas/report.schema.json); HTML, PDF and compare all
render from it. Every KPI carries its source: "device", "simulated", "emulated" or "reference"."""

from __future__ import annotations

import dataclasses
import getpass
import hashlib
import json
import platform
import socket
from pathlib import Path
from typing import Any

from hexstudio.core.genie.journal import read_journals
from hexstudio.core.manifest import RunManifest, now_iso
from hexstudio.core.reports.bench import bench_section
from hexstudio.core.reports.predicted import (
    predicted_section,
    read_prediction,
    settings_now,
    speculative_prediction,
)
from hexstudio.core.reports.redact import scrub, secret_values_in
from hexstudio.core.stages import STAGES
from hexstudio.core.status import KINDS, RunStatus, run_status, stage_statuses
from hexstudio.core.units import finite

REPORT_VERSION = 1

# The by-hand deployment of Llama-3.1-Nemotron-Nano-8B on the IQ-9075 EVK (shared/facts/workstation.md)
REFERENCE_KPIS = {
    "init_ms": 4060.0,
    "prompt_tokens": 29,
    "prompt_tok_s": 158.05,
    "ttft_ms": 183.5,
    "generated_tokens": 31,
    "gen_tok_s": 10.03,
    "gen_time_ms": 3090.0,
}
KPI_LABELS = {
    "init_ms": ("Init", "ms"),
    "prompt_tokens": ("Prompt", "tokens"),
    "prompt_tok_s": ("Prompt processing", "tok/s"),
    "ttft_ms": ("Time to first token", "ms"),
    "generated_tokens": ("Generated", "tokens"),
    "gen_tok_s": ("Generation", "tok/s"),
    "gen_time_ms": ("Generation time", "ms"),
}
SETTING_KEYS = (
    "context_length",
    "ar_n",
    "parts",
    "calibration_samples",
    "calibration_seq_len",
    "calibration_text",
    "weight_bits",
    "activation_bits",
    "kv_bits",
    "device",
    "qairt_version",
    "compile_target",
    "benchmark_prompt",
)
NEXT_STEP = {
    "model": "Check the model id or folder on the Model page (`hexstudio model inspect M`), then run again.",
    "preflight": "Fix the failing checks on the Preflight page (or override the gate), then resume the run.",
    "quantize": "Read the quantize log; lower calibration samples or context length if memory ran out, then resume.",
    "validate": "Look at the metrics that failed; more calibration samples usually help. Override only knowingly.",
    "compile": "Read the AI Hub job's failure reason (its web address is in the log), then resume: finished jobs "
    "are not submitted again.",
    "board": "Run the doctor on the Board page and apply its fixes, then resume.",
    "chat": "Run `hexstudio explain --file` on the chat log for the cause, fix the board, then resume.",
    "evaluate": "Open the Evaluate page: it shows where the board's greedy continuation left the host "
    "simulation's. Run the stage again after fixing the board or bundle, or override the gate "
    "knowingly (the override is recorded and shown here).",
    "report": "Run `hexstudio report RUN --format json` to see the error in full.",
}


def _read_json(path: Path) -> dict[str, Any] | None:
    """A stage's JSON document; None when it is missing, damaged or not an object (a `null` or a list left by a
    hand edit): the report leaves that part out rather than failing."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, json.JSONDecodeError):
        return None
    return data if isinstance(data, dict) else None


def _bundle_files(doc: dict[str, Any]) -> dict[str, Any]:
    """bundle.json's files for the report: entries whose path, sha256 or size fail the bundle checks
    (hexstudio.shared.bundle.safepath) are not listed as files but named under `problems`."""
    from hexstudio.shared.bundle.safepath import UnsafePath, check_bundle_files

    files: list[dict[str, Any]] = []
    problems: list[str] = []
    raw = doc.get("files") if isinstance(doc, dict) else None
    for i, f in enumerate(raw if isinstance(raw, list) else []):
        try:
            check_bundle_files([f], f"bundle.json files[{i}]")
        except UnsafePath as exc:
            problems.append(str(exc)[:400])
            continue
        files.append({"path": f["path"], "sha256": f["sha256"], "size": f["size"]})
    if raw is not None and not isinstance(raw, list):
        problems.append("bundle.json 'files' is not a list")
    return {"files": files, "problems": problems}


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
    while rows and not rows[-1][1] and not rows[-1][2]:  # the sample taken as the process tree exited
        rows.pop()
    step = max(1, len(rows) // max_points)
    return rows[::step]


def token_rate_unit(chunks: list[dict[str, Any]]) -> str:
    """ "tokens/s" when every chunk carries its token count (from the runner or the bundle's tokenizer), else
    "chunks/s": a chunk is one read of the runner's output, not a token."""
    return "tokens/s" if chunks and all(isinstance(c.get("tokens"), int) for c in chunks) else "chunks/s"


def token_rate_series(chunks: list[dict[str, Any]], window_s: float = 1.0) -> list[list[float]]:
    """The rate over a sliding window, one point per chunk: tokens/s when the chunks carry token counts,
    else chunks/s (see token_rate_unit)."""
    out: list[list[float]] = []
    times = [float(c["t"]) for c in chunks]
    per_token = token_rate_unit(chunks) == "tokens/s"
    counts = [int(c["tokens"]) if per_token else 1 for c in chunks]
    j = 0
    for i, t in enumerate(times):
        while times[j] < t - window_s:
            j += 1
        span = t - times[j]
        if i > j and span > 0:
            out.append([round(t, 3), round(sum(counts[j + 1 : i + 1]) / span, 2)])
    return out


def _stage_rows(m: RunManifest) -> list[dict[str, Any]]:
    rows = []
    for s, status in zip(STAGES, stage_statuses(m), strict=True):
        st = m.stage(s.name).data
        out = st.get("outcome") or {}
        gate = st.get("gate") or {}
        rows.append(
            {
                "name": s.name,
                "title": s.title,
                "state": st.get("state", "pending"),
                "status": {**status.as_json(), "color": status.color},
                "started": st.get("started"),
                "ended": st.get("ended"),
                "duration_s": st.get("duration_s"),
                "peak_rss_bytes": st.get("peak_rss_bytes"),
                "peak_vram_bytes": st.get("peak_vram_bytes"),
                "outcome": {
                    "kind": out.get("kind"),
                    "code": out.get("code"),
                    "message": out.get("message"),
                    "hint": out.get("hint"),
                }
                if out
                else None,
                "gate": {
                    "passed": gate.get("passed"),
                    "reason": gate.get("reason"),
                    "override": status.override or gate.get("override"),
                }
                if gate
                else None,
                "warnings": [w.get("message") for w in st.get("warnings") or []],
            }
        )
    return rows


def _status(m: RunManifest, stages: list[dict[str, Any]]) -> tuple[RunStatus, dict[str, Any] | None]:
    """The run's status from the one status model (hexstudio.core.status), in the words the dashboard and the CLI use;
    the Report stage counts as passed while it runs (this is its output). The failure names the stage that
    holds the run back, why and what next."""
    statuses = [
        dataclasses.replace(x, kind=KINDS["passed"]) if x.stage == "report" and x.key == "running" else x
        for x in stage_statuses(m)
    ]
    rs = run_status(statuses)
    if rs.key not in ("failed", "gate_failed", "cancelled", "interrupted") or rs.stage is None:
        return rs, None
    s = next(x for x in stages if x["name"] == rs.stage)
    st = next(x for x in statuses if x.stage == rs.stage)
    if rs.key == "gate_failed":
        hint = (
            f"Fix what the stage reported and run it again, or override the gate (the studio's Override "
            f"button, or `hexstudio run --resume {m.run_id} --override-gate {rs.stage}`); an override is "
            "recorded with who and when."
            if st.overridable
            else f"Run the {rs.stage} stage again."
        )
        return rs, {
            "stage": rs.stage,
            "state": "gate failed",
            "code": "gate_not_passed",
            "message": f"{s['title']} gate not passed: {st.gate_reason}",
            "hint": hint,
            "next_step": NEXT_STEP.get(rs.stage) or hint,
        }
    out = s.get("outcome") or {}
    return rs, {
        "stage": rs.stage,
        "state": st.word,
        "code": out.get("code"),
        "message": out.get("message") or f"{s['title']} did not complete ({st.word}).",
        "hint": out.get("hint"),
        "next_step": NEXT_STEP.get(rs.stage) or f"Resume the run (hexstudio run --resume {m.run_id}).",
    }


def _recipe_rows(versions: dict[str, Any], python: str) -> list[dict[str, Any]]:
    try:
        from hexstudio.shared import recipes
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


def build_report(
    run_dir: Path, *, redact_hosts: bool = False, extra_secrets: list[str] | None = None
) -> dict[str, Any]:
    m = RunManifest.load(run_dir)
    art = run_dir / "artifacts"
    model_doc = (_read_json(art / "model" / "model.json") or {}) if m.stage("model").state == "done" else {}
    info = model_doc.get("info") or {}
    stages = _stage_rows(m)
    rstatus, failure = _status(m, stages)
    env = dict(m.data.get("environment") or {})
    versions = dict(m.data.get("versions") or {})
    settings = m.settings
    resolved = model_doc.get("resolved") or {}
    rep: dict[str, Any] = {
        "report_version": REPORT_VERSION,
        "generated": now_iso(),
        "generator": f"HexStudio {versions.get('hexstudio', '?')}",
        "run": {
            "run_id": m.run_id,
            "created": m.data.get("created"),
            "updated": m.data.get("updated"),
            "status": rstatus.report_status,
            "status_word": rstatus.word,
            "failure": failure,
        },
        "model": {
            "id": m.inputs.get("model"),
            "revision": model_doc.get("revision"),
            "source": model_doc.get("source"),
            "architecture": info.get("architecture"),
            "num_parameters": info.get("num_parameters"),
            "num_layers": info.get("num_layers"),
            "hidden_size": info.get("hidden_size"),
            "vocab_size": info.get("vocab_size"),
            # the preflight's memory estimates: the dashed line on each heavy stage's memory chart
            "estimates": {
                k: v
                for k, v in (model_doc.get("estimates") or {}).items()
                if k.endswith("_peak_rss_bytes") and isinstance(v, (int, float))
            },
        },
        "settings": {
            k: resolved.get(k, settings.get(k)) for k in SETTING_KEYS if k in settings or k in resolved
        },
        "environment": {
            **{
                k: env.get(k)
                for k in ("host", "os", "wsl", "python", "cpu_count", "memory_bytes", "swap_bytes", "gpus")
            },
            "versions": versions,
            "recipes": _recipe_rows(versions, str(env.get("python") or platform.python_version())),
        },
        "stages": stages,
        "validation": None,
        "compile": None,
        "bundle": None,
        "board": None,
        "chat": None,
        "bench": bench_section(art / "bench" / "bench.json"),  # `hexstudio bench`, not a stage: any time
        "kpis": [],
        "series": {"resources": {}, "token_rate": []},
        "events": [
            {"t": e.get("t"), "kind": e.get("kind"), "message": e.get("message")}
            for e in m.data.get("events") or []
        ],
    }
    # a stage's artifacts count only when the stage is done: after a failed attempt artifacts/<stage>/ still
    # holds an earlier attempt's files, which would describe a different run
    done = {st["name"] for st in stages if st["state"] == "done"}
    # done, but its inputs changed since (a new bundle pushed, other settings): its figures describe the run as
    # it was, and say so
    stale = {st["name"] for st in stages if st["status"]["key"] == "stale"}

    def artifact(stage: str, rel: str) -> dict[str, Any] | None:
        return _read_json(art / stage / rel) if stage in done else None

    v = artifact("validate", "validation.json")
    if v:
        rep["validation"] = {
            "verdict": v.get("verdict"),
            "summary": v.get("summary"),
            "checks": v.get("checks") or {},
            "calibration_graph": v.get("calibration_graph"),
        }
    b = artifact("compile", "bundle/bundle.json")
    rep["compile"] = _compile_section(run_dir, b, "compile" in done)
    if b:
        rep["bundle"] = _bundle_files(b)
    bd = artifact("board", "board.json")
    if bd:
        rep["board"] = {
            "name": bd.get("board"),
            "label": bd.get("label"),
            # which board, without naming it: runs on two boards stay apart in a compare of reports whose host
            # names are hidden (then both labels read ssh://[user]@[host]:22)
            "key": hashlib.sha256(f"{bd.get('board')}\0{bd.get('label')}".encode()).hexdigest()[:12],
            "simulated": bool(bd.get("simulated")),
            "doctor": bd.get("doctor") or [],
            "push": bd.get("push") or {},
        }
    ch = artifact("chat", "chat.json")
    if ch:
        source = _chat_source(ch, bd, m)
        rep["chat"] = {
            "source": source,
            "board": ch.get("board"),
            "prompt": ch.get("prompt"),
            "reply": ch.get("reply"),
            "state": ch.get("state"),
            "stale": "chat" in stale,
        }
        k = ch.get("kpis") or {}
        for key, (label, unit) in KPI_LABELS.items():
            rep["kpis"].append(
                {
                    "name": key,
                    "label": label,
                    "unit": unit,
                    "value": k.get(key),
                    "source": source,
                    "reference": REFERENCE_KPIS[key],
                }
            )
        rep["series"]["token_rate"] = token_rate_series(ch.get("chunks") or [])
        rep["series"]["token_rate_unit"] = token_rate_unit(ch.get("chunks") or [])
    # the numbers of a simulator board are not device results, whatever compiled the bundle: real QNN binaries
    # compiled on this PC run on Qualcomm's HTP simulator there, and their bundle is not "simulated"
    rep["simulated_board"] = bool(
        (rep["compile"] or {}).get("simulated")
        or (rep["board"] or {}).get("simulated")
        or (rep["chat"] or {}).get("source") == "simulated"
    )
    rep["chat_sessions"] = _chat_sessions(run_dir)
    # the speed predictor's figures (issue 28): labeled predicted, beside the measured KPIs, never in them
    prediction = read_prediction(run_dir)
    rep["predicted"] = predicted_section(prediction, rep["kpis"], settings_now(settings, resolved))
    ev = artifact("evaluate", "evaluate.json")
    if ev:  # the Evaluate stage: every suite float -> simulated -> board (hexstudio/core/eval/)
        rep["evaluation"] = {
            k: ev.get(k)
            for k in (
                "source",
                "simulated",
                "legs",
                "leg_titles",
                "prompt_format",
                "tool_format",
                "board_session",
            )
        }
        rep["evaluation"]["stale"] = "evaluate" in stale
        rep["evaluation"]["suites"] = [
            {
                k: t.get(k)
                for k in ("suite", "title", "description", "scorer", "cases", "sha256", "legs", "drops")
            }
            for t in ev.get("suites") or []
        ]
        # a speculative dialog's predicted speed at the acceptance measured (not from an out-of-date prediction)
        if rep["predicted"] is not None and not rep["predicted"]["stale"]:
            rep["predicted"]["speculative"] = speculative_prediction(
                run_dir, m.settings, ev.get("board_session"), prediction
            )
    for s in STAGES:
        series = _resources(run_dir, s.name) if m.stage(s.name).state != "pending" else []
        if series:
            rep["series"]["resources"][s.name] = series
    secrets = list(extra_secrets or []) + _keyring_secrets() + secret_values_in(m.data.get("inputs"))
    hosts: list[str] = []
    users: list[str] = []
    if redact_hosts:
        hosts, users = _names_to_hide(m, env, bd)
        rep["environment"]["host"] = "[host]" if env.get("host") else None
    out: dict[str, Any] = finite(scrub(rep, secrets, hosts, users))  # valid JSON, whatever a metric holds
    return out


def _names_to_hide(
    m: RunManifest, env: dict[str, Any], board_doc: dict[str, Any] | None
) -> tuple[list[str], list[str]]:
    """Host and user names of this machine, of the run's board (settings and the board's ssh:// label) and of its
    worker host (a stage's failure names it: "Worker host 'gpu1' (alice@10.2.3.4:22) ...")."""
    hosts = [str(env.get("host") or ""), socket.gethostname()]
    users = [_local_user()]
    label = (board_doc or {}).get("label")
    if isinstance(label, str) and label.startswith("ssh://"):
        user, _, host = label.split("//", 1)[1].rsplit(":", 1)[0].rpartition("@")
        hosts.append(host)
        users.append(user)
    try:
        from hexstudio.core.settings import Settings

        settings = Settings.load()
        cfg = settings.boards.get(str(m.inputs.get("board") or ""), {})
        hosts += [str(cfg.get("host") or ""), str(cfg.get("ssh_alias") or "")]
        users.append(str(cfg.get("user") or ""))
        worker = str(m.settings.get("worker_host") or "")
        if worker and worker != "local":
            from hexstudio.core.remote.hosts import worker_hosts

            wcfg = worker_hosts(settings).get(worker) or {}
            hosts += [str(wcfg.get("host") or ""), str(wcfg.get("ssh_alias") or "")]
            users.append(str(wcfg.get("user") or ""))
    except Exception:  # an unreadable settings file: hide what the run itself names
        pass
    placeholders = {"redacted", "[host]", "[user]", "localhost"}
    return (
        [h for h in hosts if h and h not in placeholders],
        [u for u in users if u and u not in placeholders],
    )


def _local_user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):  # no passwd entry (containers)
        return ""


def _keyring_secrets() -> list[str]:
    """Every secret HexStudio keeps in keyring for these settings (hexstudio.core.secrets.secret_names)."""
    try:
        from hexstudio.core.secrets import known_secret_values, secret_names
        from hexstudio.core.settings import Settings

        cfg = Settings.load()
        return known_secret_values(secret_names(cfg.data)) + secret_values_in(cfg.data)
    except Exception:  # an unreadable settings file or keyring must not stop a report; values are still
        return []  # scrubbed by key name and by pattern


def _median(xs: list[float]) -> float | None:
    xs = sorted(xs)
    if not xs:
        return None
    mid = len(xs) // 2
    return xs[mid] if len(xs) % 2 else round((xs[mid - 1] + xs[mid]) / 2, 2)


def _chat_sessions(run_dir: Path) -> list[dict[str, Any]]:
    """Interactive chats on this run's bundle (Chat page, `hexstudio chat`), from the run's chat journals:
    per session the board, mode and source, and each turn's KPIs; medians over the complete turns."""
    out = []
    for j in read_journals(run_dir):
        h = j["session"]
        turns = []
        for t in j["turns"]:
            k = t.get("kpis") or {}
            user = str(t.get("user") or "")
            turns.append(
                {
                    "n": t.get("n"),
                    "state": t.get("state"),
                    "source": t.get("source"),
                    "user": user if len(user) <= 80 else user[:77] + "...",
                    "ttft_ms": k.get("ttft_ms"),
                    "prompt_tok_s": k.get("prompt_tok_s"),
                    "gen_tok_s": k.get("gen_tok_s"),
                    "generated_tokens": k.get("generated_tokens"),
                    "init_ms": k.get("init_ms"),
                    "note": t.get("note"),
                    "error": t.get("error"),
                }
            )
        done = [t for t in turns if t["state"] == "complete"]
        sources = sorted({str(t["source"]) for t in turns})
        out.append(
            {
                "id": j["id"],
                "started": h.get("started"),
                "board": h.get("board_label") or h.get("board"),
                "mode": h.get("mode"),
                "template": h.get("template"),
                "sampler": h.get("sampler"),
                "source": sources[0] if len(sources) == 1 else "mixed",
                "turns": turns,
                "median_ttft_ms": _median([t["ttft_ms"] for t in done if t["ttft_ms"] is not None]),
                "median_gen_tok_s": _median([t["gen_tok_s"] for t in done if t["gen_tok_s"] is not None]),
            }
        )
    return out


def _chat_source(chat: dict[str, Any], board_doc: dict[str, Any] | None, m: RunManifest) -> str:
    """device | simulated. When chat.json does not say, anything that could be the simulator is simulated."""
    src = chat.get("source") or (chat.get("kpis") or {}).get("source")
    if src in ("device", "simulated", "emulated"):
        return str(src)
    if (board_doc or {}).get("simulated") or m.inputs.get("board") == "sim" or board_doc is None:
        return "simulated"
    return "device"


def _compile_section(run_dir: Path, bundle: dict[str, Any] | None, done: bool) -> dict[str, Any] | None:
    """From compile.json (job states), else bundle.json, else the AI Hub jobs file of an unfinished compile."""
    cj = (_read_json(run_dir / "artifacts" / "compile" / "compile.json") or {}) if done else {}
    jobs_file = _read_json(run_dir / "aihub_jobs.json") or {}
    if not (bundle or cj or jobs_file):
        return None
    src = bundle or cj
    jobs = cj.get("jobs") or (bundle or {}).get("aihub_jobs") or list((jobs_file.get("jobs") or {}).values())
    failed = cj.get("failed_jobs") if cj else jobs_file.get("failed")
    keep = ("part", "kind", "graph", "job_id", "url", "state", "reason")
    return {
        "simulated": bool(src.get("simulated")),
        "emulated": bool(src.get("emulated")),
        "target": cj.get("target")
        or src.get("compile_target")
        or ("simulation" if src.get("simulated") else "aihub"),
        "device": src.get("device"),
        "qairt_version": src.get("qairt_version"),
        "context_length": src.get("context_length"),
        "parts": src.get("parts"),
        "jobs": [{k: j.get(k) for k in keep if k in j} for j in jobs],
        "failed_jobs": [{k: j.get(k) for k in keep if k in j} for j in failed or []],
    }
