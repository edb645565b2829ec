"""Genie over a real SSH server (tests/support/sshd.py on 127.0.0.1): the simulator installed on the
'board' streams a chat turn, its profile is parsed; hostile prompts arrive verbatim and run nothing;
a persistent session with the test libGenie keeps the model loaded over the SSH channel. Also the
simulator's own session mode on the local simulator board."""

from __future__ import annotations

import asyncio
import posixpath
import secrets
import sys
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.device.board import Board, sim_board
from hexstudio.core.device.connect import connect_ssh
from hexstudio.core.genie.conversation import Conversation
from hexstudio.core.genie.helper import helper_dir
from hexstudio.core.genie.run import Chunk, QueryResult, run_query
from hexstudio.core.genie.session import ChatSession, TurnResult
from hexstudio.workers.board import helper_files
from tests.genie.conftest import FakeGenie, SimWorkspace, assert_streamed
from tests.support.board_helpers import board_python_program
from tests.support.sshd import SshServer

HOSTILE = (
    "$(touch {canary}) `touch {canary}` \"double\" 'single' ; touch {canary} && echo x | sh\n"
    "second line\twith a tab \\ backslash — naïve café 日本語 ✓ 🙂"
)


async def ssh_board(
    srv: SshServer, *, simulated: bool, config: dict[str, Any] | None = None, env_script: str | None = None
) -> Board:
    cfg = srv.key_config()
    t = await connect_ssh("evk-test", cfg, trust=lambda *_a: True)
    if simulated:  # the simulator installed on the test board (same flags and output as genie-t2t-run)
        return Board(
            "evk-test",
            t,
            True,
            genie_command=[sys.executable, "-m", "hexstudio.workers.genie_sim.t2t"],
            # the board's own interpreter, with HexStudio installed (a remote host's, not this machine's paths)
            config={"runner": "simulator", "python": sys.executable},
        )
    return Board("evk-test", t, False, config=config or {}, env_script=env_script)


def test_chat_turn_streams_over_ssh_and_the_profile_matches(
    ssh_server: SshServer, sim_workspace: SimWorkspace
) -> None:
    async def go() -> tuple[QueryResult, dict[str, Any], str]:
        board = await ssh_board(ssh_server, simulated=True)
        try:
            res = await run_query(
                board,
                sim_workspace.remote_bundle,
                "Question: Where does the sun rise? Answer:",
                max_tokens=24,
            )
            runs = posixpath.join(sim_workspace.remote_bundle, ".hexstudio-runs")
            listing = await board.transport.run(["ls", "-A", runs])
            # the prompt and the profile do not stay on the board; the profile comes back with the result
            assert listing.stdout.split() == [], listing.stdout
            assert res.profile is not None
            return res, res.profile, board.label
        finally:
            await board.transport.close()

    res, raw, label = asyncio.run(go())
    assert label.startswith("ssh://") and res.exit_status == 0 and res.ok, res.stderr
    assert res.transcript.simulated and res.kpis is not None and res.kpis.source == "simulated"
    assert "".join(c.text for c in res.chunks) == res.text == res.transcript.text
    # the normalised KPIs are the runner's own numbers (within 1%)
    q = [e for c in raw["components"] for e in c["events"] if e["type"] == "GenieDialog_query"][-1]
    k = res.kpis
    pairs = [
        (k.gen_tok_s, q["token-generation-rate"]["value"]),
        (k.prompt_tok_s, q["prompt-processing-rate"]["value"]),
        (k.ttft_ms, q["time-to-first-token"]["value"] / 1000),
        (k.gen_time_ms, q["token-generation-time"]["value"] / 1000),
    ]
    for ours, theirs in pairs:
        assert ours is not None and abs(ours - theirs) <= 0.01 * abs(theirs)
    assert k.generated_tokens is not None and k.gen_tok_s is not None and k.gen_time_ms is not None
    assert k.generated_tokens == q["num-generated-tokens"]["value"] and 0 < k.generated_tokens <= 24
    assert abs(k.gen_tok_s - k.generated_tokens / (k.gen_time_ms / 1000)) <= 0.01 * k.gen_tok_s
    # streamed: the first chunk arrived well before the reply ended, by the runner's own pacing
    assert_streamed(res.chunks, k.gen_time_ms, k.generated_tokens)


def test_hostile_prompt_over_ssh_arrives_verbatim_and_runs_nothing(
    ssh_server: SshServer, sim_workspace: SimWorkspace, tmp_path: Path
) -> None:
    canary = tmp_path / f"pwned-{secrets.token_hex(4)}"
    prompt = HOSTILE.format(canary=canary)

    async def go() -> QueryResult:
        board = await ssh_board(ssh_server, simulated=True)
        try:
            return await run_query(board, sim_workspace.remote_bundle, prompt, max_tokens=3)
        finally:
            await board.transport.close()

    res = asyncio.run(go())
    assert res.exit_status == 0, res.stderr
    # the runner echoes the prompt file it read: the whole prompt, its later lines too
    assert res.transcript.prompt == prompt
    assert not canary.exists()


def test_persistent_session_over_ssh_with_the_test_libgenie(
    ssh_server: SshServer, fake_genie: FakeGenie, tmp_path: Path
) -> None:
    canary = tmp_path / f"pwned-{secrets.token_hex(4)}"
    echo = tmp_path / "queries.txt"
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=1200, token_ms=15, tokens=8, echo=echo)
    prompt = HOSTILE.format(canary=canary)

    # like the EVK: libGenie.so is found through the QAIRT environment script's LD_LIBRARY_PATH
    env_script = tmp_path / "qairt-env.sh"
    env_script.write_text(f"export LD_LIBRARY_PATH={fake_genie.lib.parent}:${{LD_LIBRARY_PATH:-}}\n")

    # the board's python3 has nothing of HexStudio's: the helper runs on the modules pushed beside it
    python = board_python_program(tmp_path / "board-python")

    async def go() -> tuple[ChatSession, list[TurnResult], list[Chunk]]:
        board = await ssh_board(
            ssh_server, simulated=False, config={"python": str(python)}, env_script=str(env_script)
        )
        first: list[Chunk] = []
        try:
            async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=8) as s:
                assert s.mode == "persistent", s.fallback_reason
                r1 = await s.send(prompt, on_chunk=first.append)
                r2 = await s.send("Thanks!")
                stop = asyncio.Event()
                s.max_tokens = 400
                r3 = await s.send("Go on for a while", on_chunk=lambda c: stop.set(), stop=stop)
                return s, [r1, r2, r3], first
        finally:
            await board.transport.close()

    s, (r1, r2, r3), first = asyncio.run(go())
    assert r1.state == r2.state == "complete" and r1.mode == "persistent"
    assert len(first) == 8 and [c.tokens for c in first] == [1] * 8  # one dialog callback, one token
    assert r1.kpis is not None and r1.kpis.source == "device" and r1.kpis.generated_tokens == 8
    assert_streamed(first, r1.kpis.gen_time_ms, r1.kpis.generated_tokens)
    assert s.init_ms is not None and r2.first_chunk_ms is not None and r2.first_chunk_ms < s.init_ms / 10
    assert r3.state == "aborted" and r3.kpis is not None and (r3.kpis.generated_tokens or 0) < 100
    q = [x for x in echo.read_bytes().decode("utf-8").split("\x1e") if x]
    assert prompt in q[0]  # verbatim through JSON over the SSH channel
    assert not canary.exists()


def test_the_helper_lies_in_a_folder_named_by_its_content_and_is_copied_once(
    ssh_server: SshServer, fake_genie: FakeGenie, tmp_path: Path
) -> None:
    """Two studios, or two HexStudio versions, on one board: each helper set has its own folder, so neither
    replaces a helper the other is about to run; a session whose helper is already there copies nothing. A new
    folder removes the ones made over a month ago (they piled up, one per version)."""
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=50, token_ms=1, tokens=2)
    env_script = tmp_path / "qairt-env.sh"
    env_script.write_text(f"export LD_LIBRARY_PATH={fake_genie.lib.parent}:${{LD_LIBRARY_PATH:-}}\n")
    python = board_python_program(tmp_path / "board-python")
    contents = [(f.name, f.read_bytes()) for f in helper_files("genie_session")]

    async def go() -> tuple[str, list[str], dict[str, bytes]]:
        board = await ssh_board(
            ssh_server, simulated=False, config={"python": str(python)}, env_script=str(env_script)
        )
        home = await board.transport.home()
        # an older version's helper folder from last year and a recent one's: a new folder removes only the first
        bins = posixpath.join(home, "hexstudio", "bin")
        # this helper's own folder is made new here (an earlier test on this server may have copied it)
        await board.transport.run(["rm", "-rf", helper_dir(home, contents)])
        for name, age in (("0000000000000old", "400 days ago"), ("00000000000young", "2 days ago")):
            await board.transport.run(["mkdir", "-p", posixpath.join(bins, name)])
            await board.transport.run(["touch", "-d", age, posixpath.join(bins, name)])
        written: list[str] = []
        write = board.transport.write_bytes

        async def counted(remote: str, data: bytes, mode: int = 0o644) -> None:
            written.append(remote)
            await write(remote, data, mode)

        try:
            async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=2) as s:
                assert s.mode == "persistent", s.fallback_reason
            there = {
                name: await board.transport.read_bytes(posixpath.join(helper_dir(home, contents), name))
                for name, _ in contents
            }
            left = await board.transport.run(["ls", bins])
            left_names = set(left.stdout.split())  # other tests' recent helpers may be there too
            assert "0000000000000old" not in left_names, left_names
            assert {"00000000000young", posixpath.basename(helper_dir(home, contents))} <= left_names
            board.transport.write_bytes = counted  # the second session finds its helper in place
            async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=2) as s:
                assert s.mode == "persistent", s.fallback_reason
                assert (await s.send("Hi")).state == "complete"
            return home, written, there
        finally:
            await board.transport.close()

    home, written, there = asyncio.run(go())
    assert there == dict(contents)  # every file whole, under the folder its content names
    assert not [w for w in written if "/hexstudio/bin/" in w]
    other = [(n, d + b"\n# another version\n") if n == "genie_session.py" else (n, d) for n, d in contents]
    assert helper_dir(home, other) != helper_dir(home, contents)
    assert posixpath.dirname(helper_dir(home, contents)) == posixpath.join(home, "hexstudio", "bin")


def test_simulator_session_keeps_the_model_loaded(sim_workspace: SimWorkspace) -> None:
    prompt = "Where does the sun rise?"

    async def go() -> tuple[ChatSession, TurnResult, TurnResult, QueryResult]:
        board = sim_board(sim_workspace.root)
        async with ChatSession(
            board, sim_workspace.remote_bundle, Conversation(template="qa"), max_tokens=10
        ) as s:
            r1 = await s.send(prompt)
            r2 = await s.send("And where does it set?")
        one_shot = await run_query(
            board, sim_workspace.remote_bundle, f"Question: {prompt} Answer:", max_tokens=10
        )
        return s, r1, r2, one_shot

    s, r1, r2, one_shot = asyncio.run(go())
    assert s.mode == "persistent" and r1.simulated and r1.kpis is not None and r1.kpis.source == "simulated"
    # same deterministic text as one genie-t2t-run of the same prompt
    assert r1.text == one_shot.text and r1.text
    assert r2.state == "complete" and r2.kpis is not None and r2.kpis.init_ms == 0.0
    assert r2.first_chunk_ms is not None and s.init_ms is not None and r2.first_chunk_ms < s.init_ms


@pytest.mark.parametrize("mode", ["persistent"])
def test_simulator_session_over_ssh(ssh_server: SshServer, sim_workspace: SimWorkspace, mode: str) -> None:
    async def go() -> tuple[ChatSession, TurnResult]:
        board = await ssh_board(ssh_server, simulated=True)
        try:
            async with ChatSession(
                board, sim_workspace.remote_bundle, Conversation(template="qa"), mode=mode, max_tokens=16
            ) as s:
                return s, await s.send("What is water?")
        finally:
            await board.transport.close()

    s, r = asyncio.run(go())
    assert s.mode == mode and r.state == "complete" and r.simulated
    assert r.kpis is not None and r.kpis.source == "simulated"
    assert sum(c.tokens or 0 for c in r.chunks) == r.kpis.generated_tokens  # the session's own token counts
    assert_streamed(r.chunks, r.kpis.gen_time_ms, r.kpis.generated_tokens)


def test_fallback_over_ssh_runs_genie_t2t_run_per_turn(
    ssh_server: SshServer, fake_genie: FakeGenie, tmp_path: Path
) -> None:
    echo = tmp_path / "queries.txt"
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=300, token_ms=10, tokens=6, echo=echo)
    env_script = tmp_path / "qairt-env.sh"
    env_script.write_text(f"export LD_LIBRARY_PATH={fake_genie.lib.parent}\n")

    async def go() -> tuple[ChatSession, TurnResult, TurnResult]:
        board = await ssh_board(
            ssh_server, simulated=False, config={"python": "/nonexistent/python3"}, env_script=str(env_script)
        )
        board.genie_command = [str(fake_genie.t2t)]
        try:
            async with ChatSession(board, str(bundle), Conversation(template="llama3"), max_tokens=6) as s:
                return s, await s.send("First 'quoted' $(message)"), await s.send("Second")
        finally:
            await board.transport.close()

    s, r1, r2 = asyncio.run(go())
    assert s.mode == "per_turn" and s.fallback_reason is not None
    for r in (r1, r2):
        assert r.state == "complete" and r.mode == "per_turn" and len(r.text.split()) == 6
        assert r.kpis is not None and r.kpis.source == "device" and (r.kpis.init_ms or 0) >= 290
    q = [x for x in echo.read_bytes().decode("utf-8").split("\x1e") if x]
    assert "First 'quoted' $(message)" in q[0] and "First 'quoted' $(message)" in q[1] and "Second" in q[1]


def _undeclared_sim_command() -> list[str]:
    """The simulator run through a board record that does NOT say it is the simulator."""
    from hexstudio.core.paths import REPO_ROOT

    return ["env", f"PYTHONPATH={REPO_ROOT}", sys.executable, "-m", "hexstudio.workers.genie_sim.t2t"]


def test_simulator_on_an_undeclared_ssh_board_is_recorded_as_simulated(
    ssh_server: SshServer, sim_workspace: SimWorkspace
) -> None:
    from hexstudio.core.genie.stage import chat_record

    async def go() -> tuple[QueryResult, TurnResult]:
        board = await ssh_board(ssh_server, simulated=False)
        board.genie_command = _undeclared_sim_command()
        try:
            res = await run_query(
                board, sim_workspace.remote_bundle, "Question: What is water? Answer:", max_tokens=6
            )
            async with ChatSession(
                board, sim_workspace.remote_bundle, Conversation(template="qa"), mode="per_turn", max_tokens=6
            ) as s:
                turn = await s.send("What is water?")
            return res, turn
        finally:
            await board.transport.close()

    res, turn = asyncio.run(go())
    assert res.exit_status == 0 and res.ok, res.stderr
    assert res.transcript.simulated  # the simulator's banner says so
    assert res.simulated and res.kpis is not None and res.kpis.source == "simulated"
    doc = chat_record("evk-test", "Question: What is water? Answer:", res)
    assert doc["source"] == "simulated" and doc["kpis"]["source"] == "simulated"
    assert (
        turn.state == "complete"
        and turn.simulated
        and turn.kpis is not None
        and turn.kpis.source == "simulated"
    )
    assert turn.as_json()["simulated"] is True


def test_a_board_record_can_declare_the_simulator_as_its_runner(ssh_server: SshServer) -> None:
    from types import SimpleNamespace

    from hexstudio.core.device.board import BoardError, open_board

    cfg = ssh_server.key_config()
    settings = SimpleNamespace(
        boards={
            "sim-over-ssh": {**cfg, "runner": "simulator", "python": sys.executable},
            "real": cfg,
            "odd": {**cfg, "runner": "genie-x"},
        }
    )

    async def go() -> tuple[Board, Board, str]:
        sim = await open_board("sim-over-ssh", settings, trust=lambda *_a: True)
        real = await open_board("real", settings, trust=lambda *_a: True)
        try:
            await open_board("odd", settings, trust=lambda *_a: True)
            message = ""
        except BoardError as exc:
            message = f"{exc.message} {exc.hint}"
        for b in (sim, real):
            await b.transport.close()
        return sim, real, message

    sim, real, message = asyncio.run(go())
    assert sim.simulated and sim.genie_command == [sys.executable, "-m", "hexstudio.workers.genie_sim.t2t"]
    assert sim.label.startswith("ssh://") and sim.env_script is None
    assert not real.simulated and real.genie_command == ["genie-t2t-run"]
    assert "genie-x" in message and "'simulator'" in message


def test_per_turn_over_ssh_applies_the_budget_on_a_real_runner_and_stops_midway(
    ssh_server: SshServer, fake_genie: FakeGenie, tmp_path: Path
) -> None:
    """genie-t2t-run has no --max-tokens: the budget travels in the per-run config (dialog.max-num-tokens).
    Stop ends a per-turn reply mid-way over SSH and leaves no runner behind."""
    bundle = fake_genie.bundle(tmp_path / "bundle", init_ms=100, token_ms=25, tokens=30)
    env_script = tmp_path / "qairt-env.sh"
    env_script.write_text(f"export LD_LIBRARY_PATH={fake_genie.lib.parent}\n")

    async def go() -> tuple[TurnResult, TurnResult, str]:
        board = await ssh_board(
            ssh_server, simulated=False, config={"python": sys.executable}, env_script=str(env_script)
        )
        board.genie_command = [str(fake_genie.t2t)]
        try:
            async with ChatSession(
                board, str(bundle), Conversation(template="llama3"), mode="per_turn", max_tokens=4
            ) as s:
                r1 = await s.send("Short answer, please")
                s.max_tokens = 200
                stop = asyncio.Event()
                r2 = await s.send("Now talk for a long time", on_chunk=lambda c: stop.set(), stop=stop)
            await asyncio.sleep(0.5)
            ps = await board.transport.run(["ps", "-eo", "args"])
            return r1, r2, ps.stdout
        finally:
            await board.transport.close()

    r1, r2, ps = asyncio.run(go())
    assert r1.state == "complete" and r1.mode == "per_turn" and len(r1.text.split()) == 4  # not the fake's 30
    assert r1.kpis is not None and r1.kpis.generated_tokens == 4 and r1.kpis.source == "device"
    assert r2.state == "aborted" and 0 < len(r2.text.split()) < 30 and r2.wall_ms < 200 * 25
    assert str(fake_genie.t2t) not in ps  # the stopped runner is gone


def test_a_remote_simulator_host_runs_its_own_python_and_real_genie_only_per_turn() -> None:
    """A board declared `"runner": "simulator"` on another host got this machine's interpreter, PYTHONPATH and
    onnxruntime-qnn folder for its persistent helper: "No such file" there, or "libGenie is not installed here"
    about the workstation."""
    from hexstudio.core.genie.runtime import GenieHtpSimulator, OnnxruntimeTwin, RuntimeError_

    class Remote:  # any transport but this machine's
        label = "ssh://far-sim"

    board = Board("far-sim", Remote(), True, config={"runner": "simulator", "python": "/opt/hs/bin/python"})  # type: ignore[arg-type]
    argv, env = OnnxruntimeTwin().helper_argv(board, None, None, "/b")
    assert argv[:3] == ["/opt/hs/bin/python", "-m", "hexstudio.workers.genie_sim.session"] and env is None
    with pytest.raises(RuntimeError_, match="only on this machine") as ei:
        GenieHtpSimulator().helper_argv(board, None, None, "/b")
    assert "--mode per_turn" in (ei.value.hint or "")
