"""`hexstudio bundle check`: does a Genie bundle meet Genie's contract, before it goes to a board?

Works on any bundle folder: HexStudio's own (bundle.json), or one laid out as qai-hub-models lays it
out (genie_config.json, `<model>_part_{i}_of_{n}.bin`, metadata.yaml, tool-versions.yaml,
htp_backend_ext_config.json, tokenizer.json, tokenizer_config.json, config.json). Each finding names
the Genie error it prevents (Genie's exact text where Genie has one) and what to do about it.

    from hexstudio.shared.bundle.check import check_bundle
    for f in check_bundle(Path("bundle"), board_facts): print(f.severity, f.message, f.fix)

`board_facts` are the board doctor's facts (hexstudio/core/device/doctor.py): dsp_arch, chip, soc_id,
qairt_version. Pure Python + yaml (hexstudio.core imports it for push and the doctor).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from hexstudio.shared.bundle import KNOWN_DEVICES, bundle_qairt_version, safepath, speculative, version_tuple
from hexstudio.shared.bundle import genie_model as gm
from hexstudio.shared.bundle import genie_schema as gs
from hexstudio.shared.chat_template import added_bos, token_text

ERROR, WARNING, INFO = "error", "warning", "info"
NO_MESSAGE = "(none: Genie loads the bundle and the model computes wrong output)"


@dataclass
class Finding:
    code: str
    severity: str  # error | warning | info
    message: str  # what is wrong, in this bundle
    genie_error: str | None  # what Genie prints when it meets this (exact text where it has one)
    fix: str  # what to do

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def errors(findings: list[Finding]) -> list[Finding]:
    return [f for f in findings if f.severity == ERROR]


def report_text(findings: list[Finding]) -> str:
    """The findings as a person reads them (errors first)."""
    order = {ERROR: 0, WARNING: 1, INFO: 2}
    lines = []
    for f in sorted(findings, key=lambda f: order.get(f.severity, 3)):
        lines.append(f"[{f.severity.upper()}] {f.code}: {f.message}")
        if f.genie_error:
            lines.append("  Genie says: " + f.genie_error.replace("\n", "\n              "))
        if f.fix:
            lines.append(f"  Fix: {f.fix}")
    return "\n".join(lines)


# -- the genie_config.json schema ------------------------------------------------------------------------
# Genie's schema messages (re.search patterns, in the order tried) -> what to do; {0}, {1}... are the groups
_SCHEMA_FIXES: tuple[tuple[str, str], ...] = (
    (
        r"^Missing (.+) field: version$",
        'Add "version": 1 to the {0} section of genie_config.json (Genie requires it in every section that '
        "has one).",
    ),
    (
        r"^Missing (.+) field: (.+)$",
        'Add "{1}" to the {0} section of genie_config.json (Genie requires it; `hexstudio bundle config '
        "--model HF_FOLDER` prints a complete config for the model).",
    ),
    (
        r"^Unknown (.+?) config key: (.+)$",
        'Remove "{1}" from the {0} section of genie_config.json: Genie 1.13 does not know it and refuses the '
        "whole file.",
    ),
    (
        r"^Rope scaling parameter not supported",
        "Remove that key from positional-encoding.rope-scaling (Genie knows rope-type, factor, "
        "low-freq-factor, high-freq-factor, original-max-position-embeddings, short-factor, long-factor).",
    ),
    (r"unsupported version", 'Set "version": 1 there (the only version Genie 1.13 knows).'),
    (
        r"^Invalid (.+) config: (.+) is not (.+)$",
        "Write {1} in the {0} section as {2} JSON value (bos-token: -1 when the model has none, never null).",
    ),
    (
        r"^Rope type not supported",
        "Genie 1.13 knows rope-type llama3, default and longrope. Write the config again with "
        "`hexstudio bundle config`: it expresses linear and YaRN scaling as longrope factors.",
    ),
    (
        r"^Specify one config from",
        "Remove pos-id-dim and rope-theta from backend.QnnHtp: model.positional-encoding carries them.",
    ),
    (
        r"unsupported type|^Invalid dialog type|^positional-encoding type",
        "Use a value Genie knows: dialog.type basic, backend.type QnnHtp, model.type binary, "
        "positional-encoding.type rope.",
    ),
    (r"^Multiple dialog config key", 'genie_config.json names "dialog" twice: keep one.'),
)


def _schema_fix(msg: str) -> str:
    for pattern, fix in _SCHEMA_FIXES:
        m = re.search(pattern, msg)
        if m:
            return fix.format(*m.groups())
    return (
        "Correct genie_config.json as the message says (`hexstudio bundle config --model HF_FOLDER` prints a "
        "complete config)."
    )


def _config_findings(text: str) -> tuple[dict[str, Any] | None, list[Finding]]:
    out = []
    for i, msg in enumerate(gs.genie_config_text_errors(text)):
        note = "" if i == 0 else " (Genie stops at the first error; this one is next)"
        out.append(
            Finding(
                "config_schema",
                ERROR,
                f"genie_config.json: {msg}{note}",
                f"{msg}\n{gs.CONFIG_FAILED}",
                _schema_fix(msg),
            )
        )
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return None, out
    if not out:
        for issue in gs.dialog_create_errors(doc):
            fix = {
                "dialog.sampler": 'Add "sampler": {"version": 1, "seed": 42, "temp": 0.8, "top-k": 40, '
                '"top-p": 0.95} to dialog.',
                "dialog.engine.backend.QnnHtp.kv-dim": 'Add "kv-dim": <head_dim> to backend.QnnHtp (128 for '
                "Llama 3).",
            }.get(issue.key, f"Add the missing value at {issue.key} (`hexstudio bundle config` writes it).")
            out.append(
                Finding(
                    "config_load",
                    ERROR,
                    f"genie_config.json {issue.key}: {issue.message}",
                    f"{issue.message}\n{gs.DIALOG_FAILED}" if issue.genie_text else None,
                    fix,
                )
            )
    return (doc if isinstance(doc, dict) else None), out


# -- graph specs -----------------------------------------------------------------------------------------
_COMPONENT = re.compile(r"^(prompt|token)_(\d+_of_\d+)$")


def graphs_from_metadata(doc: dict[str, Any], context_size: int | None = None) -> dict[str, dict[str, Any]]:
    """metadata.yaml components keyed by Genie graph name (`prompt_1_of_2` -> `prompt_ar128_cl4096_1_of_2`,
    as qai-hub-models names the graphs): AR and CL from the component's shapes as Genie reads them; a part
    whose shapes carry no CL (the embedding-only first part) takes its siblings' CL, else the config's."""
    comps: dict[str, tuple[dict[str, Any], tuple[int, int] | None]] = {}
    for comp, spec in (doc.get("components") or {}).items():
        if not isinstance(spec, dict):
            continue
        spec = {"inputs": spec.get("inputs") or {}, "outputs": spec.get("outputs") or {}}
        try:
            comps[str(comp)] = (spec, gm.variant_of(str(comp), spec))
        except ValueError:
            comps[str(comp)] = (spec, None)
    sibling_cl: dict[str, int] = {}
    for comp, (_, v) in comps.items():
        m = _COMPONENT.match(comp)
        if m and v and v[1] > 0:
            sibling_cl[m.group(1)] = max(sibling_cl.get(m.group(1), 0), v[1])
    out: dict[str, dict[str, Any]] = {}
    for comp, (spec, v) in comps.items():
        m = _COMPONENT.match(comp)
        if m and v:
            cl = v[1] if v[1] > 0 else sibling_cl.get(m.group(1)) or context_size or v[1]
            out[f"{m.group(1)}_ar{v[0]}_cl{cl}_{m.group(2)}"] = spec
        else:
            out[comp] = spec
    return out


def _descriptor_graphs(path: Path) -> dict[str, dict[str, Any]]:
    """Graph specs from a simulated context binary (a JSON descriptor): {"graphs": {name: spec}} or
    {"graphs": [{"name", "inputs", "outputs"}]} or one graph {"name", "inputs", "outputs"}."""
    try:
        doc = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError):
        return {}
    if not isinstance(doc, dict):
        return {}
    g = doc.get("graphs")
    if isinstance(g, dict):
        return {str(k): v for k, v in g.items() if isinstance(v, dict)}
    items = g if isinstance(g, list) else [doc]
    return {
        str(e["name"]): {"inputs": e.get("inputs") or {}, "outputs": e.get("outputs") or {}}
        for e in items
        if isinstance(e, dict) and "name" in e and isinstance(e.get("inputs"), dict)
    }


def _names_only(entries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """graphs.json / quantize.json entries (tensor names without shapes)."""
    out = {}
    for e in entries:
        if isinstance(e, dict) and "name" in e:
            io = e.get("io") if isinstance(e.get("io"), dict) else None
            if io and isinstance(io.get("inputs"), dict):
                out[str(e["name"])] = {"inputs": io["inputs"], "outputs": io.get("outputs") or {}}
            else:
                out[str(e["name"])] = {
                    "inputs": {n: {} for n in e.get("inputs") or []},
                    "outputs": {n: {} for n in e.get("outputs") or []},
                }
    return out


def load_graph_specs(
    bundle: Path, ctx_bins: list[str], context_size: int | None = None
) -> tuple[dict[str, dict[str, Any]], str]:
    """(graph specs by graph name, where they came from)."""
    specs: dict[str, dict[str, Any]] = {}
    # a simulated context binary is a small JSON document (hexstudio/workers/genie_sim/simbin.py)
    for b in ctx_bins:
        p = bundle / b
        try:
            with open(p, "rb") as fh:
                is_json = fh.read(1) == b"{"
        except OSError:
            is_json = False
        if is_json:
            specs.update(_descriptor_graphs(p))
    if specs:
        return specs, "the simulated context binaries"
    meta = bundle / "metadata.yaml"
    if meta.is_file():
        import yaml

        try:
            doc = yaml.safe_load(meta.read_text(encoding="utf-8"))
        except (OSError, yaml.YAMLError):
            doc = None
        if isinstance(doc, dict):
            return graphs_from_metadata(doc, context_size), "metadata.yaml"
    gj = bundle / "graphs.json"
    if gj.is_file():
        try:
            doc = json.loads(gj.read_text(encoding="utf-8"))
            return _names_only(doc.get("graphs") or []), "graphs.json (tensor names only)"
        except (OSError, json.JSONDecodeError, AttributeError):
            pass
    return {}, ""


# -- the checks ------------------------------------------------------------------------------------------
_BIN = re.compile(r"^(?P<model>.+?)_(?:part_)?(?P<i>\d+)_of_(?P<n>\d+)(?P<ext>\.serialized\.bin|\.bin)$")
_GRAPH = re.compile(r"^(?P<kind>prompt|token)_ar(?P<ar>\d+)_cl(?P<cl>\d+)_(?P<i>\d+)_of_(?P<n>\d+)$")


_KIND_BIN = re.compile(
    r"^(?P<model>.+?)_(?P<kind>(?:prompt|token)(?:_ar\d+)?(?:_cl\d+)?)_part_"
    r"(?P<rest>\d+_of_\d+(?:\.serialized)?\.bin)$"
)


def _part_findings(bins: list[str], shown: list[str]) -> list[Finding]:
    """`bins` (names as <model>_part_<i>_of_<n>.bin) form one model's parts 1..n; `shown`: the names to print."""
    out = []
    parsed = [_BIN.match(Path(b).name) for b in bins]
    if not bins or not all(parsed):
        bad = [b for b, m in zip(shown, parsed, strict=True) if not m]
        if bad:
            out.append(
                Finding(
                    "ctx_bin_names",
                    WARNING,
                    f"ctx-bins {', '.join(bad)} are not named "
                    "<model>_part_<i>_of_<n>.bin, so the parts cannot be checked for completeness.",
                    None,
                    "Name the context binaries as qai-hub-models does: <model>_part_1_of_5.bin ...",
                )
            )
        return out
    models = {m.group("model") for m in parsed if m}
    totals = {int(m.group("n")) for m in parsed if m}
    idx = [int(m.group("i")) for m in parsed if m]
    if (
        len(models) > 1
        or len(totals) > 1
        or totals != {len(bins)}
        or sorted(idx) != list(range(1, len(bins) + 1))
    ):
        out.append(
            Finding(
                "ctx_bin_names",
                ERROR,
                f"ctx-bins do not form one model's parts 1..n: {', '.join(shown)}.",
                "Tensor not found (the last split's logits, or a part's hidden state is never written)",
                "List every part of one model once: <model>_part_1_of_N.bin ... <model>_part_N_of_N.bin.",
            )
        )
    elif idx != sorted(idx):
        out.append(
            Finding(
                "ctx_bin_order",
                WARNING,
                f"ctx-bins are not in part order: {', '.join(shown)}.",
                None,
                "List them as part 1, 2, ... n (Genie orders splits by graph name, but people read this "
                "list).",
            )
        )
    return out


def _ctx_bin_findings(bundle: Path, bins: list[str]) -> list[Finding]:
    out = []
    for i, b in enumerate(bins):
        p = bundle / b
        if not p.is_file():
            out.append(
                Finding(
                    "ctx_bin_missing",
                    ERROR,
                    f"ctx-bins[{i}] {b} is not in the bundle.",
                    f"NSPModel: Can't access model file : {b}\n{gs.DIALOG_FAILED}",
                    "Copy the context binary into the bundle folder (or download the bundle again); "
                    "ctx-bins paths are relative to the folder genie-t2t-run runs in.",
                )
            )
        elif p.stat().st_size == 0:
            out.append(
                Finding(
                    "ctx_bin_empty",
                    ERROR,
                    f"ctx-bins[{i}] {b} is an empty file.",
                    f"Received path to an empty file for context index = {i}. Nothing to deserialize.",
                    "Download or compile that part again.",
                )
            )
    # a local compile for the x86 simulator writes one binary per graph: <model>_{prompt|token}_part_<i>_of_<n>.bin,
    # <model>_prompt_ar<AR>_part_... for another AR (ar_sizes), <model>_{prompt|token}[_ar<AR>]_cl<CL>_part_... for
    # another context length; each kind, AR and CL forms parts 1..n
    groups: dict[str, list[str]] = {}
    for b in bins:
        m = _KIND_BIN.match(Path(b).name)
        groups.setdefault(m.group("kind") if m else "", []).append(
            f"{m.group('model')}_part_{m.group('rest')}" if m else b
        )
    for kind, names in groups.items():
        out += _part_findings(
            names, bins if not kind else [b for b in bins if f"_{kind}_part_" in Path(b).name]
        )
    return out


def _obj(doc: Any, *keys: str) -> dict[str, Any]:
    """doc[k1][k2]... when every step is an object, else {}."""
    for k in keys:
        doc = doc.get(k) if isinstance(doc, dict) else None
    return doc if isinstance(doc, dict) else {}


def _graph_findings(graphs: dict[str, dict[str, Any]], source: str, cfg: dict[str, Any]) -> list[Finding]:
    size = _obj(cfg, "dialog", "context").get("size")
    htp = _obj(cfg, "dialog", "engine", "backend", "QnnHtp")
    pe = _obj(cfg, "dialog", "engine", "model").get("positional-encoding")
    kv_dim = htp.get("kv-dim") if isinstance(htp.get("kv-dim"), int) else None
    rope_dim = (pe or {}).get("rope-dim") if isinstance(pe, dict) else htp.get("pos-id-dim", 64)
    ptype = pe.get("type", "rope") if isinstance(pe, dict) else "rope"
    issues = gm.model_issues(
        graphs,
        size if isinstance(size, int) else None,
        kv_dim=kv_dim,
        rope_dim=rope_dim if isinstance(rope_dim, int) else None,
        positional=ptype if isinstance(ptype, str) else "rope",
    )
    lines = gm.genie_lines(issues)
    out = []
    fixes = {
        "tensor_not_found": "Export the graphs with Genie's I/O names (input_ids, attention_mask, position_ids_cos, "
        "position_ids_sin, past_key_<l>_in/out, past_value_<l>_in/out, logits) and compute rope "
        "outside the graph; re-run Quantize and Compile.",
        "shape": "Export the graphs in Genie's layout (attention_mask [1,1,AR,CL], cos/sin [1,1,AR,head_dim/2], "
        "past_key [KVH,1,HD,CL-AR], past_value [KVH,1,CL-AR,HD]) and set QnnHtp.kv-dim to head_dim.",
        "non_identical_quant": "Quantize once for both graphs (one encodings file for AR-128 and AR-1), tie each "
        "past_*_in quantizer to its past_*_out, and give a part boundary one encoding; "
        "re-run Quantize and Compile.",
        "context_size": "Set dialog.context.size to at most the graphs' CL (the _cl<N>_ in their names), or "
        "compile for a longer context.",
        "variant": "Name graphs {prompt|token}_ar<AR>_cl<CL>_<i>_of_<n> and give them input_ids/attention_mask.",
        "kv_pair": "Every past_key_<l> tensor needs its past_value_<l> twin.",
        "split_chain": "Give each part boundary ONE name: the output of part k and the input of part k+1 must be "
        "the same tensor name (qai-hub-models: _model_model_layers_<l>_Add_1_output_0).",
        "split_order": "Zero-pad the part number in graph names when there are 10 or more parts.",
        "split_count": "Compile and link every part of the model; each variant needs parts 1..n.",
        "cos_sin_quant": "Give position_ids_sin the same encoding as position_ids_cos (one range covering "
        "both tables).",
        "kv_asymmetric": "Quantize the KV cache 8-bit symmetric (offset -128), as qai-hub-models does.",
        "kv_untied": "Tie each past_*_in quantizer to its past_*_out (one encoding per layer's key and value).",
        "mask_quant": "Calibrate attention_mask on [-X, 0] (e.g. [-50, 0] for w4a16) so its largest code is 0.0.",
    }
    for i in issues:
        where = f"{i.graph}: {i.tensor}" if i.graph and i.tensor else (i.graph or i.tensor or "the graphs")
        genie = None
        if i.genie:
            genie = (
                "\n".join(lines)
                if i.stage == "validate" and lines and lines[0] == gm.BLOCK_HEAD
                else f"{i.message}\n{gm.TENSORS_FAILED}"
                if i.stage == "tensors"
                else i.message
            )
            genie += f"\n{gs.DIALOG_FAILED}"
        label = "Genie refuses the load" if i.genie else "HexStudio finding (Genie does not check this)"
        out.append(
            Finding(
                f"graph_{i.code}",
                ERROR,
                f"{where} - {i.message} [{label}; from {source}]",
                genie if i.genie else NO_MESSAGE,
                fixes.get(i.code, "See docs/genie.md."),
            )
        )
    # graph names (AR/CL) against their shapes
    for name, spec in graphs.items():
        m = _GRAPH.match(name)
        if not m:
            continue
        try:
            ar, cl = gm.variant_of(name, spec)
        except ValueError:
            continue
        if (
            (ar, cl) != (int(m.group("ar")), int(m.group("cl")))
            and spec.get("inputs")
            and any(isinstance(t, dict) and t.get("shape") for t in spec["inputs"].values())
        ):
            out.append(
                Finding(
                    "graph_name_variant",
                    WARNING,
                    f"{name}: the name says AR {m.group('ar')} CL "
                    f"{m.group('cl')}, the shapes say AR {ar} CL {cl} (Genie believes the shapes).",
                    None,
                    "Name the graph after its shapes.",
                )
            )
    return out


def _cl_from_names(names: list[str]) -> set[int]:
    return {
        int(m.group("cl")) for n in names if (m := _GRAPH.match(Path(n).stem if n.endswith(".onnx") else n))
    }


def _context_findings(
    cfg: dict[str, Any], graphs: dict[str, dict[str, Any]], bins: list[str]
) -> list[Finding]:
    size = ((cfg.get("dialog") or {}).get("context") or {}).get("size")
    if not isinstance(size, int):
        return []
    cls = _cl_from_names(list(graphs)) or _cl_from_names(bins)
    out = []
    if cls and not graphs and size > max(cls):  # without specs the names are all there is
        out.append(
            Finding(
                "context_size",
                ERROR,
                f"dialog.context.size {size} exceeds the graphs' CL {max(cls)} (from their names).",
                "Failure to initialize model. Config specifies "
                f"context->size={size}, but loaded max-CL={max(cls)}\n{gs.DIALOG_FAILED}",
                f"Set dialog.context.size to {max(cls)} or compile for {size}.",
            )
        )
    if cls and size < max(cls):
        out.append(
            Finding(
                "context_size_small",
                WARNING,
                f"dialog.context.size {size} is below the graphs' CL "
                f"{max(cls)}: Genie accepts it, but conversations stop at {size} tokens.",
                None,
                f"Set dialog.context.size to {max(cls)}.",
            )
        )
    return out


def _rope_findings(cfg: dict[str, Any], hf: dict[str, Any] | None) -> list[Finding]:
    from hexstudio.shared import rope

    d = cfg.get("dialog") or {}
    size = (d.get("context") or {}).get("size")
    eng = d.get("engine") if isinstance(d.get("engine"), dict) else None
    if hf is None or eng is None or not isinstance(size, int):
        return (
            [
                Finding(
                    "rope_unchecked",
                    WARNING,
                    "The bundle has no config.json: its rope settings cannot be compared with the model's.",
                    None,
                    "Put the model's Hugging Face config.json into the bundle (qai-hub-models does).",
                )
            ]
            if hf is None
            else []
        )
    htp = (eng.get("backend") or {}).get("QnnHtp") or {}
    pe = (eng.get("model") or {}).get("positional-encoding")
    if not isinstance(pe, dict):  # legacy: rope with pos-id-dim / QnnHtp.rope-theta, no scaling
        pe = {
            "type": "rope",
            "rope-dim": htp.get("pos-id-dim", 64),
            "rope-theta": htp.get("rope-theta", 10000),
        }
    out = []
    fix = (
        "Write positional-encoding from the model's own config.json (`hexstudio bundle config --model HF_FOLDER` "
        "prints it; never a hard-coded factor)."
    )
    try:
        effect = rope.rope_effect(pe, hf, size)
    except (
        rope.RopeError,
        KeyError,
        TypeError,
        ValueError,
    ) as exc:  # Genie cannot compute what the model needs
        out.append(
            Finding(
                "rope_mismatch",
                ERROR,
                f"The rope Genie computes from genie_config.json differs from "
                f"the model's config.json: {exc}.",
                NO_MESSAGE,
                fix,
            )
        )
        effect = None
    if effect is not None:
        # Genie loads it and runs: a warning with the measured effect, not a refusal (Qualcomm's own Llama 3.2
        # bundles write rope factor 8.0 where the checkpoint says 32.0)
        af = (
            f"; the cos/sin multiplier is {effect['attention_factor'][0]} instead of "
            f"{effect['attention_factor'][1]}"
            if "attention_factor" in effect
            else ""
        )
        out.append(
            Finding(
                "rope_differs",
                WARNING,
                f"The rope Genie computes from genie_config.json differs from the "
                f"model's config.json in {effect['pairs']} of {effect['of']} frequency pairs: at the "
                f"context's end (position {size - 1}) angles differ by up to {effect['max_angle_rad']} rad; "
                f"every angle is within 0.1 rad up to position {effect['within_0_1_rad_until']}{af}. "
                "Genie loads it; long prompts drift from what the model was trained on.",
                NO_MESSAGE,
                fix,
            )
        )
    try:
        hd = rope.head_dim_of(hf)
    except (KeyError, TypeError, ValueError):
        hd = None
    kv = htp.get("kv-dim")
    if hd is not None and isinstance(kv, int) and kv != hd:
        out.append(
            Finding(
                "kv_dim",
                ERROR,
                f"backend.QnnHtp.kv-dim is {kv}; the model's head_dim is {hd}.",
                "Expected [ *, " + str(hd) + ", *] ... (Genie's KV shape check, ShapeError)",
                f"Set backend.QnnHtp.kv-dim to {hd}.",
            )
        )
    return out


MAX_CONFIG_BYTES = 16 << 20  # genie_config.json, config.json, bundle.json ...: far beyond any real one


def _read_json(p: Path) -> Any:
    try:
        with safepath.open_regular(p.parent, p.name, p.name) as fh:  # a FIFO or device is not read
            return json.loads(fh.read(64 * MAX_CONFIG_BYTES).decode("utf-8"))
    except (OSError, ValueError):  # missing, unsafe (UnsafePath), not UTF-8, not JSON
        return None


def _named_file(cfg: dict[str, Any] | None, *keys: str, default: str) -> str:
    """The file genie_config.json names at `keys` (e.g. dialog.engine.backend.extensions), as Genie reads it; the
    conventional name when the config names none (the path rules were checked before: safepath)."""
    node: Any = cfg or {}
    for k in keys:
        node = node.get(k) if isinstance(node, dict) else None
    return node if isinstance(node, str) and node else default


def _ext_name(cfg: dict[str, Any] | None) -> str:
    return _named_file(
        cfg, "dialog", "engine", "backend", "extensions", default="htp_backend_ext_config.json"
    )


def _board_findings(
    bundle: Path, facts: dict[str, Any] | None, simulated: bool, cfg: dict[str, Any] | None = None
) -> list[Finding]:

    out = []
    ext = _read_json(bundle / _ext_name(cfg))
    dev = (
        (ext.get("devices") or [{}])[0]
        if isinstance(ext, dict) and isinstance(ext.get("devices"), list) and ext["devices"]
        else {}
    )
    if not isinstance(dev, dict):
        dev = {}
    if not simulated and not dev:
        out.append(
            Finding(
                "htp_ext",
                WARNING,
                "htp_backend_ext_config.json is missing or names no device.",
                None,
                "Write it as qai-hub-models does: devices[0] with soc_model and dsp_arch of the board.",
            )
        )
    qairt = bundle_qairt_version(bundle)
    if not simulated and qairt is None:
        out.append(
            Finding(
                "tool_versions",
                WARNING,
                "tool-versions.yaml does not name the QAIRT that compiled the bundle.",
                None,
                "Keep the tool-versions.yaml AI Hub's link job reported (qairt: ...).",
            )
        )
    if facts is None or facts.get("simulated") or simulated:
        return out
    have_arch, want_arch = facts.get("dsp_arch"), dev.get("dsp_arch")
    if have_arch and want_arch and str(have_arch) != str(want_arch):
        out.append(
            Finding(
                "dsp_arch",
                ERROR,
                f"The bundle is compiled for Hexagon {want_arch}; the board is {have_arch}.",
                "Could not create context from binary (QNN error 5000/5005: the binary "
                "is for another dsp_arch)",
                f"Compile for a {have_arch} device (the IQ-9075 EVK is v73).",
            )
        )
    chip = str(facts.get("chip") or "").lower()
    want_soc = next(
        (d["soc_model"] for d in KNOWN_DEVICES.values() if chip and str(d["chipset"]).endswith(chip)), None
    )
    if want_soc is not None and dev.get("soc_model") is not None and int(dev["soc_model"]) != int(want_soc):
        out.append(
            Finding(
                "soc_model",
                ERROR,
                f"htp_backend_ext_config.json says soc_model {dev['soc_model']}; the "
                f"board ({facts.get('chip')}) is soc_model {want_soc}.",
                "Could not create context from binary (the HTP backend is configured for another SoC)",
                f"Set devices[0].soc_model to {want_soc}, or compile for this board's device.",
            )
        )
    board_q = facts.get("qairt_version")
    if qairt and qairt != "simulator":
        if not board_q:
            out.append(
                Finding(
                    "qairt_missing",
                    ERROR,
                    f"The board has no QAIRT; the bundle needs {qairt} or newer.",
                    "genie-t2t-run: command not found",
                    "Install QAIRT on the board (Board page).",
                )
            )
        elif version_tuple(str(board_q)) < version_tuple(qairt):
            out.append(
                Finding(
                    "qairt_old",
                    ERROR,
                    f"The board's QAIRT {board_q} is older than the QAIRT {qairt} that compiled the bundle.",
                    "Could not create context from binary ... 5000",
                    f"Install QAIRT {'.'.join(map(str, version_tuple(qairt)))} or newer on the board.",
                )
            )
    return out


def _token_ids(bundle: Path, cfg: dict[str, Any] | None = None) -> tuple[dict[str, int], bool]:
    """Token content -> id from the tokenizer the config names (dialog.tokenizer.path: added tokens and
    vocabulary); False when unreadable."""
    doc = _read_json(bundle / _named_file(cfg, "dialog", "tokenizer", "path", default="tokenizer.json"))
    if not isinstance(doc, dict):
        return {}, False
    ids: dict[str, int] = {}
    vocab = (doc.get("model") or {}).get("vocab") if isinstance(doc.get("model"), dict) else None
    if isinstance(vocab, dict):
        ids.update({str(k): int(v) for k, v in vocab.items() if isinstance(v, int)})
    for t in doc.get("added_tokens") or []:
        if isinstance(t, dict) and "content" in t and isinstance(t.get("id"), int):
            ids[str(t["content"])] = int(t["id"])
    return ids, bool(ids)


def _token_findings(
    bundle: Path, cfg: dict[str, Any], hf: dict[str, Any] | None, graphs: dict[str, dict[str, Any]]
) -> list[Finding]:
    ctx = (cfg.get("dialog") or {}).get("context") or {}
    bos, eos = ctx.get("bos-token"), ctx.get("eos-token")
    eos_ids = [e for e in (eos if isinstance(eos, list) else [eos]) if isinstance(e, int)]
    ids, readable = _token_ids(bundle, cfg)
    by_id = {v: k for k, v in ids.items()}
    out = []
    tc = _read_json(bundle / "tokenizer_config.json")
    tc = tc if isinstance(tc, dict) else {}
    for k, v in (tc.get("added_tokens_decoder") or {}).items():
        if isinstance(v, dict) and isinstance(v.get("content"), str) and str(k).isdigit():
            by_id.setdefault(int(k), v["content"])
            ids.setdefault(v["content"], int(k))
            readable = True
    if not readable:
        out.append(
            Finding(
                "tokens_unchecked",
                WARNING,
                "tokenizer.json has no readable vocabulary: bos/eos cannot be checked against it.",
                None,
                "Use the model's own tokenizer.json.",
            )
        )
        return out
    if isinstance(bos, int) and bos >= 0 and bos not in by_id:
        out.append(
            Finding(
                "bos_unknown",
                ERROR,
                f"bos-token {bos} is no token of tokenizer.json.",
                NO_MESSAGE,
                "Set dialog.context.bos-token to the model's bos_token_id (config.json), or -1 when it "
                "has none.",
            )
        )
    for e in eos_ids:
        if e not in by_id:
            out.append(
                Finding(
                    "eos_unknown",
                    ERROR,
                    f"eos-token {e} is no token of tokenizer.json: generation never stops on it.",
                    NO_MESSAGE,
                    "Copy eos_token_id from the model's config.json.",
                )
            )
    want_bos = token_text(tc.get("bos_token"))
    if (
        want_bos is not None
        and want_bos in ids
        and isinstance(bos, int)
        and bos in by_id
        and ids[want_bos] != bos
    ):
        out.append(
            Finding(
                "bos_mismatch",
                ERROR,
                f"bos-token {bos} ({by_id.get(bos)!r}) is not the tokenizer's "
                f"bos_token {want_bos!r} ({ids[want_bos]}).",
                NO_MESSAGE,
                f"Set dialog.context.bos-token to {ids[want_bos]}.",
            )
        )
    if want_bos is not None and want_bos in ids and bos == -1 and added_bos(tc) is not None:
        out.append(
            Finding(
                "bos_disabled",
                WARNING,
                f"bos-token is -1 (none) but the tokenizer has bos_token "
                f"{want_bos!r} ({ids[want_bos]}): Genie will not insert it before each query.",
                None,
                f"Set dialog.context.bos-token to {ids[want_bos]} if the model was trained with it.",
            )
        )
    if "bos_token" in tc and added_bos(tc) is None and isinstance(bos, int) and bos >= 0:
        out.append(
            Finding(
                "bos_not_the_tokenizers",
                WARNING,
                f"bos-token {bos} ({by_id.get(bos)!r}) is set, but the tokenizer adds no BOS (its bos_token is "
                "null, or add_bos_token false): Genie puts that token before every query, where the model never "
                "saw one.",
                None,
                "Set dialog.context.bos-token to -1 (HexStudio writes -1 for such tokenizers).",
            )
        )
    want_eos = token_text(tc.get("eos_token"))
    if (
        isinstance(eos, list)
        and want_eos in ids
        and eos_ids
        and ids[want_eos] in eos_ids
        and eos_ids[0] != ids[want_eos]
    ):
        out.append(
            Finding(
                "eos_not_the_turns_end",
                # qai-hub-models writes config.json's order too: a note, not a fault
                INFO,
                f"eos-token starts with {eos_ids[0]} ({by_id.get(eos_ids[0])!r}): Genie writes the first eos-token "
                f"between a reply and the next query, where the chat template writes {want_eos!r}. Later turns "
                "of a chat then read differently from the model's own format.",
                None,
                f"Put {ids[want_eos]} first in dialog.context.eos-token (the order does not change which tokens "
                "stop a reply; HexStudio writes it so).",
            )
        )
    if want_eos is not None and want_eos in ids and eos_ids and ids[want_eos] not in eos_ids:
        out.append(
            Finding(
                "eos_mismatch",
                ERROR,
                f"eos-token {eos} does not include the tokenizer's eos_token "
                f"{want_eos!r} ({ids[want_eos]}): replies run on to the token limit.",
                NO_MESSAGE,
                f"Add {ids[want_eos]} to dialog.context.eos-token (an array is allowed).",
            )
        )
    n_vocab = ctx.get("n-vocab")
    if (
        hf is not None
        and isinstance(n_vocab, int)
        and isinstance(hf.get("vocab_size"), int)
        and n_vocab != hf["vocab_size"]
    ):
        out.append(
            Finding(
                "n_vocab",
                ERROR,
                f"dialog.context.n-vocab {n_vocab} differs from the model's vocab_size "
                f"{hf['vocab_size']} (Genie does not compare them; sampling reads the wrong logits).",
                NO_MESSAGE,
                f"Set dialog.context.n-vocab to {hf['vocab_size']}.",
            )
        )
    return out


def _real_findings(
    bundle: Path, real: dict[str, Any], facts: dict[str, Any] | None, cfg: dict[str, Any] | None = None
) -> list[Finding]:
    from hexstudio.shared.bundle.qnn_findings import binary_problems, parser_finding

    out: list[Finding] = []
    for name in [
        "genie_config.json",
        *sorted(real.get("dialogs") or {}),
    ]:  # the basic config, then lade/spd's
        pf = parser_finding(real, name)
        if pf is not None:
            code, sev, genie, message = pf
            out.append(
                Finding(
                    code,
                    sev,
                    message,
                    genie,
                    "Fix the key Genie names (docs/genie.md lists the schema), or compile again."
                    if sev == ERROR
                    else "",
                )
            )
    ext = _read_json(bundle / _ext_name(cfg))
    dev = (
        (ext.get("devices") or [{}])[0]
        if isinstance(ext, dict) and isinstance(ext.get("devices"), list)
        else {}
    )
    ext_soc = (
        dev.get("soc_model") if isinstance(dev, dict) and isinstance(dev.get("soc_model"), int) else None
    )
    board_soc = None
    chip = str((facts or {}).get("chip") or "").lower()
    if chip:
        board_soc = next(
            (int(d["soc_model"]) for d in KNOWN_DEVICES.values() if str(d["chipset"]).endswith(chip)), None
        )
    for code, sev, message, fix in binary_problems(
        real, ext_soc if ext_soc else None, board_soc, (facts or {}).get("qairt_version")
    ):
        out.append(Finding(code, sev, message, None, fix))
    return out


def check_bundle(
    path: Path | str, board_facts: dict[str, Any] | None = None, real: dict[str, Any] | None = None
) -> list[Finding]:
    """Every finding about the bundle folder `path` (errors: Genie would refuse it or run it wrong). `real`:
    what Qualcomm's own code said (hexstudio/workers/qnn/genie_check.py: Genie's parser, QNN's binary reader); its
    findings come first and its graph specs replace metadata.yaml's."""
    bundle = Path(path)
    manifest = _read_json(bundle / "bundle.json")
    simulated = bool(isinstance(manifest, dict) and manifest.get("simulated"))
    out: list[Finding] = []
    if simulated:
        out.append(
            Finding(
                "simulated",
                INFO,
                "A simulation bundle (runs on the simulator board only).",
                None,
                "Compile for a real device to run on a board.",
            )
        )
    cfg_path = bundle / "genie_config.json"
    try:  # a regular file only (a FIFO here hung `bundle check`, issue 27), at most MAX_CONFIG_BYTES
        with safepath.open_regular(bundle, "genie_config.json", "genie_config.json") as fh:
            text = fh.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
        if len(text) > MAX_CONFIG_BYTES:
            raise ValueError(f"it is larger than {MAX_CONFIG_BYTES} bytes")
    except safepath.UnsafePath as exc:
        return [*out, Finding("unsafe_path", ERROR, exc.message, NO_MESSAGE, exc.hint or "")]
    except FileNotFoundError:
        return [
            *out,
            Finding(
                "config_missing",
                ERROR,
                f"{bundle} has no genie_config.json: it is not a Genie bundle folder.",
                "Failed to create the dialog config.",
                "Point at the bundle folder: a run's is runs/<RUN>/artifacts/compile/bundle (`hexstudio runs show "
                "RUN` names the run's folder).",
            ),
        ]
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        return [
            *out,
            Finding(
                "config_missing",
                ERROR,
                f"{cfg_path} cannot be read ({exc}).",
                "Failed to create the dialog config.",
                "Write it again: `hexstudio bundle config --model MODEL_FOLDER`, or compile the bundle again.",
            ),
        ]
    cfg, found = _config_findings(text)
    out += found
    if cfg is None:
        return out
    try:  # every file it names: inside the bundle, no symlink out, a regular file; before any is opened
        safepath.check_genie_config(cfg, bundle)
    except safepath.UnsafePath as exc:
        return [*out, Finding("unsafe_path", ERROR, exc.message, NO_MESSAGE, exc.hint or "")]
    # the speculative dialogs' configs: the same rules
    for variant in sorted(bundle.glob("genie_config.*.json")):
        try:
            with safepath.open_regular(bundle, variant.name, variant.name) as fh:
                vtext = fh.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
            vcfg = json.loads(vtext) if len(vtext) <= MAX_CONFIG_BYTES else None
            if not isinstance(vcfg, dict):
                raise ValueError("it is not one JSON object of at most 16 MiB")
            safepath.check_genie_config(vcfg, bundle, variant.name)
        except safepath.UnsafePath as exc:
            return [*out, Finding("unsafe_path", ERROR, exc.message, NO_MESSAGE, exc.hint or "")]
        except (OSError, UnicodeDecodeError, ValueError) as exc:
            out.append(
                Finding(
                    "dialog_config_unreadable",
                    ERROR,
                    f"{variant.name} cannot be read ({exc}).",
                    "Failed to create the dialog config.",
                    "Compile the bundle again (Compile stage).",
                )
            )
            continue
        missing = [b for b in (speculative.ctx_bins(vcfg.get("dialog") or {})) if not (bundle / b).is_file()]
        if missing:
            out.append(
                Finding(
                    "ctx_bin_missing",
                    ERROR,
                    f"{variant.name} names {missing[0]}, which is not in the bundle.",
                    f"NSPModel: Can't access model file : {missing[0]}\n{gs.DIALOG_FAILED}",
                    "Compile the bundle again (the spd draft's binaries go under draft/).",
                )
            )
    bins = [
        b
        for b in _obj(cfg, "dialog", "engine", "model", "binary").get("ctx-bins") or []
        if isinstance(b, str)
    ]
    tok = _obj(cfg, "dialog", "tokenizer").get("path")
    if isinstance(tok, str) and not (bundle / tok).is_file():
        out.append(
            Finding(
                "tokenizer_missing",
                ERROR,
                f"The tokenizer {tok} is not in the bundle.",
                f"{tok}: file does not exist\n{gs.DIALOG_FAILED}",
                "Copy the model's tokenizer.json into the bundle.",
            )
        )
    out += _ctx_bin_findings(bundle, bins)
    size = _obj(cfg, "dialog", "context").get("size")
    graphs, source = load_graph_specs(bundle, bins, size if isinstance(size, int) else None)
    if real and real.get("available"):
        out += _real_findings(bundle, real, board_facts, cfg)
        from hexstudio.shared.bundle.qnn_findings import graphs_from_binaries

        from_bins = graphs_from_binaries([b for b in real.get("binaries") or [] if not b.get("simulated")])
        if from_bins:
            graphs, source = (
                from_bins,
                f"the context binaries (read by QNN {real.get('qnn_version')}'s libQnnSystem)",
            )
    if graphs:
        out += _graph_findings(graphs, source, cfg)
    else:
        out.append(
            Finding(
                "graphs_unchecked",
                WARNING,
                "The bundle has no metadata.yaml (graph I/O specs): the "
                "graph names, shapes and quantization cannot be checked before the board loads them.",
                None,
                "Keep the metadata.yaml AI Hub's export writes beside the context binaries.",
            )
        )
    out += _context_findings(cfg, graphs, bins)
    hf = _read_json(bundle / "config.json")
    hf = hf if isinstance(hf, dict) else None
    out += _rope_findings(cfg, hf)
    out += _board_findings(bundle, board_facts, simulated, cfg)
    out += _token_findings(bundle, cfg, hf, graphs)
    return out
