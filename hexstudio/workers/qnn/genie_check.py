"""Qualcomm's own checks of a bundle, run on this machine: Genie's config parser and QNN's binary reader.

    python -m hexstudio.workers.qnn.genie_check BUNDLE_DIR          # one JSON document on stdout

- genie_config.json through libGenie's `GenieDialogConfig_createFromJson` (Genie 1.21 from the
  onnxruntime-qnn wheel): its status and the text Genie prints on a refusal, verbatim (e.g. "Schema
  validation failed with 1 error: - at '/engine/model': ...").
- every ctx-bin through libQnnSystem's `QnnSystemContext_getBinaryInfo` (hexstudio.workers.qnn.context_info): the QNN
  build, the SoC model, each graph's name and I/O tensors (name, dtype, shape, scale/offset). A simulated
  stand-in (the onnxruntime twin's JSON document) is reported as such, not read.

Runs in its own process (the studio starts it): a crash inside a Qualcomm library ends this process only,
and the library's printed text is captured through its file descriptors. Standard library only.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import sys
from pathlib import Path
from typing import Any

from hexstudio.workers.board.genie_session import captured_fds
from hexstudio.workers.qnn.context_info import ContextInfoError, read_context_info
from hexstudio.workers.qnn.libs import INSTALL_HINT, find_qnn_libs

SIM_BIN_MARK = b"hexstudio-simulated-context-binary"
MAX_CONFIG_BYTES = 1 << 20


def genie_parse(config_text: str, lib: Path) -> dict[str, Any]:
    """{"status": int, "message": text Genie printed, "genie_version"}; status 0 = Genie accepts the config."""
    g = ctypes.CDLL(str(lib))
    create = g.GenieDialogConfig_createFromJson
    create.argtypes = [ctypes.c_char_p, ctypes.POINTER(ctypes.c_void_p)]
    create.restype = ctypes.c_int32
    version = ".".join(str(getattr(g, f"Genie_getApi{p}Version")()) for p in ("Major", "Minor", "Patch"))
    handle = ctypes.c_void_p()
    with captured_fds() as text:
        status = int(create(config_text.encode("utf-8"), ctypes.byref(handle)))
    if status == 0 and handle:
        free = g.GenieDialogConfig_free
        free.argtypes = [ctypes.c_void_p]
        free(handle)
    msg = "".join(text).strip()
    return {"status": status, "message": msg, "genie_version": version}


def read_config(path: Path) -> str:
    """A config file's text: a regular file (no link followed, no FIFO waited on), at most MAX_CONFIG_BYTES."""
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_NONBLOCK", 0))
    with os.fdopen(fd, "rb") as fh:
        if not os.path.isfile(path):
            raise OSError("not a regular file")
        text = fh.read(MAX_CONFIG_BYTES + 1).decode("utf-8")
    if len(text) > MAX_CONFIG_BYTES:
        raise OSError(f"larger than {MAX_CONFIG_BYTES} bytes")
    return text


def check(bundle: Path) -> dict[str, Any]:
    libs = find_qnn_libs()
    if libs is None:
        return {"available": False, "hint": INSTALL_HINT}
    doc: dict[str, Any] = {"available": True, "qnn_version": libs.qnn_version, "wheel": libs.wheel_version}
    cfg_path = bundle / "genie_config.json"
    try:
        text = read_config(cfg_path)
    except (OSError, UnicodeDecodeError) as exc:
        doc["config"] = {"status": None, "message": f"cannot read {cfg_path}: {exc}"}
        return doc
    doc["config"] = genie_parse(text, libs.genie)
    doc["dialogs"] = {}  # the speculative dialogs' configs beside it (genie_config.lade.json, ...)
    for variant in sorted(bundle.glob("genie_config.*.json")):
        try:
            doc["dialogs"][variant.name] = genie_parse(read_config(variant), libs.genie)
        except (OSError, UnicodeDecodeError) as exc:
            doc["dialogs"][variant.name] = {"status": None, "message": f"cannot read {variant}: {exc}"}
    try:
        cfg = json.loads(text)
        bins = cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
        bins = [b for b in bins if isinstance(b, str)] if isinstance(bins, list) else []
    except (ValueError, KeyError, TypeError):
        bins = []
    root = bundle.resolve()
    doc["binaries"] = []
    for b in bins:
        p = (bundle / b).resolve()
        entry: dict[str, Any] = {"file": b}
        if root not in p.parents or not p.is_file():  # the path rules themselves are the light checker's
            entry.update({"error": "unreadable", "message": f"{b} is not a regular file inside the bundle"})
        else:
            with open(p, "rb") as fh:
                head = fh.read(256)
            if SIM_BIN_MARK in head:
                entry["simulated"] = True
            else:
                try:
                    entry.update(read_context_info(p, libs.system).to_json())
                except (ContextInfoError, OSError) as exc:
                    entry.update({"error": "unreadable", "message": str(exc)})
        doc["binaries"].append(entry)
    return doc


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m hexstudio.workers.qnn.genie_check")
    ap.add_argument("bundle", type=Path)
    args = ap.parse_args(argv)
    print(json.dumps(check(args.bundle)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
