"""Qualcomm's libGenie 1.21 on the x86 HTP simulator answers from the built-in model's locally compiled bundle,
through the same helper and protocol as a real board, and computes what the host's HTP simulation computes."""

from __future__ import annotations

import asyncio
import json
import subprocess
from pathlib import Path

import pytest

from tests.qnn.conftest import genie_session, needs_qnn
from tests.support.cli import sim_t2t_argv

pytestmark = [needs_qnn, pytest.mark.slow]


def _remote_bundle(local_run: Path) -> str:
    return str(json.loads((local_run / "artifacts" / "board" / "board.json").read_text())["remote_bundle"])


def test_chat_session_runs_real_genie_on_the_htp_simulator(local_run: Path) -> None:
    from hexstudio.core.device.board import sim_board
    from hexstudio.core.genie.session import ChatSession

    board = sim_board(local_run.parent.parent)

    async def go() -> tuple[object, ChatSession]:
        s = ChatSession(
            board, _remote_bundle(local_run), mode="persistent", max_tokens=6, sampler="deterministic"
        )
        async with s:
            r = await s.send("The capital of France is")
            return r, s

    r, s = asyncio.run(go())
    assert s.runtime.key == "genie-htp-sim" and s.mode == "persistent"
    assert s.simulated and "HTP simulator" in str(s.runtime_version) and "1.21" in str(s.runtime_version)
    assert r.text.strip() and r.state == "complete"  # type: ignore[attr-defined]
    assert r.kpis is not None and r.kpis.source == "simulated"  # type: ignore[attr-defined]
    assert r.kpis.origin == "profile"  # type: ignore[attr-defined]  # Genie's own profile


def test_greedy_real_genie_equals_the_host_htp_simulation(local_run: Path) -> None:
    """The board's Genie and the host's HTP leg run the same arithmetic: token for token."""
    from tokenizers import Tokenizer

    from hexstudio.workers.arloop import DeploymentPair
    from hexstudio.workers.evaluate import htp_pair_args

    art = local_run / "artifacts"

    class Spec:
        def upstream_dir(self, n: str) -> Path:
            return art / n

    q = json.loads((art / "quantize" / "quantize.json").read_text())
    pair = DeploymentPair.from_graphs(
        q["graphs"],
        art / "quantize",
        positional_encoding=q["positional_encoding"],
        variant="sim",
        context_length=int(q["context_length"]),
        ar_n=int(q["ar_n"]),
        **htp_pair_args(Spec(), q),
    )  # type: ignore[arg-type]
    bundle = art / "compile" / "bundle"
    tok = Tokenizer.from_file(str(bundle / "tokenizer.json"))
    cfg = json.loads((bundle / "genie_config.json").read_text())
    bos = int(cfg["dialog"]["context"]["bos-token"])
    prompt = "Tell me about the workshop."
    ids = ([bos] if bos >= 0 else []) + tok.encode(prompt, add_special_tokens=False).ids
    host = pair.generate(ids, 8)
    helper = subprocess.run(
        sim_t2t_argv(prompt, 8),
        cwd=_remote_bundle(local_run),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert helper.returncode == 0, helper.stderr[-2000:]
    assert "Qualcomm's libGenie on the HTP simulator" in helper.stdout  # the real driver, labeled simulated
    reply = helper.stdout.split("[BEGIN]: ", 1)[1].rsplit("[END]", 1)[0]
    assert (
        tok.encode(reply, add_special_tokens=False).ids
        == host[: len(tok.encode(reply, add_special_tokens=False).ids)]
    )
    assert tok.decode(host) == reply


def test_the_helper_protocol_stop_sequences_and_genies_log(local_run: Path) -> None:
    msgs = [
        {"op": "query", "id": 1, "prompt": "The capital of France is", "max_tokens": 8, "stop": ["."]},
        {"op": "quit"},
    ]
    events, _ = genie_session(_remote_bundle(local_run), "genie_config.json", "warn", msgs, timeout=300)
    ready = next(e for e in events if e["event"] == "ready")
    assert (
        ready["simulated"] is True
        and ready["genie_version"] == "1.21.0"
        and "HTP simulator" in ready["runner"]
    )
    assert ready["stop_sequences"] is True
    assert next(e for e in events if e["event"] == "stop") == {
        "event": "stop",
        "id": 1,
        "applied": True,
        "message": None,
    }
    text = "".join(e["text"] for e in events if e["event"] == "text")
    end = next(e for e in events if e["event"] == "end")
    # Genie ends the reply at the stop sequence and does not emit the sequence itself (unconstrained, the reply runs
    # on: " Paris.\n\nThe sky ...")
    assert end["state"] == "complete" and text == " Paris"
    assert sum(1 for e in events if e["event"] == "text") < 8
    assert any(e["event"] == "log" for e in events)  # Genie's own lines, through GenieLog
    assert end["profile"]["components"][0]["events"]  # GenieProfile's JSON


def test_chat_session_hands_stop_strings_to_genie(local_run: Path) -> None:
    """Issue 31: the session gives its stop strings to the dialog (GenieDialog_setStopSequence) instead of cutting
    the text itself: Genie ends the reply there and leaves the matched text out; a later turn without them runs
    past it (they are cleared), and one with them again stops again."""
    from hexstudio.core.device.board import sim_board
    from hexstudio.core.genie.session import ChatSession, TurnResult
    from hexstudio.serve.bridge import _Raw

    board = sim_board(local_run.parent.parent)
    prompt = "The capital of France is"

    async def go() -> tuple[ChatSession, list[TurnResult]]:
        s = ChatSession(
            board,
            _remote_bundle(local_run),
            _Raw(template="plain"),
            mode="persistent",
            max_tokens=8,
            sampler="deterministic",
        )
        out = []
        async with s:
            for stops in (["."], [], ["."]):
                await s.reset()
                out.append(await s.send(prompt, stop_strings=stops))
        return s, out

    s, (stopped, free, again) = asyncio.run(go())
    assert s.runtime.key == "genie-htp-sim" and s.stop_sequences is True
    assert stopped.stop == "genie" and not stopped.stop_hit and stopped.state == "complete"
    assert stopped.text == " Paris"  # Genie's cut: the "." is not in the reply
    assert free.stop is None and free.text.startswith(" Paris.")  # cleared: it runs on past the "."
    assert again.stop == "genie" and again.text == " Paris"


def test_a_switch_between_greedy_and_sampling_is_refused_so_the_dialog_is_made_again(local_run: Path) -> None:
    """Genie fixes the greedy shortcut when the dialog is made (qualla sampler.cpp: temp <= 0 or top-k 1) and
    GenieSampler_applyConfig never changes it: temperature 1.5 was reported applied and every seed gave the
    greedy reply (`hexstudio serve` ignored a request's temperature). The helper now refuses that switch, and
    its callers make the dialog again with the new sampler; a change within greedy decoding is still applied."""
    msgs = [
        {"op": "sampler", "sampler": {"temp": 1.5, "top-k": 0, "top-p": 1.0, "seed": 1}},
        {"op": "sampler", "sampler": {"temp": 0.0, "top-k": 1, "top-p": 1.0, "seed": 7}},
        {"op": "quit"},
    ]
    events, _ = genie_session(_remote_bundle(local_run), "genie_config.json", "warn", msgs, timeout=300)
    answers = [e for e in events if e["event"] == "sampler"]
    assert [a["applied"] for a in answers] == [False, True], answers
    assert "greedy" in answers[0]["message"]


def test_a_full_context_fails_the_query_as_genie_t2t_run_does(local_run: Path) -> None:
    """Qualcomm's genie-t2t-run exits with EXIT_FAILURE and "Failed to query." on GENIE_STATUS_WARNING_CONTEXT_
    EXCEEDED (main.cpp); the simulator board's runner on real libGenie logged the warning and exited 0, so a
    per-turn reply cut by the context limit was reported as complete."""
    run = subprocess.run(
        sim_t2t_argv(" ".join(["water"] * 600), 8),  # past the built-in model's 512-token context
        cwd=_remote_bundle(local_run),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "Qualcomm's libGenie on the HTP simulator" in run.stdout
    assert run.returncode == 1 and "Failed to query." in run.stderr, (run.returncode, run.stderr[-1500:])
