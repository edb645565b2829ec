"""GenieX beside Genie on the simulator board: one session interface, both runtimes, the same pushed bundle."""

from __future__ import annotations

import asyncio
import json
import posixpath
import subprocess
import sys
from pathlib import Path

import pytest

from hexstudio.core.device.board import python_env, sim_board
from hexstudio.core.genie.conversation import Conversation
from hexstudio.core.genie.session import ChatSession, SessionError
from tests.genie.conftest import SimWorkspace
from tests.support.cli import python_module


def _bundle_local(ws: SimWorkspace) -> Path:
    board = sim_board(ws.root)
    return (
        Path(board.transport.root) / ws.remote_bundle.lstrip("/")
        if not Path(ws.remote_bundle).is_absolute()
        else Path(ws.remote_bundle)
    )


def _turns(ws: SimWorkspace, runtime: str, messages: list[str]) -> tuple[ChatSession, list]:
    async def go() -> tuple[ChatSession, list]:
        board = sim_board(ws.root)
        s = ChatSession(board, ws.remote_bundle, Conversation(template="qa"), max_tokens=12, runtime=runtime)
        await s.open()
        out = [await s.send(m) for m in messages]
        await s.close()
        return s, out

    return asyncio.run(go())


def test_both_runtimes_chat_on_the_same_pushed_bundle(sim_workspace: SimWorkspace) -> None:
    """Switching runtime needs no re-push: GenieX's metadata.json is derived on the board; the model stays
    loaded between turns; every number carries the runtime and version that produced it, labeled simulated."""
    g, genie_turns = _turns(sim_workspace, "genie", ["What is the capital of France?", "And of Italy?"])
    x, geniex_turns = _turns(sim_workspace, "geniex", ["What is the capital of France?", "And of Italy?"])
    assert g.mode == x.mode == "persistent"
    for t in genie_turns:
        assert (
            t.runtime == "genie" and t.runtime_version and "twin of Genie" in t.runtime_version
        )  # labeled, not Genie
    for t in geniex_turns:
        assert t.state == "complete" and t.text.strip(), t.as_json()
        assert (
            t.runtime == "geniex"
            and "GenieX" in (t.runtime_version or "")
            and "simulator" in t.runtime_version
        )
        assert t.simulated and t.kpis is not None and t.kpis.source == "simulated"
        assert t.kpis.origin == "geniex_profile" and t.kpis.generated_tokens and t.kpis.gen_tok_s
        assert t.as_json()["runtime"] == "geniex"
    # the same bundle, the same deterministic sampler: the same first reply through either runtime
    assert geniex_turns[0].text == genie_turns[0].text
    # kept loaded: the init is paid on the first turn only
    assert geniex_turns[1].kpis is not None and geniex_turns[1].kpis.init_ms == 0.0
    meta = json.loads((_bundle_local(sim_workspace) / "metadata.json").read_text())
    assert meta["model_id"].startswith("llama_v3_") and meta["model_files"]


def test_geniex_cli_face(sim_workspace: SimWorkspace, tmp_path: Path) -> None:
    """`geniex version`, `pull --local-path`, `list` and `infer -p --verbose` as GenieX prints them, labeled simulated."""
    bundle = _bundle_local(sim_workspace)
    if not (bundle / "metadata.json").exists():
        _turns(sim_workspace, "geniex", ["Hi"])
    env = {**python_env(), "GENIEX_DATADIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}

    def geniex(*args: str) -> subprocess.CompletedProcess[str]:
        return python_module("hexstudio.workers.genie_sim.geniex", *args, env=env)

    v = geniex("version")
    assert v.returncode == 0
    lines = v.stdout.splitlines()
    assert lines[0].startswith("GenieX CLI Version:     v") and "(HexStudio simulator)" in lines[0]
    assert lines[1] == "QAIRT Runtime Version:  v2.45.0.260326"
    assert geniex("pull", "local/tiny", "--local-path", str(bundle)).returncode == 0
    assert "local/tiny" in geniex("list").stdout
    r = geniex(
        "infer",
        "local/tiny",
        "-p",
        "Question: What is the capital of France? Answer:",
        "--max-tokens",
        "8",
        "--verbose",
    )
    assert r.returncode == 0, r.stderr
    assert "> Question: What is the capital of France? Answer:" in r.stdout
    for key in (
        "ttft:",
        "prompt tokens:",
        "prompt speed:",
        "decode tokens:",
        "decode speed:",
        "stop reason:",
    ):
        assert key in r.stdout, r.stdout
    assert "simulated" in r.stdout
    missing = geniex("infer", "local/nothing", "-p", "hi")
    assert missing.returncode != 0 and "pull it first" in missing.stderr


def test_geniex_refuses_what_its_qairt_plugin_refuses(sim_workspace: SimWorkspace, tmp_path: Path) -> None:
    """No metadata.json, a model_id the plugin cannot dispatch, a bundle compiled with a newer QAIRT."""
    import shutil

    from hexstudio.workers.genie_sim.geniex_model import GenieXError, check_bundle

    src = _bundle_local(sim_workspace)
    b = tmp_path / "b"
    shutil.copytree(src, b)
    (b / "metadata.json").unlink(missing_ok=True)
    with pytest.raises(GenieXError, match=r"cannot open .*metadata\.json"):
        check_bundle(b)
    (b / "metadata.json").write_text(
        json.dumps(
            {
                "model_id": "gpt2_tiny",
                "model_files": {"prompt_ar128_cl512_1_of_2": {"inputs": {}, "outputs": {}}},
            }
        )
    )
    with pytest.raises(GenieXError, match="no LLM factory matches model_id 'gpt2_tiny'"):
        check_bundle(b)
    (b / "metadata.json").write_text(
        json.dumps(
            {
                "model_id": "llama_v3_tiny",
                "model_files": {"prompt_ar128_cl512_1_of_2": {"inputs": {}, "outputs": {}}},
            }
        )
    )
    (b / "tool-versions.yaml").write_text("tool_versions:\n  qairt: 2.46.0.260601\n")
    with pytest.raises(GenieXError, match="newer than GenieX's qairt plugin"):
        check_bundle(b)


def test_geniex_has_no_per_turn_mode(sim_workspace: SimWorkspace) -> None:
    async def go() -> None:
        s = ChatSession(
            sim_board(sim_workspace.root), sim_workspace.remote_bundle, mode="per_turn", runtime="geniex"
        )
        await s.open()

    with pytest.raises(SessionError, match="no per-turn mode"):
        asyncio.run(go())
    with pytest.raises(SessionError, match="Unknown runtime"):
        ChatSession(sim_board(sim_workspace.root), posixpath.join("x"), runtime="llamacpp")


def test_geniex_refuses_a_bundle_without_a_chat_template(sim_workspace: SimWorkspace, tmp_path: Path) -> None:
    """GenieX's qairt pipeline applies the model's chat template itself and will not load without one; HexStudio
    says so before starting GenieX on the board, and points to Genie (same bundle)."""
    import shutil

    from hexstudio.core.device.board import sim_board
    from hexstudio.core.genie.runtime import RuntimeError_, board_runtime
    from hexstudio.workers.genie_sim.geniex_model import GenieXError, check_bundle

    src = _bundle_local(sim_workspace)
    if not (src / "metadata.json").exists():
        _turns(sim_workspace, "geniex", ["Hi"])
    b = tmp_path / "b"
    shutil.copytree(src, b)
    tc = json.loads((b / "tokenizer_config.json").read_text())
    del tc["chat_template"]
    (b / "tokenizer_config.json").write_text(json.dumps(tc))
    with pytest.raises(GenieXError, match=r"LLMPipeline: tokenizer_config.json at '.*' has no chat_template"):
        check_bundle(b)
    board = sim_board(sim_workspace.root)
    with pytest.raises(RuntimeError_, match="no chat template") as exc:
        asyncio.run(board_runtime("geniex").prepare(board, str(b)))
    assert "genie" in (exc.value.hint or "") and "no re-push" in (exc.value.hint or "")


@pytest.mark.parametrize("runtime", ["genie", "geniex"])
def test_sampler_changes_without_a_reload_on_both_runtimes(sim_workspace: SimWorkspace, runtime: str) -> None:
    """The chat panel's sampler change reaches the loaded model through the runtime interface (the helper's
    sampler op): applied, no new init, and the next turn still streams."""

    async def go() -> None:
        s = ChatSession(
            sim_board(sim_workspace.root),
            sim_workspace.remote_bundle,
            Conversation(template="qa"),
            max_tokens=8,
            runtime=runtime,
        )
        await s.open()
        try:
            first = await s.send("What is the capital of France?")
            assert await s.apply_sampler({"temp": 0.8, "top-k": 40, "top-p": 0.95, "seed": 7}) is None
            assert s.sampler == "custom" and s.sampler_values is not None and s.sampler_values["seed"] == 7
            second = await s.send("And of Italy?")
            assert second.state == "complete" and second.text.strip(), second.as_json()
            assert second.kpis is not None and not second.kpis.init_ms and first.runtime == runtime
        finally:
            await s.close()

    asyncio.run(go())


def test_geniex_chat_template_and_repl(sim_workspace: SimWorkspace, tmp_path: Path) -> None:
    """The plugin's chat template rules (a default system prompt on a fresh cache, only the new messages after
    a turn) and `geniex infer` without a prompt: GenieX's REPL commands over stdin."""
    from hexstudio.workers.genie_sim.geniex_model import DEFAULT_SYSTEM_PROMPT, SimGenieX

    bundle = _bundle_local(sim_workspace)
    if not (bundle / "metadata.json").exists():
        _turns(sim_workspace, "geniex", ["Hi"])
    m = SimGenieX(bundle)
    first = m.apply_chat_template([{"role": "user", "content": "Hello"}])
    assert DEFAULT_SYSTEM_PROMPT in first and first.rstrip().endswith("assistant<|end_header_id|>")
    m.generate(first, 2, lambda text, tokens=1: None)
    later = m.apply_chat_template(
        [
            {"role": "user", "content": "Hello"},
            {"role": "assistant", "content": "Hi"},
            {"role": "user", "content": "Bye"},
        ]
    )
    assert DEFAULT_SYSTEM_PROMPT not in later and "Hello" not in later and "Bye" in later
    with pytest.raises(ValueError, match="No new messages since last assistant turn"):
        m.apply_chat_template([{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi"}])
    m.reset()
    assert DEFAULT_SYSTEM_PROMPT in m.apply_chat_template([{"role": "user", "content": "Hello"}])

    env = {**python_env(), "GENIEX_DATADIR": str(tmp_path / "cache"), "PATH": "/usr/bin:/bin"}
    cmd = [sys.executable, "-m", "hexstudio.workers.genie_sim.geniex"]
    subprocess.run(
        [*cmd, "pull", "local/tiny", "--local-path", str(bundle)],
        env=env,
        check=True,
        timeout=120,
        capture_output=True,
    )
    r = subprocess.run(
        [*cmd, "infer", "local/tiny", "--max-tokens", "6"],
        env=env,
        text=True,
        capture_output=True,
        input="/?\nWhat is the capital of France?\n/foo\n/clear\n/exit\nnever asked\n",
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    out = r.stdout
    assert "Commands:" in out and "/clear" in out and "Clear the screen and conversation history" in out
    assert "> What is the capital of France?" in out and "first token" in out
    assert "Unknown command: /foo" in out and "\033[H\033[2J" in out and "never asked" not in out


def test_geniex_metadata_is_made_again_when_the_bundle_changed(sim_workspace: SimWorkspace) -> None:
    """metadata.json was trusted for being there: one left by an earlier push of the run's folder (a recompile with
    other parts or binaries; push never removes files) or cut short on the board made GenieX load the wrong graph
    specs, and no command wrote it again. It is derived each time, and written only when it differs."""
    from hexstudio.core.genie.runtime import GenieX

    meta = _bundle_local(sim_workspace) / "metadata.json"

    async def prepare() -> list[str]:
        return await GenieX().prepare(sim_board(sim_workspace.root), sim_workspace.remote_bundle)

    asyncio.run(prepare())
    good = meta.read_bytes()
    assert asyncio.run(prepare()) == [] and meta.read_bytes() == good  # unchanged: nothing written
    meta.write_text('{"model_id": "an earlier compile", "model_files": []}')  # stale
    notes = asyncio.run(prepare())
    assert notes and "wrote" in notes[0] and meta.read_bytes() == good
    meta.write_bytes(b"")  # cut short on the board
    asyncio.run(prepare())
    assert meta.read_bytes() == good
