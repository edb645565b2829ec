"""An HTP graph run on Qualcomm's x86 HTP simulator behind the float interface of an onnxruntime session.

The host legs (hexstudio/workers/arloop.py: Genie's loop over the deployment pair) feed floats that are already the
values Genie writes (GenieFeeds with the graphs' encodings) and read floats back. An HTP graph
(hexstudio.workers.qnn.htp_graph) takes and returns Genie's quantized buffers. This wrapper quantizes each float feed
with its input's encoding (exact: the feed is (q + offset) * scale already), runs the graph through the QNN
EP with CPU fallback off, and dequantizes the outputs: so the same loop measures the HTP's own arithmetic.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import numpy as np

from hexstudio.workers.qnn.ep import HtpTarget, session_options
from hexstudio.workers.qnn.htp_graph import IoTensor, deployment_io

_NP = {
    "uint8": np.uint8,
    "uint16": np.uint16,
    "int8": np.int8,
    "int16": np.int16,
    "int32": np.int32,
    "float32": np.float32,
}


def quantize(v: np.ndarray, t: IoTensor) -> np.ndarray:
    dt = _NP[t.dtype]
    if t.scale is None:
        return np.asarray(v).astype(dt)
    info = np.iinfo(dt)
    q = np.round(np.asarray(v, np.float64) / t.scale) + int(t.zero_point or 0)
    return np.clip(q, info.min, info.max).astype(dt)


def dequantize(q: np.ndarray, t: IoTensor) -> np.ndarray:
    if t.scale is None:
        return np.asarray(q)
    return ((np.asarray(q, np.float32) - float(t.zero_point or 0)) * np.float32(t.scale)).astype(np.float32)


class HtpSession:
    """`get_inputs()`, `get_outputs()` and `run(names, feeds)` as onnxruntime's, over the HTP simulator."""

    def __init__(self, path: Path, target: HtpTarget) -> None:
        import onnx
        import onnxruntime as ort

        ins, outs = deployment_io(onnx.load(os.fspath(path), load_external_data=False))
        self.inputs = {t.name: t for t in ins}
        self.outputs = {t.name: t for t in outs}
        self.sess = ort.InferenceSession(os.fspath(path), session_options(target))

    def get_inputs(self) -> Any:
        return self.sess.get_inputs()

    def get_outputs(self) -> Any:
        return self.sess.get_outputs()

    def run(self, names: list[str] | None, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
        q = {n: quantize(v, self.inputs[n]) for n, v in feeds.items()}
        names = names or list(self.outputs)
        return [dequantize(o, self.outputs[n]) for n, o in zip(names, self.sess.run(names, q), strict=True)]
