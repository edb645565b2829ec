"""The Genie bundle of a local compile: real QNN context binaries from QNN 2.51 on this machine.

Laid out as AI Hub's bundle is (docs/compile.md): context binaries, genie_config.json (checked by
Genie's own parser afterwards), htp_backend_ext_config.json for the target device, metadata.yaml
describing every compiled graph's I/O as the binaries themselves say (read back through
libQnnSystem), tokenizer.json, tokenizer_config.json, config.json and tool-versions.yaml (`qairt:`
the QNN build that wrote the binaries).

Forms: `shared` writes `<model>_part_<i>_of_<n>.bin` holding both graphs of a part (the board);
`single` writes `<model>_prompt_part_<i>_of_<n>.bin` and `<model>_token_part_<i>_of_<n>.bin` (the x86
HTP simulator cannot load shared weights).
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from hexstudio.shared import bundle as gb
from hexstudio.shared.protocol import Emitter
from hexstudio.shared.run_settings import RunSettings
from hexstudio.workers.bundle_json import write_bundle_json
from hexstudio.workers.bundle_metadata import variant_suffix
from hexstudio.workers.qnn.compile import (
    CompiledPart,
    GraphToCompile,
    LocalCompileError,
    compile_part,
    read_back,
)
from hexstudio.workers.qnn.context_info import ContextInfo, TensorInfo
from hexstudio.workers.qnn.ep import HtpTarget, ordered_path
from hexstudio.workers.qnn.libs import find_qnn_libs

FORMS = ("single", "shared")


def qairt_of_build(build_id: str) -> str:
    """'v2.51.0.260929181845' -> '2.51.0.260929181845' (tool-versions.yaml's form)."""
    return build_id[1:] if build_id.startswith("v") else build_id


def prepare_htp_graphs(
    quantize_dir: Path, q: dict[str, Any], work: Path, em: Emitter
) -> list[GraphToCompile]:
    """Each quantized simulation graph rewritten for HTP (hexstudio.workers.qnn.htp_graph) and saved at a path whose
    EP graph name sorts in part order."""
    from hexstudio.workers.qnn.htp_graph import HtpGraphError, htp_graph, load_sim_graph, save_htp_graph

    gdir = work / "graphs"
    if gdir.exists():
        shutil.rmtree(gdir)
    gdir.mkdir(parents=True)
    out: list[GraphToCompile] = []
    parts = int(q["parts"])
    every = [*q["graphs"], *(q.get("variants") or [])]  # the main context length's graphs, then other CLs'
    for g in sorted(
        every,
        key=lambda g: (
            int(g["part"]),
            "variant_of" in g,
            g.get("context_length", 0),
            g["kind"] != "prompt_processor",
            -int(g.get("seq_len") or 0),  # the main AR first, then smaller ones (ar_sizes)
        ),
    ):
        if "sim_onnx" not in g:
            raise LocalCompileError(
                "missing_graph", f"Graph {g['name']} has no quantized ONNX.", "Run the Quantize stage again."
            )
        try:
            src = quantize_dir / g["sim_onnx"]
            model, report = htp_graph(load_sim_graph(src))
        except HtpGraphError as exc:
            raise LocalCompileError(
                "htp_graph",
                f"Graph {g['name']} cannot be put in HTP's form: {exc}.",
                "This is a HexStudio bug: report it with the run folder.",
            ) from None
        path = ordered_path(gdir, str(g["name"]), int(g["part"]), parts)
        save_htp_graph(model, path, src.parent)
        em.log(
            f"{g['name']}: Genie's quantized I/O ({len(report.quantized_inputs)} inputs, "
            f"{len(report.quantized_outputs)} outputs), {len(report.embedding_gathers)} embedding lookups as "
            f"DQ-Gather-Q, {len(report.requantized_matmuls)} mixed-precision MatMuls requantized"
        )
        out.append(GraphToCompile(str(g["name"]), str(g["kind"]), int(g["part"]), parts, path))
    return out


def _tensor_doc(t: TensorInfo) -> dict[str, Any]:
    doc: dict[str, Any] = {"shape": list(t.shape), "dtype": t.dtype}
    if t.scale is not None:
        doc["quantization_parameters"] = {"scale": t.scale, "offset": t.offset}
    return doc


def metadata_from_binaries(parts: list[CompiledPart], graphs: list[GraphToCompile]) -> dict[str, Any]:
    """metadata.yaml's document from what the binaries hold (qai-hub-models' component names)."""
    from hexstudio.workers.bundle_metadata import main_variant, variant_component

    by_qnn = {qg.name: qg for p in parts for info in p.infos for qg in info.graphs}
    comps: dict[str, Any] = {}
    main_ar, main_cl = main_variant([g.name for g in graphs])
    for kind in ("prompt_processor", "token_generator"):
        for g in (g for g in graphs if g.kind == kind):
            qnn_name = next(p.graphs[g.name] for p in parts if g.name in p.graphs)
            qg = by_qnn[qnn_name]
            comp = variant_component(
                g.name, main_ar, main_cl
            )  # another AR's or CL's graph: its own component
            comps[comp] = {
                "qnn_graph": qnn_name,
                "inputs": {t.name: _tensor_doc(t) for t in qg.inputs},
                "outputs": {t.name: _tensor_doc(t) for t in qg.outputs},
            }
    return {"components": comps, "precision": "w4a16", "runtime": "genie"}


def check_graph_order(parts: list[CompiledPart], graphs: list[GraphToCompile]) -> None:
    """Genie orders each (AR, CL) group's graphs by name: the compiled names must sort in part order."""
    from hexstudio.shared.bundle.genie_model import variant_of

    for group in sorted({variant_of(g.name, {}) for g in graphs}):
        seq = [
            next(p.graphs[g.name] for p in parts if g.name in p.graphs)
            for g in sorted((g for g in graphs if variant_of(g.name, {}) == group), key=lambda g: g.part)
        ]
        if seq != sorted(seq):
            raise LocalCompileError(
                "graph_order",
                f"The compiled AR-{group[0]} CL-{group[1]} graphs do not sort "
                f"in part order ({seq}): Genie would run the parts in the wrong order.",
                "This is a HexStudio bug (hexstudio/workers/qnn/ep.py ordered_path): report it.",
            )


def write_local_bundle(
    quantize_dir: Path,
    model_doc: dict[str, Any],
    hf_dir: Path,
    out: Path,
    settings: RunSettings,
    device: dict[str, Any],
    form: str,
    em: Emitter,
) -> dict[str, Any]:
    from hexstudio.shared.bundle.genie_model import variant_of
    from hexstudio.shared.bundle.speculative import DraftHost
    from hexstudio.workers.genie_config import check_speculative, checked_genie_config, write_dialog_configs

    if form not in FORMS:
        raise LocalCompileError("bad_form", f"Unknown context binary form '{form}'.", f"Use one of {FORMS}.")
    libs = find_qnn_libs()
    if libs is None:
        from hexstudio.workers.qnn.libs import INSTALL_HINT

        raise LocalCompileError(
            "qnn_missing",
            "Local compile needs Qualcomm's QNN libraries (onnxruntime-qnn), "
            "which are not installed in this environment.",
            INSTALL_HINT,
        )
    q = json.loads((quantize_dir / "quantize.json").read_text())
    hf_config = json.loads((hf_dir / "config.json").read_text())
    tok = hf_dir / "tokenizer.json"
    # before anything compiles: a draft that could not load beside this bundle costs no compile
    host = DraftHost.on(q["context_length"], device, libs.qnn_version)
    check_speculative(hf_config, q, settings, tok.read_bytes() if tok.is_file() else None, host=host)
    target = HtpTarget(int(device["soc_model"]), str(device["dsp_arch"]))
    work = out / "htp"
    bdir = out / "bundle"
    bdir.mkdir(parents=True)
    em.progress(0.05, "rewriting the graphs in the form QNN HTP compiles whole")
    graphs = prepare_htp_graphs(quantize_dir, q, work, em)
    nparts = int(q["parts"])
    slug = gb.model_slug(str(model_doc["model"]).replace("builtin:", ""))
    compiled: list[CompiledPart] = []
    ctx_bins: list[str] = []
    for k in range(1, nparts + 1):
        pg = [g for g in graphs if g.part == k]
        units = [pg] if form == "shared" else [[g] for g in pg]
        for unit in units:
            what = ", ".join(g.name for g in unit)
            em.progress(
                0.1 + 0.75 * (len(compiled) / (nparts * len(units))),
                f"QNN {libs.qnn_version}: compiling {what} for {device['name']} "
                f"(soc_model {target.soc_model}, {target.dsp_arch})",
            )
            cp = compile_part(unit, work / "ctx" / unit[0].name, target, shared=form == "shared")
            read_back(cp, unit)
            compiled.append(cp)
            em.metric(f"compile_seconds.{unit[0].name}", round(cp.seconds, 2), unit="s")
            em.metric(f"compile_peak_rss.{unit[0].name}", cp.peak_rss_bytes, unit="bytes")
            label = gb.part_label(k, nparts)
            if form == "shared":
                name = gb.ctx_bin_name(slug, k, nparts)
            else:
                kind = "prompt" if unit[0].kind == "prompt_processor" else "token"
                ar, cl = variant_of(unit[0].name, {})
                suffix = variant_suffix(kind, ar, cl, int(q["ar_n"]), int(q["context_length"]))
                name = f"{slug}_{kind}{suffix}_part_{label}.bin"
            # moved, not copied: the stage folder would hold every binary twice (GBs at 8B), hashed twice
            shutil.move(cp.bins[0], bdir / name)
            ctx_bins.append(name)
    check_graph_order(compiled, graphs)
    from hexstudio.workers.qnn.htp_agreement import MAX_SIM_BYTES, sim_bytes

    # no HTP leg runs at this size: drop the weight copies
    if sim_bytes(quantize_dir, q["graphs"]) > MAX_SIM_BYTES:
        shutil.rmtree(work / "graphs", ignore_errors=True)
    infos: list[ContextInfo] = [i for c in compiled for i in c.infos]
    build = infos[0].build_id if infos else ""
    qairt = qairt_of_build(build) or libs.qnn_version
    cfg = checked_genie_config(hf_config, hf_dir, q, ctx_bins, settings, simulated=False)
    try:  # first: spd's draft is checked against the bundle's own tokenizer.json
        gb.copy_model_files(hf_dir, bdir)
    except gb.BundleError as exc:
        raise LocalCompileError(
            "tokenizer_missing", str(exc), "Use a model with a fast tokenizer (tokenizer.json)."
        ) from None
    # basic, and each speculative dialog asked for
    write_dialog_configs(bdir, cfg, hf_config, q, settings, runs_on=(device, qairt))
    (bdir / "htp_backend_ext_config.json").write_text(json.dumps(gb.htp_ext_config(device), indent=4))
    from hexstudio.workers.bundle_metadata import write_metadata

    write_metadata(bdir / "metadata.yaml", metadata_from_binaries(compiled, graphs))
    (bdir / "tool-versions.yaml").write_text(f"qairt: {qairt}\n")
    em.metric("compile_seconds", round(sum(c.seconds for c in compiled), 2), unit="s")
    em.metric("compile_peak_rss", max((c.peak_rss_bytes for c in compiled), default=0), unit="bytes")
    em.progress(0.9, "writing bundle.json")
    dev: dict[str, Any] = {k: device[k] for k in ("name", "soc_model", "dsp_arch") if k in device}
    dev["attributes"] = list(device.get("attributes") or [])
    return write_bundle_json(
        bdir,
        model_doc,
        q,
        device=dev,
        qairt_version=qairt,
        target={
            "compile_target": "local",
            "binaries": "qnn",
            "context_binary_form": form,
            "weight_sharing": form == "shared",
            "qnn_version": libs.qnn_version,
            "qnn_build_id": build,
            "context_lengths": q.get("context_lengths") or [q["context_length"]],
        },
    )
