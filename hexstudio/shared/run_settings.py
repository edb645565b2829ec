"""The run settings, declared once: a typed dataclass whose fields say everything about each setting.

A run setting is one key of a run's `settings` (run.json): it is set with `hexstudio run --set KEY=VALUE`,
on a stage page of the studio, or in the studio's `run_defaults`. Each field of `RunSettings` below is the
one declaration of a setting: its type (the annotation), default, range or choices, unit, label, help, the
stages whose results depend on it, and where the studio shows it. Everything else is derived from here:

- `check()` / `check_all()`: what the CLI's `--set`, `Workspace.create_run` and the studio refuse;
- `parse_cli_value()` and `cli_help()`: `hexstudio run --set` and its `--help`;
- `read_by(stage)`: the run settings in a stage's `inputs` (hexstudio/core/stages.py, the resume hash);
- `typed_settings()` / `run_settings_of()`: run.json's settings as a RunSettings, defaults filled in (a worker's
  `spec.settings`, hexstudio/shared/worker_spec.py); `DEFAULTS` is every default;
- `form_fields(page)`: the fields a stage page of the studio shows (hexstudio/core/settings.py adds the
  device list);
- `markdown_table()`: docs/settings.md (a test keeps the file equal to it).

Adding a setting is adding one field here (`setting(...)`); the CLI help, the studio's form (with
`page=`), the docs and the stage's inputs (with `stages=`) follow.

"Advanced" settings (operational knobs, test hooks, flags that have their own command-line option) are
written into a run only when set; the others are written into every new run with their default.

`resolve_settings()` is the one "auto" rule for context_length and parts (the Model stage, preflight
and `hexstudio model inspect` all call it).

Light: standard library and hexstudio.shared.modelinfo (pure Python) only.
"""

# ruff: noqa: RUF009  (a `setting(...)` default is `dataclasses.field(...)` with the declaration as its metadata)

from __future__ import annotations

import copy
import dataclasses
import json
import textwrap
import types
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, TypedDict, Union, get_args, get_origin, get_type_hints

from hexstudio.shared import modelinfo
from hexstudio.shared.errors import ActionableError

DEFAULT_DEVICE = "Dragonwing IQ-9075 EVK"  # the device a new run compiles for (the IQ-9075 EVK)
AUTO = "auto"
# "auto" context length: the built-in model's own, and every other model's (the Model stage resolves it)
AUTO_CONTEXT_LENGTH = {"builtin": 512, "other": 4096}

Widget = Literal["spin", "check", "choice", "line", "device"]


def setting(
    default: Any,
    *,
    label: str,
    help: str,
    stages: tuple[str, ...] = (),
    unit: str | None = None,
    range: tuple[float, float] | None = None,
    choices: tuple[Any, ...] | None = None,
    page: str | None = None,
    widget: Widget | None = None,
    advanced: bool = False,
    flag: str | None = None,
    file: bool = False,
    nonempty: bool = False,
    items: str | None = None,
    fields_of: type | None = None,
) -> Any:
    """One run setting's declaration (a dataclass field; its type is the field's annotation).

    label/help/unit: what a person reads (CLI help, studio form, docs). stages: the stages whose results
    depend on it (their `inputs`: a change makes them stale). range: lowest and highest accepted value
    (numbers); choices: the accepted values (for a list: of each item). page: the stage page of the studio
    that shows it (None: not on a form); widget: the form's widget when not the one its type implies.
    advanced: written into a run only when set. flag: the `hexstudio run` option that also sets it. file: the
    value may name a local file, or a bundle folder, whose contents are an input of the stages (a remote worker
    host gets a copy of a file: hexstudio.core.remote.stage.FILE_SETTINGS). nonempty: text that must not be blank.
    items: what the items of a list are, in words. fields_of: the dataclass declaring a JSON object's keys."""
    meta = {
        "label": label,
        "help": help,
        "stages": stages,
        "unit": unit,
        "range": range,
        "choices": choices,
        "page": page,
        "widget": widget,
        "advanced": advanced,
        "flag": flag,
        "file": file,
        "nonempty": nonempty,
        "items": items,
        "fields_of": fields_of,
    }
    if isinstance(default, (dict, list)):
        return field(default_factory=lambda: copy.deepcopy(default), metadata=meta)
    return field(default=default, metadata=meta)


# the Validate stage's thresholds (hexstudio.workers.metrics.DEFAULT_THRESHOLDS and hexstudio.workers.validate.EXPORT_THRESHOLDS;
# tests/core/test_run_settings.py keeps the names equal): what `thresholds` may override
THRESHOLD_NAMES = (
    "top1_agreement",
    "kl_divergence",
    "continuation_kl_divergence",
    "greedy_agreement",
    "perplexity_ratio",
    "salad_score",
    "export_top1_agreement",
    "export_max_logit_error",
    "export_layer_error",
    "htp_logits_argmax_agreement",
    "htp_logits_mean_code_error",
)


@dataclass
class Sampler:
    """Genie's sampler (genie_config.json "sampler"); greedy by default, so replies are reproducible."""

    seed: int = setting(42, label="Seed", help="random seed of the sampler", range=(0, 2**32 - 1))
    temp: float = setting(0.0, label="Temperature", help="0 is greedy", range=(0.0, 100.0))
    top_k: int = setting(1, label="Top-k", help="keep the k most likely tokens", range=(1, 1 << 20))
    top_p: float = setting(
        1.0,
        label="Top-p",
        help="keep the smallest set of tokens whose probability reaches p",
        range=(0.0, 1.0),
    )


@dataclass
class RunSettings:
    """Every run setting. Field order is the order of run.json, the CLI help, the docs and a page's form."""

    # -- the model and its deployment shape ---------------------------------------------------------------
    context_length: int | Literal["auto"] = setting(
        AUTO,
        label="Context length",
        unit="tokens",
        range=(modelinfo.MIN_CONTEXT_LENGTH, 131072),
        stages=("model", "preflight", "quantize"),
        help='The longest sequence the deployed model holds (prompt and reply). "auto": '
        f"{AUTO_CONTEXT_LENGTH['builtin']} for the built-in model, {AUTO_CONTEXT_LENGTH['other']} for others. "
        f"At least {modelinfo.MIN_CONTEXT_LENGTH}: the Validate stage's teacher-forced windows need that room.",
    )
    ar_n: int = setting(
        128,
        label="Prompt processor length (AR-N)",
        unit="tokens",
        range=(1, 4096),
        stages=("model", "quantize"),
        help="Tokens the prompt processor takes per call; the token generator takes one (AR-1).",
    )
    context_lengths: str = setting(
        "",
        label="More context lengths",
        stages=("model", "preflight", "quantize"),
        advanced=True,
        help='Smaller context lengths to put in the bundle beside context_length, comma-separated (e.g. "1024,2048"): '
        "Genie runs the smallest one that holds the dialog and switches up as it grows (shorter attention, "
        "faster tokens early on). Each a multiple of ar_n (and of 32), above ar_n, below context_length.",
    )
    ar_sizes: str = setting(
        "",
        label="More AR sizes",
        stages=("model", "preflight", "quantize"),
        advanced=True,
        help='Smaller prompt-processor lengths to put in the bundle beside ar_n, comma-separated (e.g. "4"): Genie '
        "runs the smallest AR that holds a call, so spd verifies its draft_len+1 tokens on an AR-4 graph instead "
        "of AR-N (and a short prompt runs on a small one). Each between 2 and ar_n; one more graph per part and "
        "context length.",
    )
    parts: int | Literal["auto"] = setting(
        AUTO,
        label="Parts",
        range=(1, 64),
        stages=("model", "quantize"),
        help='How many parts (context binaries) the model is split in. "auto": by model size and, when known, '
        "the board's RAM (the Model stage's part plan).",
    )
    # -- quantization -------------------------------------------------------------------------------------
    calibration_samples: int = setting(
        8,
        label="Calibration samples",
        unit="samples",
        range=(1, 100000),
        stages=("preflight", "quantize"),
        page="quantize",
        help="Text samples run through the model to calibrate the activation encodings.",
    )
    calibration_seq_len: int = setting(
        128,
        label="Calibration sequence length",
        unit="tokens",
        range=(2, 131072),
        stages=("preflight", "quantize"),
        page="quantize",
        help="Tokens per calibration sample.",
    )
    calibration_text: str = setting(
        "builtin",
        label="Calibration text",
        stages=("quantize",),
        file=True,
        help='"builtin" or the path of a UTF-8 text file to calibrate on.',
    )
    calibration_unit: str = setting(
        "layer",
        label="Calibration unit",
        choices=("layer", "part"),
        # the Model stage's memory estimate (model.json), which the Preflight stage checks, depends on it
        stages=("model", "preflight", "quantize"),
        help='"layer": one QuantSim per decoder layer; "part": one per part (about 5x the memory at 8B).',
    )
    validation_text: str = setting(
        "builtin",
        label="Validation text",
        stages=("validate",),
        file=True,
        help='"builtin" or the path of a UTF-8 text file the Validate stage measures perplexity and agreement on.',
    )
    weight_bits: int = setting(
        4,
        label="Weight bits",
        unit="bits",
        # HTP runs int4 and int8 weights; there is no 2-bit weight type for a context binary
        choices=(4, 8),
        stages=("quantize",),
        help="Weight precision (4: int4 blockwise LPBQ, as in Qualcomm's W4A16 recipe; 8: int8 per channel).",
    )
    activation_bits: int = setting(
        16,
        label="Activation bits",
        unit="bits",
        choices=(8, 16),
        stages=("quantize",),
        help="Activation precision.",
    )
    kv_bits: int = setting(
        8,
        label="KV cache bits",
        unit="bits",
        choices=(8, 16),
        stages=("quantize",),
        help="KV cache precision.",
    )
    quantsim_config: str = setting(
        "aimet",
        label="QuantSim configuration",
        choices=("aimet", "llm"),
        stages=("quantize",),
        advanced=True,
        help='AIMET QuantSim\'s rules for the target: "aimet": AIMET\'s stock htp_v<N> configuration; "llm": '
        "HexStudio's LLM configuration after qai-hub-models' (per-channel weights, RMSNorm's included; "
        "data-movement outputs not quantized; Constant outputs not quantized; only Concat's quantizers tied). "
        'docs/quantize.md has both measured on the HTP simulator ("llm" agreed with it slightly less).',
    )
    # -- compile ------------------------------------------------------------------------------------------
    compile_target: str = setting(
        AUTO,
        label="Target",
        choices=("auto", "local", "aihub", "sim"),
        # Preflight checks the local compile's memory and disk where the run compiles on this machine
        stages=("preflight", "compile"),
        page="compile",
        help='"local": QNN 2.51 on this machine (onnxruntime-qnn: no account, no upload) writes real context '
        'binaries; "aihub": compile on Qualcomm AI Hub; "sim": the onnxruntime twin\'s stand-in bundle '
        '(a labeled fallback where onnxruntime-qnn cannot be installed); "auto": local for the simulator '
        "board (sim without onnxruntime-qnn), aihub for a real one.",
    )
    device: str = setting(
        DEFAULT_DEVICE,
        label="Device",
        stages=("quantize", "compile"),
        page="compile",
        widget="device",
        nonempty=True,
        help="The AI Hub device the bundle is compiled for (its Hexagon version also shapes quantization).",
    )
    qairt_version: str = setting(
        "2.42",
        label="QAIRT version",
        stages=("compile",),
        page="compile",
        help="The QAIRT version AI Hub compiles with; the board's runtime must match it.",
    )
    aihub_consent: bool = setting(
        False,
        label="I agree to upload model-derived files to Qualcomm AI Hub",
        stages=("compile",),
        page="compile",
        help="Nothing is uploaded to AI Hub unless this is true.",
    )
    speculative_dialogs: str = setting(
        "none",
        label="Speculative dialogs",
        choices=("none", "lade", "spd", "lade,spd"),
        stages=("compile",),
        page="compile",
        help="Genie dialogs written beside the basic one (genie_config.<type>.json), for Chat, serve and Evaluate to "
        'choose: "lade" (lookahead decoding, no draft model; lade_window, lade_ngram, lade_gcap), "spd" (a '
        "draft model proposes, the model verifies; the draft is the model itself for now). Real bundles only "
        "(compile_target local or aihub).",
    )
    spd_draft: str = setting(
        "self",
        label="spd draft model",
        stages=("compile",),
        advanced=True,
        file=True,  # the draft bundle's contents count: a draft compiled again makes the target's bundle stale
        help='The draft of the spd dialog: "self" (the model drafts for itself: checks the dialog, no speed-up) or '
        "the folder of the draft model's compiled bundle with the same tokenizer (the run of e.g. "
        "builtin:tiny-llama-draft: <run>/artifacts/compile/bundle); its context binaries go under draft/.",
    )
    spd_draft_len: int = setting(
        3,
        label="spd draft length",
        unit="tokens",
        range=(1, 64),
        stages=("compile",),
        advanced=True,
        help="Tokens the draft proposes per spd step (Genie's dialog.spd.draft-len).",
    )
    lade_window: int = setting(
        8,
        label="lade window",
        unit="tokens",
        range=(1, 64),
        stages=("compile",),
        advanced=True,
        help="Lookahead decoding's window (Genie's dialog.lade.window). A lade step runs (window + gcap) x "
        "(ngram - 1) tokens at once; it must fit the prompt processor (ar_n).",
    )
    lade_ngram: int = setting(
        2,
        label="lade n-gram",
        unit="tokens",
        range=(2, 16),
        stages=("compile",),
        advanced=True,
        help="Lookahead decoding's n-gram size (Genie's dialog.lade.ngram): the longest guess checked per step. "
        "Above 2, Genie 1.21 keeps its lookahead set-up batch in the KV cache for the first step, so greedy output "
        "can differ from the basic dialog's (docs/genie.md); the Evaluate stage's greedy parity suite shows it.",
    )
    lade_gcap: int = setting(
        8,
        label="lade guesses per step",
        range=(1, 64),
        stages=("compile",),
        advanced=True,
        help="Lookahead decoding's guess cap (Genie's dialog.lade.gcap): n-grams verified per step.",
    )
    # -- chat ---------------------------------------------------------------------------------------------
    benchmark_prompt: str = setting(
        "What is the capital of France?",
        label="Benchmark prompt",
        stages=("chat",),
        nonempty=True,
        help="The deterministic prompt the Chat stage measures token rates with.",
    )
    sampler: dict[str, float] = setting(
        dataclasses.asdict(Sampler()),
        label="Sampler",
        stages=("chat",),
        fields_of=Sampler,
        help="Genie's sampler for the Chat stage's benchmark reply: seed, temp, top_k, top_p (a JSON object; keys "
        "left out keep their default). It goes into a copy of the bundle's config on the board; the bundle itself "
        "keeps Genie's greedy default, and the Chat page, `hexstudio chat` and serve choose their own.",
    )
    dialog_type: str = setting(
        "basic",
        label="Dialog",
        choices=("basic", "lade", "spd"),
        stages=("evaluate",),
        advanced=True,
        help='The Genie dialog the Evaluate stage runs on the board (chat and serve take --dialog): "basic", or a '
        "speculative one the Compile stage wrote (speculative_dialogs). With greedy sampling every dialog must "
        "give the basic one's tokens (the parity gate checks it); lade and spd report the tokens accepted per "
        "step.",
    )
    # -- gates --------------------------------------------------------------------------------------------
    thresholds: dict[str, float] = setting(
        {},
        label="Validation thresholds",
        stages=("validate",),
        help="Overrides of the Validate stage's thresholds, by metric name (a JSON object).",
    )
    override_gates: list[str] = setting(
        [],
        label="Overridden gates",
        items="stage names",
        flag="--override-gate",
        help="Stages whose failed gate the run continues past (recorded in the run).",
    )
    # -- advanced: written into a run only when set ---------------------------------------------------------
    revision: str | None = setting(
        None,
        label="Hugging Face revision",
        stages=("model",),
        advanced=True,
        flag="--revision",
        help="A branch, tag or commit hash of the Hugging Face model (unset: main).",
    )
    worker_host: str | None = setting(
        None,
        label="Worker host",
        # Preflight measures the machine the heavy stages run on: another one is another measurement (the other
        # stages' results are the same wherever they ran, so they stay current)
        stages=("preflight",),
        advanced=True,
        flag="--worker-host",
        help="The worker host (`hexstudio worker add`) the heavy stages run on over SSH (unset: this machine).",
    )
    board_ram_bytes: int | None = setting(
        None,
        label="Board RAM",
        unit="bytes",
        range=(1, 2**50),
        stages=("model", "preflight"),  # parts "auto" (resolve_settings)
        advanced=True,
        help="The target board's RAM: parts are kept under 1/8 of it (unset: unknown).",
    )
    validate_unit: str = setting(
        "unit",
        label="Validation unit",
        choices=("unit", "part"),
        advanced=True,
        help='How the Validate stage runs the quantized graphs: "unit" (one calibration unit at a time, little '
        'memory) or "part" (whole parts).',
    )
    aimet_smoke: bool = setting(
        True, label="AIMET smoke test", advanced=True, help="Preflight runs a small AIMET-ONNX quantization."
    )
    prompt_template: str = setting(
        AUTO,
        label="Prompt template",
        stages=("chat", "evaluate"),
        advanced=True,
        help='The chat template prompts are written with ("auto": the model\'s own).',
    )
    runtime: str | None = setting(
        None,
        label="Runtime",
        stages=("chat", "evaluate"),
        advanced=True,
        help="The board's runtime for Chat and Evaluate (unset: the board's, else genie).",
    )
    benchmark_max_tokens: int = setting(
        32,
        label="Benchmark reply length",
        unit="tokens",
        range=(1, 131072),
        stages=("chat",),
        advanced=True,
        help="Tokens generated for the benchmark prompt.",
    )
    eval_suites: list[str] | None = setting(
        None,
        label="Evaluation suites",
        stages=("evaluate",),
        items="suite names or suite files",
        advanced=True,
        help="The suites the Evaluate stage runs (unset: the default suites).",
    )
    eval_legs: list[str] = setting(
        ["float", "sim", "board"],
        label="Evaluation legs",
        choices=("float", "sim", "board"),
        stages=("evaluate",),
        items="legs",
        advanced=True,
        help="Where the Evaluate stage scores: the host float model, the host quantized simulation, the board.",
    )
    aihub_compile_options: str = setting(
        "",
        label="AI Hub compile options",
        # the options change the compiled binaries: a change makes the Compile stage out of date
        stages=("compile",),
        advanced=True,
        help="Extra options appended to AI Hub's compile options (as qai-hub-models' --compile-options).",
    )
    aihub_compact_upload: bool = setting(
        True,
        label="Compact AI Hub upload",
        advanced=True,
        help="Upload int4/int8 weights and the embedding table as their integers (int8, uint16) with the ops that "
        "make them float again, each checked to re-quantize to the same integers (about a quarter of the bytes; "
        "docs/aihub-upload.md). Off: fp32 weights, as qai-hub-models uploads them. Turn it off if an AI Hub "
        "compile job refuses the compact form.",
    )
    aihub_model_name: str = setting(
        "",
        label="AI Hub model name",
        advanced=True,
        help="The <model> in the AI Hub bundle's file and job names (empty: from the model id, e.g. tiny_llama).",
    )
    aihub_poll_interval_s: float | None = setting(
        None,
        label="AI Hub poll interval",
        unit="s",
        range=(0.0, 3600.0),
        advanced=True,
        help="Seconds between AI Hub job status requests (unset: the worker's default, 15 s). Against Qualcomm's "
        "own AI Hub at least 5 s: it limits an account's requests.",
    )
    aihub_http_retries: int | None = setting(
        None,
        label="AI Hub HTTP retries",
        range=(0, 100),
        advanced=True,
        help="Retries of a failed AI Hub request (unset: the client's default).",
    )
    aihub_http_backoff_s: float | None = setting(
        None,
        label="AI Hub HTTP backoff",
        unit="s",
        range=(0.0, 600.0),
        advanced=True,
        help="Backoff factor between AI Hub retries (unset: the client's default).",
    )
    aihub_link_mbps: float | None = setting(
        None,
        label="AI Hub upload link speed",
        unit="Mbit/s",
        range=(0.01, 1e6),
        advanced=True,
        help="Your uplink to Qualcomm AI Hub, for the upload size and ETA the Compile stage shows before it uploads "
        "(unset: the rate the last upload to the same AI Hub measured, kept in <workspace>/aihub-uplink.json; "
        "100 Mbit/s assumed before any upload).",
    )
    aihub_api_url: str | None = setting(
        None,
        label="AI Hub API address",
        advanced=True,
        help="AI Hub's API address (unset: $HEXSTUDIO_AIHUB_API_URL, else Qualcomm's).",
    )
    aihub_web_url: str | None = setting(
        None,
        label="AI Hub web address",
        advanced=True,
        help="AI Hub's web address for job links (unset: $HEXSTUDIO_AIHUB_WEB_URL, else Qualcomm's).",
    )


# -- the registry, derived from the dataclass -----------------------------------------------------------------

Kind = Literal["int", "float", "bool", "text", "object", "list"]
_KINDS: dict[type, Kind] = {
    int: "int",
    float: "float",
    bool: "bool",
    str: "text",
    dict: "object",
    list: "list",
}


@dataclass(frozen=True)
class SettingSpec:
    """One run setting as the registry gives it (from a `setting(...)` field of RunSettings)."""

    name: str
    kind: Kind
    default: Any
    label: str
    help: str
    stages: tuple[str, ...] = ()
    auto: bool = False  # "auto" is also accepted
    optional: bool = False  # null (unset) is also accepted
    unit: str | None = None
    range: tuple[float, float] | None = None
    choices: tuple[Any, ...] | None = None
    page: str | None = None
    widget: Widget | None = None
    advanced: bool = False
    flag: str | None = None
    file: bool = False
    nonempty: bool = False
    items: str | None = None
    fields: Mapping[str, SettingSpec] | None = None  # a JSON object's keys (the sampler)

    def type_text(self) -> str:
        """The accepted values in words: 'a whole number 97 to 131072 or "auto"', 'one of 2, 4, 8'."""
        if self.choices is not None and self.kind != "list":
            t = "one of " + ", ".join(json.dumps(c) for c in self.choices)
        else:
            t = {
                "int": "a whole number",
                "float": "a number",
                "bool": "true or false",
                "text": "text",
                "object": "a JSON object",
                "list": "a JSON list",
            }[self.kind]
            if self.kind == "list" and (self.items or self.choices):
                t += (
                    " of "
                    + (self.items or "")
                    + (" (" + ", ".join(json.dumps(c) for c in self.choices) + ")" if self.choices else "")
                )
            if self.range is not None:
                t += f" {_num(self.range[0])} to {_num(self.range[1])}"
        if self.auto:
            t += ' or "auto"'
        if self.optional:
            t += " or null (unset)"
        return t


def _num(v: float) -> str:
    return f"{v:g}" if isinstance(v, float) else str(v)


def _specs_of(cls: type) -> dict[str, SettingSpec]:
    hints = get_type_hints(cls)
    out: dict[str, SettingSpec] = {}
    for f in dataclasses.fields(cls):
        kind, auto, optional = _kind_of(hints[f.name])
        md = f.metadata
        default = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = SettingSpec(
            name=f.name,
            kind=kind,
            default=default,
            label=md["label"],
            help=md["help"],
            stages=md["stages"],
            auto=auto,
            optional=optional,
            unit=md["unit"],
            range=md["range"],
            choices=md["choices"],
            page=md["page"],
            widget=md["widget"],
            advanced=md["advanced"],
            flag=md["flag"],
            file=md["file"],
            nonempty=md["nonempty"],
            items=md["items"],
            fields=_specs_of(md["fields_of"]) if md["fields_of"] is not None else None,
        )
    return out


def _kind_of(hint: Any) -> tuple[Kind, bool, bool]:
    args = get_args(hint) if get_origin(hint) in (Union, types.UnionType) else (hint,)
    auto = any(get_origin(a) is Literal and AUTO in get_args(a) for a in args)
    optional = type(None) in args
    base = [get_origin(a) or a for a in args if a is not type(None) and get_origin(a) is not Literal]
    if len(base) != 1 or base[0] not in _KINDS:
        raise TypeError(
            f"a run setting's type is one of int, float, bool, str, dict, list (optionally | None or "
            f"| Literal['auto']), not {hint!r}"
        )
    return _KINDS[base[0]], auto, optional


SETTINGS: dict[str, SettingSpec] = _specs_of(RunSettings)
DEFAULTS = RunSettings()
"""Every setting's default, typed."""


class BadSettings(ActionableError):
    """Values that are not run settings of the right type: one sentence per problem in `problems`."""

    def __init__(self, problems: Sequence[str]) -> None:
        super().__init__(
            " ".join(problems),
            "Give a value the message allows (`hexstudio run --help` lists every setting with its range).",
            code="bad_setting",
        )
        self.problems = list(problems)


@dataclass(frozen=True)
class TypedSettings:
    """A run's settings as a worker reads them: `values` (every setting, typed, defaults filled in), the
    names the run set itself (`given`), and the keys that are no run setting (`hooks`: a test worker's
    knobs such as the self-test's "seconds"; never a real setting)."""

    values: RunSettings
    given: frozenset[str]
    hooks: Mapping[str, Any]

    def to_json(self) -> dict[str, Any]:
        """What was given, as run.json holds it (defaults stay implicit, so a worker host's copy of the spec
        and the resume hash see the same keys as before)."""
        out = {k: copy.deepcopy(getattr(self.values, k)) for k in SETTINGS if k in self.given}
        out.update(copy.deepcopy(dict(self.hooks)))
        return out


def typed_settings(values: Mapping[str, Any], *, strict: bool = True) -> TypedSettings:
    """`values` (run.json's "settings") as typed settings. A null for a setting that cannot be null means
    "unset" (its default). strict: a value `check` refuses raises BadSettings naming each (a worker's spec
    must never carry one: `Workspace.create_run` and `--set` refuse them first); not strict: such a value is
    left at its default (a report reading an old run)."""
    known: dict[str, Any] = {}
    hooks: dict[str, Any] = {}
    problems: list[str] = []
    for k, v in values.items():
        s = SETTINGS.get(k)
        if s is None:
            hooks[k] = v
            continue
        if v is None and not s.optional:
            continue
        why = check(k, v)
        if why is not None:
            problems.append(why)
            continue
        known[k] = copy.deepcopy(v)
    if problems and strict:
        raise BadSettings(problems)
    return TypedSettings(RunSettings(**known), frozenset(known), hooks)


def run_settings_of(values: Mapping[str, Any]) -> RunSettings:
    """run.json's settings as a RunSettings, leniently (see typed_settings)."""
    return typed_settings(values, strict=False).values


def spec(name: str) -> SettingSpec | None:
    return SETTINGS.get(name)


def default_run_settings() -> dict[str, Any]:
    """What a new run's settings start from: every setting that is not advanced, with its default (a copy)."""
    return {s.name: copy.deepcopy(s.default) for s in SETTINGS.values() if not s.advanced}


def read_by(stage: str) -> tuple[str, ...]:
    """The run settings the stage's results depend on (its `inputs`), in registry order."""
    return tuple(s.name for s in SETTINGS.values() if stage in s.stages)


# -- checking and parsing -------------------------------------------------------------------------------------


def _type_name(v: Any) -> str:
    return {
        bool: "true/false",
        int: "a whole number",
        float: "a number",
        str: "text",
        dict: "a JSON object",
        list: "a JSON list",
        type(None): "null",
    }.get(type(v), type(v).__name__)


def _given(v: Any) -> str:
    return repr(v) if isinstance(v, str) else json.dumps(v)


def _given_typed(v: Any) -> str:
    """'"128" (text)': what was given and its type (null needs no second word)."""
    return _given(v) if v is None else f"{_given(v)} ({_type_name(v)})"


def _check_value(s: SettingSpec, name: str, value: Any) -> str | None:
    given = _given(value)
    if s.auto and value == AUTO:
        return None
    if s.optional and value is None:
        return None
    alt = ' or "auto"' if s.auto else ""
    if s.kind == "int":
        if isinstance(value, bool) or not isinstance(value, int):
            return f"{name} must be a whole number{alt}, not {_given_typed(value)}."
    elif s.kind == "float":
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return f"{name} must be a number{alt}, not {_given_typed(value)}."
    elif s.kind == "bool":
        if not isinstance(value, bool):
            return f"{name} must be true or false, not {given}."
    elif s.kind == "text":
        if not isinstance(value, str):
            return f"{name} must be text, not {_given_typed(value)}."
    elif s.kind == "object":
        if not isinstance(value, dict):
            return f"{name} must be a JSON object, not {given}."
        if name == "thresholds":  # checked when set, not found wrong after hours of quantize (issue 27)
            for k, v in value.items():
                if k not in THRESHOLD_NAMES:
                    return (
                        f"thresholds.{k} is not a validation threshold (known: {', '.join(THRESHOLD_NAMES)})."
                    )
                if isinstance(v, bool) or not isinstance(v, (int, float)) or v != v or not 0 <= v <= 1e6:
                    return f"thresholds.{k} must be a number from 0 to 1000000, not {_given_typed(v)}."
    elif s.kind == "list":
        if not isinstance(value, list):
            return f"{name} must be a JSON list, not {given}."
        if not all(isinstance(x, str) for x in value):
            return f"{name} must be a list of {s.items or 'text'}."
        if s.choices is not None and (bad := [x for x in value if x not in s.choices]):
            return (
                f"{name}: {', '.join(json.dumps(x) for x in bad)} is not one of "
                f"{', '.join(json.dumps(c) for c in s.choices)}."
            )
        return None
    if s.range is not None:
        lo, hi = s.range
        if not lo <= value <= hi:
            if isinstance(lo, float) or isinstance(hi, float):
                return f"{name} {value} is out of range ({lo:g} to {hi:g})."
            return f"{name} {value} is out of range ({lo} to {hi})."
    if s.choices is not None and value not in s.choices:
        return f"{name} {given} is not one of {', '.join(json.dumps(c) for c in s.choices)}."
    if s.nonempty and not value.strip():
        return f"{name} is empty."
    if s.fields is not None:
        for k, v in value.items():
            sub = s.fields.get(k)
            if sub is None:
                return f"{name}.{k} is not a {name} setting (known: {', '.join(s.fields)})."
            why = _check_value(sub, f"{name}.{k}", v)
            if why is not None:
                return why
    return None


def check(name: str, value: Any) -> str | None:
    """Why `value` is not acceptable for the run setting `name` (a sentence naming the setting, what was
    given and what is expected); None when it is, or when `name` is not a run setting (a test hook)."""
    s = SETTINGS.get(name)
    why = None if s is None else _check_value(s, name, value)
    if why is not None and name == "speculative_dialogs" and isinstance(value, str):
        from hexstudio.shared.bundle.speculative import REFUSED

        for t in (x.strip() for x in value.split(",")):
            if t in REFUSED:  # a dialog Genie has but HexStudio cannot build: say why, not only the choices
                return f"speculative_dialogs: {REFUSED[t]}"
    # checked when set, not after an hour of quantizing
    if why is None and name in ("context_lengths", "ar_sizes"):
        try:
            (extra_context_lengths if name == "context_lengths" else extra_ar_sizes)(value)
        except ValueError as exc:
            return str(exc)
    return why


def genie_cl_problem(context_length: int, ar_n: int) -> str | None:
    """Why Genie would run this (CL, AR) pair wrong, or None. Measured with Genie 1.21 on the HTP simulator: a
    prompt-processor graph whose past KV length CL - AR equals its AR (CL = 2 x AR) gives different tokens under
    Genie than the same compiled graph fed directly (which matches the host simulation), deterministically; at
    every other CL tried (CL-128/160/256/512 with AR-32, CL-512 with AR-128) they agree."""
    if context_length == 2 * ar_n:
        return (
            f"context length {context_length} is twice ar_n {ar_n}: Genie 1.21 then mistakes the prompt "
            "processor's past KV (CL - AR entries) for its new one and answers wrong. Use another context "
            "length or ar_n."
        )
    return None


def extra_context_lengths(
    value: Any, context_length: int | None = None, ar_n: int | None = None
) -> list[int]:
    """The `context_lengths` setting as sorted ints; ValueError (a sentence) for a bad one. With the run's
    context_length and ar_n, each must lie strictly between them (Genie's KV holds CL - AR entries) and be a
    multiple of ar_n, as context_length is."""
    text = str(value or "").strip()
    out: set[int] = set()
    for item in (x.strip() for x in text.split(",") if x.strip()):
        if not item.isdigit():
            raise ValueError(f'context_lengths: {item!r} is not a whole number (give e.g. "1024,2048").')
        n = int(item)
        if n % 32:
            raise ValueError(f"context_lengths: {n} is not a multiple of 32 (Genie's KV cache moves in 32s).")
        if context_length is not None and n >= context_length:
            raise ValueError(
                f"context_lengths: {n} is not below context_length {context_length}; the largest "
                "context length is context_length itself."
            )
        if ar_n is not None and n <= ar_n:
            raise ValueError(
                f"context_lengths: {n} leaves no room past the prompt processor's {ar_n} tokens "
                f"(it must exceed ar_n)."
            )
        if ar_n is not None and n % ar_n:
            lo, hi = n // ar_n * ar_n, (n // ar_n + 1) * ar_n
            raise ValueError(
                f"context_lengths: {n} is not a multiple of ar_n {ar_n}: the prompt processor consumes the context "
                f"in blocks of {ar_n} tokens, as for context_length. Use {f'{lo} or {hi}' if lo > ar_n else hi}."
            )
        if ar_n is not None and (why := genie_cl_problem(n, ar_n)):
            raise ValueError(f"context_lengths: {why}")
        out.add(n)
    return sorted(out)


def check_all(values: Mapping[str, Any]) -> list[str]:
    """Every problem of `values`, one sentence each (unknown keys are not checked)."""
    return [p for k, v in values.items() if (p := check(k, v)) is not None]


def shape_problem(values: Mapping[str, Any]) -> str | None:
    """What the Model or Quantize stage would refuse of context_length and ar_n together, told before a run is
    made or its settings change (hexstudio.core.runs.change_settings): None when either is "auto" or they fit. What needs the model's config (its longest context, its window) is the Model stage's."""
    cl, ar = values.get("context_length"), values.get("ar_n")
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (cl, ar)):
        return None
    assert isinstance(cl, int) and isinstance(ar, int)
    return modelinfo.check_context({}, cl, ar) or genie_cl_problem(cl, ar)


def parse_cli_value(name: str, text: str) -> Any:
    """The value of `--set NAME=TEXT`: text settings take the text as given (qairt_version=2.42), the
    others read it as JSON (numbers bare, true/false, objects), falling back to the text itself."""
    s = SETTINGS.get(name)
    if s is not None and s.kind == "text":
        return text
    try:
        return json.loads(text)
    except json.JSONDecodeError:
        return text


def closest(name: str) -> str | None:
    """The run setting a mistyped name most likely meant."""
    import difflib

    m = difflib.get_close_matches(name, list(SETTINGS), n=1, cutoff=0.6)
    return m[0] if m else None


# -- the "auto" rule --------------------------------------------------------------------------------------------


class ResolvedSettings(TypedDict):
    """The settings that size a run, with "auto" resolved (model.json "resolved" plus calibration)."""

    context_length: int
    ar_n: int
    parts: int
    calibration_samples: int
    calibration_seq_len: int


def resolve_settings(
    info: Mapping[str, Any],
    settings: RunSettings | Mapping[str, Any],
    *,
    builtin: bool,
    board_name: str | None = None,
) -> tuple[ResolvedSettings, dict[str, Any]]:
    """context_length and parts with "auto" (or unset) resolved, and the part plan behind parts.

    context_length "auto": AUTO_CONTEXT_LENGTH (the built-in model's, or every other model's), never beyond the
    model's max_position_embeddings (issue 27: a local copy of the built-in model was told "context_length 4096
    beyond 2048", a limit nobody had asked for). parts "auto":
    the part plan's (hexstudio.shared.modelinfo.part_plan: model size, the context length, board_ram_bytes when set).
    The Model stage, preflight and `hexstudio model inspect` all resolve with this."""
    # a mapping is checked: a value `check` refuses (context_length -1) raises BadSettings naming it
    rs = settings if isinstance(settings, RunSettings) else typed_settings(settings).values
    ctx = rs.context_length
    if ctx == AUTO:
        context_length = AUTO_CONTEXT_LENGTH["builtin" if builtin else "other"]
        # a model made for shorter contexts, or one that attends over a shorter window: its own limit, in whole
        # prompt-processor blocks (a limit below two blocks is left for check_context to explain)
        limits = [
            v
            for v in (info.get("max_position_embeddings"), info.get("sliding_window"))
            if isinstance(v, int) and not isinstance(v, bool) and 0 < v < context_length
        ]
        if limits:
            context_length = min(limits)
            if context_length // rs.ar_n * rs.ar_n > rs.ar_n:
                context_length = context_length // rs.ar_n * rs.ar_n
    else:
        context_length = int(ctx)
    board_ram = rs.board_ram_bytes or None
    plan = modelinfo.part_plan(dict(info), context_length, board_ram, board_name)
    resolved: ResolvedSettings = {
        "context_length": context_length,
        "ar_n": rs.ar_n,
        "parts": int(plan["parts"]) if rs.parts == AUTO else int(rs.parts),
        "calibration_samples": rs.calibration_samples,
        "calibration_seq_len": rs.calibration_seq_len,
    }
    return resolved, plan


# -- faces: the studio's form, the CLI help, the docs -----------------------------------------------------------


@dataclass(frozen=True)
class FormField:
    """What a form needs to show one run setting (Qt-free; the studio turns it into a widget)."""

    key: str
    label: str
    widget: Widget
    help: str
    unit: str | None = None
    minimum: float | None = None
    maximum: float | None = None
    choices: tuple[Any, ...] | None = None


def _widget_of(s: SettingSpec) -> Widget | None:
    if s.widget is not None:
        return s.widget
    if s.choices is not None and s.kind != "list":
        return "choice"
    return {"int": "spin", "float": "spin", "bool": "check", "text": "line"}.get(s.kind)  # type: ignore[return-value]


def form_fields(page: str) -> tuple[FormField, ...]:
    """The fields the studio's `page` (a stage name) shows, in registry order."""
    out = []
    for s in SETTINGS.values():
        w = _widget_of(s)
        if s.page != page or w is None:
            continue
        out.append(
            FormField(
                key=s.name,
                label=s.label,
                widget=w,
                help=s.help,
                unit=s.unit,
                minimum=s.range[0] if s.range else None,
                maximum=s.range[1] if s.range else None,
                choices=s.choices,
            )
        )
    return tuple(out)


def _default_text(s: SettingSpec) -> str:
    return "unset" if s.default is None else json.dumps(s.default)


def cli_help(width: int = 100) -> str:
    """The run settings for `hexstudio run --help` (its epilog)."""
    lines = ["run settings (--set KEY=VALUE; JSON values, text as it is):"]

    def block(s: SettingSpec) -> None:
        head = f"  {s.name} = {_default_text(s)}"
        what = s.type_text() + (f" ({s.unit})" if s.unit else "")
        lines.append(f"{head}    {what}")
        extra = f" Stages: {', '.join(s.stages)}." if s.stages else ""
        flag = f" Also {s.flag}." if s.flag else ""
        lines.extend(
            textwrap.wrap(
                s.help + extra + flag, width=width, initial_indent="      ", subsequent_indent="      "
            )
        )

    for s in SETTINGS.values():
        if not s.advanced:
            block(s)
    lines.append("advanced run settings (written into a run only when set):")
    for s in SETTINGS.values():
        if s.advanced:
            block(s)
    return "\n".join(lines)


DOCS_BEGIN = (
    "<!-- run-settings table: generated by hexstudio.shared.run_settings.markdown_table(); do not edit -->"
)
DOCS_END = "<!-- end of the generated table -->"


def markdown_table() -> str:
    """The run settings as the Markdown tables of docs/settings.md (between DOCS_BEGIN and DOCS_END)."""

    def cell(t: str) -> str:
        return t.replace("|", "\\|").replace("\n", " ")

    out = [DOCS_BEGIN, ""]
    for title, advanced in (
        ("Run settings", False),
        ("Advanced run settings (written into a run only when set)", True),
    ):
        out += [
            f"### {title}",
            "",
            "| Setting | Values | Default | Stages | Studio | Description |",
            "|---|---|---|---|---|---|",
        ]
        for s in SETTINGS.values():
            if s.advanced != advanced:
                continue
            values = s.type_text() + (f" ({s.unit})" if s.unit else "")
            desc = s.label + ". " + s.help + (f" Also `{s.flag}`." if s.flag else "")
            if s.fields:
                desc += (
                    " Keys: "
                    + "; ".join(
                        f"`{k}` {f.type_text()}, default {json.dumps(f.default)}" for k, f in s.fields.items()
                    )
                    + "."
                )
            page = f"{s.page} page" if s.page else ""
            out.append(
                f"| `{s.name}` | {cell(values)} | `{cell(_default_text(s))}` | {', '.join(s.stages)} | "
                f"{page} | {cell(desc)} |"
            )
        out.append("")
    out.append(DOCS_END)
    return "\n".join(out)


def extra_ar_sizes(value: Any, ar_n: int | None = None, context_lengths: Sequence[int] = ()) -> list[int]:
    """The `ar_sizes` setting as sorted ints; ValueError (a sentence) for a bad one. With the run's ar_n and its
    context lengths, each must lie between 2 and ar_n - 1 and be a pair Genie runs right with every CL."""
    out: set[int] = set()
    for item in (x.strip() for x in str(value or "").split(",") if x.strip()):
        if not item.isdigit():
            raise ValueError(f'ar_sizes: {item!r} is not a whole number (give e.g. "4").')
        n = int(item)
        if n < 2:
            raise ValueError(f"ar_sizes: {n} is the token generator's (AR-1) or none; give 2 or more.")
        if ar_n is not None and n >= ar_n:
            raise ValueError(f"ar_sizes: {n} is not below ar_n {ar_n}; the largest AR is ar_n itself.")
        for cl in context_lengths:
            if why := genie_cl_problem(cl, n):
                raise ValueError(f"ar_sizes: {why}")
        out.add(n)
    return sorted(out)
