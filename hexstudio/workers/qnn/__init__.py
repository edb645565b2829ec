"""Qualcomm's own runtime on this machine: QNN 2.51 and Genie 1.21 from the onnxruntime-qnn wheel.

- `libs`: where the wheel's libraries are, and their versions (no import of onnxruntime).
- `context_info`: a QNN context binary read back through libQnnSystem's QnnSystemContext_getBinaryInfo
  (ctypes; standard library only).
- `htp_graph`: the deployment graphs in the form QNN HTP compiles whole (Genie's quantized I/O, the
  embedding lookup, mixed-precision MatMuls).
- `compile`: local compile through the QNN execution provider into real context binaries.
- `genie_check`: Genie's own config parser (libGenie's GenieDialogConfig_createFromJson).

Facts and their sources: docs/genie.md, docs/compile.md.
"""
