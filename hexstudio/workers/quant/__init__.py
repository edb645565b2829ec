"""Quantization pieces the quantize, validate and preflight workers share: calibration units, encodings, QDQ
conversion, the AIMET smoke test."""
