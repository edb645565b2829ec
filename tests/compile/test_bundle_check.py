"""`hexstudio bundle check`: Genie's contract checked before a bundle reaches a board (hexstudio/shared/bundle/check.py,
genie_schema.py, genie_model.py), the push and doctor hooks, and the error decoder's contract rules.

Every bundle here is built from small synthetic specs (tests/compile/genie_bundles.py): no quantization run."""

from __future__ import annotations

import copy
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any, ClassVar

import pytest
import yaml

from hexstudio.shared import bundle as gb
from hexstudio.shared.bundle import genie_model as gm
from hexstudio.shared.bundle import genie_schema as gs
from hexstudio.shared.bundle.check import Finding, check_bundle, errors
from tests.compile import genie_bundles as gbx
from tests.support.cli import hexstudio as _hexstudio

FIXTURE = Path(__file__).parent / "fixtures" / f"{gbx.MODEL_ID}-genie-w4a16-qualcomm_qcs9075"
BOARD = {"dsp_arch": "v73", "chip": "QCS9075", "soc_id": "676", "qairt_version": "2.42.0.251225135753"}


def _codes(fs: list[Finding]) -> list[str]:
    return [f.code for f in errors(fs)]


# -- the qai-hub-models layout passes ------------------------------------------------------------------
def test_the_qai_hub_models_layout_fixture_passes(tmp_path: Path) -> None:
    assert sorted(p.name for p in FIXTURE.iterdir()) == sorted(
        [*gbx.BUNDLE_FILES, "tool-versions.yaml", *(f"{gbx.MODEL_ID}_part_{i}_of_3.bin" for i in (1, 2, 3))]
    )
    found = check_bundle(FIXTURE, BOARD)
    assert errors(found) == [] and [f for f in found if f.severity == "warning"] == []
    # qai-hub-models keeps config.json's eos order (<|end_of_text|> first): Genie writes that one between turns
    assert [f.code for f in found if f.severity == "info"] == ["eos_not_the_turns_end"]
    # the checked-in fixture is what the generator writes from the facts
    fresh = gbx.write_bundle(tmp_path / "fresh")
    for p in FIXTURE.iterdir():
        assert (fresh / p.name).read_bytes() == p.read_bytes(), p.name
    # the fixture is the layout, its .bin files are text stand-ins: HexStudio's checks only (Qualcomm's reader would
    # rightly refuse them: test_a_stand_in_binary_is_refused_by_qnns_reader)
    out = _hexstudio("bundle", "check", str(FIXTURE), "--json", "--no-qualcomm")
    assert out.returncode == 0, out.stdout + out.stderr
    assert json.loads(out.stdout)["ok"] is True


def test_hexstudios_own_layout_passes(tmp_path: Path) -> None:
    """Two parts (no embedding-only part), boundary named as QNN spells it, genie_config from our writer."""
    hf = gbx.LLAMA_32_1B
    comps = gbx.graph_specs(hf, 512, parts=[list(range(0, 8)), list(range(8, 16))], slash=False)
    cfg = gb.genie_config(hf, 512, [gb.ctx_bin_name("m", i, 2) for i in (1, 2)], 64)
    b = gbx.write_bundle(tmp_path / "b", components=comps, cfg=cfg)
    assert errors(check_bundle(b, BOARD)) == []


# -- any ONE fault is refused, with Genie's message ----------------------------------------------------
def _cfg(b: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    cfg = json.loads((b / "genie_config.json").read_text())
    edit(cfg)
    (b / "genie_config.json").write_text(json.dumps(cfg, indent=4))


def _meta(b: Path, edit: Callable[[dict[str, Any]], None]) -> None:
    doc = yaml.safe_load((b / "metadata.yaml").read_text())
    edit(doc["components"])
    (b / "metadata.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))


def _no_backend_version(c: dict[str, Any]) -> None:
    del c["dialog"]["engine"]["backend"]["version"]


def _unknown_key(c: dict[str, Any]) -> None:
    c["dialog"]["engine"]["backend"]["QnnHtp"]["rope-scaling-mode"] = "auto"


def _renamed_input(comps: dict[str, Any]) -> None:
    for spec in comps.values():  # in-graph rope: position_ids instead of Genie's cos/sin
        if "position_ids_sin" in spec["inputs"]:
            spec["inputs"]["position_ids"] = spec["inputs"].pop("position_ids_sin")


def _untied_kv(comps: dict[str, Any]) -> None:
    comps["token_2_of_3"]["inputs"]["past_key_3_in"]["quantization_parameters"]["scale"] = 0.07


def _two_boundary_names(comps: dict[str, Any]) -> None:
    for inst in ("prompt", "token"):
        outs, ins = comps[f"{inst}_2_of_3"]["outputs"], comps[f"{inst}_3_of_3"]["inputs"]
        outs["hidden_states_out"] = outs.pop(gbx.boundary(7))
        ins["hidden_states_in"] = ins.pop(gbx.boundary(7))


def _rope_factor(c: dict[str, Any]) -> None:
    # qai-hub-models' hard-coded 8.0 for a Llama 3.2 whose config.json says 32.0
    c["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"]["factor"] = 8.0


@pytest.mark.parametrize(
    "fault,edit,code,genie",
    [
        (
            "missing version",
            lambda b: _cfg(b, _no_backend_version),
            "config_schema",
            "Missing backend field: version\nFailed to create the dialog config.",
        ),
        (
            "unknown config key",
            lambda b: _cfg(b, _unknown_key),
            "config_schema",
            "Unknown QnnHtp config key: rope-scaling-mode\nFailed to create the dialog config.",
        ),
        (
            "renamed graph input",
            lambda b: _meta(b, _renamed_input),
            "graph_tensor_not_found",
            "Tensor not found: position_ids_sin\nError : Could not find I/O tensors in loaded graphs. ",
        ),
        (
            "untied KV encoding",
            lambda b: _meta(b, _untied_kv),
            "graph_non_identical_quant",
            '[ERROR] "token_ar1_cl4096_2_of_3 : past_key_3_in - Non-identical quantization parameters found for the same '
            'tensor"',
        ),
        ("part boundary with two names", lambda b: _meta(b, _two_boundary_names), "graph_split_chain", None),
    ],
)
def test_one_fault_is_refused_with_genies_message(
    tmp_path: Path, fault: str, edit: Callable[[Path], None], code: str, genie: str | None
) -> None:
    b = gbx.write_bundle(tmp_path / "b")
    edit(b)
    found = check_bundle(b, BOARD)
    hits = [f for f in errors(found) if f.code == code]
    assert hits, f"{fault}: {_codes(found)}"
    f = hits[0]
    assert f.fix and f.message
    if genie is not None:
        assert f.genie_error is not None and genie in f.genie_error, f.genie_error
    else:  # Genie itself loads it; the model then computes garbage: said so, with the fix
        assert f.genie_error is not None and f.genie_error.startswith("(none")
    if code == "graph_non_identical_quant":
        assert "Error validating model. Please check your I/O. Error validating HTP models" in (
            f.genie_error or ""
        )
    out = _hexstudio("bundle", "check", str(b))
    assert out.returncode == 1 and f"[ERROR] {code}" in out.stdout and "Traceback" not in out.stderr


def test_a_rope_genie_loads_but_the_model_did_not_train_on_is_a_warning_with_its_effect(
    tmp_path: Path,
) -> None:
    """Qualcomm's own Llama 3.2 bundles write rope factor 8.0 where config.json says 32.0: Genie loads them, so the
    push is not blocked; the finding says how far the angles drift over the context."""
    b = gbx.write_bundle(tmp_path / "b")
    _cfg(b, _rope_factor)
    found = check_bundle(b, BOARD)
    assert errors(found) == [], _codes(found)
    w = next(f for f in found if f.code == "rope_differs")
    assert w.severity == "warning" and "frequency pairs" in w.message and "rad" in w.message and w.fix
    out = _hexstudio("bundle", "check", str(b), "--no-qualcomm")
    assert out.returncode == 0 and "[WARNING] rope_differs" in out.stdout


def test_check_json_names_genies_error_and_the_fix(tmp_path: Path) -> None:
    b = gbx.write_bundle(tmp_path / "b")
    _cfg(b, _no_backend_version)
    out = _hexstudio("bundle", "check", str(b), "--json")
    doc = json.loads(out.stdout)
    assert out.returncode == 1 and doc["ok"] is False and doc["errors"] >= 1
    first = doc["findings"][0]
    assert set(first) == {"code", "severity", "message", "genie_error", "fix"}
    assert first["genie_error"].startswith("Missing backend field: version") and "version" in first["fix"]


# -- genie_config schema: Genie's order and texts ------------------------------------------------------
def _good() -> dict[str, Any]:
    return gbx.genie_config()


@pytest.mark.parametrize(
    "edit,first",
    [
        (lambda d: d.pop("dialog"), "Missing dialog field: dialog"),
        (lambda d: d.update(extra=1), "Unknown dialog config key: extra"),
        (lambda d: d["dialog"].update(version=2), "Invalid dialog config: unsupported version: 2"),
        (lambda d: d["dialog"].update(version="1"), "Invalid dialog config: version is not numeric"),
        (lambda d: d["dialog"].update(type="chat"), "Invalid dialog type: chat"),
        (
            lambda d: d["dialog"]["context"].update({"bos-token": None}),
            "Invalid context config: bos-token is not numeric",
        ),
        (
            lambda d: d["dialog"]["context"].update({"eos-token": "</s>"}),
            "Invalid context config: eos-token is not an array or numeric",
        ),
        # mandatory keys are reported alphabetically (a std::set): eos-token before n-vocab
        (
            lambda d: [d["dialog"]["context"].pop(k) for k in ("n-vocab", "eos-token")],
            "Missing context field: eos-token",
        ),
        (
            lambda d: d["dialog"]["engine"]["backend"]["QnnHtp"].pop("version"),
            "Missing QnnHtp field: version",
        ),
        (
            lambda d: d["dialog"]["engine"]["backend"].update(type="HexStudioSimulator"),
            'Invalid backend config: unsupported type: "HexStudioSimulator"',
        ),
        (
            lambda d: d["dialog"]["engine"]["backend"]["QnnHtp"].update({"use-mmap": 1}),
            "Invalid QnnHtp config: use-mmap is not boolean",
        ),
        (lambda d: d["dialog"]["engine"]["model"]["binary"].pop("version"), "Missing binary field: version"),
        (
            lambda d: d["dialog"]["engine"]["model"]["positional-encoding"].update(version=1),
            "Unknown positional encoding config key: version",
        ),
        (
            lambda d: d["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"].update(
                {"rope-type": "yarn"}
            ),
            "Rope type not supportedyarn",
        ),
        (
            lambda d: d["dialog"]["engine"]["model"]["positional-encoding"]["rope-scaling"].update(version=1),
            "Rope scaling parameter not supported version",
        ),
        (
            lambda d: d["dialog"]["engine"]["backend"]["QnnHtp"].update({"pos-id-dim": 32}),
            "Specify one config from pos-id-dim and positional-encoding",
        ),
        (
            lambda d: d["dialog"]["engine"]["backend"]["QnnHtp"].update({"rope-theta": 500000}),
            "Specify one config from rope-theta and positional-encoding",
        ),
        (
            lambda d: d["dialog"]["engine"]["model"]["binary"].update({"ctx-bins": ["a.bin", 3]}),
            "ctx-bins must be an array of strings",
        ),
        (lambda d: d["dialog"].update({"max-num-tokens": -1}), "number of tokens must be > 0. provided: -1"),
    ],
)
def test_schema_messages_are_genies(edit: Callable[[dict[str, Any]], Any], first: str) -> None:
    doc = _good()
    assert gs.genie_config_errors(doc) == []
    edit(doc)
    assert gs.genie_config_errors(doc)[0] == first


def test_schema_walks_in_genies_order_and_reports_every_error() -> None:
    doc = _good()
    del doc["dialog"]["engine"]["backend"]["version"]  # engine.backend
    doc["dialog"]["context"]["bos-token"] = None  # context: before engine alphabetically
    doc["dialog"]["tokenizer"]["extra"] = 1  # tokenizer: after engine alphabetically, but...
    # ...Genie validates the engine after dialog's key loop (it needs dialog.type first)
    assert gs.genie_config_errors(doc) == [
        "Invalid context config: bos-token is not numeric",
        "Unknown tokenizer config key: extra",
        "Missing backend field: version",
    ]
    assert gs.genie_config_text_errors('{"dialog": {}, "dialog": {}}') == [
        'Multiple dialog config key: "dialog"'
    ]


def test_practically_mandatory_keys() -> None:
    doc = _good()
    del doc["dialog"]["sampler"]
    del doc["dialog"]["engine"]["backend"]["QnnHtp"]["kv-dim"]
    del doc["dialog"]["engine"]["model"]["positional-encoding"]["rope-dim"]
    assert gs.genie_config_errors(doc) == []  # Genie's validator lets them through...
    issues = {i.key: i for i in gs.dialog_create_errors(doc)}  # ...loading the dialog does not
    assert issues["dialog.sampler"].message.startswith("qualla: mandatory config key : (sampler) not found")
    assert "kv-dim" in issues["dialog.engine.backend.QnnHtp.kv-dim"].message
    assert "(rope-dim) not found" in issues["dialog.engine.model.positional-encoding.rope-dim"].message


def test_the_llama_31_8b_config_from_bundle_config_passes_the_checker(tmp_path: Path) -> None:
    from tests.support.configs import LLAMA_31_8B

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    out = _hexstudio("bundle", "config", "--model", str(tmp_path), "--context-length", "4096")
    assert out.returncode == 0, out.stderr
    cfg = json.loads(out.stdout)
    assert gs.genie_config_errors(cfg) == [] and gs.dialog_create_errors(cfg) == []
    # as a whole bundle (its parts named as the config says, the model's own config.json beside it)
    comps = gbx.graph_specs(
        LLAMA_31_8B | {"head_dim": 128},
        4096,
        parts=[None, list(range(0, 9)), list(range(9, 18)), list(range(18, 27)), list(range(27, 32))],
    )
    b = gbx.write_bundle(tmp_path / "b", hf=LLAMA_31_8B | {"head_dim": 128}, components=comps, cfg=cfg)
    (b / "config.json").write_text(json.dumps(LLAMA_31_8B))
    assert _codes(check_bundle(b, BOARD)) == []


# -- the model checks, Genie's quirks included ---------------------------------------------------------
def _comps(**kw: Any) -> dict[str, dict[str, Any]]:
    from hexstudio.shared.bundle.check import graphs_from_metadata

    return graphs_from_metadata({"components": gbx.graph_specs(**kw)}, 4096)


def test_model_checks_pass_the_reference_graphs() -> None:
    g = _comps()
    assert sorted(g)[0] == "prompt_ar128_cl4096_1_of_3"  # the embedding-only part takes its siblings' CL
    assert gm.genie_lines(gm.model_issues(g, 4096, kv_dim=64, rope_dim=32)) == []
    assert gm.model_issues(g, 4096, kv_dim=64, rope_dim=32) == []


def test_genie_compares_kv_in_out_only_across_two_graphs() -> None:
    g = {k: v for k, v in _comps().items() if k.startswith("prompt")}  # one variant only
    g["prompt_ar128_cl4096_2_of_3"]["inputs"]["past_key_0_in"]["quantization_parameters"]["scale"] = 0.07
    assert gm.genie_lines(gm.model_issues(g, 4096)) == []  # Genie misses it...
    assert [i.code for i in gm.model_issues(g, 4096)] == ["kv_untied"]  # ...HexStudio does not


def test_genie_output_block_for_validation_errors() -> None:
    g = _comps()
    g["token_ar1_cl4096_3_of_3"]["inputs"]["attention_mask"]["quantization_parameters"]["offset"] = -65000
    lines = gm.genie_lines(gm.model_issues(g, 4096))
    assert lines[0] == '[ERROR] "Model Validation Errors found"'
    assert (
        '[ERROR] "token_ar1_cl4096_3_of_3 : attention_mask - Non-identical quantization parameters found for the '
        'same tensor"' in lines
    )
    assert lines[-1] == "Error validating model. Please check your I/O. Error validating HTP models"
    codes = {i.code for i in gm.model_issues(g, 4096)}
    assert {"non_identical_quant", "mask_quant"} <= codes  # and its largest code is no longer 0.0


def test_context_size_above_the_graphs_cl() -> None:
    assert gm.genie_lines(gm.model_issues(_comps(), 8192)) == [
        "Failure to initialize model. Config specifies context->size=8192, but loaded max-CL=4096"
    ]


def test_shapes_use_genies_dims() -> None:
    g = _comps()
    g["prompt_ar128_cl4096_2_of_3"]["inputs"]["position_ids_cos"]["shape"] = [1, 1, 128, 64]  # full width
    issue = next(i for i in gm.model_issues(g, 4096, rope_dim=32) if i.code == "shape")
    assert (issue.graph, issue.tensor) == ("ShapeError", "position_ids_cos")
    assert issue.message.startswith("Expected [ 1, 128, 32] bitwidth=*. Found [ 1, 128, 64]")


def test_hexstudio_findings_genie_does_not_make() -> None:
    g = _comps()
    for spec in g.values():
        ins = spec["inputs"]
        if "position_ids_sin" in ins:
            ins["position_ids_sin"]["quantization_parameters"] = {"scale": 1.0 / 65535, "offset": -32768}
        for t, s in {**ins, **spec["outputs"]}.items():
            if t.startswith("past_value_0"):
                s["quantization_parameters"]["offset"] = -120
    codes = {i.code for i in gm.model_issues(g, 4096)}
    assert {"cos_sin_quant", "kv_asymmetric"} <= codes and gm.genie_lines(gm.model_issues(g, 4096)) == []


def test_split_order_must_be_lexicographic() -> None:
    names = [f"prompt_ar128_cl4096_{i}_of_10" for i in range(1, 11)]
    specs: dict[str, dict[str, Any]] = {n: {"inputs": {}, "outputs": {}} for n in names}
    issues = gm.model_issues(specs, 4096)
    assert any(i.code == "split_order" for i in issues)  # _10_of_10 sorts before _2_of_10


# -- board facts, tokens ----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    "facts,code",
    [
        ({**BOARD, "dsp_arch": "v75"}, "dsp_arch"),
        ({**BOARD, "chip": "QCS8550"}, None),  # unknown chip: soc_model not judged
        ({**BOARD, "qairt_version": "2.40.0.251030"}, "qairt_old"),
        ({**BOARD, "qairt_version": None}, "qairt_missing"),
    ],
)
def test_board_facts(facts: dict[str, Any], code: str | None) -> None:
    codes = _codes(check_bundle(FIXTURE, facts))
    assert codes == ([code] if code else [])


def test_soc_model_against_the_board(tmp_path: Path) -> None:
    b = gbx.write_bundle(tmp_path / "b", soc_model=69)
    assert _codes(check_bundle(b, BOARD)) == ["soc_model"]
    assert _codes(check_bundle(b, None)) == []  # without --board nothing about the board is judged


def test_special_tokens_against_the_tokenizer(tmp_path: Path) -> None:
    b = gbx.write_bundle(tmp_path / "b")
    _cfg(b, lambda c: c["dialog"]["context"].update({"bos-token": 128001, "eos-token": [128001]}))
    assert set(_codes(check_bundle(b, BOARD))) == {"bos_mismatch", "eos_mismatch"}
    _cfg(b, lambda c: c["dialog"]["context"].update({"bos-token": 999999, "eos-token": 128009}))
    assert _codes(check_bundle(b, BOARD)) == ["bos_unknown"]
    # a tokenizer that adds no BOS (Qwen's bos_token null) beside a bos-token: Genie adds it to every query
    _cfg(b, lambda c: c["dialog"]["context"].update({"bos-token": 128000, "eos-token": [128009, 128001]}))
    tc = json.loads((b / "tokenizer_config.json").read_text())
    (b / "tokenizer_config.json").write_text(json.dumps({**tc, "bos_token": None}))
    found = check_bundle(b, BOARD)
    assert [(f.code, f.severity) for f in found if f.severity != "error"] == [
        ("bos_not_the_tokenizers", "warning")
    ]
    # a tokenizer that names its BOS but does not add it (add_bos_token false): the same warning; with bos-token
    # -1 no "bos_disabled", since -1 is what HexStudio writes for it
    (b / "tokenizer_config.json").write_text(json.dumps({**tc, "add_bos_token": False}))
    assert [f.code for f in check_bundle(b, BOARD)] == ["bos_not_the_tokenizers"]
    _cfg(b, lambda c: c["dialog"]["context"].update({"bos-token": -1}))
    assert [f.code for f in check_bundle(b, BOARD)] == []
    (b / "tokenizer_config.json").write_text(json.dumps(tc))
    assert [f.code for f in check_bundle(b, BOARD)] == ["bos_disabled"]


def test_ctx_bins_present_and_named_consistently(tmp_path: Path) -> None:
    b = gbx.write_bundle(tmp_path / "b")
    (b / f"{gbx.MODEL_ID}_part_2_of_3.bin").unlink()
    f = next(f for f in check_bundle(b, BOARD) if f.code == "ctx_bin_missing")
    assert f.genie_error and f.genie_error.startswith(
        f"NSPModel: Can't access model file : {gbx.MODEL_ID}_part_2_of_3"
    )
    b2 = gbx.write_bundle(tmp_path / "b2")
    _cfg(b2, lambda c: c["dialog"]["engine"]["model"]["binary"]["ctx-bins"].pop(1))
    assert "ctx_bin_names" in _codes(check_bundle(b2, BOARD))


# -- push and doctor ------------------------------------------------------------------------------------
def test_push_to_a_real_board_refuses_a_bundle_with_errors(tmp_path: Path) -> None:
    import asyncio

    from hexstudio.core.device.board import BoardError
    from hexstudio.core.device.push import push_bundle

    b = gbx.write_bundle(tmp_path / "b")
    _cfg(b, _no_backend_version)
    gb.write_manifest(
        b,
        {
            "model": "m",
            "simulated": False,
            "emulated": False,
            "device": {"name": "Dragonwing IQ-9075 EVK", "dsp_arch": "v73", "soc_model": 77},
        },
    )

    class _Board:  # a real board nothing may be sent to
        simulated, name = False, "evk"
        config: ClassVar[dict[str, Any]] = {}

        @property
        def transport(self) -> Any:
            raise AssertionError("nothing may be sent")

    facts = {**BOARD, "mem_total_bytes": 16 << 30, "mem_available_bytes": 12 << 30}
    with pytest.raises(BoardError) as ei:
        asyncio.run(push_bundle(_Board(), b, "b", facts=facts))  # type: ignore[arg-type]
    assert "Missing backend field: version" in ei.value.message and "bundle check" in (ei.value.hint or "")


def test_the_doctor_reports_the_contract_of_a_bundle(tmp_path: Path) -> None:
    from hexstudio.core.device.doctor import FAIL, OK, contract_check

    assert contract_check(FIXTURE, BOARD).status == OK
    b = gbx.write_bundle(tmp_path / "b")
    _meta(b, _untied_kv)
    c = contract_check(b, BOARD)
    assert c.status == FAIL and "Non-identical quantization" in c.evidence[0].output


# -- the error decoder knows every contract error ---------------------------------------------------------
@pytest.mark.parametrize(
    "text,rule",
    [
        ("Missing backend field: version\nFailed to create the dialog config.", "genie_config_missing_key"),
        ("Unknown QnnHtp config key: foo\nFailed to create the dialog config.", "genie_config_unknown_key"),
        ("Invalid context config: bos-token is not numeric", "genie_config_bad_value"),
        ("Invalid dialog config: unsupported version: 2", "genie_config_bad_value"),
        ("Rope type not supportedyarn", "genie_rope_type"),
        ("Specify one config from rope-theta and positional-encoding", "genie_rope_conflict"),
        (
            "Tensor not found: position_ids_sin\nError : Could not find I/O tensors in loaded graphs. ",
            "genie_tensor_not_found_rope",
        ),
        (
            "Tensor not found: attention_mask\nError : Could not find I/O tensors in loaded graphs. ",
            "genie_tensor_not_found",
        ),
        (
            '[ERROR] "Model Validation Errors found"\n[ERROR] "token_ar1_cl4096_2_of_3 : past_key_3_in - Non-identical '
            'quantization parameters found for the same tensor"\nError validating model. Please check your I/O. Error '
            "validating HTP models",
            "genie_nonidentical_quant",
        ),
        (
            "Failure to initialize model. Config specifies context->size=8192, but loaded max-CL=4096",
            "genie_context_size",
        ),
        ("NSPModel: Can't access model file : m_part_2_of_3.bin", "genie_model_file"),
        ("QnnDevice_create failed: 4000 (QNN_BACKEND_CANNOT_INITIALIZE)", "qnn_backend_4000"),
        ("Failed to free device: 14003\ncontext error 1007", "qnn_1007_oom"),
        ("Failed to free device: 14003", "free_device_14003"),
        ("QnnBackend_create error 1009", "qnn_1009_loading_binaries"),
        ("Unable to find a valid interface.", "qnn_interface"),
        ("remote_handle64_open failed 0x80000416", "fastrpc_0x80000416"),
        (
            "export ADSP_LIBRARY_PATH=/opt/qairt/2.42/lib/hexagon-v73/unsigned:/usr/lib/rfsa/adsp",
            "adsp_path_colon",
        ),
    ],
)
def test_explain_decodes_every_contract_error(text: str, rule: str) -> None:
    from hexstudio.core.device.explain import explain

    ms = explain(text)
    assert rule in [m.id for m in ms], [m.id for m in ms]
    m = next(m for m in ms if m.id == rule)
    assert m.cause and m.fix and m.severity == "error"


def test_explain_cli_on_genies_output(tmp_path: Path) -> None:
    out = _hexstudio("explain", "Missing backend field: version")
    assert out.returncode == 0 and "version" in out.stdout and "bundle check" in out.stdout
    assert copy.deepcopy(gs.CONFIG_FAILED) == "Failed to create the dialog config."


def test_a_simulation_bundle_is_read_from_its_simulated_context_binaries(tmp_path: Path) -> None:
    """LEAD's simulated context binaries (JSON documents named <model>_part_i_of_n.bin) carry the graph specs."""
    from hexstudio.shared.bundle.check import graphs_from_metadata

    b = gbx.write_bundle(tmp_path / "b")
    (b / "metadata.yaml").unlink()
    graphs = graphs_from_metadata({"components": gbx.graph_specs()}, 4096)
    for i in (1, 2, 3):
        part = [
            {"name": n, "onnx": f"sim/{n}.onnx", **spec}
            for n, spec in graphs.items()
            if n.endswith(f"_{i}_of_3")
        ]
        (b / f"{gbx.MODEL_ID}_part_{i}_of_3.bin").write_text(
            json.dumps(
                {
                    "format": "hexstudio-simulated-context-binary",
                    "version": 1,
                    "simulated": True,
                    "graphs": part,
                }
            )
        )
    gb.write_manifest(b, {"model": "m", "simulated": True})
    found = check_bundle(b, None)
    assert errors(found) == [] and "graphs_unchecked" not in [f.code for f in found]
    part3 = json.loads((b / f"{gbx.MODEL_ID}_part_3_of_3.bin").read_text())
    part3["graphs"][1]["inputs"]["past_key_9_in"]["quantization_parameters"]["offset"] = -100
    (b / f"{gbx.MODEL_ID}_part_3_of_3.bin").write_text(json.dumps(part3))
    assert "graph_non_identical_quant" in _codes(check_bundle(b, None))


def test_the_checker_reads_the_files_the_config_names(tmp_path: Path) -> None:
    """extensions and tokenizer.path are read where genie_config.json points, as Genie reads them (not by the
    conventional names): a board-specific extension file with the wrong SoC is found; renamed files are no gap."""
    b = gbx.write_bundle(tmp_path / "b")
    (b / "htp_backend_ext_config.json").rename(b / "board_ext.json")
    (b / "tokenizer.json").rename(b / "tok.json")

    def point(c: dict[str, Any]) -> None:
        c["dialog"]["engine"]["backend"]["extensions"] = "board_ext.json"
        c["dialog"]["tokenizer"]["path"] = "tok.json"

    _cfg(b, point)
    found = check_bundle(b, BOARD)
    assert errors(found) == [] and not any(f.code in ("htp_ext", "tokens_unchecked") for f in found), _codes(
        found
    )
    ext = json.loads((b / "board_ext.json").read_text())
    ext["devices"][0]["soc_model"] = 43
    (b / "board_ext.json").write_text(json.dumps(ext))
    assert "soc_model" in _codes(check_bundle(b, BOARD))


def test_bundle_config_names_the_binaries_as_the_compile_writes_them(tmp_path: Path) -> None:
    """`bundle config` named parts `_part_1_of_12` where the compile writes `_part_01_of_12` (zero-padded, so
    Genie orders them by name): a genie_config.json corrected from its output, as the check's fixes suggest,
    named files no bundle holds."""
    from hexstudio.shared import bundle as gb
    from tests.support.configs import LLAMA_31_8B

    (tmp_path / "config.json").write_text(json.dumps(LLAMA_31_8B))
    out = _hexstudio(
        "bundle", "config", "--model", str(tmp_path), "--context-length", "4096", "--parts", "12"
    )
    assert out.returncode == 0, out.stderr
    bins = json.loads(out.stdout)["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
    assert bins[0].endswith("_part_01_of_12.bin") and bins[-1].endswith("_part_12_of_12.bin"), bins
    assert gb.ctx_bin_name("m", 3, 12) == f"m_part_{gb.part_label(3, 12)}.bin"
