"""The registry of run settings (hexstudio/shared/run_settings.py) and everything derived from it: `--set`
and `hexstudio run --help`, the studio's field lists, each stage's inputs, the workers' defaults, the docs,
the one "auto" rule; the typed stage documents (hexstudio/shared/artifacts.py); gates that read outputs."""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from hexstudio.shared import modelinfo
from hexstudio.shared import run_settings as rs
from hexstudio.shared.data import builtin_model_dir
from hexstudio.shared.run_settings import RunSettings, setting
from tests.support.configs import LLAMA_31_8B

ROOT = Path(__file__).resolve().parents[2]
BUILTIN_DIR = builtin_model_dir()

# What a new run got before the registry (hexstudio/core/settings.py's table): unchanged, so runs and resumes are too.
OLD_DEFAULTS: dict[str, Any] = {
    "context_length": "auto",
    "ar_n": 128,
    "parts": "auto",
    "calibration_samples": 8,
    "calibration_seq_len": 128,
    "calibration_text": "builtin",
    "calibration_unit": "layer",
    "validation_text": "builtin",
    "weight_bits": 4,
    "activation_bits": 16,
    "kv_bits": 8,
    "device": "Dragonwing IQ-9075 EVK",
    "qairt_version": "2.42",
    "compile_target": "auto",
    "aihub_consent": False,
    "benchmark_prompt": "What is the capital of France?",
    "sampler": {"seed": 42, "temp": 0.0, "top_k": 1, "top_p": 1.0},
    "thresholds": {},
    "override_gates": [],
    # added since (issue 29): a run without it hashes as before (hexstudio.core.pipeline.HASHED_WHEN_SET)
    "speculative_dialogs": "none",
}
# Each stage's inputs before the registry: the same names keep every completed stage's input hash.
OLD_INPUTS: dict[str, set[str]] = {
    "model": {
        "model",
        "revision",
        "context_length",
        "ar_n",
        "parts",
        "context_lengths",
        "ar_sizes",
        "calibration_unit",
        "board_ram_bytes",  # added since (hashed only when set: HASHED_WHEN_CHANGED)
    },  # added since (calibration_unit: hashed only when not "layer", HASHED_WHEN_CHANGED)
    "preflight": {
        "context_length",
        "calibration_samples",
        "calibration_seq_len",
        "workspace",
        "context_lengths",
        "ar_sizes",
        "calibration_unit",
        "worker_host",  # added since (hashed only when set: HASHED_WHEN_CHANGED)
        "board_ram_bytes",  # the same
        "compile_target",  # added since (hashed only when not "auto": HASHED_WHEN_CHANGED)
    },
    "quantize": {
        "context_length",
        "ar_n",
        "parts",
        "calibration_samples",
        "calibration_seq_len",
        "calibration_text",
        "calibration_unit",
        "weight_bits",
        "activation_bits",
        "kv_bits",
        "device",
        "context_lengths",
        "quantsim_config",
        "ar_sizes",
    },  # added since: HASHED_WHEN_SET
    "validate": {"validation_text", "thresholds"},
    "compile": {
        "board",
        "device",
        "qairt_version",
        "aihub_consent",
        "compile_target",
        "speculative_dialogs",
        "spd_draft",
        "spd_draft_len",  # added since: HASHED_WHEN_SET
        "lade_window",
        "lade_ngram",
        "lade_gcap",
        "aihub_compile_options",  # added since: HASHED_WHEN_SET
    },
    "board": {"board"},
    "chat": {"board", "benchmark_prompt", "sampler", "prompt_template", "runtime", "benchmark_max_tokens"},
    "evaluate": {"board", "eval_suites", "eval_legs", "prompt_template", "runtime", "dialog_type"},
    "report": set(),
}


def fake_run(settings: dict[str, Any], board: str = "sim") -> Any:
    """What input_hash reads of a run: its settings, inputs, stage records (none) and folder (no workspace suites)."""
    from types import SimpleNamespace

    return SimpleNamespace(
        settings=settings,
        inputs={"model": "builtin:tiny-llama", "board": board},
        stage=lambda n: SimpleNamespace(data={}),
        run_dir=Path("/nonexistent-workspace/runs/r"),
    )


def test_defaults_and_stage_inputs_are_what_they_were() -> None:
    from hexstudio.core.settings import DEFAULT_RUN_SETTINGS
    from hexstudio.core.stages import STAGES

    assert DEFAULT_RUN_SETTINGS == OLD_DEFAULTS
    assert {s.name: set(s.inputs) for s in STAGES} == OLD_INPUTS
    for s in STAGES:  # every run setting a stage depends on comes from the registry's `stages=`
        assert set(rs.read_by(s.name)) <= set(s.inputs)
        assert set(s.inputs) - set(rs.read_by(s.name)) <= {"model", "board", "workspace"}
    assert not hasattr(STAGES[0], "produces")


@pytest.mark.parametrize(
    ("stage", "key", "changed"),
    [
        ("chat", "runtime", "geniex"),
        ("chat", "prompt_template", "qa"),
        ("chat", "benchmark_max_tokens", 64),
        ("model", "board_ram_bytes", 8 * 2**30),
        ("preflight", "board_ram_bytes", 8 * 2**30),
    ],
)
def test_a_setting_a_stage_read_undeclared_is_its_input_and_old_runs_stay_current(
    stage: str, key: str, changed: Any
) -> None:
    """Settings a stage read without declaring them: the Chat stage formats its prompt, picks its runtime and reply
    length, and the "auto" parts rule reads the board's RAM. A change re-ran nothing (`--resume --set runtime=geniex` kept
    the Chat result measured on genie). A run that leaves the setting at what the stage assumed keeps the stage
    current; a run that sets another value runs it again."""

    from hexstudio.core.stage_state import input_hash
    from hexstudio.core.stages import STAGES

    m = fake_run(dict(OLD_DEFAULTS))
    st = next(x for x in STAGES if x.name == stage)
    assert key in st.inputs
    before = dataclasses.replace(st, inputs=tuple(k for k in st.inputs if k != key))
    assert input_hash(m, st) == input_hash(m, before)  # type: ignore[arg-type]
    m.settings = {**OLD_DEFAULTS, key: changed}
    assert input_hash(m, st) != input_hash(m, before)  # type: ignore[arg-type]


def test_calibration_unit_made_an_input_of_model_and_preflight_keeps_old_runs_current() -> None:
    """The Model stage's estimate now depends on calibration_unit: a run made before, at "layer", keeps its
    Model and Preflight stages current (re-running the Model stage would make Quantize stale: hours)."""

    from hexstudio.core.stage_state import input_hash
    from hexstudio.core.stages import STAGES

    m = fake_run(dict(OLD_DEFAULTS))
    for name in ("model", "preflight"):
        s = next(x for x in STAGES if x.name == name)
        before = dataclasses.replace(s, inputs=tuple(k for k in s.inputs if k != "calibration_unit"))
        assert input_hash(m, s) == input_hash(m, before), name  # type: ignore[arg-type]
        m.settings = {**OLD_DEFAULTS, "calibration_unit": "part"}
        assert input_hash(m, s) != input_hash(m, before), name  # type: ignore[arg-type]
        m.settings = dict(OLD_DEFAULTS)


def test_a_run_from_before_the_speculative_settings_keeps_its_stages_current() -> None:

    from hexstudio.core.stage_state import HASHED_WHEN_SET, input_hash
    from hexstudio.core.stages import STAGES

    old = {k: v for k, v in OLD_DEFAULTS.items() if k not in HASHED_WHEN_SET}
    m = fake_run(old)
    for s in STAGES:
        narrowed = dataclasses.replace(s, inputs=tuple(k for k in s.inputs if k not in HASHED_WHEN_SET))
        assert input_hash(m, s) == input_hash(m, narrowed), s.name  # type: ignore[arg-type]
    m.settings = {**old, "speculative_dialogs": "spd"}  # a run that sets one hashes it
    compile_ = next(s for s in STAGES if s.name == "compile")
    assert input_hash(m, compile_) != input_hash(
        m, dataclasses.replace(compile_, inputs=tuple(k for k in compile_.inputs if k not in HASHED_WHEN_SET))
    )  # type: ignore[arg-type]


def test_every_setting_is_fully_declared() -> None:
    from hexstudio.core.stages import STAGE_NAMES

    for s in rs.SETTINGS.values():
        assert s.label and s.help.strip(), s.name
        assert set(s.stages) <= set(STAGE_NAMES), s.name
        assert s.page is None or s.page in STAGE_NAMES, s.name
        assert rs.check(s.name, s.default) is None, f"{s.name}'s own default is refused"
        if s.range is not None:
            assert s.kind in ("int", "float") and s.range[0] <= s.range[1]
    # the typed defaults the workers read are the registry's
    assert dataclasses.asdict(rs.DEFAULTS) == {n: s.default for n, s in rs.SETTINGS.items()}


def test_the_docs_table_is_the_registry() -> None:
    text = (ROOT / "docs" / "settings.md").read_text(encoding="utf-8")
    assert rs.markdown_table() in text, (
        "docs/settings.md is not the registry's table; regenerate it: .venv/bin/python -c \"from "
        'hexstudio.shared.run_settings import markdown_table; print(markdown_table())" and paste it between the '
        "markers"
    )


def test_more_context_lengths_are_checked_when_set() -> None:
    assert rs.check("context_lengths", "1024, 2048") is None and rs.check("context_lengths", "") is None
    assert "multiple of 32" in str(rs.check("context_lengths", "1000"))
    assert "whole number" in str(rs.check("context_lengths", "1k"))
    assert rs.extra_context_lengths("2048,1024,1024") == [1024, 2048]
    with pytest.raises(ValueError, match="below context_length 512"):
        rs.extra_context_lengths("512", 512, 128)
    with pytest.raises(ValueError, match="exceed ar_n"):
        rs.extra_context_lengths("128", 512, 128)
    with pytest.raises(ValueError, match="twice ar_n 32"):  # Genie 1.21 answers wrong at CL = 2 x AR
        rs.extra_context_lengths("64", 256, 32)
    # as context_length itself: 544 with AR-128 would leave 416 past slots, no whole number of blocks
    with pytest.raises(ValueError, match=r"544 is not a multiple of ar_n 128.*Use 512 or 640"):
        rs.extra_context_lengths("544", 1024, 128)
    assert rs.extra_context_lengths("544", 1024, 32) == [544]
    with pytest.raises(ValueError, match=r"Use 256\.$"):  # 128 is no context length beside AR-128
        rs.extra_context_lengths("160", 1024, 128)
    assert rs.genie_cl_problem(512, 128) is None and rs.genie_cl_problem(256, 128)


def test_check_messages_name_the_setting_the_value_and_what_it_takes() -> None:
    assert rs.check("parts", None) == 'parts must be a whole number or "auto", not null.'
    assert rs.check("ar_n", "128") == "ar_n must be a whole number, not '128' (text)."
    assert (
        rs.check("sampler", {"seed": 2**33}) == "sampler.seed 8589934592 is out of range (0 to 4294967295)."
    )
    assert (
        rs.check("eval_legs", ["board", "gpu"]) == 'eval_legs: "gpu" is not one of "float", "sim", "board".'
    )
    assert rs.check("override_gates", [1]) == "override_gates must be a list of stage names."
    assert rs.check("revision", None) is None and rs.check("board_ram_bytes", None) is None  # optional: unset
    assert rs.check("aihub_poll_interval_s", 0.05) is None
    assert rs.check("a_test_hook", object()) is None  # not a run setting: not checked here (--set refuses it)
    assert rs.check_all({"ar_n": 0, "kv_bits": 4, "weight_bits": 4}) == [
        "ar_n 0 is out of range (1 to 4096).",
        "kv_bits 4 is not one of 8, 16.",
    ]


def _run_parser() -> argparse.ArgumentParser:
    from hexstudio.cli import run_cmd

    top = argparse.ArgumentParser(prog="hexstudio")
    sub = top.add_subparsers()
    run_cmd.register(sub)
    parser: argparse.ArgumentParser = sub.choices["run"]
    return parser


def test_set_refuses_a_name_that_is_not_a_run_setting() -> None:
    from hexstudio.cli.common import CliError
    from hexstudio.cli.run_cmd import _parse_set

    with pytest.raises(CliError) as e:
        _parse_set(["calibraton_samples=4"])
    assert "calibraton_samples is not a run setting" in e.value.message
    assert "Did you mean calibration_samples?" in (e.value.hint or "")
    assert _parse_set(
        ["qairt_version=2.42", 'sampler={"temp": 0.5}', "revision=v1.0", "board_ram_bytes=null"]
    ) == {"qairt_version": "2.42", "sampler": {"temp": 0.5}, "revision": "v1.0", "board_ram_bytes": None}


def test_the_field_lists_are_the_pages_fields() -> None:
    """The Qt-free field lists the stage pages build their forms from (hexstudio.ui.pages.base.SettingSpec rows)."""
    from hexstudio.core.settings import form_fields, settings_fields
    from hexstudio.shared.bundle import KNOWN_DEVICES

    assert settings_fields("quantize") == (
        ("calibration_samples", "Calibration samples", "int"),
        ("calibration_seq_len", "Calibration sequence length", "int"),
    )
    assert settings_fields("compile") == (
        ("compile_target", "Target", ["auto", "local", "aihub", "sim"]),
        ("device", "Device", list(KNOWN_DEVICES)),
        ("qairt_version", "QAIRT version", "text"),
        ("aihub_consent", "I agree to upload model-derived files to Qualcomm AI Hub", "bool"),
        ("speculative_dialogs", "Speculative dialogs", ["none", "lade", "spd", "lade,spd"]),
    )
    (samples, _) = form_fields("quantize")
    assert (samples.widget, samples.unit, samples.minimum, samples.maximum) == ("spin", "samples", 1, 100000)
    assert samples.help and form_fields("report") == ()
    assert next(iter(KNOWN_DEVICES)) == rs.DEFAULT_DEVICE  # the offline list shows the default device first


def test_a_new_setting_is_added_in_one_place(monkeypatch: pytest.MonkeyPatch) -> None:
    """Acceptance (issue 21): one field in the registry, and the CLI (--set, --help), the studio's field list,
    the docs, the stage's inputs and new runs all have it."""

    @dataclasses.dataclass
    class WithNewSetting(RunSettings):
        quantize_threads: int = setting(
            4,
            label="Quantize threads",
            unit="threads",
            range=(1, 64),
            stages=("quantize",),
            page="quantize",
            help="CPU threads the quantizer uses.",
        )

    monkeypatch.setattr(rs, "SETTINGS", rs._specs_of(WithNewSetting))
    from hexstudio.cli.common import CliError
    from hexstudio.cli.run_cmd import _parse_set
    from hexstudio.core.settings import form_fields, settings_fields

    # the CLI: --set reads and checks it, --help lists it with its range, unit, default and help
    assert _parse_set(["quantize_threads=8"]) == {"quantize_threads": 8}
    with pytest.raises(CliError, match=r"quantize_threads 99 is out of range \(1 to 64\)"):
        _parse_set(["quantize_threads=99"])
    help_text = _run_parser().format_help()
    assert "quantize_threads = 4    a whole number 1 to 64 (threads)" in help_text
    assert "CPU threads the quantizer uses. Stages: quantize." in help_text
    # the studio: the Quantize page's form gets a spin box with its label, range, unit and tooltip
    assert ("quantize_threads", "Quantize threads", "int") in settings_fields("quantize")
    f = next(f for f in form_fields("quantize") if f.key == "quantize_threads")
    assert (f.widget, f.minimum, f.maximum, f.unit, f.help) == (
        "spin",
        1,
        64,
        "threads",
        "CPU threads the quantizer uses.",
    )
    # the docs table, the stage's inputs (the resume hash) and the settings of a new run
    assert (
        "| `quantize_threads` | a whole number 1 to 64 (threads) | `4` | quantize | quantize page |"
        in rs.markdown_table()
    )
    assert "quantize_threads" in rs.read_by("quantize")
    assert rs.default_run_settings()["quantize_threads"] == 4


def test_help_lists_every_run_setting() -> None:
    help_text = _run_parser().format_help()
    for name in rs.SETTINGS:
        assert f"  {name} = " in help_text, name


# -- the one "auto" rule -----------------------------------------------------------------------------------------


def _big_info() -> dict[str, Any]:
    return modelinfo.inspect_config({**LLAMA_31_8B, "torch_dtype": "bfloat16"})


def test_resolve_settings_is_the_rule_for_auto() -> None:
    tiny = modelinfo.inspect_folder(BUILTIN_DIR)
    r, plan = rs.resolve_settings(tiny, rs.default_run_settings(), builtin=True)
    assert r == {
        "context_length": 512,
        "ar_n": 128,
        "parts": 2,
        "calibration_samples": 8,
        "calibration_seq_len": 128,
    }
    assert plan["parts"] == 2
    big = _big_info()
    r, plan = rs.resolve_settings(big, {"context_length": "auto", "parts": "auto"}, builtin=False)
    assert (
        r["context_length"] == 4096 and r["parts"] == plan["parts"] == modelinfo.part_plan(big, 4096)["parts"]
    )
    r, plan = rs.resolve_settings(big, {"context_length": 2048, "parts": 7, "ar_n": 64}, builtin=False)
    assert (r["context_length"], r["parts"], r["ar_n"]) == (2048, 7, 64)
    # the board's RAM, when set, shapes the plan
    small_board = rs.resolve_settings(big, {"board_ram_bytes": 8 * 1024**3}, builtin=False)[0]["parts"]
    assert small_board > modelinfo.part_plan(big, 4096)["parts"]


def test_auto_context_keeps_to_the_models_limits_in_whole_blocks() -> None:
    """ "auto" took max_position_embeddings as it was (2000 with AR-128: not a multiple, refused at the Model stage)
    and ignored a shorter sliding window (refused too, "Use at most N", though nobody had set a length)."""
    big = _big_info()
    for limits, want in (
        ({"max_position_embeddings": 2000}, 1920),
        ({"sliding_window": 2048}, 2048),
        ({"max_position_embeddings": 3000, "sliding_window": 2500}, 2432),
    ):
        r, _ = rs.resolve_settings({**big, **limits}, {"context_length": "auto"}, builtin=False)
        assert r["context_length"] == want, (limits, r)
        assert modelinfo.check_context({**big, **limits}, r["context_length"], r["ar_n"]) is None


def test_an_auto_context_of_twice_ar_n_is_refused_before_quantize() -> None:
    """The built-in model's auto context (512) with ar_n 256 passed Model and Preflight, and Quantize refused it."""
    from hexstudio.core.services import ServiceError
    from hexstudio.core.services import model as model_service

    with pytest.raises(ServiceError, match="twice ar_n 256"):
        model_service.inspect("builtin:tiny-llama", None, 256, None)


def test_preflight_and_model_inspect_resolve_as_the_model_stage(monkeypatch: pytest.MonkeyPatch) -> None:
    from hexstudio.core.services import model as model_service
    from hexstudio.core.services import preflight as preflight_service

    big = _big_info()
    monkeypatch.setattr(model_service, "model_config", lambda model, revision=None: {"fake": model})
    monkeypatch.setattr(modelinfo, "inspect_config", lambda cfg: big)
    for ctx, parts in ((None, None), (2048, None), (None, 9)):
        want, _ = rs.resolve_settings(
            big, {"context_length": ctx or "auto", "parts": parts or "auto"}, builtin=False
        )
        out = model_service.inspect("meta-llama/Llama-3.1-8B", ctx, None, parts)
        assert (out["context_length"], out["ar_n"], out["parts"]) == (
            want["context_length"],
            want["ar_n"],
            want["parts"],
        )
        pre = preflight_service.resolve_estimate_settings(
            big,
            "meta-llama/Llama-3.1-8B",
            {**rs.default_run_settings(), "context_length": ctx or "auto", "parts": parts or "auto"},
        )
        assert pre == want


def test_model_json_is_a_model_doc(tmp_path: Path) -> None:
    """The real Model stage on the built-in model: model.json has ModelDoc's keys and the resolved shape."""
    from hexstudio.shared.artifacts import ModelDoc, load_json, required_keys
    from tests.support.runs import run_stages

    m, res = run_stages(tmp_path / "ws", ("model",))
    assert res.ok, res.message
    doc = load_json(m.run_dir / "artifacts" / "model" / "model.json", ModelDoc)
    assert set(doc) == required_keys(ModelDoc)
    assert doc["resolved"] == {"context_length": 512, "ar_n": 128, "parts": 2}


# -- gates read the declared outputs --------------------------------------------------------------------------------


def test_a_gate_fails_a_done_stage_without_its_declared_output(tmp_path: Path) -> None:
    from hexstudio.core.runs import Workspace
    from hexstudio.core.stages import get_stage

    m = Workspace(tmp_path / "ws").create_run("builtin:tiny-llama", "sim")
    st = m.stage("model").data
    st["state"] = "done"
    st["artifacts"] = [{"path": "artifacts/model/other.json", "sha256": "0" * 64, "size": 1}]
    g = get_stage("model").gate(m)
    assert not g.passed and "model completed without writing model.json" in g.reason
    st["artifacts"].append({"path": "artifacts/model/model.json", "sha256": "0" * 64, "size": 1})
    assert get_stage("model").gate(m).passed
    v = m.stage("validate").data
    v.update(state="done", artifacts=[], metrics={})
    assert "without writing validation.json" in get_stage("validate").gate(m).reason


# -- light ---------------------------------------------------------------------------------------------------------


def test_the_shared_package_is_light() -> None:
    """hexstudio.shared is imported by the studio at start-up and by every worker: no heavy ML, no Qt, no studio."""
    code = (
        "import sys, json, hexstudio.shared.run_settings, hexstudio.shared.artifacts; "
        "print(json.dumps(sorted(m for m in ('torch', 'onnx', 'onnxruntime', 'transformers', 'aimet_onnx', "
        "'numpy', 'PySide6', 'hexstudio.core', 'hexstudio.ui', 'hexstudio.cli', 'hexstudio.serve') "
        "if m in sys.modules)))"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    assert json.loads(out.stdout) == []


def test_ai_hub_compile_options_make_the_compile_out_of_date() -> None:
    """aihub_compile_options change the binaries AI Hub compiles, but were no input of the Compile stage: a run
    whose options changed kept its old binaries as current. A run that never set them hashes as before."""

    from hexstudio.core.stage_state import input_hash
    from hexstudio.core.stages import STAGES

    compile_stage = next(x for x in STAGES if x.name == "compile")
    before = dataclasses.replace(
        compile_stage, inputs=tuple(k for k in compile_stage.inputs if k != "aihub_compile_options")
    )
    m = fake_run(dict(OLD_DEFAULTS), board="evk")
    assert input_hash(m, compile_stage) == input_hash(m, before)  # type: ignore[arg-type]
    m.settings = {**OLD_DEFAULTS, "aihub_compile_options": "--quantize_full_type w8a16"}
    assert input_hash(m, compile_stage) != input_hash(m, before)  # type: ignore[arg-type]


# Settings that say how a stage works, not what it produces: its results are the same whatever they are, so they
# are no stage's input (a change runs nothing again)
HOW_NOT_WHAT = {
    "aimet_smoke": "whether Preflight also runs a small AIMET quantization: a check, not an estimate",
    "aihub_compact_upload": "the form of the upload to AI Hub; Quantize only reports its size",
    "validate_unit": "how much Validate holds in memory at once; the scores are the same",
    "aihub_api_url": "where AI Hub is reached",
    "aihub_web_url": "the job links shown",
    "aihub_http_retries": "how the client retries",
    "aihub_http_backoff_s": "how the client retries",
    "aihub_link_mbps": "the upload estimate shown",
    "aihub_model_name": "the model's name on AI Hub",
    "aihub_poll_interval_s": "how often the job is asked about",
}
STAGE_CODE = {
    "model": ["hexstudio/workers/model.py"],
    "preflight": ["hexstudio/workers/preflight.py"],
    "quantize": [
        "hexstudio/workers/quantize.py",
        "hexstudio/workers/quant/*.py",
        "hexstudio/workers/export/*.py",
    ],
    "validate": ["hexstudio/workers/validate.py"],
    "compile": [
        "hexstudio/workers/compile.py",
        "hexstudio/workers/aihub.py",
        "hexstudio/workers/genie_config.py",
        "hexstudio/workers/qnn/*.py",
    ],
    "board": ["hexstudio/core/device/stage.py"],
    "chat": ["hexstudio/core/genie/stage.py"],
    "evaluate": ["hexstudio/core/eval/stage.py", "hexstudio/workers/evaluate.py"],
}


def test_every_setting_a_stages_code_reads_is_its_input() -> None:
    """`hexstudio run --resume --set K=V` runs again the stages whose inputs hold K. The Chat stage read
    prompt_template, runtime and benchmark_max_tokens without declaring them, and Compile the sampler: a change
    re-ran nothing. Every run setting a stage's own files read by name (settings.K, settings.get("K"),
    settings["K"]) is one of its inputs, or says how the stage works (HOW_NOT_WHAT, with why). Reads through
    shared helpers (resolve_settings reads board_ram_bytes) and aliases are not seen here: those helpers' settings
    are declared by hand (test_a_setting_a_stage_read_undeclared_is_its_input_and_old_runs_stay_current)."""
    import re

    from hexstudio.core.stages import STAGES

    root = Path(__file__).resolve().parents[2]
    for stage, patterns in STAGE_CODE.items():
        text = "\n".join(p.read_text() for pat in patterns for p in sorted(root.glob(pat)))
        assert text, stage
        read = {
            name
            for name in rs.SETTINGS
            if re.search(rf'settings\.{name}\b|settings\.get\("{name}"|settings\["{name}"\]', text)
        }
        inputs = set(next(s for s in STAGES if s.name == stage).inputs)
        assert read - inputs <= set(HOW_NOT_WHAT), (stage, sorted(read - inputs - set(HOW_NOT_WHAT)))


def test_a_combination_is_judged_with_the_settings_on_disk(tmp_path: Path) -> None:
    """The studio held run R; `run --resume R --set context_length=1024` changed it since. The studio's change
    of ar_n to 1024 was judged with its old context_length (4096) and accepted: a pair Compile refuses hours
    later (context_length must be larger than AR-N)."""
    import pytest

    from hexstudio.core.runs import Workspace, change_settings
    from hexstudio.shared.run_settings import BadSettings

    ws = Workspace(tmp_path / "ws")
    studio = ws.create_run("builtin:tiny-llama", "sim", {"context_length": 4096, "ar_n": 128})
    terminal = ws.open_run(studio.run_id)
    change_settings(terminal, {"context_length": 1024}, "test")
    with pytest.raises(BadSettings, match="must be larger than AR-N 1024"):
        change_settings(studio, {"ar_n": 1024}, "test")
    assert ws.open_run(studio.run_id).settings["ar_n"] == 128  # nothing changed
