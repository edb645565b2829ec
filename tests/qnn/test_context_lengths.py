"""Several context lengths in one bundle: the Quantize stage exports every graph at each (one calibration, one set of
encodings), the local compile writes them as real context binaries, and Qualcomm's libGenie 1.21 on the HTP
simulator starts in the smallest and switches up as the dialog grows (its own log says so), giving the tokens the
single-context-length bundle gives."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from tests.aihub_emulator.fixtures import aihub_emulator  # noqa: F401
from tests.aihub_emulator.server import AIHubEmulator
from tests.qnn.conftest import genie_session, needs_qnn

# AR-32 keeps the test short; CL 128 beside 256 (never CL = 2 x AR: hexstudio.shared.run_settings.genie_cl_problem);
# with a lade dialog whose step (2 + 4) x 1 = 6 tokens fits AR-32, and spd (the model drafting for itself) whose
# draft_len + 1 = 4 verification tokens run on the AR-4 graphs `ar_sizes` adds at both CLs
SETTINGS = {
    "calibration_samples": 2,
    "calibration_seq_len": 64,
    "context_length": 256,
    "ar_n": 32,
    "context_lengths": "128",
    "compile_target": "local",
    "aimet_smoke": False,
    "speculative_dialogs": "lade,spd",
    "lade_window": 2,
    "lade_ngram": 2,
    "lade_gcap": 4,
    "spd_draft_len": 3,
    "ar_sizes": "4",
}


@pytest.fixture(scope="module")
def two_cl_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace

    ws = tmp_path_factory.mktemp("two-cl")
    m = Workspace(ws).create_run("builtin:tiny-llama", "sim", dict(SETTINGS))
    res = asyncio.run(Pipeline(m).run(until="board"))
    assert res.ok, f"{res.message} ({res.hint})"
    return Path(m.run_dir)


def _genie(bundle: Path, config: str, prompt: str, max_tokens: int) -> tuple[str, list[str]]:
    msgs = [{"op": "query", "id": 1, "prompt": prompt, "max_tokens": max_tokens}, {"op": "quit"}]
    events, stderr = genie_session(bundle, config, "verbose", msgs, timeout=600)
    end = next(e for e in events if e["event"] == "end")
    assert end["state"] == "complete", (end, stderr[-2000:])
    return "".join(e["text"] for e in events if e["event"] == "text"), [
        str(e["message"]) for e in events if e["event"] == "log"
    ]


@needs_qnn
@pytest.mark.slow(
    reason="real Genie on the HTP simulator must cross each context-length boundary (a dialog long enough to "
    "switch graphs twice); the simulator runs at ~1 token/s on 2 cores"
)
def test_two_context_lengths_are_one_bundle_and_genie_switches_between_them(two_cl_run: Path) -> None:
    art = two_cl_run / "artifacts"
    q = json.loads((art / "quantize" / "quantize.json").read_text())
    assert q["context_lengths"] == [256, 128] and q["context_length"] == 256
    assert sorted(g["name"] for g in q["variants"]) == [
        "prompt_ar32_cl128_1_of_2",
        "prompt_ar32_cl128_2_of_2",
        "prompt_ar4_cl128_1_of_2",
        "prompt_ar4_cl128_2_of_2",
        "prompt_ar4_cl256_1_of_2",
        "prompt_ar4_cl256_2_of_2",
        "token_ar1_cl128_1_of_2",
        "token_ar1_cl128_2_of_2",
    ]
    # one calibration: every variant carries its part's encodings, byte for byte
    for v in q["variants"]:
        main = next(g for g in q["graphs"] if g["name"] == v["variant_of"])
        assert (art / "quantize" / v["encodings"]).read_bytes() == (
            art / "quantize" / main["encodings"]
        ).read_bytes()
    remote = Path(json.loads((art / "board" / "board.json").read_text())["remote_bundle"])
    cfg = json.loads((remote / "genie_config.json").read_text())
    bins = cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert cfg["dialog"]["context"]["size"] == 256 and len(bins) == 12
    assert sum("_cl128_" in b for b in bins) == 6 and sum("_ar4_" in b for b in bins) == 4
    assert json.loads((remote / "bundle.json").read_text())["context_lengths"] == [256, 128]
    # the reference: the same bundle with the CL-256 graphs only
    one = json.loads(json.dumps(cfg))
    one["dialog"]["engine"]["model"]["binary"]["ctx-bins"] = [b for b in bins if "_cl128_" not in b]
    (remote / "genie_config.one-cl.json").write_text(json.dumps(one))
    prompt = (
        "Emma found a small board in the kitchen at night. The sky was grey and the wind was strong. " * 4
        + "Emma smiled and looked at the small board."
    )
    from tokenizers import Tokenizer

    n_prompt = len(Tokenizer.from_file(str(remote / "tokenizer.json")).encode(prompt).ids)
    # up to three AR-32 prompt chunks fit CL-128; the replies cross it at 127 tokens. A long prompt (95 tokens)
    # keeps the generated part short: the simulator makes ~2 tokens/s, prompt chunks are much cheaper per token
    assert 64 < n_prompt <= 96
    n = 128 - n_prompt + 6
    try:
        both, log = _genie(remote, "genie_config.json", prompt, n)
        ref, ref_log = _genie(remote, "genie_config.one-cl.json", prompt, n)
    finally:
        (remote / "genie_config.one-cl.json").unlink()
    loaded = next(line for line in log if "Graphs loaded" in line)
    assert all(f"({ar}, {cl}): 2" in loaded for ar in (1, 4, 32) for cl in (128, 256)), loaded
    # Genie starts in the small context and moves up as the KV cache fills (crossing CL-128 while generating)
    assert any("Initializing to AR-32 CL-128" in line for line in log), log
    assert any("reshapeCache(AR-1 CL-128 -> AR-1 CL-256)" in line for line in log), [
        x for x in log if "reshape" in x
    ]
    assert any("Initializing to AR-32 CL-256" in line for line in ref_log)
    assert both == ref and len(both) > 100  # the same tokens across the switch


@needs_qnn
@pytest.mark.slow
def test_one_bundle_holds_two_context_lengths_and_a_lade_and_an_spd_dialog(two_cl_run: Path) -> None:
    """issue 29's acceptance on the built-in model: one bundle, two CLs, the basic, lade and spd configs, each
    accepted by Genie 1.21's own parser and loaded by real Genie on the HTP simulator, greedy tokens equal."""
    from hexstudio.core.services.bundle_check import check
    from hexstudio.shared.bundle import speculative as sp
    from hexstudio.shared.bundle.check import errors
    from tests.qnn.test_speculative import _first_texts

    bundle = two_cl_run / "artifacts" / "compile" / "bundle"
    findings = check(bundle)
    assert not errors(findings), [f.message for f in errors(findings)]
    for name in ("genie_config.json", "genie_config.lade.json", "genie_config.spd.json"):
        assert any(f.code == "genie_parser_ok" and name in f.message for f in findings), name
        cfg = json.loads((bundle / name).read_text())
        held = sp.ctx_bins(cfg["dialog"])
        assert (
            sum("_cl128_" in b for b in held) == 6 and sum("_ar4_" in b for b in held) == 4
        )  # both CLs, AR-4
    remote = Path(
        json.loads((two_cl_run / "artifacts" / "board" / "board.json").read_text())["remote_bundle"]
    )
    prompt = "The sky was grey and"
    texts = {c: _first_texts(remote, c, prompt, 4) for c in ("genie_config.json", "genie_config.lade.json")}
    basic = texts["genie_config.json"]
    assert len(basic) == 4 and "".join(basic).strip()
    assert texts["genie_config.lade.json"] == basic, texts
    # spd verifies its draft_len + 1 = 4 tokens on the AR-4 graphs (Genie picks the smallest AR that holds a call)
    spd, log = _genie(remote, "genie_config.spd.json", prompt, 4)
    assert spd == "".join(basic), (spd, basic)
    assert any("reshapeCache(" in line and "-> AR-4 CL-128)" in line for line in log), [
        x for x in log if "reshape" in x
    ]


def test_preflight_counts_every_context_length_the_bundle_holds() -> None:
    """Each variant compiles every graph again (time; the simulator's one-graph binaries: disk); the KV cache and the
    board's weight-shared bundle are sized by the largest CL as before."""
    from hexstudio.core.services.preflight import context_variants
    from hexstudio.shared import modelinfo
    from hexstudio.shared.data import builtin_model_dir

    info = modelinfo.inspect_folder(builtin_model_dir())
    one = modelinfo.estimate(info, 4096)
    three = modelinfo.estimate(
        info, 4096, context_variants=context_variants({"context_lengths": "1024,2048"})
    )
    assert three["context_variants"] == 3 and one["context_variants"] == 1
    assert three["local_compile_seconds"] == pytest.approx(3 * one["local_compile_seconds"], abs=2)
    assert three["local_compile_disk_bytes"] == pytest.approx(3 * one["local_compile_disk_bytes"], abs=4)
    assert three["kv_cache_bytes"] == one["kv_cache_bytes"] and three["bundle_bytes"] == one["bundle_bytes"]
    assert context_variants({"context_lengths": "1k"}) == 1  # the setting check says what is wrong


def test_ar_sizes_are_checked_when_set_and_counted_by_preflight() -> None:
    """`ar_sizes` adds a prompt-processor graph per part and context length (one more compile each); a value Genie
    cannot use is refused when it is set, naming the setting, before any stage runs."""
    from hexstudio.core.services.preflight import ar_variants
    from hexstudio.shared import modelinfo
    from hexstudio.shared import run_settings as rs
    from hexstudio.shared.data import builtin_model_dir

    assert rs.extra_ar_sizes("8, 4,4") == [4, 8] and rs.extra_ar_sizes("") == []
    for bad, words in (("1", "token generator"), ("x", "not a whole number"), ("128", "not below ar_n")):
        with pytest.raises(ValueError, match=words):
            rs.extra_ar_sizes(bad, ar_n=128)
    with pytest.raises(ValueError, match="twice ar_n 64"):  # CL 128 = 2 x AR-64: Genie 1.21 answers wrong
        rs.extra_ar_sizes("64", ar_n=128, context_lengths=[128, 512])
    assert rs.check("ar_sizes", "4,1") is not None and rs.check("ar_sizes", "4") is None
    info = modelinfo.inspect_folder(builtin_model_dir())
    one = modelinfo.estimate(info, 4096)
    more = modelinfo.estimate(info, 4096, ar_variants=ar_variants({"ar_sizes": "4,8"}))
    assert more["ar_variants"] == 2 and ar_variants({"ar_sizes": "x"}) == 0
    assert more["local_compile_seconds"] == pytest.approx(2 * one["local_compile_seconds"], abs=2)


@needs_qnn
@pytest.mark.slow
def test_ai_hub_links_every_ar_and_context_length_of_a_part_into_its_context(
    two_cl_run: Path,
    tmp_path: Path,
    aihub_emulator: AIHubEmulator,  # noqa: F811 (the fixture)
) -> None:
    """The AI Hub compile of the same quantized graphs (EMULATED service): one compile job per graph, the variants
    (CL-128, AR-4) included, one link job per part joining all of its graphs into one context binary, as Qualcomm's
    long-context bundles hold them; every component in metadata.yaml, the config accepted by Genie's own parser."""
    from hexstudio.core.pipeline import Pipeline
    from hexstudio.core.runs import Workspace
    from hexstudio.shared.bundle.genie_schema import genie_config_errors
    from hexstudio.workers.bundle_metadata import read_metadata
    from tests.support.sim_runs import copy_run

    emu = aihub_emulator
    run_dir = copy_run(two_cl_run, tmp_path)
    m = Workspace(tmp_path).open_run(run_dir.name)
    # lade is refused on AI Hub for this 840-token vocabulary (Genie seeds ids 1000+): spd only
    m.settings.update({**emu.run_settings(), "compile_target": "aihub", "speculative_dialogs": "spd"})
    m.save()
    res = asyncio.run(Pipeline(m).run(only="compile"))
    assert res.ok, f"{res.message} ({res.hint})"
    q = json.loads((run_dir / "artifacts" / "quantize" / "quantize.json").read_text())
    every = [*q["graphs"], *q["variants"]]
    assert emu.submissions == {"compile": len(every), "link": 2} and emu.uploads == len(every) == 12
    links = [j for j in emu.jobs.values() if j.kind == "link"]
    assert sorted(len(j.graphs) for j in links) == [6, 6], [j.graphs for j in links]  # 6 graphs in each part
    bundle = run_dir / "artifacts" / "compile" / "bundle"
    cfg = json.loads((bundle / "genie_config.json").read_text())
    assert cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"] == [
        "tiny_llama_part_1_of_2.bin",
        "tiny_llama_part_2_of_2.bin",
    ]
    assert genie_config_errors(cfg) == []
    comps = read_metadata(bundle / "metadata.yaml")["components"]
    assert sorted(comps) == sorted(
        f"{kind}_{i}_of_2{suffix}"
        for i in (1, 2)
        for kind, suffix in (
            ("prompt", ""),
            ("token", ""),
            ("prompt", "_cl128"),
            ("token", "_cl128"),
            ("prompt", "_ar4"),
            ("prompt", "_ar4_cl128"),
        )
    )
