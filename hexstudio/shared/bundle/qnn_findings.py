"""What Qualcomm's own code said about a bundle (hexstudio/workers/qnn/genie_check.py, run in a child process), as
`bundle check` findings. Pure data: no library is loaded here.

- Genie's parser: a refusal is an error carrying Genie's text verbatim; acceptance is noted with the
  Genie version that accepted it.
- QNN's reader: each ctx-bin's graphs become graph specs keyed as Genie would key them
  (`{prompt|token}_ar<AR>_cl<CL>_<i>_of_<n>`: AR and CL from the shapes, the part from the order Genie gives
  a group's graphs: by `_<i>_of_<n>` in the name, else by name), so the same Genie-model checks
  (genie_model.model_issues: tensor names, shapes, identical quantization of shared tensors, part chains)
  run on what the binaries really hold rather than on metadata.yaml.
- Target: the binaries' SoC model against the bundle's htp_backend_ext_config.json and the board's; the QNN
  build against the board's QAIRT.
"""

from __future__ import annotations

import re
from typing import Any

from hexstudio.shared.bundle import genie_model as gm

_SPLIT = re.compile(r"_(\d+)_of_(\d+)$")


def spec_of(graph: dict[str, Any]) -> dict[str, Any]:
    def tensors(ts: list[dict[str, Any]]) -> dict[str, Any]:
        out = {}
        for t in ts:
            d: dict[str, Any] = {"shape": list(t.get("shape") or []), "dtype": t.get("dtype")}
            if t.get("scale") is not None:
                d["quantization_parameters"] = {"scale": t["scale"], "offset": t["offset"]}
            out[str(t["name"])] = d
        return out

    return {"inputs": tensors(graph.get("inputs") or []), "outputs": tensors(graph.get("outputs") or [])}


def graphs_from_binaries(binaries: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Graph specs from the context binaries, keyed by Genie's view of each graph (see the module doc)."""
    groups: dict[tuple[int, int], list[tuple[str, dict[str, Any]]]] = {}
    for b in binaries:
        for g in b.get("graphs") or []:
            spec = spec_of(g)
            try:
                ar, cl = gm.variant_of(str(g.get("name")), spec)
            except ValueError:
                continue
            groups.setdefault((ar, cl), []).append((str(g.get("name")), spec))
    out: dict[str, dict[str, Any]] = {}
    for (ar, cl), items in groups.items():
        # Genie 1.21: graphs with _<i>_of_<n> first, in that order; the others after them, sorted by name
        items.sort(
            key=lambda it: (
                (0, int(_SPLIT.search(it[0]).group(1)), it[0])  # type: ignore[union-attr]
                if _SPLIT.search(it[0])
                else (1, 0, it[0])
            )
        )
        n = len(items)
        kind = "token" if ar == 1 else "prompt"
        for i, (_name, spec) in enumerate(items, start=1):
            width = len(str(n))
            out[f"{kind}_ar{ar}_cl{cl}_{i:0{width}d}_of_{n}"] = spec
    return out


def parser_finding(
    doc: dict[str, Any], name: str = "genie_config.json"
) -> tuple[str, str, str | None, str] | None:
    """(code, severity, genie text, message) for Genie's parser result on the config `name` (genie_config.json,
    or a speculative dialog's genie_config.<type>.json), None when it was not run."""
    c = (doc.get("config") if name == "genie_config.json" else (doc.get("dialogs") or {}).get(name)) or {}
    if c.get("status") is None:
        return None
    ver = c.get("genie_version") or "?"
    if int(c["status"]) == 0:
        return (
            "genie_parser_ok",
            "info",
            None,
            f"Genie {ver}'s own parser (libGenie, GenieDialogConfig_createFromJson) accepts {name}.",
        )
    return (
        "genie_parser",
        "error",
        str(c.get("message") or f"status {c['status']}"),
        f"Genie {ver}'s own parser refuses {name} (GenieDialogConfig_createFromJson status {c['status']}).",
    )


def binary_problems(
    doc: dict[str, Any], ext_soc: int | None, board_soc: int | None, board_qairt: str | None
) -> list[tuple[str, str, str, str]]:
    """(code, severity, message, fix) for the binaries themselves."""
    out: list[tuple[str, str, str, str]] = []
    builds = set()
    for b in doc.get("binaries") or []:
        if b.get("simulated"):
            continue
        if b.get("error"):
            out.append(
                (
                    "ctx_bin_unreadable",
                    "error",
                    f"{b.get('file')}: {b.get('message')}",
                    "Compile or download that part again: Genie cannot load a file QNN cannot read.",
                )
            )
            continue
        builds.add(str(b.get("build_id") or ""))
        soc = b.get("soc_model")
        if isinstance(soc, int) and ext_soc is not None and soc != ext_soc:
            out.append(
                (
                    "ctx_bin_soc",
                    "error",
                    f"{b.get('file')} was prepared for soc_model {soc}; "
                    f"htp_backend_ext_config.json says {ext_soc}.",
                    "Compile for the board's device, or fix devices[0].soc_model.",
                )
            )
        if isinstance(soc, int) and board_soc is not None and soc != board_soc:
            out.append(
                (
                    "ctx_bin_board_soc",
                    "error",
                    f"{b.get('file')} was prepared for soc_model {soc}; the "
                    f"board is soc_model {board_soc}. A context binary is pinned to its SoC and will not load.",
                    "Compile again for the board's device.",
                )
            )
    if len(builds) > 1:
        out.append(
            (
                "ctx_bin_builds",
                "warning",
                f"The context binaries come from different QNN builds: {', '.join(sorted(builds))}.",
                "Compile every part with one QAIRT version.",
            )
        )
    if builds and board_qairt:
        build = sorted(builds)[-1].lstrip("v")
        have = tuple(int(x) for x in re.findall(r"\d+", board_qairt)[:2])
        want = tuple(int(x) for x in re.findall(r"\d+", build)[:2])
        if have and want and have < want:
            out.append(
                (
                    "ctx_bin_newer_than_board",
                    "error",
                    f"The context binaries were written by QNN {build}; the "
                    f"board's QAIRT is {board_qairt}. An older runtime cannot load a newer binary.",
                    "Install the same or a newer QAIRT on the board (Board page: Install QAIRT), or compile "
                    "with the board's version.",
                )
            )
    return out
