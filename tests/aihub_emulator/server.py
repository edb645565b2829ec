"""A local Qualcomm AI Hub emulator: speaks the protobuf-over-HTTP protocol of the installed
`qai_hub` client (0.56) so the REAL client runs end to end with no internet.

EMULATED: it cannot compile anything. A "compiled" DLC or a "linked" context binary it returns is a
zip holding README.txt (saying EMULATED), emulated.json (what was asked: options, graphs, device) and
the inputs it was given. Every device it lists carries the attribute `hexstudio:emulated`, and every
response carries the header `X-HexStudio-Emulated: true`.

What it serves (paths under {api_url}/api/v1/, trailing slash, `Authorization: token T`):
  GET  devices/?name=&os=&select=&attributes=        DeviceList
  GET  users/auth/user/                              User
  POST models/                                       Model -> CreateUpdateResponse
  GET  models/{id}/                                  Model
  GET  models/{id}/multipart_upload/?file_size=N     FileUploadResponse (pre-signed PUT urls to us)
  POST models/{id}/multipart_upload/                 FileMultipartUploadComplete -> CreateUpdateResponse
  GET  models/{id}/download/                         FileDownloadResponse (url back to us)
  POST jobs/?seed_target_model=true                  Job{compile_job|link_job} -> CreateUpdateResponse
  GET  jobs/{id}/                                    Job (state from the job's clock)
  GET  job_summaries/?type=&offset=&limit=           JobSummaryList (newest first)
  GET  jobs/{id}/device_runs/latest/artifact_list/T/ NamedArtifactDownloadURLList (hub log)
and, outside the API (no token, like pre-signed S3 urls): PUT /_upload/{model}/{k}, GET /_files/{id}.

What it checks, as the real service would (a check that fails ends the job FAILED with a reason in
AI Hub's style; `emu.failure_reasons` lists them): every option must be one it knows (compile:
OPTIONS, link: LINK_OPTIONS; a `--qnn_options` key too, QNN_OPTIONS), with a valid value (a repeated
option: the last value wins, repeated `--qnn_options` add up); the QAIRT version must be one it offers
(QAIRT_VERSIONS); a compile to qnn_dlc needs `--qnn_options context_enable_graphs=<one graph name>` (a C
identifier); an AIMET upload (a directory with an .encodings) must hold exactly one .onnx, the .data it
references and one .encodings in AIMET format 0.6.1 or 1.0.0, and its ONNX must type-check (fp16 or integer
initializers are accepted where they feed ops that take them, e.g. a Cast; not straight into a float op); a
link job takes QNN DLCs compiled for its device and one QAIRT version, with distinct graph names. A
compiled DLC and a linked context binary carry the model metadata QAIRT_SDK_VERSION (the full version,
e.g. 2.42.0.251225135753_193295) and QNN_MODEL_GRAPH_NAMES, as AI Hub's do.

Where these come from (Qualcomm's sources unless marked; qai-hub-models = github.com/qualcomm/ai-hub-models
v0.47.0, b61a009, and quic/ai-hub-models v0.46.1, 52c080d; qai_hub = the installed client 0.56):
- `--output_names`: names that are not outputs of the uploaded model are IGNORED (emulated.json lists the
  ones used). qai-hub-models' LLM export (models/_shared/llm/export.py) compiles every split part with
  `get_hub_compile_options`, which appends `--output_names` + ALL of the model's outputs (utils/base_model.py
  get_hub_compile_options; models/_shared/llm/model.py `_get_output_names`: logits, past_key_{i}_out,
  past_value_{i}_out for every layer); parts 1..N-1 hold none of logits nor the other parts' KV outputs
  (split_onnx_utils), and those jobs succeed on AI Hub. Inferred from that, not from a statement of the
  service's: what it does with a name that IS an output (ordering, renaming) is not emulated.
- LLM compile options as qai-hub-models sends them: `--target_runtime qnn_dlc --qairt_version 2.42
  --output_names ... --quantize_io --qnn_options context_enable_graphs=<graph> --quantize_full_type w8a16
  --quantize_io` (`--quantize_io` twice: base_model.py adds it for the precision, llm/model.py again).
  `--force_channel_last_input/--force_channel_last_output`: base_model.py get_hub_compile_options.
- `--qnn_options` keys: context_enable_graphs (base_model.py get_hub_compile_options/get_hub_profile_options),
  default_graph_gpu_precision (qai-hub-models scorecard/path_profile.py), default_graph_htp_precision
  (compile) and default_graph_htp_optimizations=O=3 (LINK options) in qai_hub client.py's
  submit_compile_and_link_jobs docstring, whose code also appends `--qnn_options context_enable_graphs=...`
  and `--target_runtime qnn_dlc` to the caller's options (so repeats must be taken). The other keys are
  AI Hub's documented QNN options (app.aihub.qualcomm.com/docs/hub/api.html, "profile & inference options")
  as a third-party wrapper transcribes them (NOT read from Qualcomm's page). Values are not checked, except
  graph names. The refusal's wording is ours: no real AI Hub message for an unknown key was found.
- AIMET encodings: 0.6.1 (activation_encodings/param_encodings as dicts keyed by tensor name) and 1.0.0
  (lists of encodings with a "name"): qai-hub-models reads and re-writes both when it splits an .aimet
  model into the parts it uploads (split_onnx_utils/utils.py `_load_encoding`, `split_onnx_by_names`;
  `uses_lists = version >= 1.0.0`), and its own quantsim exports 1.0.0 (llm/model.py
  `qs.encoding_version = "1.0.0"`). AIMET also writes 2.0.0 and 2.1.0 (aimet_common/quantsim.py
  VALID_ENCODING_VERSIONS); nothing at hand says whether AI Hub takes them, so they are refused with an
  "[emulator]" reason that says so.
- Dragonwing IQ-9075 EVK: os "1.7" and `os:qc_linux` (qai-hub-models v0.47.0 devices_and_chipsets.yaml,
  generated from hub.get_devices() by configs/devices_and_chipsets_yaml.py: ostype "Qualcomm Linux" =
  ScorecardDevice.OperatingSystemType.QC_LINUX, read from the `os:` attribute by scorecard/device.py;
  v0.46.1 had 1.5), chipset:qualcomm-qcs9075 (same yaml). `abi:aarch64-oe-linux-gcc11`, framework:tflite
  and htp-supports-fp16:true: a third party's recorded live device query (not a Qualcomm source);
  qai-hub-models reads the `abi:` attribute as the QAIRT SDK lib folder (utils/llm_helpers.py
  copy_qairt_files_for_genie_bundle). AI Hub also lists the alias chipset:qcs9075 (the yaml's aliases are
  the device's `chipset:` attributes), here in sorted order, before the chipset: hexstudio/workers/aihub.py
  parse_device takes the vendor-prefixed one wherever it stands. `abi:aarch64-android` on the Android devices:
  the same third party's records.

Job states: compile CREATED -> OPTIMIZING_MODEL -> DONE|FAILED, link CREATED -> LINKING_MODELS ->
DONE|FAILED, advancing with time (`queue_s`, `run_s`); `hold_jobs()` keeps jobs running (a slow job)
until `release_jobs()`.

Failure injection (per test): `fail_auth` (every API call answers 401), `rate_limit(n)` (the next n
job submissions answer 429; None = all until `rate_limit(0)`), `fail_next(kind, reason, graph=None)`
(the next matching job ends FAILED with that reason), `hold_jobs()` (slow jobs), `lose_submit_answers(n)`
(the next n submissions create their job and drop the connection before answering). Counters:
`submissions` {"compile": n, "link": n}, `uploads`, `requests` [(method, path, status)],
`failure_reasons` {job id: reason} for the jobs its checks failed.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import threading
import time
import uuid
import zipfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

from qai_hub import public_api_pb2 as pb

EMULATED_ATTRIBUTE = "hexstudio:emulated"
DEFAULT_TOKEN = "emulated-aihub-token"
HUB_VERSION = "hexstudio-emulator-0.56"

# QAIRT versions the emulator offers: what --qairt_version accepts -> the full version its compiled models
# carry (QAIRT_SDK_VERSION). The default is used when --qairt_version is absent.
QAIRT_VERSIONS: dict[str, str] = {"2.42": "2.42.0.251225135753_193295"}
DEFAULT_QAIRT = "2.42"
# Compile options it knows: name -> allowed values (None: any value; () : a flag without a value).
OPTIONS: dict[str, tuple[str, ...] | None] = {
    "--target_runtime": (
        "qnn_dlc",
        "qnn_context_binary",
        "qnn_lib_aarch64_android",
        "tflite",
        "onnx",
        "precompiled_qnn_onnx",
    ),
    "--qairt_version": None,
    "--output_names": None,
    "--quantize_io": (),
    "--quantize_io_type": ("int8", "uint8", "int16", "uint16"),
    "--quantize_full_type": ("int8", "int16", "w8a8", "w8a16", "w4a8", "w4a16", "float16"),
    "--qnn_options": None,
    "--compute_unit": None,
    "--truncate_64bit_io": (),
    "--truncate_64bit_tensors": (),
    "--force_channel_last_input": None,  # qai-hub-models utils/base_model.py get_hub_compile_options
    "--force_channel_last_output": None,
}
# Link options: --qnn_options too (qai_hub 0.56 client.py, submit_compile_and_link_jobs' docstring:
# link_options="--qnn_options default_graph_htp_optimizations=O=3").
LINK_OPTIONS: dict[str, tuple[str, ...] | None] = {"--qairt_version": None, "--qnn_options": None}
# --qnn_options keys (see the module docstring for where each comes from). Values are not checked, except
# context_enable_graphs' graph names: no Qualcomm source at hand lists the values the service takes.
QNN_OPTIONS = (
    # Qualcomm's own callers: qai-hub-models (context_enable_graphs, default_graph_gpu_precision) and the
    # qai_hub 0.56 client's docstrings (default_graph_htp_precision, default_graph_htp_optimizations)
    "context_enable_graphs",
    "default_graph_gpu_precision",
    "default_graph_htp_precision",
    "default_graph_htp_optimizations",
    # AI Hub's documented QNN options (api.html "profile & inference options"; the list as transcribed by
    # a third party, not read from Qualcomm's page itself)
    "context_async_execution_queue_depth_numeric",
    "context_error_reporting_options_level",
    "context_error_reporting_options_storage_limit",
    "context_memory_limit_hint",
    "context_priority",
    "context_gpu_performance_hint",
    "context_gpu_use_gl_buffers",
    "context_htp_performance_mode",
    "default_graph_priority",
    "default_graph_gpu_disable_memory_optimizations",
    "default_graph_gpu_disable_node_optimizations",
    "default_graph_gpu_disable_queue_recording",
    "default_graph_htp_disable_fold_relu_activation_into_conv",
    "default_graph_htp_num_hvx_threads",
    "default_graph_htp_optimization_type",
    "default_graph_htp_optimization_value",
    "default_graph_htp_disable_short_depth_conv_on_hmx",
    "default_graph_htp_vtcm_size",
)
GRAPH_NAME_RE = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
# AIMET encodings formats Qualcomm's own LLM pipeline uploads to AI Hub (qai-hub-models
# _shared/llm/split_onnx_utils/utils.py keeps either form in the .aimet parts it uploads): version -> whether
# activation_encodings/param_encodings are lists of named encodings (1.0.0) or dicts keyed by name (0.6.1).
AIMET_ENCODINGS_FORMATS: dict[str, bool] = {"0.6.1": False, "1.0.0": True}
# Formats AIMET itself can write (aimet_common/quantsim.py VALID_ENCODING_VERSIONS) with no evidence at hand
# either way about AI Hub: refused, with an [emulator] reason that says so.
AIMET_ENCODINGS_UNVERIFIED = ("2.0.0", "2.1.0")

# Run settings that make hexstudio/workers/aihub.py poll fast and never sit in HTTP retries.
FAST_RUN_SETTINGS: dict[str, Any] = {
    "aihub_poll_interval_s": 0.05,
    "aihub_http_retries": 0,
    "aihub_http_backoff_s": 0.01,
}


@contextmanager
def fast_client_knobs() -> Iterator[None]:
    """In-process: the qai_hub client's job polling (10 s: `qai_hub.client.Job._polling_interval`)
    and urllib3/backoff retries (~30-46 s on refused connections, 429 and 5xx:
    `qai_hub.util.session.MAX_RETRIES`, `BACKOFF_FACTOR`) made fast. Also pass `retry=False` to
    submit_compile_job (its rate-limit loop sleeps 20 s)."""
    import qai_hub.client as hc
    import qai_hub.util.session as hs

    saved = (hc.Job._polling_interval, hs.MAX_RETRIES, hs.BACKOFF_FACTOR)
    hc.Job._polling_interval = 1
    hs.MAX_RETRIES, hs.BACKOFF_FACTOR = 0, 0.01
    try:
        yield
    finally:
        hc.Job._polling_interval, hs.MAX_RETRIES, hs.BACKOFF_FACTOR = saved


def no_proxy_env() -> dict[str, str]:
    hosts = {h for h in os.environ.get("NO_PROXY", os.environ.get("no_proxy", "")).split(",") if h}
    value = ",".join(sorted(hosts | {"127.0.0.1", "localhost"}))
    return {"NO_PROXY": value, "no_proxy": value}


# Device records as AI Hub lists them (see the module docstring for the sources). One old device without
# weight sharing (v68) and one v69 device show the refusals.
DEVICES: list[dict[str, Any]] = [
    {
        "name": "Dragonwing IQ-9075 EVK",
        "os": "1.7",
        "soc_description": "Qualcomm QCS9075",
        # chipset:qcs9075 is the chipset's alias (qai-hub-models v0.47.0 devices_and_chipsets.yaml takes a device's
        # aliases from its chipset: attributes), sorted before it as the rest are; HexStudio takes the vendor-prefixed
        # one wherever it stands (hexstudio/workers/aihub.parse_device)
        "attributes": [
            "abi:aarch64-oe-linux-gcc11",
            "chipset:qcs9075",
            "chipset:qualcomm-qcs9075",
            "format:iot",
            "framework:onnx",
            "framework:qnn",
            "framework:tflite",
            "hexagon:v73",
            "htp-supports-fp16:true",
            "htp-supports-weight-sharing:true",
            "os:qc_linux",
            "soc-model:77",
            "vendor:qualcomm",
        ],
    },
    {
        "name": "Snapdragon 8 Gen 3 QRD",
        "os": "14",
        "soc_description": "Qualcomm Snapdragon 8 Gen 3",
        "attributes": [
            "abi:aarch64-android",
            "chipset:qualcomm-snapdragon-8gen3",
            "format:phone",
            "framework:onnx",
            "framework:qnn",
            "framework:tflite",
            "hexagon:v75",
            "htp-supports-weight-sharing:true",
            "os:android",
            "soc-model:57",
            "vendor:qualcomm",
        ],
    },
    {
        # a device HexStudio does not know offline (hexstudio.shared.bundle.KNOWN_DEVICES): its arch is AI Hub's word
        "name": "Samsung Galaxy S25 (Family)",
        "os": "15",
        "soc_description": "Qualcomm Snapdragon 8 Elite",
        "attributes": [
            "abi:aarch64-android",
            "chipset:qualcomm-snapdragon-8-elite",
            "format:phone",
            "framework:onnx",
            "framework:qnn",
            "framework:tflite",
            "hexagon:v79",
            "htp-supports-weight-sharing:true",
            "os:android",
            "soc-model:69",
            "vendor:qualcomm",
        ],
    },
    {
        "name": "Snapdragon 8 Gen 1 QRD",
        "os": "12",
        "soc_description": "Qualcomm Snapdragon 8 Gen 1",
        "attributes": [
            "abi:aarch64-android",
            "chipset:qualcomm-snapdragon-8gen1",
            "format:phone",
            "framework:onnx",
            "framework:qnn",
            "framework:tflite",
            "hexagon:v69",
            "htp-supports-weight-sharing:false",
            "os:android",
            "soc-model:36",
            "vendor:qualcomm",
        ],
    },
    {
        "name": "RB3 Gen 2 (Proxy)",
        "os": "12",
        "soc_description": "Qualcomm QCS6490",
        "attributes": [
            "abi:aarch64-android",
            "chipset:qualcomm-qcs6490-proxy",
            "format:iot",
            "framework:onnx",
            "framework:qnn",
            "framework:tflite",
            "hexagon:v68",
            "os:android",
            "soc-model:35",
            "vendor:qualcomm",
        ],
    },
]

README = """EMULATED by HexStudio's AI Hub emulator (tests/aihub_emulator).

This is NOT a {what}. The emulator cannot compile or link anything: this zip only packages the
inputs it was given (see emulated.json and inputs/) so tests can check what would have been sent to
Qualcomm AI Hub. Do not push it to a board as a device result.
"""


def _now_ts() -> Any:
    from google.protobuf import timestamp_pb2

    ts = timestamp_pb2.Timestamp()
    ts.FromSeconds(int(time.time()))
    return ts


class JobRefused(Exception):
    """A check the real service makes failed: the job ends FAILED with this reason."""


def parse_options(options: str, known: dict[str, tuple[str, ...] | None], what: str) -> dict[str, str]:
    """`--name value` / `--flag` pairs, each checked against `known`. Raises JobRefused."""
    try:
        toks = shlex.split(options)
    except ValueError as exc:
        raise JobRefused(f"Failed to parse {what} options {options!r}: {exc}.") from None
    out: dict[str, str] = {}
    i = 0
    while i < len(toks):
        t = toks[i]
        if not t.startswith("--") or t not in known:
            raise JobRefused(
                f"Failed to parse {what} options: unrecognized option '{t}'. "
                f"Valid {what} options: {', '.join(sorted(known))}."
            )
        allowed = known[t]
        if allowed == ():
            out[t] = ""
            i += 1
            continue
        if i + 1 >= len(toks) or toks[i + 1].startswith("--"):
            raise JobRefused(f"Failed to parse {what} options: option '{t}' expects a value.")
        value = toks[i + 1]
        if allowed is not None and value not in allowed:
            raise JobRefused(f"Invalid value '{value}' for option '{t}'. Valid values: {', '.join(allowed)}.")
        # a repeated option: the last value wins, except --qnn_options, whose entries add up (the qai_hub client's
        # submit_compile_and_link_jobs appends its own --qnn_options and --target_runtime to the caller's, and
        # qai-hub-models' LLM options carry --quantize_io twice)
        out[t] = f"{out[t]};{value}" if t == "--qnn_options" and out.get(t) else value
        i += 2
    return out


def qnn_options(value: str) -> dict[str, str]:
    out: dict[str, str] = {}
    for item in (x for x in value.split(";") if x):
        key, eq, val = item.partition("=")
        if key not in QNN_OPTIONS or not eq:
            raise JobRefused(
                f"Invalid --qnn_options entry '{item}': unknown option '{key}'. "
                f"Valid --qnn_options: {', '.join(sorted(QNN_OPTIONS))}."
            )
        out[key] = val
    return out


def qairt_full_version(opts: dict[str, str]) -> str:
    v = opts.get("--qairt_version", DEFAULT_QAIRT)
    if v in ("latest", "default"):
        v = DEFAULT_QAIRT
    full = QAIRT_VERSIONS.get(v) or next(
        (f for f in QAIRT_VERSIONS.values() if f == v or f.startswith(v + ".")), None
    )
    if full is None:
        raise JobRefused(
            f"QAIRT version '{v}' is not available on Qualcomm AI Hub. Available versions: "
            f"{', '.join(QAIRT_VERSIONS)}."
        )
    return full


def _graphs_from_options(options: str) -> list[str]:
    """context_enable_graphs' names, without checking anything (for the log and the package)."""
    try:
        toks = shlex.split(options)
    except ValueError:
        return []
    out: list[str] = []
    for i, t in enumerate(toks):
        if t == "--qnn_options" and i + 1 < len(toks):
            for opt in toks[i + 1].split(";"):
                if opt.startswith("context_enable_graphs="):
                    out.extend(g for g in opt.split("=", 1)[1].split(",") if g)
    return out


def uploaded_model_outputs(model_type: int, data: bytes, is_directory: bool) -> list[str]:
    """The output names of an uploaded ONNX or AIMET-ONNX model, after the checks AI Hub makes on the
    upload (raises JobRefused): a directory holds exactly one .onnx, the .data file it references (if
    any) and, for AIMET, one .encodings in a format AI Hub takes (AIMET_ENCODINGS_FORMATS)."""
    import onnx

    if not is_directory:
        try:
            return [o.name for o in onnx.load_model_from_string(data).graph.output]
        except Exception as exc:  # onnx's DecodeError
            raise JobRefused(f"Failed to load the ONNX model: {exc}") from None
    try:
        z = zipfile.ZipFile(io.BytesIO(data))
    except zipfile.BadZipFile:
        raise JobRefused("The uploaded model directory is not a valid zip archive.") from None
    files = [n for n in z.namelist() if not n.endswith("/")]
    tops = {n.split("/", 1)[0] for n in z.namelist()}
    if len(tops) != 1 or any(n.count("/") != 1 for n in files):
        raise JobRefused(
            "The uploaded model must be a single directory holding its files directly "
            f"(got: {', '.join(sorted(z.namelist()))})."
        )
    base = tops.pop()
    names = [n.split("/", 1)[1] for n in files]
    onnxs = [n for n in names if n.endswith(".onnx")]
    datas = [n for n in names if n.endswith(".data")]
    encs = [n for n in names if n.endswith(".encodings")]
    other = sorted(set(names) - set(onnxs) - set(datas) - set(encs))
    if len(onnxs) != 1 or len(datas) > 1 or len(encs) > 1 or other:
        raise JobRefused(
            f"Model directory '{base}' must contain exactly one .onnx file, at most one .data and "
            f"at most one .encodings file (got: {', '.join(sorted(names))})."
        )
    if model_type == pb.MODEL_TYPE_AIMET_ONNX and len(encs) != 1:
        raise JobRefused(f"AIMET model directory '{base}' has no .encodings file.")
    try:
        model = onnx.load_model_from_string(z.read(f"{base}/{onnxs[0]}"))
    except Exception as exc:  # onnx's DecodeError
        raise JobRefused(f"Failed to load the ONNX model {onnxs[0]}: {exc}") from None
    try:  # types must agree (an fp16 or integer initializer feeds a Cast to float, not a float op directly)
        onnx.shape_inference.infer_shapes(model, check_type=True, strict_mode=True)
    except Exception as exc:  # onnx's InferenceError / ValidationError
        raise JobRefused(f"The ONNX model {onnxs[0]} is not valid: {str(exc)[:300]}") from None
    locations = sorted(
        {e.value for t in model.graph.initializer for e in t.external_data if e.key == "location"}
    )
    for loc in locations:
        if loc not in datas:
            raise JobRefused(
                f"The ONNX model {onnxs[0]} references external data '{loc}', which is not in the "
                f"model directory '{base}' (it holds: {', '.join(sorted(names))})."
            )
    if datas and datas[0] not in locations:
        raise JobRefused(
            f"Model directory '{base}' holds {datas[0]}, which the ONNX model {onnxs[0]} does not "
            "reference as its external data."
        )
    if encs:
        try:
            doc = json.loads(z.read(f"{base}/{encs[0]}"))
        except ValueError as exc:
            raise JobRefused(f"Failed to parse the AIMET encodings {encs[0]}: {exc}") from None
        check_aimet_encodings(encs[0], doc)
    return [o.name for o in model.graph.output]


def check_aimet_encodings(name: str, doc: Any) -> None:
    """An AIMET .encodings document in a format AI Hub takes, its two sections of that format's shape
    (1.0.0: lists of encodings each with a "name"; 0.6.1: dicts keyed by tensor name). Raises JobRefused."""
    version = doc.get("version") if isinstance(doc, dict) else None
    accepted = " and ".join(
        f"{v} ({'lists of named encodings' if lists else 'dicts keyed by tensor name'})"
        for v, lists in AIMET_ENCODINGS_FORMATS.items()
    )
    if version in AIMET_ENCODINGS_UNVERIFIED:
        raise JobRefused(
            f"[emulator] AIMET encodings format {version} in {name}: AIMET writes it, but this emulator "
            f"has no evidence that AI Hub takes it. Export {accepted} instead."
        )
    if not isinstance(version, str) or version not in AIMET_ENCODINGS_FORMATS:
        raise JobRefused(
            f"Unsupported AIMET encodings format in {name}: version {version!r}. "
            f"Supported versions: {accepted}."
        )
    lists = AIMET_ENCODINGS_FORMATS[version]
    for section in ("activation_encodings", "param_encodings"):
        body = doc.get(section)
        ok = (
            (
                isinstance(body, list)
                and all(isinstance(e, dict) and isinstance(e.get("name"), str) for e in body)
            )
            if lists
            else isinstance(body, dict)
        )
        if not ok:
            # the other format's shape under this version: say which version the file's shape is
            other = next(
                (
                    v
                    for v, ls in AIMET_ENCODINGS_FORMATS.items()
                    if ls != lists and isinstance(body, list if ls else dict)
                ),
                None,
            )
            hint = (
                f" Its '{section}' has the shape of format {other}: expected version {other}."
                if other
                else ""
            )
            raise JobRefused(
                f"Malformed AIMET encodings {name}: '{section}' must be "
                f"{'a list of encodings with a name' if lists else 'a dict keyed by tensor name'} "
                f"in format {version}.{hint}"
            )


def _package(what: str, meta: dict[str, Any], inputs: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        z.writestr("README.txt", README.format(what=what))
        z.writestr("emulated.json", json.dumps({"emulated": True, **meta}, indent=2))
        for name, data in inputs.items():
            z.writestr(f"inputs/{name}", data)
    return buf.getvalue()


@dataclass
class _Model:
    pb: Any
    data: bytes | None = None
    parts: dict[int, bytes] = field(default_factory=dict)
    upload_id: str = ""
    filename: str = ""
    device: str = ""  # a produced model: the device it was compiled for
    qairt: str = ""  # ... and the full QAIRT version
    graphs: list[str] = field(default_factory=list)


@dataclass
class _Job:
    job_id: str
    kind: str  # compile | link
    pb: Any  # the api_pb.Job as submitted (filled in by the server)
    created: float
    outcome: str = "success"  # success | failed
    reason: str = ""
    graphs: list[str] = field(default_factory=list)


class AIHubEmulator:
    """Start with `with AIHubEmulator() as emu:` (or .start()/.stop()). `emu.api_url`, `emu.token`."""

    def __init__(
        self,
        token: str = DEFAULT_TOKEN,
        queue_s: float = 0.05,
        run_s: float = 0.15,
        max_part_size: int = 4 << 20,
        port: int = 0,
    ) -> None:
        self.token = token
        self._port = port
        self.queue_s = queue_s
        self.run_s = run_s
        self.max_part_size = max_part_size
        self.devices = [dict(d, attributes=[*d["attributes"], EMULATED_ATTRIBUTE]) for d in DEVICES]
        self.models: dict[str, _Model] = {}
        self.jobs: dict[str, _Job] = {}
        self.files: dict[str, tuple[str, bytes]] = {}
        self.submissions = {"compile": 0, "link": 0}
        self.uploads = 0
        self.requests: list[tuple[str, str, int]] = []
        self.failure_reasons: dict[str, str] = {}
        self.fail_auth = False
        self._rate_limit: int | None = 0
        self._lose_answers = 0
        self._lose_kind: str | None = None
        self._fail_next: list[tuple[str, str, str | None]] = []
        self._held = threading.Event()
        self._lock = threading.RLock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None

    # -- life ----------------------------------------------------------------------------------
    def start(self) -> AIHubEmulator:
        emu = self

        class Handler(_Handler):
            server_emu = emu

        self._server = ThreadingHTTPServer(("127.0.0.1", self._port), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, name="aihub-emulator", daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def __enter__(self) -> AIHubEmulator:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    @property
    def port(self) -> int:
        assert self._server is not None, "start() the emulator first"
        return int(self._server.server_address[1])

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def web_url(self) -> str:
        return self.api_url

    # -- how clients reach it ------------------------------------------------------------------
    def client_config(self, token: str | None = None) -> Any:
        """A qai_hub.ClientConfig for an in-process `qai_hub.Client(config=...)`."""
        from qai_hub import ClientConfig

        return ClientConfig(
            api_token=token or self.token, api_url=self.api_url, web_url=self.web_url, verbose=False
        )

    def worker_env(self) -> dict[str, str]:
        """Environment for a compile worker (hexstudio/workers/aihub.py reads these)."""
        return {
            "HEXSTUDIO_AIHUB_TOKEN": self.token,
            "HEXSTUDIO_AIHUB_API_URL": self.api_url,
            "HEXSTUDIO_AIHUB_WEB_URL": self.web_url,
            **no_proxy_env(),
        }

    def run_settings(self) -> dict[str, Any]:
        """Run settings for a compile through this emulator (consent given, fast polling)."""
        return {
            "compile_target": "aihub",
            "aihub_consent": True,
            "aihub_api_url": self.api_url,
            "aihub_web_url": self.web_url,
            **FAST_RUN_SETTINGS,
        }

    def write_client_ini(self, path: str | Path, token: str | None = None) -> Path:
        """A qai_hub client.ini ([api] api_token, api_url, web_url) pointing here."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(
            f"[api]\napi_token = {token or self.token}\napi_url = {self.api_url}\n"
            f"web_url = {self.web_url}\nverbose = false\n"
        )
        return p

    # -- failure injection ---------------------------------------------------------------------
    def rate_limit(self, n: int | None) -> None:
        """The next n job submissions answer 429 (None: all of them until rate_limit(0))."""
        with self._lock:
            self._rate_limit = n

    def lose_submit_answers(self, n: int, kind: str | None = None) -> None:
        """The next n job submissions (of `kind`, compile or link: None, any) create their job, then the
        connection drops before the answer (a time-out or proxy reset after AI Hub took the job)."""
        with self._lock:
            self._lose_answers, self._lose_kind = n, kind

    def fail_next(self, kind: str, reason: str, graph: str | None = None) -> None:
        with self._lock:
            self._fail_next.append((kind, reason, graph))

    def hold_jobs(self) -> None:
        self._held.set()

    def release_jobs(self) -> None:
        with self._lock:
            # jobs held past their running time finish one run_s after release
            now = time.time()
            for j in self.jobs.values():
                if self._state(j) not in (pb.JOB_STATE_DONE, pb.JOB_STATE_FAILED):
                    j.created = now - self.queue_s
            self._held.clear()

    # -- job clock -----------------------------------------------------------------------------
    def _state(self, j: _Job) -> int:
        age = time.time() - j.created
        if age < self.queue_s:
            return int(pb.JOB_STATE_CREATED)
        running = pb.JOB_STATE_OPTIMIZING_MODEL if j.kind == "compile" else pb.JOB_STATE_LINKING_MODELS
        if self._held.is_set() or age < self.queue_s + self.run_s:
            return int(running)
        return int(pb.JOB_STATE_DONE if j.outcome == "success" else pb.JOB_STATE_FAILED)

    def job_pb(self, j: _Job) -> Any:
        out = pb.Job()
        out.CopyFrom(j.pb)
        state = self._state(j)
        sub = out.compile_job if j.kind == "compile" else out.link_job
        sub.job_state = state  # type: ignore[assignment]
        if state == pb.JOB_STATE_FAILED:
            sub.failure_reason = j.reason
        if state in (pb.JOB_STATE_DONE, pb.JOB_STATE_FAILED):
            out.available_artifacts.append(pb.JOB_ARTIFACT_TYPE_HUB_LOG)
            sub.completion_time.CopyFrom(_now_ts())
        return out

    def hub_log(self, j: _Job) -> bytes:
        state = self._state(j)
        lines = [
            f"[emulated] HexStudio AI Hub emulator log for {j.kind} job {j.job_id}",
            f"[emulated] graphs: {', '.join(j.graphs) or '-'}",
            f"[emulated] state: {pb.JobState.Name(state)}",
        ]
        if state == pb.JOB_STATE_FAILED:
            lines.append(f"[emulated] failure: {j.reason}")
        return ("\n".join(lines) + "\n").encode()

    # -- handlers (called with the lock held) -----------------------------------------------------
    def job_summaries(self, q: dict[str, list[str]]) -> Any:
        """GET job_summaries: newest first, filtered by `type` (compile, link) and paged by offset/limit
        (qai_hub 0.56 public_rest_api.get_job_summary_list)."""
        kind = (q.get("type") or [""])[0]
        offset = int((q.get("offset") or ["0"])[0])
        limit = int((q.get("limit") or ["50"])[0])
        jobs = sorted(
            (j for j in self.jobs.values() if not kind or j.kind == kind),
            key=lambda j: j.created,
            reverse=True,
        )
        out = pb.JobSummaryList(total_query_count=len(jobs))
        for j in jobs[offset : offset + limit]:
            full = self.job_pb(j)
            sub = full.compile_job if j.kind == "compile" else full.link_job
            fields = {
                "job_id": j.job_id,
                "name": sub.name,
                "job_state": sub.job_state,
                "device_name": sub.device.name,
                "creation_time": sub.creation_time,
            }
            if j.kind == "compile":
                out.job_summaries.append(pb.JobSummary(compile_job_summary=pb.CompileJobSummary(**fields)))
            else:
                out.job_summaries.append(pb.JobSummary(link_job_summary=pb.LinkJobSummary(**fields)))
        return out

    def new_id(self, prefix: str) -> str:
        return prefix + uuid.uuid4().hex[:8]

    def create_model(self, model: Any) -> Any:
        mid = self.new_id("m")
        m = pb.Model()
        m.CopyFrom(model)
        m.model_id = mid
        m.creation_time.CopyFrom(_now_ts())
        self.models[mid] = _Model(pb=m, filename=(model.name or mid))
        return pb.CreateUpdateResponse(id=mid, creation_time=m.creation_time)

    def produce_model(
        self,
        name: str,
        model_type: int,
        data: bytes,
        filename: str,
        producer: str,
        device: str = "",
        qairt: str = "",
        graphs: list[str] | None = None,
    ) -> Any:
        mid = self.new_id("m")
        m = pb.Model(
            model_id=mid,
            name=name,
            model_type=model_type,
            producer_id=producer,  # type: ignore[arg-type]
            file_upload_complete=True,
            creation_time=_now_ts(),
        )
        if qairt:
            m.metadata.entries[pb.MODEL_METADATA_KEY_QAIRT_SDK_VERSION] = qairt
        if graphs:
            m.metadata.entries[pb.MODEL_METADATA_KEY_QNN_MODEL_GRAPH_NAMES] = ",".join(graphs)
        self.models[mid] = _Model(
            pb=m, data=data, filename=filename, device=device, qairt=qairt, graphs=list(graphs or [])
        )
        return m

    def check_compile(self, cj: Any, src: _Model) -> tuple[str, list[str], str, list[str]]:
        """(target_runtime, graphs, full QAIRT version, the --output_names that are outputs of the model) of a
        compile job; JobRefused when AI Hub would fail it."""
        opts = parse_options(cj.options, OPTIONS, "compile")
        runtime = opts.get("--target_runtime", "tflite")
        if runtime not in ("qnn_dlc", "qnn_context_binary"):
            raise JobRefused(
                f"[emulator] target runtime '{runtime}' is valid on AI Hub, but this emulator only "
                "compiles to qnn_dlc and qnn_context_binary."
            )
        qairt = qairt_full_version(opts)
        qnn = qnn_options(opts.get("--qnn_options", ""))
        graphs = [g for g in qnn.get("context_enable_graphs", "").split(",") if g]
        if runtime == "qnn_dlc" and len(graphs) != 1:
            raise JobRefused(
                "Compiling to qnn_dlc needs exactly one graph name: --qnn_options "
                f"context_enable_graphs=<name> (got {', '.join(graphs) or 'none'})."
            )
        for g in graphs:
            if not GRAPH_NAME_RE.match(g):
                raise JobRefused(
                    f"Invalid graph name '{g}' in context_enable_graphs: a graph name must start with "
                    "a letter or '_' and hold only letters, digits and '_'."
                )
        if src.pb.model_type not in (pb.MODEL_TYPE_ONNX, pb.MODEL_TYPE_AIMET_ONNX):
            raise JobRefused("[emulator] this emulator compiles ONNX and AIMET-ONNX models only.")
        outputs = uploaded_model_outputs(int(src.pb.model_type), src.data or b"", bool(src.pb.is_directory))
        # --output_names: a name that is not an output of the uploaded model is ignored, not refused.
        # qai-hub-models passes the WHOLE model's outputs (logits, past_key_i_out, past_value_i_out for every
        # layer: _shared/llm/model.py _get_output_names via utils/base_model.py get_hub_compile_options) to the
        # compile of every split part, and parts 1..N-1 have none of logits nor the other parts' KV outputs.
        wanted = [n for n in opts.get("--output_names", "").split(",") if n]
        return runtime, graphs, qairt, [n for n in wanted if n in outputs]

    def check_link(self, lj: Any, ins: list[_Model], dev: dict[str, Any]) -> tuple[list[str], str]:
        """(graphs, full QAIRT version) of a link job; JobRefused when AI Hub would fail it."""
        opts = parse_options(lj.options, LINK_OPTIONS, "link")
        qairt = qairt_full_version(opts)
        qnn_options(opts.get("--qnn_options", ""))
        for src in ins:
            if src.device != dev["name"]:
                raise JobRefused(
                    f"Model {src.pb.model_id} was compiled for {src.device or 'no device'}, not for "
                    f"the link job's device {dev['name']}: link DLCs compiled for the same device."
                )
            if src.qairt != qairt:
                raise JobRefused(
                    f"Model {src.pb.model_id} was compiled with QAIRT {src.qairt or '?'}, but the link "
                    f"job uses QAIRT {qairt}: link DLCs compiled with the same QAIRT version."
                )
        graphs = [g for src in ins for g in src.graphs]
        dup = sorted({g for g in graphs if graphs.count(g) > 1})
        if dup:
            raise JobRefused(
                f"The models to link have graphs with the same name ({', '.join(dup)}): every graph "
                "in a context binary needs a distinct name."
            )
        return graphs, qairt

    def submit(self, job: Any) -> tuple[int, Any]:
        which = job.WhichOneof("job")
        if which not in ("compile_job", "link_job"):
            return 400, {"detail": f"the emulator only runs compile and link jobs, not {which}"}
        kind = "compile" if which == "compile_job" else "link"
        if self._rate_limit is None or self._rate_limit > 0:
            if self._rate_limit:
                self._rate_limit -= 1
            return 429, {"detail": "Request was throttled. Expected available in 60 seconds."}
        jid = self.new_id("j")
        stored = pb.Job()
        stored.CopyFrom(job)
        stored.hub_version = HUB_VERSION
        rec = _Job(jid, kind, stored, time.time())
        refused = ""
        if kind == "compile":
            cj = stored.compile_job
            src = self.models.get(cj.model.model_id)
            if src is None or src.data is None:
                return 400, {"detail": f"Model {cj.model.model_id} does not exist or was not uploaded."}
            devs = list(cj.devices.devices)
            if not devs or not any(d.name == x["name"] for d in devs for x in self.devices):
                return 400, {"detail": "No available device was given."}
            dev = next(x for x in self.devices if x["name"] == devs[0].name)
            used_outputs: list[str] = []
            try:
                runtime, rec.graphs, qairt, used_outputs = self.check_compile(cj, src)
            except JobRefused as exc:
                refused, runtime, qairt = str(exc), "qnn_dlc", ""
                rec.graphs = _graphs_from_options(cj.options)
            cj.compile_job_id = jid
            cj.device.CopyFrom(pb.Device(name=dev["name"], os=dev["os"], attributes=dev["attributes"]))
            cj.model.CopyFrom(src.pb)
            cj.creation_time.CopyFrom(_now_ts())
            dlc = runtime == "qnn_dlc"
            mtype = pb.MODEL_TYPE_QNN_DLC if dlc else pb.MODEL_TYPE_QNN_CONTEXT_BINARY
            ext = ".dlc" if dlc else ".bin"
            data = _package(
                "QNN DLC" if dlc else "QNN context binary",
                {
                    "kind": "compile",
                    "job_id": jid,
                    "device": dev["name"],
                    "options": cj.options,
                    "qairt_version": qairt,
                    "graphs": rec.graphs,
                    "output_names": used_outputs,
                    "input_model_id": src.pb.model_id,
                    "input_name": src.pb.name,
                    "input_sha256": hashlib.sha256(src.data).hexdigest(),
                },
                {f"{src.pb.model_id}.zip": src.data},
            )
            cj.target_model.CopyFrom(
                self.produce_model(
                    f"{cj.name}{ext}",
                    mtype,
                    data,
                    f"{cj.name or jid}{ext}",
                    jid,
                    dev["name"],
                    qairt,
                    rec.graphs,
                )
            )
        else:
            lj = stored.link_job
            ins = []
            for m in lj.models.models:
                src = self.models.get(m.model_id)
                if src is None or src.data is None:
                    return 400, {"detail": f"Model {m.model_id} does not exist."}
                if src.pb.model_type != pb.MODEL_TYPE_QNN_DLC:
                    return 400, {"detail": "Link jobs take QNN DLC models only."}
                ins.append(src)
            ldev: dict[str, Any] | None = next((x for x in self.devices if x["name"] == lj.device.name), None)
            if ldev is None:
                return 400, {"detail": f"Device {lj.device.name} is not available."}
            dev = ldev
            if "framework:qnn" not in dev["attributes"]:
                return 400, {"detail": f"Device {dev['name']} does not support QNN models."}
            try:
                rec.graphs, qairt = self.check_link(lj, ins, dev)
            except JobRefused as exc:
                refused, qairt = str(exc), ""
                rec.graphs = [g for src in ins for g in src.graphs]
            lj.link_job_id = jid
            lj.device.CopyFrom(pb.Device(name=dev["name"], os=dev["os"], attributes=dev["attributes"]))
            lj.models.CopyFrom(pb.ModelList(models=[s.pb for s in ins], total_query_count=len(ins)))
            lj.creation_time.CopyFrom(_now_ts())
            data = _package(
                "QNN context binary",
                {
                    "kind": "link",
                    "job_id": jid,
                    "device": dev["name"],
                    "options": lj.options,
                    "qairt_version": qairt,
                    "graphs": rec.graphs,
                    "weight_sharing": True,
                    "input_model_ids": [s.pb.model_id for s in ins],
                },
                {f"{s.pb.model_id}.dlc": s.data or b"" for s in ins},
            )
            lj.target_model.CopyFrom(
                self.produce_model(
                    f"{lj.name}.bin",
                    pb.MODEL_TYPE_QNN_CONTEXT_BINARY,
                    data,
                    f"{lj.name or jid}.bin",
                    jid,
                    dev["name"],
                    qairt,
                    rec.graphs,
                )
            )
        if refused:
            rec.outcome, rec.reason = "failed", refused
            self.failure_reasons[jid] = refused
        else:
            for i, (k, reason, graph) in enumerate(self._fail_next):
                if k == kind and (graph is None or graph in rec.graphs):
                    rec.outcome, rec.reason = "failed", reason
                    del self._fail_next[i]
                    break
        self.jobs[jid] = rec
        self.submissions[kind] += 1
        return 200, pb.CreateUpdateResponse(id=jid, creation_time=_now_ts())


class _Handler(BaseHTTPRequestHandler):
    server_emu: AIHubEmulator
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args: Any) -> None:
        pass

    # -- plumbing ------------------------------------------------------------------------------
    def _body(self) -> bytes:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            out = bytearray()
            while True:
                size = int(self.rfile.readline().strip() or b"0", 16)
                if size == 0:
                    self.rfile.readline()
                    return bytes(out)
                out += self.rfile.read(size)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _send(self, status: int, body: bytes, ctype: str, extra: dict[str, str] | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", ctype)
        self.send_header("Content-Length", str(len(body)))
        self.send_header("X-HexStudio-Emulated", "true")
        for k, v in (extra or {}).items():
            self.send_header(k, v)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)
        self.server_emu.requests.append((self.command, self.path, status))

    def _reply(self, status: int, obj: Any) -> None:
        if isinstance(obj, dict):
            self._send(status, json.dumps(obj).encode(), "application/json")
        else:
            self._send(status, obj.SerializeToString(), "application/x-protobuf")

    def _route(self) -> None:
        emu = self.server_emu
        parts = urlsplit(self.path)
        q = parse_qs(parts.query)
        path = parts.path
        body = self._body() if self.command in ("POST", "PUT", "PATCH") else b""
        if path.startswith("/_upload/"):
            return self._upload(path, body)
        if path.startswith("/_files/"):
            fid = path.rstrip("/").rsplit("/", 1)[-1]
            with emu._lock:
                f = emu.files.get(fid)
            if f is None:
                return self._reply(404, {"detail": "no such file"})
            return self._send(
                200,
                f[1],
                "application/octet-stream",
                {"Content-Disposition": f'attachment; filename="{f[0]}"'},
            )
        if not path.startswith("/api/v1/"):
            return self._reply(404, {"detail": f"not an AI Hub API path: {path}"})
        if emu.fail_auth or self.headers.get("Authorization") != f"token {emu.token}":
            return self._reply(401, {"detail": "Invalid token."})
        seg = [s for s in path[len("/api/v1/") :].split("/") if s]
        with emu._lock:
            return self._api(seg, q, body)

    def _api(self, seg: list[str], q: dict[str, list[str]], body: bytes) -> None:
        emu = self.server_emu
        cmd = self.command
        if seg == ["users", "auth", "user"] and cmd == "GET":
            return self._reply(
                200,
                pb.User(id=1, first_name="Emulated", last_name="User", email="emulated@hexstudio.invalid"),
            )
        if seg == ["devices"] and cmd == "GET":
            name = (q.get("name") or [""])[0]
            attrs = q.get("attributes") or []
            devs = [
                d
                for d in emu.devices
                if (not name or d["name"] == name) and all(a in d["attributes"] for a in attrs)
            ]
            if (q.get("select") or ["False"])[0].lower() == "true":
                devs = devs[:1]
            return self._reply(
                200,
                pb.DeviceList(
                    devices=[
                        pb.Device(
                            name=d["name"],
                            os=d["os"],
                            attributes=d["attributes"],
                            soc_description=d["soc_description"],
                        )
                        for d in devs
                    ],
                    total_query_count=len(devs),
                ),
            )
        if seg == ["models"] and cmd == "POST":
            m = pb.Model()
            m.ParseFromString(body)
            return self._reply(200, emu.create_model(m))
        if len(seg) >= 2 and seg[0] == "models":
            m_rec = emu.models.get(seg[1])
            if m_rec is None:
                return self._reply(404, {"detail": f"Model {seg[1]} not found."})
            if len(seg) == 2 and cmd == "GET":
                return self._reply(200, m_rec.pb)
            if seg[2:] == ["multipart_upload"] and cmd == "GET":
                size = int((q.get("file_size") or ["0"])[0])
                n = max(1, -(-size // emu.max_part_size))
                m_rec.upload_id = emu.new_id("u")
                m_rec.parts = {}
                urls = [f"{emu.api_url}/_upload/{seg[1]}/{k}" for k in range(n)]
                return self._reply(
                    200,
                    pb.FileUploadResponse(
                        multipart_url=pb.FileMultipartUploadURL(
                            urls=urls, upload_id=m_rec.upload_id, max_part_size=emu.max_part_size
                        )
                    ),
                )
            if seg[2:] == ["multipart_upload"] and cmd == "POST":
                done = pb.FileMultipartUploadComplete()
                done.ParseFromString(body)
                if done.upload_id != m_rec.upload_id or len(done.etags) != len(m_rec.parts):
                    return self._reply(400, {"detail": "upload id or part list does not match"})
                for k, etag in enumerate(done.etags):
                    if f'"{hashlib.md5(m_rec.parts[k]).hexdigest()}"' != etag:
                        return self._reply(400, {"detail": f"ETag of part {k} does not match"})
                m_rec.data = b"".join(m_rec.parts[k] for k in sorted(m_rec.parts))
                m_rec.pb.file_upload_complete = True
                emu.uploads += 1
                return self._reply(200, pb.CreateUpdateResponse(id=seg[1]))
            if seg[2:] == ["download"] and cmd == "GET":
                if m_rec.data is None:
                    return self._reply(404, {"detail": "The model has no file (yet)."})
                producer = emu.jobs.get(m_rec.pb.producer_id)
                if producer is not None and emu._state(producer) != pb.JOB_STATE_DONE:
                    return self._reply(409, {"detail": "The job producing this model has not succeeded."})
                fid = emu.new_id("f")
                emu.files[fid] = (m_rec.filename, m_rec.data)
                return self._reply(
                    200,
                    pb.FileDownloadResponse(
                        url=pb.FileDownloadURL(url=f"{emu.api_url}/_files/{fid}", filename=m_rec.filename)
                    ),
                )
        if seg == ["jobs"] and cmd == "POST":
            job = pb.Job()
            job.ParseFromString(body)
            status, out = emu.submit(job)
            kind = "compile" if job.WhichOneof("job") == "compile_job" else "link"
            if status == 200 and emu._lose_answers > 0 and emu._lose_kind in (None, kind):
                emu._lose_answers -= 1
                self.close_connection = True
                return None
            return self._reply(status, out)
        if seg == ["job_summaries"] and cmd == "GET":
            return self._reply(200, emu.job_summaries(q))
        if len(seg) >= 2 and seg[0] == "jobs":
            j = emu.jobs.get(seg[1])
            if j is None:
                return self._reply(404, {"detail": f"Job {seg[1]} not found."})
            if len(seg) == 2 and cmd == "GET":
                return self._reply(200, emu.job_pb(j))
            if seg[2:4] == ["device_runs", "latest"] and seg[4:5] == ["artifact_list"] and cmd == "GET":
                arts = []
                if seg[5:6] == [str(int(pb.JOB_ARTIFACT_TYPE_HUB_LOG))] and emu._state(j) in (
                    pb.JOB_STATE_DONE,
                    pb.JOB_STATE_FAILED,
                ):
                    fid = emu.new_id("f")
                    emu.files[fid] = (f"{j.job_id}_hub.log", emu.hub_log(j))
                    arts.append(
                        pb.NamedArtifactDownloadURL(
                            url=f"{emu.api_url}/_files/{fid}", filename=f"{j.job_id}_hub.log"
                        )
                    )
                return self._reply(200, pb.NamedArtifactDownloadURLList(artifacts=arts))
        return self._reply(404, {"detail": f"the emulator does not serve {cmd} /api/v1/{'/'.join(seg)}/"})

    def _upload(self, path: str, body: bytes) -> None:
        emu = self.server_emu
        if self.command != "PUT":
            return self._reply(405, {"detail": "PUT only"})
        _, _, mid, k = path.rstrip("/").split("/")
        with emu._lock:
            m = emu.models.get(mid)
            if m is None:
                return self._reply(404, {"detail": "no such upload"})
            m.parts[int(k)] = body
        self._send(200, b"", "text/plain", {"ETag": f'"{hashlib.md5(body).hexdigest()}"'})

    def do_GET(self) -> None:
        self._route()

    def do_POST(self) -> None:
        self._route()

    def do_PUT(self) -> None:
        self._route()

    def do_PATCH(self) -> None:
        self._route()
