"""Parse genie-t2t-run's --profile JSON (artifact_type GENIE_PROFILE) into normalised KPIs."""

from __future__ import annotations

import itertools
import json
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError


class ProfileError(ActionableError, ValueError):
    pass


@dataclass
class Kpis:
    init_ms: float | None
    prompt_tokens: int | None
    prompt_tok_s: float | None
    ttft_ms: float | None
    generated_tokens: int | None
    gen_tok_s: float | None
    gen_time_ms: float | None
    source: str  # "device" | "simulated"
    queries: int = 1
    # "profile" (--profile JSON) | "kpis_block" (old QAIRT's printed [KPIS]: block) | "helper_timing" (no profile:
    # the board helper's own clock over Genie's token callbacks)
    origin: str = "profile"
    accepted_per_step: float | None = None  # lade/spd: Genie's token-acceptance-rate (tokens per step)
    # where accepted_per_step comes from: "genie" (its profile) or "token times" (estimated from when each token
    # arrived, where Genie wrote no profile: accepted_from_token_times)
    accepted_source: str | None = None

    def as_json(self) -> dict[str, Any]:
        doc = asdict(self)
        for key in ("accepted_per_step", "accepted_source"):
            if doc[key] is None:  # only speculative dialogs have them: basic documents stay as they were
                del doc[key]
        return doc


# a gap between two tokens longer than this share of the long gaps (their 90th percentile) starts a new step
STEP_GAP_SHARE = 0.2


def accepted_from_token_times(monos: list[float]) -> float | None:
    """Tokens accepted per step of a speculative dialog, estimated from when each token reached the host: Genie
    delivers the tokens one step accepts back to back (lhd-dec.cpp 274-318, spec-dec.cpp: one callback a token
    after the step's graph run), so a step boundary is a gap as long as a graph run, and the tokens inside a step
    are a sampler call apart (~1 ms against ~1.9 s a step on the x86 simulator, measured). As Genie's own
    token-acceptance-rate (Dialog KPIs: generated tokens after the first over iterations): (n - 1) / boundaries.
    None for fewer than 3 tokens. Used where Genie wrote no profile (a lade reply the helper ended at max_tokens:
    docs/genie.md); checked against Genie's own figure on spd replies (tests/qnn/test_speculative.py)."""
    if len(monos) < 3:
        return None
    gaps = sorted(b - a for a, b in itertools.pairwise(monos))
    long = gaps[int(0.9 * (len(gaps) - 1))]
    steps = sum(1 for g in gaps if g > STEP_GAP_SHARE * long)
    return round((len(monos) - 1) / steps, 3) if steps and long > 0 else None


def _value(ev: dict[str, Any], key: str) -> Any:
    v = ev.get(key)
    if isinstance(v, dict):
        return v.get("value")
    return v


def _ms(ev: dict[str, Any], key: str) -> float | None:
    v = ev.get(key)
    if not isinstance(v, dict) or v.get("value") is None:
        return None
    unit = v.get("unit", "us")
    scale = {"us": 1e-3, "ms": 1.0, "s": 1e3}.get(unit, 1e-3)
    return round(float(v["value"]) * scale, 3)


def _by_start(events: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Events in the order they started (their "start" timestamp; in place order where one has none)."""

    def start(pair: tuple[int, dict[str, Any]]) -> tuple[float, int]:
        t = pair[1].get("start")
        return (
            float(t) if isinstance(t, (int, float)) and not isinstance(t, bool) else float("-inf"),
            pair[0],
        )

    return [e for _n, e in sorted(enumerate(events), key=start)]


def parse_profile(data: dict[str, Any] | str | Path) -> Kpis:
    if isinstance(data, (str, Path)) and not str(data).lstrip().startswith("{"):
        data = Path(data).read_text(encoding="utf-8")
    if isinstance(data, str):
        try:
            data = json.loads(data)
        except json.JSONDecodeError as exc:
            raise ProfileError(
                f"The profile is not JSON ({exc.msg}); genie-t2t-run may have crashed before writing it."
            ) from None
    assert isinstance(data, dict)
    if (data.get("header") or {}).get("artifact_type") != "GENIE_PROFILE":
        raise ProfileError("Not a Genie profile: header.artifact_type is not GENIE_PROFILE.")
    events = [ev for c in data.get("components", []) for ev in c.get("events", [])]
    # the latest by its start time, not by its place: Genie writes the components in name order (a std::map in
    # Profile.cpp getProfilingData), and dialog10 comes before dialog2 there
    creates = _by_start([e for e in events if e.get("type") == "GenieDialog_create"])
    queries = _by_start([e for e in events if e.get("type") == "GenieDialog_query"])
    if not queries:
        raise ProfileError("The profile has no GenieDialog_query event: the query did not run.")
    q = queries[-1]  # several queries: the latest is this turn's
    simulated = bool((data.get("metadata") or {}).get("simulated"))
    pt = _value(q, "num-prompt-tokens")
    gt = _value(q, "num-generated-tokens")
    pr = _value(q, "prompt-processing-rate")
    gr = _value(q, "token-generation-rate")
    acc = _value(q, "token-acceptance-rate")  # only a speculative dialog (lade, spd) reports it
    return Kpis(
        init_ms=_ms(creates[-1], "init-time") if creates else None,
        prompt_tokens=int(pt) if pt is not None else None,
        prompt_tok_s=float(pr) if pr is not None else None,
        ttft_ms=_ms(q, "time-to-first-token"),
        generated_tokens=int(gt) if gt is not None else None,
        gen_tok_s=float(gr) if gr is not None else None,
        gen_time_ms=_ms(q, "token-generation-time"),
        source="simulated" if simulated else "device",
        queries=len(queries),
        accepted_per_step=round(float(acc), 3) if isinstance(acc, (int, float)) else None,
        accepted_source="genie" if isinstance(acc, (int, float)) else None,
    )


def kpis_from_block(block: dict[str, float], simulated: bool = False) -> Kpis | None:
    """KPIs from the `[KPIS]:` block QAIRT before 2.35 printed instead of writing --profile (origin
    "kpis_block"). The block has times and rates but no token counts: those are derived as
    rate x time and rounded; TTFT is the prompt processing time. None when the block holds no rate."""
    if block.get("gen_rate") is None and block.get("prompt_rate") is None:
        return None

    def ms(key: str) -> float | None:
        return round(block[key] / 1000, 3) if block.get(key) is not None else None

    def count(rate: str, us: str) -> int | None:
        if block.get(rate) is None or block.get(us) is None:
            return None
        return round(block[rate] * block[us] / 1e6)

    return Kpis(
        init_ms=ms("init_us"),
        prompt_tokens=count("prompt_rate", "prompt_us"),
        prompt_tok_s=block.get("prompt_rate"),
        ttft_ms=ms("prompt_us"),
        generated_tokens=count("gen_rate", "gen_us"),
        gen_tok_s=block.get("gen_rate"),
        gen_time_ms=ms("gen_us"),
        source="simulated" if simulated else "device",
        origin="kpis_block",
    )
