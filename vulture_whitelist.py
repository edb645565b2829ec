"""Names vulture reports as unused that are used: read from outside its view, or needed where they stand.

The gates run `vulture hexstudio vulture_whitelist.py --min-confidence 60` (./dev gates): a name listed here
counts as used. Add a name only with a reason in its group; dead code is deleted instead. Bare names are
module-level functions, constants and class fields; `_.name` is an attribute or a method of some object.
"""

# ruff: noqa: B018, F821
# (this file is never run: vulture only reads the names in it)

# Public helpers the tests, the benches or the docs call (the studio itself does not, yet they are its API).
render_calls  # hexstudio/core/eval/toolcall.py (tests/eval/test_toolcall.py)
hf_home  # hexstudio/core/hf.py (tests/support/fake_hub.py, tests/core/test_hf_*.py)
code_command  # hexstudio/core/jobs.py (tests/core/test_launch.py, tests/packaging/test_launch_dispatch.py)
close_logging  # hexstudio/core/logs.py (tests/core/test_logging.py)
validate_manifest  # hexstudio/core/manifest.py (tests/core/test_foundation.py, test_pipeline.py)
BUILTIN_MODEL_DIR  # hexstudio/core/paths.py (tests/model, tests/genie, tests/packaging)
check_run_setting  # hexstudio/core/settings.py (tests/test_bad_inputs.py)
uploaded_weight  # hexstudio/workers/aihub_upload.py (tests/compile/test_aihub_upload.py)
zipped_bytes  # hexstudio/workers/aihub_upload.py (bench/llama8b_shapes.py)
KVState  # hexstudio/workers/arloop.py (tests/model/test_model.py)
read_metadata  # hexstudio/workers/bundle_metadata.py (tests/compile, tests/qnn, docs/compile.md)
BUILTIN_DIR  # hexstudio/workers/model.py (tests/core/test_run_settings.py)
dequantize_weight  # hexstudio/workers/quant/qdq.py (tests/quantize/test_units.py)
STEPS  # hexstudio/workers/quant/smoke.py (tests/model/test_export_fidelity.py)
genie_rope  # hexstudio/shared/bundle/__init__.py (tests/compile/test_bundle.py)
acceptance  # hexstudio/shared/bundle/speculative.py (tests/qnn/test_speculative.py)
ERROR_KEYS  # hexstudio/shared/errors.py (tests/core/test_errors.py)
unregister_family  # hexstudio/shared/families.py (tests/core/test_family_seam.py; the plug-in seam)
event_json_schema  # hexstudio/shared/protocol.py (tests/core/test_foundation.py, WORKER_PROTOCOL.md)
markdown_table  # hexstudio/shared/run_settings.py (tests/core/test_run_settings.py, docs/settings.md)
_.plain_text  # hexstudio/ui/chat_view.py (tests/gui)
_.comparison_html  # hexstudio/ui/dialogs/runs.py (tests/gui/test_studio_ui.py)
_.last_result  # hexstudio/ui/controller.py (tests/gui read what the last stage returned)

# Named constants that document a table they belong to (the codes an outside program uses).
EXIT_OK  # hexstudio/cli/common.py: the CLI's exit codes 0/1/2, beside EXIT_FAILED and EXIT_USAGE
SENTENCE_END  # hexstudio/workers/board/genie_session.py: GenieDialog_SentenceCode_t, unpacked whole
ERR_FILE_NOT_FOUND  # hexstudio/workers/genie_sim/geniex_serve.py: GenieX's error codes, as its header has them
EVENT_TYPES  # hexstudio/shared/protocol.py: the protocol's event types (its docstring names them)
LLAMA  # hexstudio/shared/families.py: each family is registered where it is defined (and
QWEN2  # importable by name for a plug-in that derives its own from it)
QWEN3
MISTRAL
PHI3

# Dataclass and pydantic fields: written to and read from JSON documents (artifacts, reports, the OpenAI
# request body), by the tests, or by name through asdict()/model_dump().
mono  # hexstudio/core/genie/run.py Chunk
total_bytes  # hexstudio/core/remote/sync.py
_.total_bytes
max_completion_tokens  # hexstudio/serve/schema.py (OpenAI request fields the server accepts)
stream_options
function
tool_call_id
tool_choice
data_bytes  # hexstudio/workers/aihub_upload.py UploadStats (tests/compile/test_aihub_upload.py)
fp16_tensors
fp32_tensors
_.data_bytes
_.fp16_tensors
_.fp32_tensors
qnn_dtype  # hexstudio/workers/qnn/context_info.py (fields of the context binary's info, in its JSON)
core_api
backend_api
soc_version
context_blob_size
info_version
max_code_error  # hexstudio/workers/qnn/htp_agreement.py (the HTP agreement document)
mean_code_error
code_range
argmax_agreement
_.argmax_agreement
logits_argmax_agreement
logits_mean_code_error
logits_max_code_error
calibration  # hexstudio/shared/artifacts.py (the stage documents)
weight_sharing
encodings_version
tool
aihub_jobs
qairt_full_version
eos_token_ids  # hexstudio/shared/chat_template.py
intermediate_size  # hexstudio/shared/families.py (a family's config.json key names, read by name)
sim_cycles  # hexstudio/shared/predict.py (the prediction document)
input_fill_bytes
intermediate_fill_bytes
intermediate_spill_bytes
output_spill_bytes
embedding
override_gates  # hexstudio/shared/run_settings.py (run settings, read by name)
eval_suites

# Attributes set for a library that reads them: paramiko (SSH timeouts, SFTP request size), tarfile,
# onnxruntime's SessionOptions, qai_hub's client, aimet's quantsim module, uvicorn's server and cycle,
# http.server, jinja2's extension.
_.banner_timeout  # hexstudio/core/device/connect.py (paramiko Transport)
_.auth_timeout
_.MAX_REQUEST_SIZE  # hexstudio/core/device/transport.py (paramiko SFTPFile)
_.mtime  # hexstudio/core/device/qairt.py (tarfile.TarInfo)
_.intra_op_num_threads  # onnxruntime.SessionOptions
_.inter_op_num_threads
_.log_severity_level
_._polling_interval  # hexstudio/workers/aihub.py (qai_hub client)
_.MAX_RETRIES
_.BACKOFF_FACTOR
_.encoding_version  # hexstudio/workers/quant/partwise.py (aimet_onnx quantsim module)
_.use_symmetric_encodings  # hexstudio/workers/quant/aimet_compat.py (an aimet_onnx quantizer property setter)
_.disconnected  # hexstudio/serve/server.py (uvicorn's RequestResponseCycle)
_.should_exit  # hexstudio/serve/server.py (uvicorn.Server)
_.force_exit
protocol_version  # hexstudio/workers/genie_sim/geniex_serve.py (BaseHTTPRequestHandler)
server_version
_.daemon_threads  # (ThreadingHTTPServer)
tags  # hexstudio/shared/chat_template.py (jinja2.ext.Extension.tags)

# Overrides a framework calls: uvicorn's protocol and server, http.server's handler, Qt's events.
_.send_400_response  # hexstudio/serve/server.py
_.capture_signals
_.log_message  # hexstudio/workers/genie_sim/geniex_serve.py
_.do_OPTIONS
_.do_GET
_.do_POST
_.closeEvent  # hexstudio/ui/main_window.py
_.sizeHint  # hexstudio/ui/plots.py

# References held so that what they point to lives: a ctypes callback Genie calls back into, a running
# asyncio task, a dialog shown modeless.
_._log_cb  # hexstudio/workers/board/genie_session.py
_._shutdown  # hexstudio/ui/main_window.py
_._refresh_task  # hexstudio/ui/pages/workstation.py
_.compare_dialog  # hexstudio/ui/dialogs/runs.py

# hexstudio/ui/pages/chat.py: being split by another change; its names are left as they are for now.
_.splitter
_._closing
_._regen
