"""The QNN execution provider of onnxruntime-qnn, set up as Qualcomm's x86 HTP needs it.

Facts used (checked on x86 with onnxruntime 1.32 + onnxruntime-qnn 2.7.0; docs/compile.md):
- the EP is a plugin: `onnxruntime.register_execution_provider_library("QNNExecutionProvider", path)`, then
  `SessionOptions.add_provider_for_devices(devices, options)`;
- `htp_arch` must be given (the default, v68, refuses int4 weights: error 3110) and `soc_model` names
  the target (77: QCS9075/QCS9100, Hexagon v73);
- `session.disable_cpu_ep_fallback=1`, so a node HTP refuses fails the session instead of running on the
  CPU where nobody sees it;
- `ep.context_enable=1`, `ep.context_embed_mode=0` and `ep.context_file_path=DIR/x.onnx` write the QNN
  context binary `DIR/x_qnn.bin`; `ep.share_ep_contexts=1` on each session and `ep.stop_share_ep_contexts=1`
  on the last put several graphs, sharing weights, into one binary.
- The EP names each QNN graph `QNNExecutionProvider_QNNExecutionProvider_<h>_1_0`, where <h> is the low 64
  bits of MurmurHash3 x86_128 (seed 0) of the model's path as given to the session (onnxruntime's
  ModelMetadefIdGenerator). Genie 1.21 orders graphs that lack `_<i>_of_<n>` names by name (its log:
  "does not follow the expected split naming ... ordered after all graphs that do"), so `ordered_path`
  picks a file name whose hash sorts in part order; the compile checks the order it got.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

EP_NAME = "QNNExecutionProvider"
GRAPH_NAME_PREFIX = "QNNExecutionProvider_QNNExecutionProvider_"


@dataclass(frozen=True)
class HtpTarget:
    """What a context binary is prepared for."""

    soc_model: int
    dsp_arch: str  # "v73"

    @property
    def htp_arch(self) -> str:
        return self.dsp_arch.lstrip("vV")


_registered = False


def register_ep() -> Any:
    """Register the QNN EP plugin once per process; returns the onnxruntime module."""
    global _registered
    import onnxruntime as ort
    import onnxruntime_qnn

    if not _registered:
        try:
            ort.register_execution_provider_library(EP_NAME, onnxruntime_qnn.get_library_path())
        except Exception as exc:  # registered already by someone else in this process
            if "already" not in str(exc).lower():
                raise
        _registered = True
    return ort


def session_options(
    target: HtpTarget,
    *,
    context_file: Path | None = None,
    share: bool = False,
    stop_share: bool = False,
    profiling_csv: Path | None = None,
) -> Any:
    ort = register_ep()
    from hexstudio.workers.qnn.libs import find_qnn_libs

    libs = find_qnn_libs()
    if libs is None:
        raise RuntimeError("onnxruntime-qnn is not installed")
    so = ort.SessionOptions()
    devices = [d for d in ort.get_ep_devices() if d.ep_name == EP_NAME]
    opts = {"backend_path": str(libs.htp), "htp_arch": target.htp_arch, "soc_model": str(target.soc_model)}
    if profiling_csv is not None:
        opts.update({"profiling_level": "detailed", "profiling_file_path": str(profiling_csv)})
    so.add_provider_for_devices(devices, opts)
    so.add_session_config_entry("session.disable_cpu_ep_fallback", "1")
    if context_file is not None:
        so.add_session_config_entry("ep.context_enable", "1")
        so.add_session_config_entry("ep.context_embed_mode", "0")
        so.add_session_config_entry("ep.context_file_path", str(context_file))
    if share:
        so.add_session_config_entry("ep.share_ep_contexts", "1")
    if stop_share:
        so.add_session_config_entry("ep.stop_share_ep_contexts", "1")
    so.log_severity_level = 2
    return so


def graph_name_for_path(path: str) -> str:
    import mmh3

    h = mmh3.hash128(path.encode("utf-8"), 0, x64arch=False, signed=False) & ((1 << 64) - 1)
    return f"{GRAPH_NAME_PREFIX}{h}_1_0"


def ordered_path(folder: Path, stem: str, part: int, parts: int) -> Path:
    """An absolute path `folder/<stem>~<salt>.onnx` whose EP graph name sorts in part order: the hash's leading
    digits spell 10**w + part (w digits wide), so part 1 < part 2 < ... whatever the hashes' lengths."""
    width = len(str(parts))
    want = str(10**width + part)
    folder = folder.resolve()
    for salt in range(1_000_000):
        p = folder / f"{stem}~{salt}.onnx"
        if graph_name_for_path(os.fspath(p))[len(GRAPH_NAME_PREFIX) :].startswith(want):
            return p
    raise RuntimeError(f"no file name for {stem} gives an ordered graph name")  # ~1 in 10**(w+1): never
