"""Knowledge both sides of the process boundary need: the studio (hexstudio.core) and the workers import it.

Light on purpose: the standard library and the pure-Python parts of workers only (no torch, onnx,
onnxruntime, transformers, aimet_onnx; no Qt; never hexstudio.core), so the GUI can import it at start-up and a
worker on a remote Linux host reads the same declarations.

- run_settings: the typed registry of run settings (defaults, ranges, choices, labels, the stages that
  read each one) and the "auto" rule (resolve_settings).
- artifacts: the shapes of the JSON documents stages hand each other (model.json, quantize.json,
  bundle.json).
"""
