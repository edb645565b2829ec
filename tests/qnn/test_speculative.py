"""Genie's speculative dialogs (lade, spd) beside the basic one in one bundle: written only where the model can
have them, accepted by Genie 1.21's own parser, and run by real Genie on the HTP simulator with greedy output
token for token the basic dialog's, reporting Genie's tokens accepted per step."""

from __future__ import annotations

import asyncio
import json
import shutil
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from hexstudio.shared.bundle import speculative as sp
from hexstudio.shared.bundle.genie_schema import genie_config_errors
from hexstudio.shared.run_settings import RunSettings, check, run_settings_of
from hexstudio.workers.runtime import WorkerError
from tests.qnn.conftest import genie_on_simulator, needs_qnn

BUILTIN_CONFIG = (
    Path(__file__).resolve().parents[2] / "hexstudio/shared/data/builtin_model/tiny-llama/config.json"
)


def _basic() -> dict:
    from hexstudio.shared import bundle as gb

    hf = json.loads(BUILTIN_CONFIG.read_text())
    return gb.genie_config(hf, 512, ["m_part_1_of_2.bin", "m_part_2_of_2.bin"], 64)


def runs_on(bundle: Path) -> tuple[dict[str, Any], str | None]:
    """The device and QAIRT a compiled bundle is for (write_dialog_configs checks an spd draft against them)."""
    doc = json.loads((bundle / "bundle.json").read_text())
    return doc["device"], doc.get("qairt_version")


def _draft(folder: Path, **manifest: Any) -> Path:
    """A draft model's compiled bundle as an AI Hub compile writes it (no "binaries" key; device, QAIRT)."""
    folder.mkdir()
    doc = {
        "simulated": False,
        "emulated": False,
        "device": {"name": "Dragonwing IQ-9075 EVK", "soc_model": "77", "dsp_arch": "v73"},
        "qairt_version": "2.42",
        "context_length": 4096,
        **manifest,
    }
    (folder / "bundle.json").write_text(json.dumps(doc))
    hf = json.loads(BUILTIN_CONFIG.read_text())
    from hexstudio.shared import bundle as gb

    (folder / "genie_config.json").write_text(
        json.dumps(gb.genie_config(hf, 4096, ["d_part_1_of_1.bin"], 64))
    )
    (folder / "tokenizer.json").write_bytes(b'{"model": {}}')
    (folder / "d_part_1_of_1.bin").write_bytes(b"\x00" * 64)
    return folder


def test_a_draft_compiled_on_ai_hub_drafts_and_one_that_cannot_load_beside_is_refused(tmp_path: Path) -> None:
    """Every AI Hub draft was refused (bundle.json has no "binaries": "qnn" off the local compile), with a hint
    to compile on AI Hub; a draft of a smaller context, another device or a newer QAIRT went through and failed
    on the board."""
    hf = json.loads(BUILTIN_CONFIG.read_text())
    tok, n = b'{"model": {}}', int(hf["vocab_size"])
    host = sp.DraftHost(4096, "v73", 77, "2.42.0")
    eng, bins = sp.draft_engine(_draft(tmp_path / "hub"), tok, n, host)
    assert eng["model"]["binary"]["ctx-bins"] == ["draft/d_part_1_of_1.bin"] and len(bins) == 1
    refused = {
        "emulated": ({"emulated": True}, "no real context binaries"),
        "small": ({"context_length": 2048}, "context of 2048 tokens and this model's dialog has 4096"),
        "arch": ({"device": {"soc_model": "69", "dsp_arch": "v75"}}, "dsp_arch v75"),
        "newer": ({"qairt_version": "2.45"}, "QAIRT 2.45, newer than this bundle's 2.42.0"),
    }
    for name, (manifest, said) in refused.items():
        with pytest.raises(sp.SpeculativeError, match=said):
            sp.draft_engine(_draft(tmp_path / name, **manifest), tok, n, host)
    # an older QAIRT's binaries load on the newer runtime
    sp.draft_engine(_draft(tmp_path / "older", qairt_version="2.40"), tok, n, host)


def _turn(local_run: Path, dialog: str, prompt: str, max_tokens: int, mode: str = "persistent") -> Any:
    """One greedy turn through the studio's session (the persistent helper, or genie-t2t-run per turn) on the
    simulator board."""
    from hexstudio.core.device.board import sim_board
    from hexstudio.core.genie.session import ChatSession
    from hexstudio.serve.bridge import _Raw

    remote = json.loads((local_run / "artifacts" / "board" / "board.json").read_text())["remote_bundle"]

    async def go() -> Any:
        s = ChatSession(
            sim_board(local_run.parent.parent),
            str(remote),
            _Raw(template="plain"),
            mode=mode,
            max_tokens=max_tokens,
            sampler="deterministic",
            dialog=dialog,
        )
        async with s:
            return await s.send(prompt)

    return asyncio.run(go())


def test_lade_and_spd_configs_follow_genies_schema_and_leave_basic_alone() -> None:
    basic = _basic()
    before = json.dumps(basic)
    lade = sp.dialog_config(basic, "lade")
    spd = sp.dialog_config(basic, "spd", spd=sp.Spd(draft_len=5))
    assert json.dumps(basic) == before  # derived, never changed in place
    assert lade["dialog"]["type"] == "lade" and lade["dialog"]["lade"] == {
        "version": 1,
        "update-mode": "ALWAYS_FWD_ONE",
        "window": 8,
        "ngram": 2,  # not Qualcomm's 4: Genie 1.21's lookahead set-up at ngram >= 3 (docs/genie.md)
        "gcap": 8,
    }
    assert isinstance(lade["dialog"]["engine"], dict) and "role" not in lade["dialog"]["engine"]
    eng = spd["dialog"]["engine"]
    assert [e["role"] for e in eng] == ["draft", "target"] and spd["dialog"]["spd"] == {
        "version": 1,
        "draft-len": 5,
    }
    assert sp.target_engine(spd["dialog"])["role"] == "target"
    assert sp.ctx_bins(spd["dialog"]) == [
        "m_part_1_of_2.bin",
        "m_part_2_of_2.bin",
    ]  # the model drafts for itself
    # Genie's spd asserts temp > 0: the greedy default becomes temp 1 with top-k 1 (and greedy: true)
    sampler = spd["dialog"]["sampler"]
    assert sampler["temp"] == 1.0 and sampler["top-k"] == 1 and sampler["greedy"] is True
    assert genie_config_errors(lade) == [] and genie_config_errors(spd) == []
    assert sp.config_name("basic") == "genie_config.json" and sp.config_name("spd") == "genie_config.spd.json"


def test_what_a_model_cannot_have_is_refused_with_the_reason_before_anything_compiles() -> None:
    from hexstudio.workers.genie_config import check_speculative

    hf = json.loads(BUILTIN_CONFIG.read_text())  # vocab 840: the local compile clamps lade's seed ids 1000+
    q = {"ar_n": 128}
    assert check_speculative(hf, q, run_settings_of({"speculative_dialogs": "lade,spd"})) == ["lade", "spd"]
    with pytest.raises(WorkerError) as ei:  # a lade step (48 tokens) longer than the prompt processor
        check_speculative(hf, {"ar_n": 32}, run_settings_of({"speculative_dialogs": "lade", "lade_ngram": 4}))
    assert ei.value.code == "dialog_unsupported" and "AR-32" in ei.value.message and "48" in ei.value.message
    assert check_speculative(
        hf,
        {"ar_n": 32},
        run_settings_of({"speculative_dialogs": "lade", "lade_window": 4, "lade_gcap": 4, "lade_ngram": 3}),
    ) == ["lade"]  # (4 + 4) x 2 = 16 tokens
    assert check_speculative(hf, q, run_settings_of({"speculative_dialogs": "spd"})) == ["spd"]
    assert check_speculative(hf, q, run_settings_of({"speculative_dialogs": "none"})) == []
    big = {**hf, "vocab_size": 32000}
    assert check_speculative(big, q, run_settings_of({"speculative_dialogs": "lade,spd"})) == ["lade", "spd"]
    assert "AR-16" in str(sp.lade_problem([1, 16], sp.Lade(ngram=4)))  # a step of 48 tokens needs AR >= 48
    assert sp.lade_problem([1, 16], sp.Lade()) is None  # the default: (8 + 8) x 1 = 16 tokens
    # gcap 0 crashed Genie 1.21 (an empty n-gram pool): refused by the setting and again by the compile
    assert "gcap >= 1" in str(sp.lade_problem([1, 128], sp.Lade(gcap=0)))
    assert check("lade_gcap", 0) is not None
    with pytest.raises(WorkerError, match="gcap >= 1"):
        check_speculative(hf, q, RunSettings(speculative_dialogs="lade", lade_gcap=0))
    # refused when set (the setting's check), and again by the compile for a spec that bypassed it
    assert "SSD training" in str(check("speculative_dialogs", "lade,ssd-q1"))
    with pytest.raises(WorkerError, match="SSD training"):
        check_speculative(big, q, RunSettings(speculative_dialogs="ssd-q1"))
    assert "same tokenizer" in str(sp.spd_problem(sp.Spd(), 32000, 32064, [1, 128]))


def test_speculative_settings_that_cannot_compile_are_refused_when_the_run_is_made(tmp_path: Path) -> None:
    """lade's step longer than the prompt processor, or an spd draft length past it, were accepted when the run
    was made and refused only at Compile, after the export and hours of quantizing (and the lade hint, "raise
    ar_n", meant doing them again)."""
    from hexstudio.core.runs import Workspace
    from hexstudio.core.settings import SettingsError, check_run_settings

    ws = Workspace(tmp_path / "ws")
    with pytest.raises(SettingsError) as err:
        ws.create_run(
            "builtin:tiny-llama", "sim", {"ar_n": 32, "speculative_dialogs": "lade", "lade_ngram": 4}
        )
    assert "lade: A lade step runs" in str(err.value) and "AR-32" in str(err.value)
    assert ws.list_runs() == []  # no run folder was made
    with pytest.raises(SettingsError, match="draft-len 40 \\+ 1 exceeds the largest graph"):
        check_run_settings({"ar_n": 32, "speculative_dialogs": "spd", "spd_draft_len": 40})
    check_run_settings(
        {"ar_n": 32, "speculative_dialogs": "lade", "lade_window": 4, "lade_gcap": 4, "lade_ngram": 3}
    )
    check_run_settings({"speculative_dialogs": "spd", "spd_draft": str(tmp_path / "draft-compiled-later")})


def test_lades_seed_ids_are_refused_only_past_the_vocabulary() -> None:
    """Genie seeds ids 1000 .. 1000 + window - 1 (lhd-dec.cpp); a vocabulary of exactly 1000 + window holds them
    all, and was refused (<= for <)."""
    eight = sp.Lade(window=8)
    assert "token ids 1000+" in str(sp.lade_problem([1, 128], eight, n_vocab=1007))  # id 1007 is past it
    assert sp.lade_problem([1, 128], eight, n_vocab=1008) is None  # ids 1000..1007 fit
    assert "token ids 1000+" in str(sp.lade_problem([1, 128], sp.Lade(), n_vocab=840))


def test_a_draft_with_the_same_tokenizer_but_another_vocabulary_size_is_said_so(tmp_path: Path) -> None:
    """A draft with this model's tokenizer.json but a padded vocabulary of another size was refused as having
    "another tokenizer", and the hint sent the person looking for another folder of the same pair."""
    draft = tmp_path / "draft"
    draft.mkdir()
    (draft / "tokenizer.json").write_bytes(b'{"model": "the same"}')
    (draft / "bundle.json").write_text("{}")
    (draft / "genie_config.json").write_text(json.dumps({"dialog": {"context": {"n-vocab": 151936}}}))
    with pytest.raises(sp.SpeculativeError) as err:
        sp.draft_engine(draft, b'{"model": "the same"}', 152064)
    msg = err.value.message
    assert "this model's tokenizer but 151936 logits per token" in msg and "152064" in msg and "lade" in msg
    with pytest.raises(sp.SpeculativeError, match="another tokenizer"):
        sp.draft_engine(draft, b'{"model": "another"}', 151936)


def test_genies_profile_acceptance_is_read_as_tokens_per_step() -> None:
    from hexstudio.core.genie.profile import parse_profile

    doc: dict[str, Any] = {
        "header": {"artifact_type": "GENIE_PROFILE"},
        "components": [
            {
                "events": [
                    {"type": "GenieDialog_create", "init-time": {"value": 1000, "unit": "us"}},
                    {
                        "type": "GenieDialog_query",
                        "num-prompt-tokens": {"value": 7},
                        "num-generated-tokens": {"value": 12},
                        "token-acceptance-rate": {"value": 3.6666667, "unit": "toks/iteration"},
                    },
                ]
            }
        ],
    }
    assert parse_profile(doc).accepted_per_step == 3.667
    assert sp.acceptance(doc) == pytest.approx(3.6666667)
    doc["components"][0]["events"][1].pop("token-acceptance-rate")  # a basic dialog reports none
    assert parse_profile(doc).accepted_per_step is None


@needs_qnn
@pytest.mark.slow
def test_real_genie_runs_spd_greedy_token_for_token_as_basic(local_run: Path, tmp_path: Path) -> None:
    from hexstudio.core.genie.session import SessionError
    from hexstudio.core.services.bundle_check import check
    from hexstudio.shared.bundle.check import errors
    from hexstudio.workers.genie_config import write_dialog_configs

    remote = Path(json.loads((local_run / "artifacts" / "board" / "board.json").read_text())["remote_bundle"])
    q = json.loads((local_run / "artifacts" / "quantize" / "quantize.json").read_text())
    hf = json.loads((remote / "config.json").read_text())
    basic = json.loads((remote / "genie_config.json").read_text())
    # what the Compile stage writes with speculative_dialogs=spd, on a copy of the pushed bundle
    bundle = tmp_path / "bundle"
    shutil.copytree(remote, bundle)
    assert write_dialog_configs(
        bundle,
        basic,
        hf,
        q,
        run_settings_of({"speculative_dialogs": "spd", "spd_draft_len": 3}),
        runs_on=runs_on(remote),
    ) == [
        "genie_config.json",
        "genie_config.spd.json",
    ]
    findings = check(bundle)  # Genie 1.21's own parser on both configs
    assert not errors(findings), [f.message for f in errors(findings)]
    assert any(f.code == "genie_parser_ok" and "genie_config.spd.json" in f.message for f in findings)
    # the real runtime, through the session the studio uses (persistent helper on the HTP simulator)
    shutil.copy2(bundle / "genie_config.spd.json", remote / "genie_config.spd.json")
    prompt = "Once upon a time, Emma"
    try:
        plain, spd = _turn(local_run, "basic", prompt, 8), _turn(local_run, "spd", prompt, 8)
        with pytest.raises(SessionError, match="no lade dialog"):  # not compiled: said, with what to do
            _turn(local_run, "lade", prompt, 8)
    finally:
        (remote / "genie_config.spd.json").unlink()
    assert plain.state == spd.state == "complete" and plain.text.strip()
    assert spd.text == plain.text  # greedy: the same tokens
    assert plain.kpis is not None and plain.kpis.accepted_per_step is None
    assert (
        spd.kpis is not None and spd.kpis.accepted_per_step is not None and spd.kpis.accepted_per_step > 1.0
    )
    assert spd.kpis.source == "simulated" and spd.kpis.accepted_source == "genie"
    # the estimate used where Genie writes no profile (a lade reply cut at max_tokens), against Genie's own figure
    from hexstudio.core.genie.profile import accepted_from_token_times

    monos = [c.mono for c in spd.chunks if c.mono is not None and c.tokens == 1]
    est = accepted_from_token_times(monos)
    assert est is not None
    # the same steps as Genie counted: lhd-dec's definition, (n - 1) / steps, is the estimate's; spec-dec counts
    # the prompt's token nowhere (its _n_generated grows by each step's accepted tokens only, 279) yet still
    # subtracts one (427): (n - 2) / steps
    n = len(monos)
    assert round((n - 1) / est) == round((n - 2) / spd.kpis.accepted_per_step) >= 1, (est, spd.kpis, monos)


@pytest.fixture(scope="module")
def draft_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """builtin:tiny-llama-draft (1 layer, the built-in model's tokenizer) compiled locally: spd's draft."""
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace

    ws = tmp_path_factory.mktemp("draft-ws")
    m = Workspace(ws).create_run(
        "builtin:tiny-llama-draft",
        "sim",
        {"calibration_samples": 4, "compile_target": "local", "aimet_smoke": False},
    )
    res = asyncio.run(Pipeline(m).run(until="compile"))
    assert res.ok, f"{res.message} ({res.hint})"
    return Path(m.run_dir) / "artifacts" / "compile" / "bundle"


@needs_qnn
@pytest.mark.slow
def test_the_built_in_draft_model_drafts_for_the_built_in_model_on_real_genie(
    local_run: Path, draft_bundle: Path, tmp_path: Path
) -> None:
    from hexstudio.workers.genie_config import check_speculative, write_dialog_configs

    remote = Path(json.loads((local_run / "artifacts" / "board" / "board.json").read_text())["remote_bundle"])
    q = json.loads((local_run / "artifacts" / "quantize" / "quantize.json").read_text())
    hf = json.loads((remote / "config.json").read_text())
    basic = json.loads((remote / "genie_config.json").read_text())
    settings = run_settings_of(
        {"speculative_dialogs": "spd", "spd_draft": str(draft_bundle), "spd_draft_len": 3}
    )
    tok = (remote / "tokenizer.json").read_bytes()
    assert check_speculative(hf, q, settings, tok) == ["spd"]
    with pytest.raises(WorkerError, match="another tokenizer"):  # a draft must share the tokenizer
        check_speculative(hf, q, settings, tok + b" ")
    bundle = tmp_path / "bundle"
    shutil.copytree(remote, bundle)
    write_dialog_configs(bundle, basic, hf, q, settings, runs_on=runs_on(remote))
    spd_cfg = json.loads((bundle / "genie_config.spd.json").read_text())
    draft_bins = spd_cfg["dialog"]["engine"][0]["model"]["binary"]["ctx-bins"]
    assert spd_cfg["dialog"]["engine"][0]["role"] == "draft" and all(
        b.startswith("draft/") for b in draft_bins
    )
    assert all((bundle / b).is_file() for b in draft_bins)
    # on the simulator board, through the studio's session, against the basic dialog
    shutil.copytree(bundle / "draft", remote / "draft")
    shutil.copy2(bundle / "genie_config.spd.json", remote / "genie_config.spd.json")
    try:
        plain, spd = (
            _turn(local_run, "basic", "The sky was grey and", 12),
            _turn(local_run, "spd", "The sky was grey and", 12),
        )
    finally:
        (remote / "genie_config.spd.json").unlink()
        shutil.rmtree(remote / "draft")
    assert spd.state == "complete" and spd.text == plain.text and plain.text.strip()
    assert spd.kpis is not None and spd.kpis.accepted_per_step is not None
    assert 1.0 < spd.kpis.accepted_per_step <= 4.0  # at most draft-len + 1 a step


def _first_texts(bundle: Path, config: str, prompt: str, n: int, timeout: float = 120.0) -> list[str]:
    """The first `n` text events of one query of Genie on the HTP simulator, the helper killed after them (a lade
    query on Genie 1.21 x86 may run past max_tokens: docs/genie.md)."""
    import subprocess
    import time

    argv, env = genie_on_simulator(config, "error")
    msgs = [{"op": "query", "id": 1, "prompt": prompt, "max_tokens": n}, {"op": "quit"}]
    p = subprocess.Popen(
        argv,
        cwd=bundle,
        env=env,
        text=True,
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )
    assert p.stdin is not None and p.stdout is not None
    p.stdin.write("".join(json.dumps(m) + "\n" for m in msgs))
    p.stdin.flush()
    texts: list[str] = []
    deadline = time.monotonic() + timeout
    try:
        for line in p.stdout:
            e = json.loads(line) if line.startswith("{") else {}
            if e.get("event") == "text":
                texts.append(e["text"])
            assert e.get("event") != "end" or e.get("state") == "complete" or len(texts) >= n, e
            if len(texts) >= n or e.get("event") == "end" or time.monotonic() > deadline:
                break
    finally:
        p.kill()
        p.communicate()
    return texts


@needs_qnn
@pytest.mark.slow
def test_real_genie_runs_lade_steps_past_the_small_embedding(
    local_run: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Genie 1.21 seeds lade's lookahead with token ids 1000+, past the built-in model's 840-row embedding (its first
    step failed: `weight sel = 1000`). The local compile clamps the ids of so small a table (hexstudio.workers.qnn.htp_graph):
    lookahead steps now run on the prompt processor, and their tokens are the basic dialog's. At ngram 2: what Genie
    1.21 does on the x86 simulator with more levels (ngram >= 3 diverged from basic) is in docs/genie.md."""
    from hexstudio.workers.genie_config import check_speculative, write_dialog_configs

    remote = Path(json.loads((local_run / "artifacts" / "board" / "board.json").read_text())["remote_bundle"])
    q = json.loads((local_run / "artifacts" / "quantize" / "quantize.json").read_text())
    hf = json.loads((remote / "config.json").read_text())
    assert int(hf["vocab_size"]) < sp.LADE_SEED_BASE
    settings = run_settings_of(
        {"speculative_dialogs": "lade", "lade_window": 2, "lade_ngram": 2, "lade_gcap": 4}
    )
    assert check_speculative(hf, q, settings) == ["lade"]
    basic = json.loads((remote / "genie_config.json").read_text())
    assert write_dialog_configs(remote, basic, hf, q, settings, runs_on=runs_on(remote)) == [
        "genie_config.json",
        "genie_config.lade.json",
    ]
    assert json.loads((remote / "genie_config.lade.json").read_text())["dialog"]["lade"]["gcap"] == 4
    prompt = "The sky was grey and"
    monkeypatch.setenv("HEXSTUDIO_OVERRUN_GRACE_S", "1")  # Genie 1.21's lade never honours the ABORT anyway
    try:
        plain = _turn(local_run, "basic", prompt, 6)
        # through the studio's session: Genie 1.21's lade runs past max_tokens and ABORT, so the helper ends the
        # reply at 6 tokens and exits (docs/genie.md); Genie writes no profile for it
        lade = _turn(local_run, "lade", prompt, 6)
        # per turn (genie-t2t-run): the budget was only in the config, which lade ignores; the reply ran on to
        # EOS or a full context, minutes at 1.8 s a step
        t0 = time.monotonic()
        lade_t2t = _turn(local_run, "lade", prompt, 6, mode="per_turn")
        t2t_s = time.monotonic() - t0
    finally:
        (remote / "genie_config.lade.json").unlink()
    assert plain.state == lade.state == lade_t2t.state == "complete" and plain.text.strip()
    assert lade.text == plain.text  # the prompt's token, then five from lookahead steps: basic's tokens
    assert lade_t2t.text == plain.text and t2t_s < 60, (lade_t2t.text, t2t_s)
    assert lade.kpis is not None and lade.kpis.accepted_source == "token times"
    assert lade.kpis.accepted_per_step is not None and 1.0 <= lade.kpis.accepted_per_step <= 2.0  # ngram 2


@needs_qnn
@pytest.mark.slow
def test_genie_1_21_keeps_the_lookahead_set_up_batch_in_the_kv_for_the_first_step(local_run: Path) -> None:
    """Why lade_ngram defaults to 2 (docs/genie.md), pinned on Genie's own tensor dumps (dialog.debug.dump-tensors):
    at ngram >= 3 lhd-dec first runs a level-initialisation batch of window x (ngram - 1) tokens, and Genie 1.21
    keeps its KV, so the first lookahead step attends those tokens as past (8 slots here, past the prompt's). The
    step after it is back to the prompt and the one token accepted. When a Genie upgrade stops doing this, this test
    fails: then ngram >= 3 can be offered again."""
    import numpy as np

    remote = Path(json.loads((local_run / "artifacts" / "board" / "board.json").read_text())["remote_bundle"])
    cfg = json.loads((remote / "genie_config.json").read_text())
    cfg["dialog"]["type"] = "lade"
    cfg["dialog"]["lade"] = sp.Lade(window=4, ngram=3, gcap=1).block()
    cfg["dialog"]["debug"] = {"path": "lade-dump", "dump-tensors": True}
    (remote / "genie_config.lade3.json").write_text(json.dumps(cfg))
    try:
        _first_texts(remote, "genie_config.lade3.json", "The sky was grey and", 3)
        masks = {}  # inference number -> AR-128 attention mask rows (uint16: attend is non-zero)
        for f in sorted((remote / "lade-dump").glob("*/*/*_in_attention_mask")):
            a = np.fromfile(f, np.uint16)
            if a.size == 128 * 512:
                masks.setdefault(f.name[:3], a.reshape(128, 512))
    finally:
        (remote / "genie_config.lade3.json").unlink()
        shutil.rmtree(remote / "lade-dump", ignore_errors=True)
    past = {n: int(np.count_nonzero(m[0, : 512 - 128])) for n, m in masks.items()}
    n_prompt = int(np.count_nonzero(masks["000"].any(axis=1)))  # the prompt: one row per token
    assert past["000"] == 0 and past["001"] == n_prompt  # the prompt, then the level initialisation
    assert past["002"] == n_prompt + 4 * 2  # the first lookahead step: the set-up batch is kept as past
    assert past["003"] == n_prompt + 1  # then the prompt and the one token the step accepted


def test_a_speculative_config_is_held_to_the_bundles_path_rules(tmp_path: Path) -> None:
    """issue 27 item 3 for the dialogs' own configs: a draft ctx-bin out of the bundle is refused before anything
    is opened; one that is missing is named."""
    from hexstudio.shared.bundle.check import check_bundle

    basic = _basic()
    (tmp_path / "genie_config.json").write_text(json.dumps(basic))
    spd = sp.dialog_config(basic, "spd")
    spd["dialog"]["engine"][0]["model"]["binary"]["ctx-bins"] = ["../../outside.bin"]
    (tmp_path / "genie_config.spd.json").write_text(json.dumps(spd))
    found = check_bundle(tmp_path)
    assert any(f.code == "unsafe_path" and "genie_config.spd.json" in f.message for f in found), found
    spd["dialog"]["engine"][0]["model"]["binary"]["ctx-bins"] = ["draft/d_part_1_of_1.bin"]
    (tmp_path / "genie_config.spd.json").write_text(json.dumps(spd))
    found = check_bundle(tmp_path)
    assert any(f.code == "ctx_bin_missing" and "draft/d_part_1_of_1.bin" in f.message for f in found), found


@needs_qnn
@pytest.mark.slow(
    reason="the whole Evaluate stage with spd on real Genie (HTP simulator) against the basic dialog's tokens, "
    "plus the host HTP leg in the side environment: two simulators, every case greedy"
)
def test_the_evaluate_stage_runs_spd_on_real_genie_with_the_parity_gate(
    local_run: Path, draft_bundle: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The whole Evaluate stage with dialog_type spd on the simulator board (real Genie 1.21 on the HTP simulator):
    greedy parity against the host's HTP simulation is N/N, and Genie's tokens accepted per step are recorded, on
    every case (each after a reset: hexstudio/workers/board/genie_session.py makes an spd dialog again instead, as Genie
    1.21's spd reset loses its acceptance counts). Two cases of 8 tokens, to keep the suite's time. The draft is
    the built-in draft model's bundle, so the Compile stage itself writes the draft into the bundle (a local
    compile once read the bundle's tokenizer.json before copying it there, and failed on every draft).

    onnxruntime-qnn is taken to live in the workstation installer's side environment (the validated GPU recipe's
    Python 3.10 cannot hold it; here the "side environment" is this interpreter behind another path), so the
    host's HTP leg runs as a worker of that interpreter, beside the board leg."""
    import dataclasses

    from hexstudio.core.eval import stage as eval_stage
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace
    from hexstudio.workers.qnn import libs as qnn_libs
    from tests.support.sim_runs import copy_run

    run_dir = copy_run(local_run, tmp_path)
    m = Workspace(tmp_path).open_run(run_dir.name)
    m.settings.update(
        {
            "speculative_dialogs": "spd",
            "spd_draft": str(draft_bundle),
            "spd_draft_len": 3,
            "dialog_type": "spd",
            "eval_suites": ["greedy_parity"],
            "eval_legs": ["board"],
        }
    )
    m.save()
    monkeypatch.setattr(eval_stage, "HTP_SIM_PARITY_CASES", 2)
    monkeypatch.setattr(eval_stage, "HTP_SIM_MAX_TOKENS", 8)
    here = qnn_libs.find_qnn_libs()
    assert here is not None
    side = tmp_path / "side-env" / "python"
    side.parent.mkdir()
    side.write_text(f'#!/bin/sh\necho "$@" >> {side.parent}/calls\nexec {sys.executable} "$@"\n')
    side.chmod(0o755)
    monkeypatch.setattr(qnn_libs, "find_qnn_libs", lambda: dataclasses.replace(here, python=str(side)))
    res = asyncio.run(Pipeline(m).run(until="evaluate"))
    assert res.ok, f"{res.message} ({res.hint})"
    calls = (side.parent / "calls").read_text()
    assert "-m hexstudio.workers.evaluate --spec" in calls and "evaluate.htp.json" in calls, calls
    ev = json.loads((run_dir / "artifacts" / "evaluate" / "evaluate.json").read_text())
    bs = ev["board_session"]
    assert bs["dialog"] == "spd" and bs["accepted_per_step"] > 1.0 and bs["accepted_per_step_cases"] == 2
    assert bs["accepted_per_step_source"] == "genie"
    spd_cfg = json.loads((run_dir / "artifacts" / "compile" / "bundle" / "genie_config.spd.json").read_text())
    assert spd_cfg["dialog"]["engine"][0]["role"] == "draft"
    metrics = {
        k: (v["value"] if isinstance(v, dict) else v) for k, v in m.stage("evaluate").data["metrics"].items()
    }
    assert metrics["parity_reference"] == "htp" and metrics["parity_matched"] == metrics["parity_total"] > 0


def test_a_draft_that_cannot_load_beside_is_refused_before_anything_compiles(tmp_path: Path) -> None:
    """The draft's context, device and QAIRT were checked only when the dialog configs were written, after every
    part had compiled (hours at 8B on AI Hub): the check before the compile now gets them too."""
    from hexstudio.workers.genie_config import check_speculative

    hf = json.loads(BUILTIN_CONFIG.read_text())
    draft = _draft(tmp_path / "small", context_length=2048)
    settings = run_settings_of({"speculative_dialogs": "spd", "spd_draft": str(draft), "spd_draft_len": 3})
    q = {"ar_n": 128, "context_length": 4096}
    tok = b'{"model": {}}'
    assert check_speculative(hf, q, settings, tok) == ["spd"]  # what it knew before: the tokenizer
    with pytest.raises(WorkerError, match="context of 2048 tokens"):
        check_speculative(hf, q, settings, tok, host=sp.DraftHost(4096, "v73", 77, "2.42"))
