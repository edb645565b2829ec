"""Compile stage: turn the validated graphs into a bundle Genie (or the simulator board) can run.

Targets (the setting `compile_target`):
  local  QNN 2.51 on this machine (the onnxruntime-qnn wheel: no account, no upload): real context binaries
         (hexstudio/workers/qnn/bundle.py). For the simulator board one binary per graph (the x86 HTP simulator cannot
         load shared weights), for a real board one per part with both graphs sharing weights.
  aihub  Qualcomm AI Hub: compile both graphs per part, link them with shared weights, download the
         context binaries (hexstudio/workers/aihub.py).
  sim    the onnxruntime twin's bundle, laid out like AI Hub's: its context binaries are simulated stand-ins
         naming the QDQ ONNX parts; labeled "simulated": true everywhere. The fallback where onnxruntime-qnn
         cannot be installed.
  auto   local for the simulator board (sim where onnxruntime-qnn is missing), aihub otherwise.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from hexstudio.shared import bundle as gb
from hexstudio.shared import modelinfo
from hexstudio.shared.bundle.speculative import speculative_of
from hexstudio.shared.protocol import Emitter
from hexstudio.shared.run_settings import RunSettings
from hexstudio.workers.bundle_json import write_bundle_json
from hexstudio.workers.genie_config import checked_genie_config
from hexstudio.workers.runtime import WorkerError, WorkerSpec, worker_main


def write_sim_bundle(
    quantize_dir: Path,
    model_doc: dict[str, Any],
    hf_dir: Path,
    out: Path,
    settings: RunSettings,
    em: Emitter,
) -> dict[str, Any]:
    """The simulation bundle, laid out and configured as qai-hub-models lays out a real one (docs/compile.md):
    `<model>_part_{i}_of_{n}.bin` per part, genie_config.json (the real schema, backend QnnHtp),
    htp_backend_ext_config.json, metadata.yaml, tokenizer.json, tokenizer_config.json, config.json; each
    .bin is a simulated context binary (hexstudio/workers/genie_sim/simbin.py) naming the part's QDQ ONNX graphs
    under sim/, which the simulator board runs. bundle.json says "simulated": true."""
    from hexstudio.workers import bundle_metadata as md
    from hexstudio.workers.genie_sim.simbin import write_sim_bin

    q = json.loads((quantize_dir / "quantize.json").read_text())
    hf_config = json.loads((hf_dir / "config.json").read_text())
    bdir = out / "bundle"
    (bdir / "sim").mkdir(parents=True)
    parts = int(q["parts"])
    slug = gb.model_slug(str(model_doc["model"]).replace("builtin:", ""))
    ctx_bins: list[str] = []
    for k in range(1, parts + 1):
        entries = []
        for g in sorted(
            (g for g in q["graphs"] if int(g["part"]) == k), key=lambda g: g["kind"] != "prompt_processor"
        ):
            if "sim_onnx" not in g:
                raise WorkerError(
                    "missing_graph", f"Graph {g['name']} has no quantized ONNX.", "Re-run the Quantize stage."
                )
            src = quantize_dir / g["sim_onnx"]
            shutil.copy2(src, bdir / "sim" / f"{g['name']}.onnx")
            data = src.with_name(src.name + ".data")  # the weights, beside the graph (external data)
            if data.is_file():
                shutil.copy2(data, bdir / "sim" / f"{g['name']}.onnx.data")
            try:
                spec = md.graph_spec(g, quantize_dir)
            except md.MetadataError as exc:
                raise WorkerError("graph_io_unreadable", str(exc), "Re-run the Quantize stage.") from None
            entries.append({"name": g["name"], "onnx": f"sim/{g['name']}.onnx", **spec})
        name = gb.ctx_bin_name(slug, k, parts)
        write_sim_bin(bdir / name, entries)
        ctx_bins.append(name)
    cfg = checked_genie_config(hf_config, hf_dir, q, ctx_bins, settings, simulated=True)
    (bdir / "genie_config.json").write_text(json.dumps(cfg, indent=4))
    if q.get("variants"):
        em.warning(
            f"The onnxruntime twin runs one context length ({q['context_length']}) and one AR ({q['ar_n']}), "
            f"so the other variants ({', '.join(str(v['name']) for v in q['variants'])}) are "
            "not in this stand-in bundle.",
            hint="Compile with compile_target local (onnxruntime-qnn) or "
            "aihub: real Genie switches between them.",
            code="context_lengths_need_real_bundle",
        )
    asked, _, _ = speculative_of(settings)
    if asked:
        em.warning(
            "The onnxruntime twin runs Genie's basic dialog only, so no speculative dialog "
            f"({', '.join(asked)}) was written into this stand-in bundle.",
            hint="Compile with compile_target local (onnxruntime-qnn) or aihub for lade/spd: real Genie runs "
            "them.",
            code="speculative_needs_real_bundle",
        )
    (bdir / "htp_backend_ext_config.json").write_text(
        json.dumps(gb.htp_ext_config(gb.SIMULATOR_DEVICE), indent=4)
    )
    md.write_metadata(bdir / "metadata.yaml", md.build_metadata(q["graphs"], quantize_dir))
    try:
        gb.copy_model_files(hf_dir, bdir)
    except gb.BundleError as exc:
        raise WorkerError(
            "tokenizer_missing", str(exc), "Use a model with a fast tokenizer (tokenizer.json)."
        ) from None
    em.progress(0.8, "writing bundle.json")
    return write_bundle_json(
        bdir, model_doc, q, device=gb.SIMULATOR_DEVICE, qairt_version=None, simulated=True
    )


def run(spec: WorkerSpec, em: Emitter) -> dict[str, Any]:
    s = spec.settings
    target = s.compile_target
    board = spec.inputs.board or "sim"
    if target == "auto":
        target = resolve_auto_target(board, em)
    model_doc = json.loads((spec.upstream_dir("model") / "model.json").read_text())
    qdir = spec.upstream_dir("quantize")
    if target == "local":
        from hexstudio.workers.qnn.bundle import write_local_bundle
        from hexstudio.workers.qnn.compile import LocalCompileError

        hf_dir = modelinfo.hf_dir_of(model_doc, spec.upstream_dir("model"))
        try:
            device = gb.device_info(s.device)
        except gb.BundleError as exc:
            raise WorkerError(
                "unknown_device", str(exc), "Pick a device from the Compile page's list."
            ) from None
        form = "single" if board == "sim" else "shared"
        try:
            doc = write_local_bundle(qdir, model_doc, hf_dir, spec.out_dir, s, device, form, em)
        except LocalCompileError as exc:
            raise WorkerError(exc.code, exc.message, exc.hint) from None
    elif target == "sim":
        em.progress(0.1, "writing the simulation bundle (QDQ ONNX parts for the simulator board)")
        hf_dir = modelinfo.hf_dir_of(model_doc, spec.upstream_dir("model"))
        doc = write_sim_bundle(qdir, model_doc, hf_dir, spec.out_dir, s, em)
    elif target == "aihub":
        try:
            from hexstudio.workers import aihub
        except ImportError:
            raise WorkerError(
                "not_implemented",
                "Compiling through Qualcomm AI Hub is not implemented in this build yet.",
                "Use the simulator board (compile_target=sim) for now.",
            ) from None
        doc = aihub.compile_bundle(spec, model_doc, qdir, em)
    else:
        raise WorkerError("bad_target", f"compile_target '{target}' is not one of auto, local, aihub, sim.")
    if not doc.get("simulated") and not doc.get("emulated"):
        qualcomm_check(spec.out_dir / "bundle", em)
    for f in doc["files"]:
        em.artifact(f"bundle/{f['path']}", kind="bundle")
    em.metric("bundle_files", len(doc["files"]))
    em.metric("bundle_bytes", sum(f["size"] for f in doc["files"]), unit="bytes")
    em.metric("simulated", bool(doc["simulated"]))
    em.metric("emulated", bool(doc.get("emulated")))
    em.progress(1.0, f"bundle with {len(doc['files'])} files")
    return {
        "target": target,
        "simulated": doc["simulated"],
        "emulated": bool(doc.get("emulated")),
        "files": len(doc["files"]),
        "qnn_version": doc.get("qnn_version"),
        "context_binary_form": doc.get("context_binary_form"),
    }


def qualcomm_check(bdir: Path, em: Emitter) -> None:
    """A bundle of real context binaries (a local or an AI Hub compile) through Qualcomm's own checks before the
    stage passes: Genie 1.21's parser on genie_config.json and QNN's reader on every ctx-bin, whose graphs feed the
    Genie-model checks (hexstudio/shared/bundle/check.py). Run in a child process: a crash in a library is a failed
    check, not a dead worker. Where onnxruntime-qnn is not installed, HexStudio's own checks of the bundle run alone,
    saying so."""
    from hexstudio.shared.bundle.check import check_bundle, errors
    from hexstudio.shared.bundle.qualcomm_run import MODULE, run_qualcomm_checks
    from hexstudio.shared.python_command import python_command

    em.progress(0.95, "checking the bundle with Genie's own parser and QNN's binary reader")
    run = run_qualcomm_checks(bdir, python_command(MODULE), timeout_s=600)
    real = run.doc
    # the findings go beside the bundle: a failed attempt's logs are kept (run/logs/compile-failed/), where its
    # bundle folder is not
    findings = bdir.parent / "bundle-check.log"
    if real is None:
        why = f"it ran past {run.timeout_s:g} s" if run.timed_out else f"exit {run.returncode}"
        findings.write_text(run.tail + "\n", encoding="utf-8")
        raise WorkerError(
            "qualcomm_check_failed",
            f"Qualcomm's checks of the new bundle ended abnormally ({why}: Genie's parser or QNN's reader): "
            f"{run.tail[-300:] or 'nothing printed'}",
            f"The end of what they printed (nothing, after a time-out) is kept in {findings}. Compile again; if it "
            "happens again, report it with the run folder.",
        )
    available = bool(real.get("available"))
    if not available:
        em.warning(
            "Qualcomm's own checks did not run (onnxruntime-qnn is not installed): only HexStudio's did.",
            hint=str(real.get("hint") or ""),
            code="qualcomm_checks_missing",
        )
    bad = errors(check_bundle(bdir, None, real if available else None))
    if bad:
        first = bad[0]
        findings.write_text(
            "\n".join(f"{f.message}" + (f"\n  fix: {f.fix}" if f.fix else "") for f in bad) + "\n",
            encoding="utf-8",
        )
        whose = "Qualcomm's checks" if available else "HexStudio's checks"
        raise WorkerError(
            "bundle_check",
            f"The compiled bundle fails {whose}: {first.message}"
            + (f" Genie/QNN say: {first.genie_error}" if first.genie_error else ""),
            (first.fix + " " if first.fix else "") + f"Every error the checks found: {findings}.",
        )
    if available:
        em.log(
            f"Genie {real['config'].get('genie_version')}'s parser accepts genie_config.json; QNN "
            f"{real.get('qnn_version')}'s reader read {len(real.get('binaries') or [])} context binaries and the "
            "graphs pass Genie's checks"
        )


def auto_target(board: str) -> str:
    """compile_target "auto": local for the simulator board where Qualcomm's QNN libraries are installed, the
    onnxruntime twin's bundle ("sim") where they are not, AI Hub for a real board. The Preflight stage asks it too
    (a run that compiles locally must hold the local compile)."""
    if board != "sim":
        return "aihub"
    from hexstudio.workers.qnn.libs import find_qnn_libs

    return "local" if find_qnn_libs() is not None else "sim"


def resolve_auto_target(board: str, em: Emitter) -> str:
    """auto_target, with the twin's fallback said as a warning."""
    target = auto_target(board)
    if target != "sim":
        return target
    from hexstudio.workers.qnn.libs import INSTALL_HINT

    em.warning(
        "Qualcomm's QNN libraries (onnxruntime-qnn) are not installed, so the simulator board gets the "
        "onnxruntime twin's bundle: its context binaries are stand-ins and nothing from Qualcomm runs.",
        # the stage's inputs say "auto", not what it resolved to: installing the libraries alone does not make this
        # compile out of date
        hint=f"{INSTALL_HINT} Then compile again, forced: `hexstudio run --resume RUN --only compile --force`, or "
        "Run again on the Compile page.",
        code="qnn_missing_twin_fallback",
    )
    return "sim"


if __name__ == "__main__":
    raise SystemExit(worker_main("compile", run))
