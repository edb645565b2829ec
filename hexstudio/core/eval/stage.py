"""Evaluate stage: every selected suite on three legs, so each score is shown float -> simulated-quantized ->
board with the drop at each step.

- host float and host quantized simulation: hexstudio/workers/evaluate.py (the deployment pair, as Genie runs it);
- board: the run's board through the persistent dialog (hexstudio.core.genie.session.ChatSession: loaded once,
  the KV cache cleared between cases, no re-init), deterministic sampler.

Every finished case run is appended (fsync'd) to a journal under <run>/eval/, keyed by what it depends on
(suite case, prompt, graphs or bundle, board, runtime): a crash, a kill or a cancel loses at most the case
in flight, and the next attempt skips what is finished. Everything from the simulator board is labeled
simulated.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import math
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.core.eval.render import PromptRenderer
from hexstudio.core.eval.scoring import LEG_TITLES, parity, score_case, suite_scores
from hexstudio.core.eval.suites import DEFAULT_SUITES, Suite, SuiteError, load_named
from hexstudio.core.stage_api import StageContext, StageError, worker_env_async
from hexstudio.shared.journal import append_journal, read_journal
from hexstudio.shared.run_settings import DEFAULTS
from hexstudio.shared.worker_spec import EvalCase, EvalWork

EVAL_VERSION = 1


def _encoded(rec: dict[str, Any], encode: Callable[[str], list[int]]) -> list[int]:
    """A greedy continuation as parity compares it, board's and host's alike: its text encoded again with the
    bundle's tokenizer. The board returns text only, and a greedy continuation can hold a split the tokenizer
    never makes (" hel" + "lo" where it encodes " hello" as one token): the host's raw ids set beside the board's
    text encoded again read as a miss for an identical reply. A continuation the token limit cut inside a
    multi-byte character ends in a partial one: the host's text shows it as U+FFFD and the board leaves it out,
    so both are compared without it."""
    return encode(str(rec.get("text") or "").rstrip("\ufffd"))


def _h(*parts: Any) -> str:
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


# Qualcomm's HTP simulator runs ~1 s a token on the built-in model (both for the board's Genie and the host's
# HTP leg): on a simulated board that runs it, the board leg takes the greedy-parity suite only, its first
# cases and a shorter budget, so the default flow stays a few minutes. A real board runs every case.
HTP_SIM_PARITY_CASES = 3
HTP_SIM_MAX_TOKENS = 16
# board cases failing one after another: the board or its link is gone, the rest would fail the same way
MAX_FAILED_IN_A_ROW = 3
RUNNING_SCORE_S = 2.0  # how often the board leg's progress line scores the cases so far


class Plan:
    """What runs where: one job per (suite, case), its prompt rendered once for all legs. `htp_board`: the
    board is Qualcomm's HTP simulator (real Genie on x86), so greedy parity is judged against the host's HTP
    simulation leg, and the board leg is budgeted (HTP_SIM_*)."""

    def __init__(self, suites: list[Suite], renderer: PromptRenderer, htp_board: bool = False) -> None:
        self.htp_board = htp_board
        self.suites = suites
        self.renderer = renderer
        self.jobs: list[dict[str, Any]] = []
        self.by_case: dict[tuple[str, str], dict[str, Any]] = {}
        for s in suites:
            for c in s.cases:
                job: dict[str, Any]
                if c.scorer == "perplexity":
                    job = {"kind": "nll", "text": c.text, "legs": ("float", "sim")}
                else:
                    prompt = renderer.prompt(c)
                    max_tokens = c.max_tokens
                    legs: tuple[str, ...]
                    if c.scorer == "parity" and htp_board:
                        on_board = [x.id for x in s.cases][:HTP_SIM_PARITY_CASES]
                        legs = ("sim", "htp", "board") if c.id in on_board else ("sim",)
                        max_tokens = min(int(c.max_tokens or 64), HTP_SIM_MAX_TOKENS)
                    elif c.scorer == "parity":
                        legs = ("sim", "board")
                    else:
                        legs = ("float", "sim") if htp_board else ("float", "sim", "board")
                    job = {"kind": "generate", "prompt": prompt, "max_tokens": max_tokens, "legs": legs}
                job["key"] = (
                    f"{s.name}/{c.id}/{_h(job.get('prompt'), job.get('text'), job.get('max_tokens'))}"
                )
                job["suite"], job["case"] = s.name, c.id
                self.jobs.append(job)
                self.by_case[(s.name, c.id)] = job

    def for_leg(self, leg: str) -> list[dict[str, Any]]:
        return [j for j in self.jobs if leg in j["legs"]]


def case_runs(plan: Plan, legs: list[str]) -> int:
    """How many (leg, case) runs the legs make: the one count the stage's progress is told in."""
    return sum(1 for j in plan.jobs for leg in legs if leg in j["legs"])


class Progress:
    """The stage's one progress count over every case run (host legs and board leg together), fed by legs that
    run at the same time: the percentage and the count in the words always agree ("25 % … (72/288 case runs)")."""

    def __init__(self, ctx: StageContext, all_runs: int) -> None:
        self.ctx = ctx
        self.all_runs = max(all_runs, 1)
        self.done: dict[str, int] = {}

    def tell(self, part: str, n: int, what: str, **extra: Any) -> None:
        self.done[part] = n
        total = sum(self.done.values())
        self.ctx.emitter.progress(
            total / self.all_runs,
            f"{what} ({total}/{self.all_runs} case runs)",
            cases_done=total,
            cases_total=self.all_runs,
            **extra,
        )


async def run_host_legs(
    ctx: StageContext,
    plan: Plan,
    legs: list[str],
    journal: Path,
    progress: Progress,
    *,
    part: str = "host",
    python: str | None = None,
    env: dict[str, str] | None = None,
) -> None:
    """hexstudio/workers/evaluate.py over `legs` of the host (float and simulation graphs, or the HTP graphs on Qualcomm's
    simulator). `python`: another interpreter to run it under (the workstation installer's side environment that
    holds onnxruntime-qnn when the recipe's Python cannot); `part` names the worker in the logs and the spec."""
    cases = tuple(
        EvalCase.from_json({**j, "legs": [leg for leg in legs if leg in j["legs"]]})
        for j in plan.jobs
        if any(leg in j["legs"] for leg in legs)
    )
    runs = case_runs(plan, legs)
    done = read_journal(journal)
    if all(f"{leg}\0{j['key']}" in done for j in plan.jobs for leg in legs if leg in j["legs"]):
        progress.tell(part, runs, f"{part} legs: every case already done (from an earlier attempt)")
        return
    spec = ctx.worker_spec(ctx.out_dir / part, evaluate=EvalWork(tuple(legs), cases, journal))

    def on_event(ev: dict[str, Any]) -> None:
        if ev.get("type") == "progress":
            n = (
                int(ev["finished"])
                if isinstance(ev.get("finished"), int)
                else round(float(ev.get("fraction") or 0) * runs)
            )
            what = (
                f"{ev['leg']}: {ev['key']}" if ev.get("leg") and ev.get("key") else str(ev.get("message", ""))
            )
            progress.tell(part, n, f"host {what}")
        elif ev.get("type") in ("log", "warning"):
            ctx.emit(ev)

    res = await ctx.run_worker(
        "hexstudio.workers.evaluate",
        spec,
        name=f"evaluate.{part}",
        what=f"The Evaluate stage's host legs ({', '.join(legs)})",
        on_event=on_event,
        python=python,
        env=env,
    )
    if not res.ok:
        side = f" (in {python})" if python else ""
        raise StageError(
            res.code or "host_legs_failed",
            f"The host legs of the evaluation ({', '.join(legs)}){side} failed: {res.message}",
            res.hint
            or f"See logs/evaluate.{part}.jsonl in the run folder; cases already finished are "
            "kept and skipped when you run the stage again.",
        )


async def run_board_leg(
    ctx: StageContext,
    plan: Plan,
    journal: Path,
    board: Any,
    remote_bundle: str,
    runtime: str | None,
    on_case: Any,
    dialog: str = "basic",
) -> dict[str, Any]:
    """The cases on the board through one persistent dialog (`dialog`: basic, or a speculative one the bundle
    carries): loaded once, its KV cache cleared between cases."""
    from hexstudio.core.genie.conversation import Conversation
    from hexstudio.core.genie.session import ChatSession, SessionError

    class _Raw(Conversation):  # the prompt is already rendered with the model's template
        renders_history = False

        def prompt_for(self, user: str) -> str:
            self.dropped_turns = 0
            return user

    jobs = plan.for_leg("board")
    # a failed case is not a result (journals of older HexStudios hold some): it runs again
    done = {k for k, rec in read_journal(journal).items() if rec.get("state") != "failed"}
    todo = [j for j in jobs if f"board\0{j['key']}" not in done]
    info: dict[str, Any] = {"cases": len(jobs), "skipped_done": len(jobs) - len(todo)}
    if not todo:
        return info
    info["dialog"] = dialog
    session = ChatSession(
        board,
        remote_bundle,
        _Raw(template="qa"),
        mode="persistent",
        max_tokens=64,
        sampler="deterministic",
        runtime=runtime,
        dialog=dialog,
    )
    failed: list[str] = []
    in_a_row = 0
    try:
        try:
            await session.open()
        except SessionError as exc:
            raise StageError(
                "board_dialog_failed",
                f"The dialog could not be opened on {board.label}: {exc.message}",
                exc.hint or "See the Board page's doctor.",
            ) from None
        info.update(
            {
                "init_ms": session.init_ms,
                "runtime": session.runtime.name,
                "runtime_version": session.runtime_version,
                "simulated": session.simulated,
                "mode": session.mode,
            }
        )
        for i, j in enumerate(todo):
            ctx.check_cancelled()
            await session.reset()
            session.max_tokens = int(j["max_tokens"])
            session.conversation.max_reply_tokens = session.max_tokens
            stop = asyncio.Event()
            waiter = asyncio.ensure_future(ctx.cancel_event.wait())
            waiter.add_done_callback(_setter(stop))
            try:
                r = await session.send(j["prompt"], stop=stop)
            except ValueError as exc:
                # the prompt alone is longer than the context: a result, as the host legs record it
                rec = {
                    "leg": "board",
                    "key": j["key"],
                    "text": "",
                    "state": "context_full",
                    "error": str(exc),
                }
            except SessionError as exc:
                rec = {"leg": "board", "key": j["key"], "text": "", "state": "failed", "error": exc.message}
            else:
                too_long = r.state == "failed" and r.extra.get("prompt_too_long")
                rec = {
                    "leg": "board",
                    "key": j["key"],
                    "text": r.text,
                    "state": "context_full" if too_long else r.state,
                    "error": r.error,
                    "kpis": r.kpis.as_json() if r.kpis else None,
                    "simulated": r.simulated,
                }
            finally:
                waiter.cancel()
            # an aborted reply is not a result: not journaled
            ctx.check_cancelled()
            if rec["state"] == "failed":
                # nor is a failed one: scored, it would read as a wrong answer of the model; running the stage
                # again retries it
                failed.append(f"{j['key']}: {rec.get('error') or 'no reply'}")
                in_a_row += 1
                if in_a_row >= MAX_FAILED_IN_A_ROW:
                    break
                continue
            in_a_row = 0
            append_journal(journal, rec)
            on_case(len(jobs) - len(todo) + i + 1, len(jobs), j)
    finally:
        with contextlib.suppress(Exception):
            await session.close()
    if failed:
        stopped = f"; stopped after {MAX_FAILED_IN_A_ROW} in a row" if in_a_row >= MAX_FAILED_IN_A_ROW else ""
        raise StageError(
            "board_cases_failed",
            f"{len(failed)} evaluation case(s) got no reply from {board.label}{stopped} (first: {failed[0]}).",
            "The cases that finished are kept. Check the board (the Board page's doctor), then run the Evaluate "
            "stage again: only the cases without a result run.",
        )
    return info


def _emit_parity(em: Any, boards: list[dict[str, Any]], reference: str) -> None:
    """The board's greedy parity over every parity suite, for the gate. With no token compared (no host leg to
    compare with, or no tokenizer in the bundle) it is "not measured", said so, never a perfect 0/0."""
    matched = sum(int(b["matched"]) for b in boards)
    total = sum(int(b["total"]) for b in boards)
    if total == 0 and any(b.get("compared") for b in boards):
        em.metric("parity_reference", "empty")
        em.warning(
            "Greedy parity compared no tokens: every parity case ended at once on the board and on the host "
            "(an immediate end of text, or a prompt that filled the context). They agree, but nothing was checked.",
            "Use parity prompts the model continues (and room in the context for max_tokens), then run the "
            "Evaluate stage again.",
            code="parity_empty",
        )
        return
    if total == 0:
        em.metric("parity_reference", "none")
        em.warning(
            "Greedy parity was not measured: the board's replies had no host reference to compare with (no "
            "sim or HTP leg in eval_legs, or no tokenizer.json in the bundle).",
            "Add the sim leg to eval_legs (the default has it) and run the Evaluate stage again to check the "
            "board token for token.",
            code="parity_not_measured",
        )
        return
    em.metric("parity_matched", matched)
    em.metric("parity_total", total)
    em.metric("parity_reference", reference)


def _htp_leg_available() -> bool:
    """Whether onnxruntime-qnn imports here or in the workstation installer's side environment."""
    from hexstudio.workers.qnn.libs import find_qnn_libs

    return find_qnn_libs() is not None


async def _run_htp_leg(ctx: StageContext, plan: Plan, journal: Path, progress: Progress) -> None:
    """The host's HTP leg (the local compile's graphs on Qualcomm's HTP simulator) in a worker of its own: under
    this environment's Python when it holds onnxruntime-qnn, else under the side environment's."""
    from hexstudio.workers.qnn.libs import find_qnn_libs, with_workers_on_path

    libs = find_qnn_libs()
    if libs is None or libs.in_process:
        await run_host_legs(ctx, plan, ["htp"], journal, progress, part="htp")
        return
    await run_host_legs(
        ctx,
        plan,
        ["htp"],
        journal,
        progress,
        part="htp",
        python=libs.python,
        env=with_workers_on_path(libs.env(await worker_env_async())),
    )


async def _all_or_none(legs: list[Any]) -> None:
    """Run the legs at the same time; the first that fails (or a cancel) stops the others, and its error is
    the stage's. What each finished is already in its journal."""
    tasks = [asyncio.ensure_future(c) for c in legs]
    if not tasks:
        return
    try:
        _, pending = await asyncio.wait(tasks, return_when=asyncio.FIRST_EXCEPTION)
    except asyncio.CancelledError:
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
        raise
    for t in pending:
        t.cancel()
    await asyncio.gather(*pending, return_exceptions=True)
    for t in tasks:
        exc = t.exception() if t.done() and not t.cancelled() else None
        if exc is not None:
            raise exc


def _bundle_binaries(ctx: StageContext) -> str:
    """ "qnn" when the compile stage's bundle holds real QNN context binaries (a local or AI Hub compile)."""
    try:
        doc = json.loads((ctx.upstream["compile"] / "bundle" / "bundle.json").read_text(encoding="utf-8"))
    except (KeyError, OSError, ValueError):
        return "unknown"
    return "qnn" if doc.get("binaries") == "qnn" else "stand-in"


def _setter(ev: asyncio.Event) -> Any:
    return lambda _f: ev.set()


def _token_ids(bundle_dir: Path | None) -> Any:
    """text -> token ids with the bundle's tokenizer (for the parity check of the board's text)."""
    if bundle_dir is None or not (bundle_dir / "tokenizer.json").is_file():
        return None
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(bundle_dir / "tokenizer.json"))
    return lambda text: list(tok.encode(text, add_special_tokens=False).ids)


def score_all(
    plan: Plan, records: dict[str, dict[str, Any]], tool_format: str, encode: Any
) -> tuple[dict[str, dict[str, dict[str, dict[str, Any]]]], list[dict[str, Any]]]:
    """{suite: {leg: {case id: result}}} and the per-case rows."""
    per: dict[str, dict[str, dict[str, dict[str, Any]]]] = {}
    rows = []
    for s in plan.suites:
        legs: dict[str, dict[str, dict[str, Any]]] = {"float": {}, "sim": {}, "htp": {}, "board": {}}
        for c in s.cases:
            j = plan.by_case[(s.name, c.id)]
            row: dict[str, Any] = {"suite": s.name, "case": c.id, "category": c.category, "legs": {}}
            for leg in j["legs"]:
                rec = records.get(f"{leg}\0{j['key']}")
                if rec is None:
                    continue
                res: dict[str, Any] = {"text": rec.get("text"), "state": rec.get("state")}
                if c.scorer == "perplexity":
                    res.update({"nll_sum": rec.get("nll_sum"), "tokens": rec.get("tokens")})
                elif c.scorer == "parity":
                    # the board against the HTP simulation when there is one (real Genie must match it token for
                    # token), else against the onnxruntime simulation; the HTP leg against the onnxruntime one is
                    # an agreement figure (two arithmetics), not a gate
                    ref = "htp" if "htp" in j["legs"] else "sim"
                    if leg == "board":
                        host = records.get(f"{ref}\0{j['key']}")
                        if host is not None and encode is not None:
                            res["parity"] = parity(_encoded(rec, encode), _encoded(host, encode))
                            res["reference"] = ref
                    elif leg == "htp":
                        sim = records.get(f"sim\0{j['key']}")
                        if sim is not None:
                            res["parity"] = parity(list(rec.get("ids") or []), list(sim.get("ids") or []))
                            res["reference"] = "sim"
                else:
                    res["score"] = score_case(c, str(rec.get("text") or ""), tool_format, j["prompt"])
                legs[leg][c.id] = res
                row["legs"][leg] = {k: v for k, v in res.items() if k != "text"} | {
                    "reply": (rec.get("text") or "")[:400]
                }
            rows.append(row)
        per[s.name] = legs
    return per, rows


async def run_evaluate_stage(ctx: StageContext) -> dict[str, Any]:
    from hexstudio.core.device.board import BoardError
    from hexstudio.core.services.chat_target import board_doc as read_board_doc
    from hexstudio.core.services.chat_target import open_run_board
    from hexstudio.core.settings import Settings

    em = ctx.emitter
    run_dir = ctx.manifest.run_dir
    ws_root = run_dir.parent.parent
    names = ctx.settings.get("eval_suites") or list(DEFAULT_SUITES)
    try:
        suites = load_named(list(names), ws_root)
    except SuiteError as exc:
        raise StageError("suite_invalid", exc.message, exc.hint) from None
    legs = [x for x in (ctx.settings.get("eval_legs") or DEFAULTS.eval_legs) if x in LEG_TITLES]
    renderer = PromptRenderer.for_model(
        ctx.upstream.get("model"), str(ctx.settings.get("prompt_template", DEFAULTS.prompt_template))
    )
    board_doc = read_board_doc(ctx.upstream.get("board")) or {}
    htp_board = "board" in legs and bool(board_doc.get("simulated")) and _bundle_binaries(ctx) == "qnn"
    agreement_only = htp_board and not _htp_leg_available()
    if agreement_only:
        em.warning(
            "The board runs real Genie on the HTP simulator, but the host's HTP leg cannot run: onnxruntime-qnn "
            "imports neither here nor in a side environment (packaging/install-workstation.sh makes one). "
            "Greedy parity is measured against the onnxruntime simulation, an agreement figure between two "
            "arithmetics, not the exact gate.",
            code="htp_leg_unavailable",
        )
        htp_board = False
    if htp_board:
        legs = (
            [*legs[: legs.index("board")], "htp", *legs[legs.index("board") :]] if "htp" not in legs else legs
        )
    plan = Plan(suites, renderer, htp_board=htp_board)
    if htp_board:
        em.log(
            f"The board is Qualcomm's HTP simulator (real Genie on x86, ~1 s a token): its leg runs the first "
            f"{HTP_SIM_PARITY_CASES} greedy-parity cases, {HTP_SIM_MAX_TOKENS} tokens each, judged against the "
            "host's HTP simulation; the other suites score the host legs (a real board runs every case)."
        )
    em.log(
        f"{len(plan.jobs)} cases in {len(suites)} suite(s): {', '.join(s.name for s in suites)}; prompts with "
        f"{renderer.label()}; tool calls read in the {renderer.tool_format} format"
    )
    st = ctx.manifest.data["stages"]
    digest = {n: (st.get(n) or {}).get("output_digest") for n in ("quantize", "compile", "board")}
    runtime = str(ctx.settings.get("runtime") or "") or None
    host_journal = run_dir / "eval" / f"host-{_h(digest['quantize'], digest['compile'], EVAL_VERSION)}.jsonl"
    dialog = str(ctx.settings.get("dialog_type") or "basic")  # a speculative dialog has a journal of its own

    def board_journal_for(runtime: str | None) -> Path:
        """The board leg's journal: one per bundle, push, runtime and dialog (cases of one runtime are never
        reused for another)."""
        extra = [dialog] if dialog != "basic" else []
        key = _h(digest["compile"], digest["board"], runtime, EVAL_VERSION, *extra)
        return run_dir / "eval" / f"board-{board_doc.get('board', 'none')}-{key}.jsonl"

    board_journal = board_journal_for(runtime)
    htp_journal = run_dir / "eval" / f"htp-{_h(digest['quantize'], digest['compile'], EVAL_VERSION)}.jsonl"
    host_legs = [x for x in legs if x in ("float", "sim")]
    host_runs = case_runs(plan, host_legs) + case_runs(plan, ["htp"] if "htp" in legs else [])
    all_runs = host_runs + (len(plan.for_leg("board")) if "board" in legs else 0)
    progress = Progress(ctx, all_runs)
    encode = _token_ids(ctx.upstream["compile"] / "bundle" if "compile" in ctx.upstream else None)
    board_info: dict[str, Any] = {}
    # without a board leg every score is this workstation's (float, and its quantization simulation): "host",
    # never a device result, whatever board the run names
    # the board leg counts only where a chosen case runs on the board (perplexity alone runs on the host only)
    on_board = "board" in legs and bool(plan.for_leg("board"))
    source = ("simulated" if board_doc.get("simulated") else "device") if on_board else "host"
    # A real board is another machine: its leg runs beside the host's from the start. On this machine the host's
    # float and simulation legs (onnxruntime on every core it is given) go first, then the legs that each keep
    # one core busy run side by side: the host's HTP leg and a simulator board's Genie (on 2 cores, 4 threads
    # spinning at once cost more than they gave).
    board_leg_fn: Any = None
    board: Any = None
    if "board" in legs:
        if not board_doc:
            raise StageError(
                "no_board", "The Evaluate stage needs the board stage's result.", "Run the board stage."
            )
        try:
            board = (await open_run_board(board_doc, Settings.load(), ws_root)).board
        except BoardError as exc:
            raise StageError("board_unavailable", exc.message, exc.hint) from None
        if board.simulated and on_board:
            source = "simulated"
        # the runtime the session will run: the run's setting, else the board's own (which can change between
        # two attempts of this stage), so the journal is named for what really answered
        from hexstudio.core.genie.runtime import RuntimeError_, resolve_runtime

        try:
            runtime = resolve_runtime(board, runtime)
        except RuntimeError_ as exc:
            raise StageError("runtime_unknown", exc.message, exc.hint) from None
        board_journal = board_journal_for(runtime)

        # the running score re-reads the journals and scores every case so far: at most every RUNNING_SCORE_S, not
        # after each case (quadratic in the cases: minutes of scoring for a suite of thousands)
        last: dict[str, Any] = {
            "t": -math.inf,
            "text": "",
        }  # the first case scores (monotonic() may be small)

        def on_case(n: int, total: int, j: dict[str, Any]) -> None:
            if time.monotonic() - last["t"] >= RUNNING_SCORE_S or n == total:
                recs = {
                    **read_journal(host_journal),
                    **read_journal(htp_journal),
                    **read_journal(board_journal),
                }
                per, _ = score_all(plan, recs, renderer.tool_format, encode)
                s = next(x for x in plan.suites if x.name == j["suite"])
                sc = suite_scores(s.cases, per[s.name], s.scorer)["legs"].get("board")
                last.update(t=time.monotonic(), text=f" · {s.name} so far {sc['text']}" if sc else "")
            running = last["text"]
            progress.tell(
                "board",
                n,
                f"board ({source}): case {n} of {total}{running}",
                board_cases_done=n,
                board_cases_total=total,
            )

        async def board_leg() -> None:
            board_info.update(
                await run_board_leg(
                    ctx, plan, board_journal, board, board_doc["remote_bundle"], runtime, on_case, dialog
                )
            )

        board_leg_fn = board_leg
    board_is_local = board_leg_fn is not None and source == "simulated"

    async def on_this_machine() -> None:
        if host_legs:
            await run_host_legs(ctx, plan, host_legs, host_journal, progress)
        await _all_or_none(
            [
                *([_run_htp_leg(ctx, plan, htp_journal, progress)] if "htp" in legs else []),
                *([board_leg_fn()] if board_leg_fn is not None and board_is_local else []),
            ]
        )

    try:
        await _all_or_none(
            [
                on_this_machine(),
                *([board_leg_fn()] if board_leg_fn is not None and not board_is_local else []),
            ]
        )
    finally:
        if board is not None:
            with contextlib.suppress(Exception):
                await board.transport.close()
    ctx.check_cancelled()
    # the board's journal only where this attempt has a board leg (an earlier attempt's would be scored as this one's)
    board_records = read_journal(board_journal) if on_board else {}
    if on_board and (board_info.get("simulated") or any(r.get("simulated") for r in board_records.values())):
        # the runner said it simulates (a simulator on a host declared as a board): its word, not the record's
        source = "simulated"
    records = {**read_journal(host_journal), **read_journal(htp_journal), **board_records}
    kp = [
        r["kpis"]
        for r in board_records.values()
        if isinstance(r.get("kpis"), dict) and isinstance(r["kpis"].get("accepted_per_step"), (int, float))
    ]
    accepted = [float(k["accepted_per_step"]) for k in kp]
    if "board" in legs:
        board_info["dialog"] = dialog
        if accepted:  # Genie's token-acceptance-rate over the user's own cases (lade, spd)
            board_info["accepted_per_step"] = round(sum(accepted) / len(accepted), 3)
            board_info["accepted_per_step_cases"] = len(accepted)
            # Genie's profile, or estimated from the token times where Genie wrote none (profile.py)
            sources = sorted({str(k.get("accepted_source") or "genie") for k in kp})
            board_info["accepted_per_step_source"] = sources[0] if len(sources) == 1 else "mixed"
    per, rows = score_all(plan, records, renderer.tool_format, encode)
    table = []
    for s in suites:
        sc = suite_scores(s.cases, per[s.name], s.scorer)
        table.append(
            {
                "suite": s.name,
                "title": s.title,
                "description": s.description,
                "cases": len(s.cases),
                "sha256": s.sha256,
                "shipped": s.shipped,
                **sc,
            }
        )
    doc = {
        "evaluate_version": EVAL_VERSION,
        "board": board_doc.get("board"),
        "source": source,
        "simulated": source != "device",
        "legs": [x for x in legs if x != "board" or on_board],  # no board column where nothing ran there
        "leg_titles": {
            **LEG_TITLES,
            "board": (f"board ({'SIMULATED' if source == 'simulated' else 'device'})"),
        },
        "prompt_format": renderer.label(),
        "tool_format": renderer.tool_format,
        "board_session": board_info,
        "suites": table,
        "cases": rows,
    }
    (ctx.out_dir / "evaluate.json").write_text(json.dumps(doc, indent=2, ensure_ascii=False))
    em.artifact("evaluate.json", kind="json", role="evaluation")
    # every parity suite's board figures together: the gate judges them all, not the last suite's alone
    parity_boards = [t["legs"]["board"] for t in table if t["scorer"] == "parity" and t["legs"].get("board")]
    for t in table:
        for leg, v in t["legs"].items():
            if (
                v is not None and v.get("value") is not None
            ):  # e.g. the HTP leg's agreement with an absent sim leg
                em.metric(
                    f"{t['suite']}.{leg}",
                    v["value"],
                    unit="ppl" if t["scorer"] == "perplexity" else "",
                    scope="simulated" if leg == "board" and source == "simulated" else leg,
                )
        if t["scorer"] == "parity" and (t["legs"].get("htp") or {}).get("value") is not None:
            em.metric("htp_sim_agreement", t["legs"]["htp"]["value"])
    if parity_boards:
        _emit_parity(em, parity_boards, "htp" if htp_board else "sim-agreement" if agreement_only else "sim")
    em.metric("source", source)
    if board_info.get("dialog") not in (None, "basic"):
        em.metric("dialog", board_info["dialog"])
        if "accepted_per_step" in board_info:
            em.metric(
                "accepted_per_step",
                board_info["accepted_per_step"],
                unit="tokens/step",
                scope="simulated" if source == "simulated" else "device",
            )
            em.metric("accepted_per_step_source", board_info["accepted_per_step_source"])
    line = "; ".join(
        f"{t['suite']} " + " → ".join((t["legs"].get(leg) or {}).get("text", "—") for leg in legs)
        for t in table
    )
    em.progress(1.0, line)
    return {"suites": len(table), "source": source}
