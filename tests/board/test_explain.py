"""The error decoder recognises each message documented in facts/board.md and facts/genie.md."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from hexstudio.core.device.explain import RULES, explain, explain_dict, summary
from tests.support.cli import python_m_hexstudio

# (message as the tools print it, expected rule id, a fix id it should point to or None)
DOCUMENTED = [
    ("QnnDsp <E> Failed to create device: 14001", "qnn_device_14001", "udev_rule"),
    ("Device Creation failure", "qnn_device_14001", "daemon_restart"),
    ("QnnDsp <E> Transport layer setup failed: 14001", "qnn_device_14001", "fastrpc_packages"),
    (
        "error while loading shared libraries: libcdsprpc.so: cannot open shared object file: No such file",
        "libcdsprpc_missing",
        "fastrpc_packages",
    ),
    ("remote_handle_open: error 0x8000044f Unable to create FastRPC session", "fastrpc_ebadfd", "group_add"),
    ("apps_dev_init failed 0x80000406", "fastrpc_unable_to_load", "qairt_env"),
    ("fastrpc error 0x80000594", "fastrpc_version_mismatch", "qairt_env"),
    ("error 0x80000600: Please use testsig if using unsigned images", "fastrpc_erpc_unsigned", None),
    ("Stub lib id mismatch: expected (v2.40.0) detected (v2.45.0)", "stub_lib_id_mismatch", "qairt_env"),
    ("<E> Failed to load skel, error: 1008", "skel_1008", "qairt_env"),
    ("Unable to load Remote symbols 1008", "skel_1008", None),
    (
        "QnnHtp <E> Failed to find available PD for contextId 1 ... context size estimate 4400000000",
        "htp_memory",
        None,
    ),
    ("<E> memRegister ERROR", "htp_memory", None),
    ("graph prepare err 1002", "htp_memory", None),
    (
        "Could not create context from binary for context index = 0 : err 5000",
        "context_5000",
        "qairt_install",
    ),
    ("Could not create context from binary: err 5005", "context_5005", None),
    ("Failed to free device: 14003", "free_device_14003", None),
    (
        "libatomic.so.1: cannot open shared object file: No such file or directory",
        "libatomic_missing",
        "qairt_env",
    ),
    ("Qnn getQnnSystemInterface FAILED!", "libatomic_missing", "qairt_env"),
    ("HtpSignedPd: Unsupported config option 2", "htp_signed_pd", None),
    (
        "ERROR: Invalid --profile argument. Output file prof.json already exists.",
        "genie_profile_exists",
        None,
    ),
    ("ERROR:: Please provide prompt using --prompt or --prompt_file.", "genie_no_prompt", None),
    ("bash: genie-t2t-run: command not found", "genie_not_found", "qairt_install"),
    # Genie's contract (facts/genie-contract.md; tests/compile/test_bundle_check.py has more)
    ("Missing backend field: version", "genie_config_missing_key", None),
    ("Unknown dialog config key: foo", "genie_config_unknown_key", None),
    ("Invalid context config: bos-token is not numeric", "genie_config_bad_value", None),
    ("Rope type not supportedyarn", "genie_rope_type", None),
    ("Specify one config from pos-id-dim and positional-encoding", "genie_rope_conflict", None),
    ("Tensor not found: position_ids_sin", "genie_tensor_not_found_rope", None),
    ("Error : Could not find I/O tensors in loaded graphs. ", "genie_tensor_not_found", None),
    ("Non-identical quantization parameters found for the same tensor", "genie_nonidentical_quant", None),
    ("Config specifies context->size=8192, but loaded max-CL=4096", "genie_context_size", None),
    ("NSPModel: Can't access model file : m_part_1_of_3.bin", "genie_model_file", None),
    ("QNN_BACKEND_CANNOT_INITIALIZE (4000)", "qnn_backend_4000", "qairt_env"),
    ("context error 1007", "qnn_1007_oom", None),
    ("Unable to find a valid interface", "qnn_interface", "qairt_env"),
    # QnnCommon.h's common codes and the x86 HTP simulator's own refusals (issue 31's audit)
    ("QnnContext_createFromBinary failed with error 1009", "qnn_1009_loading_binaries", None),
    ("Could not create context from binary: 1008", "qnn_1008_incompatible", None),
    ("Failed to create device: 1400", "qnn_create_device_1400", "qairt_env"),
    ("remote_handle64_open failed 0x80000442", "fastrpc_0x80000442", "qairt_env"),
    ("Shared weights buffer isn't supported on this platform", "x86_shared_weights", None),
    (
        "QNN.backendValidateOpConfig() failed for node `g` of type `Gather` with error code 3110",
        "htp_3110_unsupported",
        None,
    ),
    ("error 0x80000416", "fastrpc_0x80000416", "qairt_env"),
    (
        "ADSP_LIBRARY_PATH=/opt/qairt/lib/hexagon-v73/unsigned:/usr/lib/rfsa/adsp",
        "adsp_path_colon",
        "qairt_env",
    ),
    ("Failed to create the dialog config.", "genie_config_failed", None),
]


@pytest.mark.parametrize(("message", "rule_id", "fix_id"), DOCUMENTED)
def test_each_documented_message(message: str, rule_id: str, fix_id: str | None) -> None:
    ms = explain(message)
    assert ms, message
    assert ms[0].id == rule_id
    assert ms[0].cause and ms[0].fix
    if fix_id:
        assert fix_id in ms[0].fix_ids


def test_every_rule_is_exercised() -> None:
    covered = {r for _, r, _ in DOCUMENTED} | {
        "advise_os_memory",
        "validator_save_results",
        "genie_dialog_failed",
        "rpcmem_dummy_call",
        "fastrpc_permission",
        "dma_heap_permission",
    }
    assert {r.id for r in RULES} <= covered


def test_informational_lines_are_not_a_diagnosis() -> None:
    log = '[WARN]  "Failed to advise OS on memory usage"\nError in saving the results\n'
    d = explain_dict(log)
    assert not d["recognised"]
    assert {m["id"] for m in d["matches"]} == {"advise_os_memory", "validator_save_results"}
    assert all(m["severity"] == "info" for m in d["matches"])
    assert summary(log) is None


def test_genie_log_points_at_the_specific_cause_first() -> None:
    log = (
        "Using libGenie.so version 1.17.0\n"
        '[WARN]  "Failed to advise OS on memory usage"\n'
        "QnnDsp <E> Failed to create device: 14001\n"
        '[ERROR] "Create From Binary FAILED!"\n'
        "Failure to initialize model\nFailed to create the dialog.\n"
    )
    ms = explain(log)
    assert ms[0].id == "qnn_device_14001" and ms[0].line_no == 3
    assert "genie_dialog_failed" not in {m.id for m in ms}  # generic, suppressed by the specific cause
    assert ms[-1].severity == "info"
    only_generic = explain("Failed to create the dialog.")
    assert [m.id for m in only_generic] == ["genie_dialog_failed"]


def test_unrelated_text_is_not_recognised() -> None:
    assert explain("all good, 42 tokens generated") == []


def _cli(*args: str, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return python_m_hexstudio(*args, stdin=stdin, main=True)


def test_cli_text_file_and_stdin(tmp_path: Path) -> None:
    r = _cli("explain", "--json", "Failed to create device: 14001")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["recognised"] and doc["matches"][0]["id"] == "qnn_device_14001"
    log = tmp_path / "genie.log"
    log.write_text("line one\nCould not create context from binary for context index = 0 : err 5000\n")
    r = _cli("explain", "--file", str(log), "--json")
    doc = json.loads(r.stdout)
    assert doc["matches"][0]["id"] == "context_5000" and doc["matches"][0]["line_no"] == 2
    r = _cli("explain", "-", stdin="Unable to create FastRPC session 0x8000044f")
    assert r.returncode == 0 and "fastrpc group" in r.stdout
    r = _cli("explain", "nothing to see")
    assert r.returncode == 1 and "Not recognised" in r.stdout
