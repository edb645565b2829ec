"""The speed predictor's figures in a run's report and in Compare (issue 28): PREDICTED by QNN's HTP simulator,
shown beside what was measured (on a device or the simulator board), never mixed into a measured figure.

A run's prediction lives in runs/<id>/predicted/prediction.json (hexstudio.core.services.predict.save_for_run: the
Preflight page's speed panel and `hexstudio predict --run ID` write it)."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.shared.predict import LABEL, speculative_rate

PREDICTION_FILE = Path("predicted") / "prediction.json"


def read_prediction(run_dir: Path) -> dict[str, Any] | None:
    """The prediction kept with a run; None when there is none, or it is damaged or of another form (a hand edit,
    an older version): the report and the panel then have no prediction, rather than failing."""
    try:
        doc = json.loads((run_dir / PREDICTION_FILE).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    if not isinstance(doc, dict) or doc.get("predicted") is not True:
        return None
    try:  # what every reader of a prediction takes from it
        _bounds(doc["decode_tok_s"]["full_context"])
        _bounds(doc["prompt_pass"]["total_ms"])
        _bounds(doc["token"]["total_ms"])
        int(doc["ar_n"])
        if not all(int(k) > 0 and _bounds(v) for k, v in doc["ttft_ms"].items()):
            return None
    except (KeyError, TypeError, ValueError, AttributeError):
        return None
    return doc


def _bounds(b: dict[str, Any]) -> dict[str, float]:
    return {k: float(b[k]) for k in ("value", "lower", "upper")}


def predicted_ttft(doc: dict[str, Any], prompt_tokens: int) -> dict[str, float]:
    """Predicted TTFT for a prompt of this length: ceil(prompt / AR-N) prompt-processor passes."""
    passes = max(1, math.ceil(prompt_tokens / int(doc["ar_n"])))
    one = doc["prompt_pass"]["total_ms"]
    return {k: float(one[k]) * passes for k in ("value", "lower", "upper")}


def stale_because(doc: dict[str, Any], now: dict[str, Any]) -> str | None:
    """Why a saved prediction no longer describes the run (None: it does). `now`: the run's context length, AR-N and
    parts (ints where known) and its `device` (the Compile stage's target): a prediction made before one of them
    changed is for another graph shape or another Hexagon."""
    changed = [
        f"{label} {doc.get(key)} → {now[key]}"
        for key, label in (("context_length", "context"), ("ar_n", "AR-N"), ("parts", "parts"))
        if isinstance(now.get(key), int) and isinstance(doc.get(key), int) and now[key] != doc[key]
    ]
    from hexstudio.shared.bundle import KNOWN_DEVICES

    device = str(now.get("device") or "")
    known = KNOWN_DEVICES.get(device)
    target = doc.get("target") or {}
    arch = target.get("dsp_arch")
    if known is not None and arch and known.get("dsp_arch") != arch:
        changed.append(f"Hexagon {arch} → {known.get('dsp_arch')} ({now.get('device')})")
    if device and known is None and target.get("name") != device:
        # nothing here can say which Hexagon the run's device has: the prediction may be for another one
        return (
            f"the run compiles for '{device}', a device HexStudio does not know offline, so this prediction (for "
            f"{target.get('name')}, Hexagon {arch}) may be for another Hexagon and is not set beside the board's "
            "figures"
            + (f" (the settings changed since too: {'; '.join(changed)})" if changed else "")
            + ": choose a device HexStudio knows (`hexstudio bundle devices`) to predict for it"
        )
    if not changed:
        return None
    return (
        f"this prediction was made for other settings than the run has now ({'; '.join(changed)}): predict again "
        "(the Preflight page's speed panel, or `hexstudio predict --run ID`)"
    )


def predicted_section(
    doc: dict[str, Any] | None, kpis: list[dict[str, Any]], now: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The report's `predicted` section: the prediction's figures, and `beside`: each measured chat KPI it can
    be set beside (decode tok/s, TTFT at the measured prompt length) with the predicted figure in its own field.
    `now` (see stale_because): a prediction for other settings is `stale`, with nothing set beside a measurement."""
    if not doc:
        return None
    stale = stale_because(doc, now) if now is not None else None
    t = doc.get("target") or {}
    measured = {k["name"]: k for k in kpis}
    beside: list[dict[str, Any]] = []
    gen = measured.get("gen_tok_s")
    beside.append(
        {
            "name": "gen_tok_s",
            "label": "Decode",
            "unit": "tok/s",
            "measured": gen.get("value") if gen else None,
            "measured_source": gen.get("source") if gen else None,
            "predicted": _bounds(doc["decode_tok_s"]["full_context"]),
        }
    )
    ttft, prompt = measured.get("ttft_ms"), measured.get("prompt_tokens")
    n = int(prompt["value"]) if prompt and isinstance(prompt.get("value"), (int, float)) else int(doc["ar_n"])
    beside.append(
        {
            "name": "ttft_ms",
            "label": f"Time to first token ({n}-token prompt)",
            "unit": "ms",
            "measured": ttft.get("value") if ttft else None,
            "measured_source": ttft.get("source") if ttft else None,
            "predicted": predicted_ttft(doc, n),
        }
    )
    return {
        "label": LABEL,
        "model": doc.get("model"),
        "qnn_version": doc.get("qnn_version"),
        "target": {"name": t.get("name"), "soc_model": t.get("soc_model"), "dsp_arch": t.get("dsp_arch")},
        "context_length": doc.get("context_length"),
        "ar_n": doc.get("ar_n"),
        "parts": doc.get("parts"),
        "decode_tok_s": _bounds(doc["decode_tok_s"]["full_context"]),
        "ttft_ms": [
            {"prompt_tokens": int(k), **_bounds(v)}
            for k, v in sorted(doc["ttft_ms"].items(), key=lambda kv: int(kv[0]))
        ],
        "notes": [str(x) for x in doc.get("notes") or []],
        "beside": [] if stale else beside,
        "stale": stale,
    }


def settings_now(settings: dict[str, Any], resolved: dict[str, Any]) -> dict[str, Any]:
    """A run's `now` for stale_because: the context length, AR-N and parts the Model stage resolved (the run's
    settings where it has not run) and the Compile stage's target device."""
    now = {k: resolved.get(k, settings.get(k)) for k in ("context_length", "ar_n", "parts")}
    return {**now, "device": settings.get("device")}


def run_prediction_stale(run_dir: Path, doc: dict[str, Any]) -> str | None:
    """Why the prediction kept with the run in `run_dir` no longer describes it (its settings or device changed
    since: stale_because); None when it still does."""
    from hexstudio.core.manifest import RunManifest
    from hexstudio.shared.errors import ActionableError

    try:
        m = RunManifest.load(run_dir)
    except (OSError, ValueError, ActionableError):  # no run there to compare with (a bundle copied elsewhere)
        return None
    resolved: dict[str, Any] = {}
    if m.stage("model").state == "done":
        try:
            resolved = (
                json.loads((run_dir / "artifacts" / "model" / "model.json").read_text()).get("resolved") or {}
            )
        except (OSError, ValueError, AttributeError):
            resolved = {}
    return stale_because(doc, settings_now(m.settings, resolved))


def speculative_prediction(
    run_dir: Path, settings: dict[str, Any], board_session: Any, doc: dict[str, Any] | None = None
) -> dict[str, Any] | None:
    """The Evaluate stage's speculative dialog (lade, spd) at its measured tokens accepted per step, costed with the
    run's prediction (and, for spd with a draft bundle, the draft run's own prediction): hexstudio.shared.predict.
    speculative_rate. None when the dialog is basic, nothing was accepted, or a cost is unknown. `doc`: the run's
    prediction when the caller has read it already."""
    doc = doc if doc is not None else read_prediction(run_dir)
    bs = board_session if isinstance(board_session, dict) else {}
    dialog, accepted = bs.get("dialog"), bs.get("accepted_per_step")
    if doc is None or dialog not in ("lade", "spd") or not isinstance(accepted, (int, float)):
        return None
    draft = None
    if dialog == "spd":
        where = str(settings.get("spd_draft") or "self")
        # a draft bundle is <draft run>/artifacts/compile/bundle: that run's prediction, if it has one
        folder = Path(where).expanduser()
        draft_run = folder.parents[2] if where != "self" and len(folder.parents) > 2 else None
        draft = doc if where == "self" else read_prediction(draft_run) if draft_run is not None else None
        why = run_prediction_stale(draft_run, draft) if draft_run is not None and draft is not None else None
        if why is not None:  # the draft's costs are for another shape or device: no spd figure from them
            return {
                "label": LABEL,
                "dialog": dialog,
                "missing": f"the draft model's run: {why}",
            }
    from hexstudio.shared.bundle.speculative import speculative_of
    from hexstudio.shared.run_settings import extra_ar_sizes, run_settings_of

    typed = run_settings_of(settings)
    _, lade, spd = speculative_of(typed)  # the values the compile wrote into the dialog configs
    try:  # the smaller prompt-processor graphs the bundle holds: a step runs on the smallest that holds it
        ar_sizes = extra_ar_sizes(typed.ar_sizes)
    except ValueError:
        ar_sizes = []
    out = speculative_rate(
        doc,
        str(dialog),
        float(accepted),
        draft_len=spd.draft_len,
        draft=draft,
        step_tokens=lade.step_tokens if dialog == "lade" else spd.draft_len + 1,
        ar_sizes=ar_sizes,
    )
    if out is None and dialog == "spd":
        return {
            "label": LABEL,
            "dialog": dialog,
            "missing": "the draft model has no prediction: run `hexstudio "
            "predict --run DRAFT_RUN` (or its Preflight page's speed panel) for the draft model's run",
        }
    return out


RowMaker = Callable[..., dict[str, Any]]


def predicted_rows(reports: list[dict[str, Any]], skipped: list[str], row: RowMaker) -> list[dict[str, Any]]:
    """Compare's predicted rows, in a section of their own (section "predicted", labels saying predicted): a
    predicted figure is never set in a measured row."""
    preds = [r.get("predicted") for r in reports]
    if not any(preds):
        return []
    if not all(preds):
        skipped.append(
            "Predicted speed: not every run has a prediction (Preflight page, or `hexstudio predict "
            "--run ID`)."
        )
        return []
    ps = [p for p in preds if p]
    if any(p.get("stale") for p in ps):
        skipped.append("Predicted speed: a run's prediction was made for other settings than it has now.")
        return []
    out = [
        row(
            "predicted",
            "predicted_decode_tok_s",
            "Decode (predicted, HTP simulator)",
            [p["decode_tok_s"]["value"] for p in ps],
            "tok/s",
        )
    ]
    common = set.intersection(*({t["prompt_tokens"] for t in p["ttft_ms"]} for p in ps))
    for n in sorted(common):
        out.append(
            row(
                "predicted",
                "predicted_ttft_ms",
                f"TTFT, {n}-token prompt (predicted, HTP simulator)",
                [next(t["value"] for t in p["ttft_ms"] if t["prompt_tokens"] == n) for p in ps],
                "ms",
            )
        )
    return out
