"""Error decoder: error messages from Genie, QNN/QAIRT and FastRPC -> cause and fix.

Table-driven (facts/board.md "Error decoder", facts/genie.md). `explain(text)` scans every line of
a log or message and returns what it recognised, most specific first. Each entry may name a doctor
fix id (hexstudio.core.device.fixes) that addresses it.

    from hexstudio.core.device.explain import explain
    for m in explain(stderr): print(m.cause, m.fix)
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass, field
from typing import Any

# severity: "error" (this is why it failed), "warning", "info" (not a diagnosis; do not chase it)


@dataclass(frozen=True)
class Rule:
    id: str
    patterns: tuple[str, ...]
    cause: str
    fix: str
    severity: str = "error"
    fix_ids: tuple[str, ...] = ()
    code: str | None = None
    generic: bool = False  # only reported when nothing more specific matched

    def regexes(self) -> list[re.Pattern[str]]:
        return [re.compile(p, re.IGNORECASE) for p in self.patterns]


RULES: tuple[Rule, ...] = (
    Rule(
        "qnn_device_14001",
        (
            r"Failed to create device:?\s*14001",
            r"Transport layer setup failed:?\s*14001",
            r"Device Creation failure",
            r"\b14001\b",
        ),
        "QNN could not open the HTP device (14001 = QNN_DEVICE_ERROR_INVALID_CONFIG). On the IQ-9075 EVK this "
        "means the FastRPC userspace (libcdsprpc) is missing, the cdsprpcd daemon is not running, or "
        "/dev/fastrpc-cdsp is not accessible to this user. On other chips: the matching skel is not first in "
        "ADSP_LIBRARY_PATH.",
        "Run the board doctor (`hexstudio board probe BOARD`) and apply its FastRPC fixes: install the FastRPC "
        "packages, add the user to the fastrpc group (then log in again), install the udev rule, restart "
        "cdsprpcd. Check ADSP_LIBRARY_PATH points at lib/hexagon-v73/unsigned first.",
        fix_ids=("fastrpc_packages", "group_add", "udev_rule", "daemon_restart", "qairt_env"),
        code="14001",
    ),
    Rule(
        "libcdsprpc_missing",
        (r"libcdsprpc\.so[\d.]*: cannot open shared object file",),
        "The FastRPC userspace library (libcdsprpc.so) is not installed on the board.",
        "Install it: Ubuntu `sudo apt install qcom-fastrpc1 qcom-fastrpc-dev qcom-libdmabufheap-dev` (Qualcomm "
        "IoT PPA) or Debian `libfastrpc1 libfastrpc-dev fastrpc-support`, then `sudo ldconfig`.",
        fix_ids=("fastrpc_packages",),
    ),
    Rule(
        "fastrpc_ebadfd",
        (r"0x8000044f", r"Unable to create FastRPC session"),
        "FastRPC could not open a session (0x8000044f = AEE_EBADFD): this user may not use /dev/fastrpc-cdsp "
        "(not in the fastrpc group, or the device is root-only).",
        "Create the fastrpc group, add the user (`sudo usermod -aG fastrpc USER`), install the udev rule, then "
        "log in again (or reboot). Verify with `id` and `ls -l /dev/fastrpc-cdsp`.",
        fix_ids=("group_add", "udev_rule", "relogin"),
        code="0x8000044f",
    ),
    Rule(
        "fastrpc_unable_to_load",
        (r"0x80000406",),
        "The DSP could not load the skel library (0x80000406 = AEE_EUNABLETOLOAD): libQnnHtpV73Skel.so not "
        "found through ADSP_LIBRARY_PATH, or not loadable.",
        "Set ADSP_LIBRARY_PATH to $QAIRT_HOME/lib/hexagon-v73/unsigned (semicolon-separated) — the QAIRT "
        "environment script does this.",
        fix_ids=("qairt_env",),
        code="0x80000406",
    ),
    Rule(
        "fastrpc_version_mismatch",
        (r"0x80000594",),
        "The CPU-side stub and the DSP-side skel are from different versions (0x80000594).",
        "Use one QAIRT install for both: LD_LIBRARY_PATH and ADSP_LIBRARY_PATH from the same /opt/qairt/<ver>; "
        "do not mix QNN libraries from /usr/lib with /opt/qairt.",
        fix_ids=("qairt_env",),
        code="0x80000594",
    ),
    Rule(
        "fastrpc_erpc_unsigned",
        (r"0x80000600", r"Please use testsig if using unsigned images"),
        "FastRPC call failed (0x80000600 = AEE_ERPC); with 'use testsig' it is a signing / unsigned protection "
        "domain problem.",
        "Run with the unsigned PD (the default for QAIRT on the EVK) and make sure the skel comes from "
        "lib/hexagon-v73/unsigned.",
        fix_ids=("qairt_env",),
        code="0x80000600",
    ),
    Rule(
        "stub_lib_id_mismatch",
        (r"Stub lib id mismatch: expected \(([^)]*)\) detected \(([^)]*)\)",),
        "QNN libraries from two QAIRT versions are loaded together (the stub's id does not match).",
        "Point LD_LIBRARY_PATH and ADSP_LIBRARY_PATH at one QAIRT version; remove other QNN copies from the "
        "library path.",
        fix_ids=("qairt_env",),
    ),
    Rule(
        "skel_1008",
        (r"Failed to load skel, error:?\s*1008", r"Unable to load Remote symbols\s*1008"),
        "The CPU-side and DSP-side libraries come from different SDKs, or ADSP_LIBRARY_PATH is wrong (1008).",
        "Use libQnnHtp*.so and libQnnHtpV73Skel.so from the same /opt/qairt/<ver>; check ADSP_LIBRARY_PATH.",
        fix_ids=("qairt_env",),
        code="1008",
    ),
    Rule(
        "htp_memory",
        (
            r"\berr(?:or)?[ :=]*1002\b",
            r"\b0x3ea\b",
            r"Failed to find available PD",
            r"context size estimate",
            r"memRegister ERROR",
        ),
        "The HTP could not allocate memory for the context: a context above the ~4 GB per-context HTP limit, "
        "or not enough device RAM.",
        "Split the model into more parts (shards) or use a shorter context_length, then compile again.",
        code="1002",
    ),
    Rule(
        "context_5000",
        (r"Could not create context from binary.*\b5000\b", r"\berr(?:or)?[ :=]*5000\b"),
        "The context binary cannot be loaded (5000): the board's QAIRT is older than the one that compiled the "
        "bundle, or the binary was built for another device / dsp_arch.",
        "Install a QAIRT on the board at least as new as the bundle's tool-versions.yaml `qairt:`, and compile "
        "for this board's device (v73 for the IQ-9075).",
        fix_ids=("qairt_install",),
        code="5000",
    ),
    Rule(
        "context_5005",
        (r"Could not create context from binary.*\b5005\b", r"\berr(?:or)?[ :=]*5005\b"),
        "The context binary cannot be loaded (5005): VTCM size, or an unsupported model/device pair.",
        "Compile for this exact device (soc_model and dsp_arch); check the VTCM setting of the compile options.",
        code="5005",
    ),
    Rule(
        "free_device_14003",
        (r"Failed to free device.*14003",),
        "Freeing the device failed (14003); together with 1007 on a 16 GB machine this is out of memory.",
        "Free RAM on the board (stop other processes) or use a smaller model / shorter context.",
        code="14003",
    ),
    Rule(
        "libatomic_missing",
        (r"libatomic\.so\.1: cannot open shared object file", r"getQnnSystemInterface FAILED"),
        "A QAIRT library needs libatomic.so.1, which is not on the library path.",
        "Add $QAIRT_HOME/lib/aarch64-oe-linux-gcc8.2 to LD_LIBRARY_PATH after lib/aarch64-oe-linux-gcc11.2 "
        "(the QAIRT environment script does this).",
        fix_ids=("qairt_env",),
    ),
    Rule(
        "htp_signed_pd",
        (r"HtpSignedPd.*Unsupported config option 2",),
        "This QNN is older and does not know the signed-PD option.",
        "Use the unsigned PD (remove the signed-PD option from htp_backend_ext_config.json).",
        severity="error",
    ),
    Rule(
        "genie_not_found",
        (r"genie-t2t-run: (?:command )?not found", r"genie-t2t-run: No such file"),
        "genie-t2t-run is not on PATH: QAIRT is not installed, or its environment script was not sourced.",
        "Install QAIRT on the board and write the environment script (`source ~/qairt-env.sh`).",
        fix_ids=("qairt_install", "qairt_env"),
    ),
    Rule(
        "genie_profile_exists",
        (r"Invalid --profile argument\. Output file .* already exists",),
        "genie-t2t-run refuses to overwrite an existing --profile file.",
        "Delete the old profile file or pass a new file name.",
    ),
    Rule(
        "genie_no_prompt",
        (r"Please provide prompt using --prompt or --prompt_file",),
        "genie-t2t-run was started without a prompt.",
        "Pass --prompt or --prompt_file (not both).",
    ),
    Rule(
        "fastrpc_permission",
        (r"/dev/fastrpc-\w+.*Permission denied", r"Permission denied.*/dev/fastrpc"),
        "This user may not open the FastRPC device node.",
        "Add the user to the fastrpc group and install the udev rule (MODE 0660, GROUP fastrpc); log in again.",
        fix_ids=("group_add", "udev_rule", "relogin"),
    ),
    Rule(
        "dma_heap_permission",
        (r"/dev/dma_heap/system.*(?:Permission denied|failed)",),
        "Non-root users cannot use /dev/dma_heap/system (fixed upstream in fastrpc udev rules 1.0.6-1).",
        "Install the udev rule that grants the fastrpc group access to /dev/dma_heap/system.",
        fix_ids=("udev_rule",),
    ),
    # -- Genie's contract (genie_config.json schema, graph I/O, quantization): docs/genie.md, `hexstudio bundle check`
    Rule(
        "genie_config_missing_key",
        (r"Missing [\w -]+ field: [\w-]+", r"Missing (?:QnnHtp|binary) (?:dialog|model) config"),
        'genie_config.json lacks a key Genie 1.13 requires (every section needs "version": 1; context needs '
        "bos-token, eos-token, size, n-vocab; QnnHtp needs spill-fill-bufsize, mmap-budget, use-mmap, cpu-mask, "
        "poll). Genie stops at the first missing key.",
        "Add the key the message names (`hexstudio bundle check BUNDLE` lists every problem at once; `hexstudio "
        "bundle config --model HF_FOLDER` prints a complete config).",
    ),
    Rule(
        "genie_config_unknown_key",
        (r"Unknown [\w -]+ config key: \S+", r"Rope scaling parameter not supported \S+"),
        'genie_config.json has a key Genie 1.13 does not know in that section (e.g. "version" inside '
        "positional-encoding or rope-scaling, which have none, or a key from a newer/older Genie).",
        "Remove the key the message names; `hexstudio bundle check BUNDLE` shows each one.",
    ),
    Rule(
        "genie_config_bad_value",
        (
            r"Invalid [\w -]+ config: [\w-]+ is not (?:numeric|boolean|a string|an object|an array)",
            r"unsupported version: ",
            r"Invalid [\w ]+ config: unsupported type: ",
            r"Invalid dialog type: ",
            r"positional-encoding type not supported",
            r"Multiple dialog config key",
            r"ctx-bins must be an array of strings",
        ),
        'A genie_config.json value has the wrong JSON type or an unknown value (a null bos-token, "version": '
        '"1" as a string, a backend type other than QnnHtp...).',
        "Write the value as the message says: numbers for token ids (bos-token -1 when the model has none, never "
        'null), "version": 1, backend.type "QnnHtp", model.type "binary".',
    ),
    Rule(
        "genie_rope_type",
        (r"Rope type not supported\s*\w*",),
        "positional-encoding.rope-scaling.rope-type is one Genie 1.13 does not compute (it knows llama3, default "
        "and longrope).",
        "Write the config again with `hexstudio bundle config`: it expresses linear and YaRN scaling as longrope "
        "factors that reproduce the model's rope exactly.",
    ),
    Rule(
        "genie_rope_conflict",
        (r"Specify one config from (?:pos-id-dim|rope-theta) and positional-encoding",),
        "backend.QnnHtp still has the legacy pos-id-dim / rope-theta while model.positional-encoding is present.",
        "Remove pos-id-dim and rope-theta from backend.QnnHtp.",
    ),
    Rule(
        "genie_tensor_not_found_rope",
        (r"Tensor not found: position_ids_(?:sin|cos)",),
        "The graphs take position_ids and apply rope inside; Genie computes the rotary tables itself from "
        "genie_config.json and feeds position_ids_cos / position_ids_sin [1, 1, AR, head_dim/2].",
        "Export the graphs with rope outside (inputs position_ids_cos and position_ids_sin), then quantize and "
        "compile again.",
    ),
    Rule(
        "genie_tensor_not_found",
        (
            r"Tensor not found",
            r"Could not find I/O tensors in loaded graphs",
            r"has no associated attention mask",
        ),
        "A graph input or output is not named as Genie expects: input_ids (first part), attention_mask, "
        "position_ids_cos/sin, past_key_<l>_in/out, past_value_<l>_in/out, logits (last part).",
        "Run `hexstudio bundle check BUNDLE` to see which tensor; export the graphs with Genie's names and "
        "compile again.",
    ),
    Rule(
        "genie_nonidentical_quant",
        (
            r"Non-identical quantization parameters found for the same tensor",
            r"Error validating HTP models",
            r"Model Validation Errors found",
        ),
        "A tensor shared between graphs (prompt and token graph, a part boundary, attention_mask, cos/sin, or a "
        "past_*_in against its past_*_out) has different scale/offset in different graphs; Genie requires one "
        "encoding per name.",
        "Quantize once for both graphs (one encodings file), tie each past_*_in quantizer to its past_*_out "
        "(8-bit symmetric), give a part boundary one encoding; `hexstudio bundle check BUNDLE` names the tensor.",
    ),
    Rule(
        "genie_context_size",
        (r"Config specifies context->size=\d+, but loaded max-CL=\d+",),
        "dialog.context.size is larger than the context length the graphs were compiled with.",
        "Set dialog.context.size to at most the CL in the graph names (_cl<N>_), or compile for a longer context.",
    ),
    Rule(
        "genie_model_file",
        (r"NSPModel: Can't access model file", r"Received path to an empty file for context index"),
        "A context binary named in ctx-bins is missing or empty (paths are relative to the folder genie-t2t-run "
        "runs in).",
        "Push the bundle again (`hexstudio board push`) and run genie-t2t-run from the bundle folder.",
    ),
    Rule(
        "qnn_backend_4000",
        (
            r"BACKEND_CANNOT_INITIALIZE",
            r"(?:error|err|status)[ :=]*4000\b",
            r"Failed to create backend.*4000",
        ),
        "The QNN HTP backend could not initialize (4000): usually the QNN libraries loaded are not the QAIRT "
        "install's (an older libQnnHtp.so from /usr/lib or /vendor/lib64 first on the library path), or the DSP "
        "side cannot be reached.",
        "Source the QAIRT environment script so LD_LIBRARY_PATH starts with $QAIRT_HOME/lib/aarch64-oe-linux-"
        "gcc11.2 and ADSP_LIBRARY_PATH with lib/hexagon-v73/unsigned; run the board doctor.",
        fix_ids=("qairt_env",),
        code="4000",
    ),
    Rule(
        "qnn_1007_oom",
        (r"(?:error|err|status)[ :=]*1007\b",),
        "The HTP ran out of memory (1007; with `Failed to free device: 14003` on a 16 GB board): the context "
        "binaries and the KV cache do not fit beside what else runs.",
        "Free RAM on the board (stop other processes), or use a smaller model, more parts or a shorter context.",
        code="1007",
    ),
    Rule(
        "qnn_interface",
        (r"Unable to find a valid interface",),
        "QNN loaded a library with no interface it can use: a libQnn*.so from /vendor/lib64 or /usr/lib "
        "(another QNN version) shadows the QAIRT install's.",
        "Put $QAIRT_HOME/lib/aarch64-oe-linux-gcc11.2 first in LD_LIBRARY_PATH (the QAIRT environment script) "
        "and remove the other QNN copies from the library path.",
        fix_ids=("qairt_env",),
    ),
    # QnnCommon.h: QNN_MIN_ERROR_COMMON 1000; +8 INCOMPATIBLE_BINARIES, +9 LOADING_BINARIES, +0 NOT_SUPPORTED
    Rule(
        "qnn_1009_loading_binaries",
        (r"(?:error|err|status)[ :=]*1009\b", r"\b1009\b.*(?:context|binar)", r"(?:context|binar).*\b1009\b"),
        "QNN could not load the context binaries (1009 = QNN_COMMON_ERROR_LOADING_BINARIES in QnnCommon.h): they "
        "were prepared for another target (another SoC model or Hexagon arch than this board's), or are damaged.",
        "Compile for this board's device (the IQ-9075 EVK is soc_model 77, v73); `hexstudio bundle check BUNDLE "
        "--board NAME` compares each binary's SoC model (read by QNN's own reader) with the board's.",
        code="1009",
    ),
    Rule(
        "qnn_1008_incompatible",
        (r"(?:context|binar|graph|create).*\b1008\b", r"\b1008\b.*(?:context|binar)"),
        "QNN refuses the context binary as incompatible (1008 = QNN_COMMON_ERROR_INCOMPATIBLE_BINARIES in "
        "QnnCommon.h): it needs a feature this HTP lacks, typically weight sharing between the prompt processor "
        "and the token generator, which Hexagon v68 and older do not have, or it was built for another arch.",
        "Compile for a v73+ device that matches the board (the IQ-9075 EVK is v73); on an older HTP use one "
        "context binary per graph (no weight sharing).",
        code="1008",
    ),
    Rule(
        "qnn_create_device_1400",
        (r"Failed to create device:?\s*1400\b",),
        "QNN could not create the HTP device (1400). 1400 is not in QnnCommon.h's code tables; it appears when the "
        "backend library cannot bring up the device of this platform: a libQnnHtp for another platform, or the "
        "DSP not reachable (the same family as 14001).",
        "Run the board doctor (`hexstudio board probe NAME`): it checks the QAIRT libraries for this SoC, "
        "FastRPC access and the environment script.",
        fix_ids=("qairt_env", "fastrpc_packages", "group_add"),
        code="1400",
    ),
    Rule(
        "x86_shared_weights",
        (r"Shared weights buffer isn't supported on this platform",),
        "Qualcomm's x86 HTP simulator cannot load context binaries whose graphs share weights (the board's form).",
        "For the simulator board compile with one context binary per graph (compile_target local with --board "
        "sim); push the shared-weight bundle to a real board.",
        code="x86_shared_weights",
    ),
    Rule(
        "htp_3110_unsupported",
        (r"with error code 3110", r"backendValidateOpConfig\(\) failed"),
        "QNN HTP refused a node (3110): its datatypes are not supported in that form for this htp_arch (e.g. a "
        "Gather over a raw uint16 table, or int4 weights on the default v68).",
        "Give the QNN EP htp_arch (73 for the IQ-9075) and put the graph in HTP's form (HexStudio's local compile "
        "does both: docs/compile.md).",
        code="3110",
    ),
    Rule(
        "fastrpc_0x80000442",
        (r"0x80000442",),
        "The DSP loaded a skel from the wrong folder (0x80000442): ADSP_LIBRARY_PATH is separated with ':' but "
        "the DSP loader splits it on ';', so it falls back to the vendor's older libQnnHtpV73Skel.so in "
        "/usr/lib/rfsa/adsp or /dsp, which does not match QAIRT's CPU-side libraries.",
        "Separate ADSP_LIBRARY_PATH entries with ';' and put $QAIRT_HOME/lib/hexagon-v73/unsigned first; the "
        "QAIRT environment script writes it right.",
        fix_ids=("qairt_env",),
        code="0x80000442",
    ),
    Rule(
        "fastrpc_0x80000416",
        (r"0x80000416",),
        "A FastRPC call into the DSP failed (0x80000416): the DSP-side skel library was not found or is not the "
        "one the CPU side expects (a wrong ADSP_LIBRARY_PATH, or stub and skel from different QAIRT versions).",
        "Set ADSP_LIBRARY_PATH to $QAIRT_HOME/lib/hexagon-v73/unsigned (';'-separated) from the same QAIRT as "
        "LD_LIBRARY_PATH; run the board doctor.",
        fix_ids=("qairt_env",),
        code="0x80000416",
    ),
    Rule(
        "adsp_path_colon",
        (
            r"ADSP_LIBRARY_PATH=[^;\s]*:[^\s]*",
            r"Failed to load skel.*libQnnHtpV\d+Skel",
            r"libQnnHtpV\d+Skel\.so.*(?:not found|cannot open|failed)",
        ),
        "The DSP could not load the versioned skel (libQnnHtpV73Skel.so): ADSP_LIBRARY_PATH is separated with ':' "
        "but the DSP loader splits it on ';', so the whole value is read as one folder that does not exist.",
        "Separate ADSP_LIBRARY_PATH entries with ';' (e.g. \"$QAIRT_HOME/lib/hexagon-v73/unsigned;/usr/lib/rfsa/"
        'adsp;/dsp"); the QAIRT environment script writes it right.',
        fix_ids=("qairt_env",),
    ),
    Rule(
        "genie_config_failed",
        (r"Failed to create the dialog config",),
        "genie-t2t-run refused genie_config.json (the line before it says which key).",
        "Run `hexstudio bundle check BUNDLE`: it reports every schema error with the fix.",
        generic=True,
    ),
    Rule(
        "genie_dialog_failed",
        # not "Failed to create the dialog config." (genie_config_failed): the config, not the binaries
        (
            r"Create From Binary FAILED",
            r"Failure to initialize model",
            r"Failed to create the dialog(?! config)",
        ),
        "Genie could not load the model's context binaries (the line before it usually says why).",
        "Look for a QNN/FastRPC error code earlier in the log (14001, 5000, 1002...) and run the board doctor.",
        generic=True,
    ),
    Rule(
        "advise_os_memory",
        (r"Failed to advise OS on memory usage",),
        "A warning from the memory-mapping code, not a diagnosis.",
        "Ignore it; look for the real error.",
        severity="info",
    ),
    Rule(
        "validator_save_results",
        (r"Error in saving the results",),
        "qnn-platform-validator could not write its result file; the check itself still ran.",
        "Ignore it; read the 'Backend ...' and 'Unit Test' lines.",
        severity="info",
    ),
    Rule(
        "rpcmem_dummy_call",
        (r"rpcmem_android\.c.*dummy",),
        "Informational rpcmem message.",
        "Ignore it.",
        severity="info",
    ),
)


@dataclass
class Match:
    id: str
    severity: str
    cause: str
    fix: str
    fix_ids: list[str] = field(default_factory=list)
    code: str | None = None
    line: str = ""
    line_no: int = 0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def explain(text: str) -> list[Match]:
    """Every rule that matches some line of `text` (once per rule, at its first line), errors first."""
    compiled = [(r, r.regexes()) for r in RULES]
    found: dict[str, Match] = {}
    for no, line in enumerate(text.splitlines(), 1):
        for rule, regexes in compiled:
            if rule.id in found:
                continue
            if any(rx.search(line) for rx in regexes):
                found[rule.id] = Match(
                    rule.id,
                    rule.severity,
                    rule.cause,
                    rule.fix,
                    list(rule.fix_ids),
                    rule.code,
                    line.strip()[:500],
                    no,
                )
    matches = list(found.values())
    if any(m.severity == "error" and not _rule(m.id).generic for m in matches):
        matches = [m for m in matches if not _rule(m.id).generic]
    order = {"error": 0, "warning": 1, "info": 2}
    matches.sort(key=lambda m: (order.get(m.severity, 3), m.line_no))
    return matches


def _rule(rule_id: str) -> Rule:
    for r in RULES:
        if r.id == rule_id:
            return r
    raise KeyError(rule_id)


def explain_dict(text: str) -> dict[str, Any]:
    ms = explain(text)
    return {"recognised": any(m.severity != "info" for m in ms), "matches": [m.to_dict() for m in ms]}


def summary(text: str) -> str | None:
    """One line 'cause -> fix' for the most relevant match (for error hints), or None."""
    for m in explain(text):
        if m.severity != "info":
            return f"{m.cause} What to do: {m.fix}"
    return None
