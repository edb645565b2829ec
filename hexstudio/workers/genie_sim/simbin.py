"""The simulated context binary: what `<model>_part_{i}_of_{n}.bin` holds in a simulation bundle.

A real bundle's context binary (AI Hub's link job) holds one part's graphs (the prompt processor and
the token generator, sharing weights) with each I/O tensor's name, shape, datatype and quantization;
Genie reads those to wire and check the graphs before it runs them. The simulator board's stand-in is
a small JSON document with the same facts, naming the QDQ ONNX graph (under sim/) that the simulator
executes for each graph. A simulation bundle is thus laid out, configured and checked exactly like a
real one; only these files differ, and they say so.

    {"format": "hexstudio-simulated-context-binary", "version": 1, "simulated": true,
     "graphs": [{"name": "prompt_ar128_cl512_1_of_2", "onnx": "sim/prompt_ar128_cl512_1_of_2.onnx",
                 "inputs": {name: {"shape": [...], "dtype": "uint16",
                                   "quantization_parameters": {"scale": s, "offset": o}}, ...},
                 "outputs": {...}}, ...]}

Pure Python (the bundle checker reads these too).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError

FORMAT = "hexstudio-simulated-context-binary"
VERSION = 1


class SimBinError(ActionableError, ValueError):
    """Not a simulated context binary (or a broken one); the message says which file and why."""


def write_sim_bin(path: Path, graphs: list[dict[str, Any]]) -> None:
    """`graphs`: [{"name", "onnx", "inputs", "outputs"}] (one part's graphs)."""
    doc = {
        "format": FORMAT,
        "version": VERSION,
        "simulated": True,
        "note": "HexStudio simulator board: a stand-in for an AI Hub context binary; not loadable by a real "
        "board's Genie",
        "graphs": graphs,
    }
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(doc, indent=1), encoding="utf-8")
    tmp.replace(path)


def is_sim_bin(path: Path) -> bool:
    try:
        with open(path, "rb") as fh:
            head = fh.read(256)
    except OSError:
        return False
    return FORMAT.encode() in head


def read_sim_bin(path: Path) -> list[dict[str, Any]]:
    """The graphs of a simulated context binary. Raises SimBinError for anything else, e.g. a real
    (AI Hub) context binary, which only a board's Genie runs."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise SimBinError(f"{path}: {exc.strerror or exc}") from None
    try:
        doc = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError):
        raise SimBinError(
            f"{path.name} is a real context binary (compiled for a Hexagon NPU): the HexStudio "
            "simulator board runs only simulation bundles. Push this bundle to a real board."
        ) from None
    if not isinstance(doc, dict) or doc.get("format") != FORMAT:
        raise SimBinError(f"{path.name} is not a HexStudio simulated context binary.")
    if doc.get("version") != VERSION:
        raise SimBinError(
            f"{path.name} is a simulated context binary of format version {doc.get('version')}; this "
            f"HexStudio reads version {VERSION}. Compile the bundle again."
        )
    graphs = doc.get("graphs")
    if not isinstance(graphs, list) or not all(
        isinstance(g, dict)
        and isinstance(g.get("name"), str)
        and isinstance(g.get("inputs"), dict)
        and isinstance(g.get("outputs"), dict)
        for g in graphs
    ):
        raise SimBinError(f"{path.name}: its graph list is damaged. Compile the bundle again.")
    return graphs
