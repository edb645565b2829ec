"""`hexstudio bundle config|devices|verify|check`: the Genie bundle, before and after compiling."""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

from hexstudio.cli.common import CliError, print_json, set_action, setting_range
from hexstudio.cli.ssh import add_trust_flag, open_named_board
from hexstudio.shared import bundle as gb
from hexstudio.shared import modelinfo
from hexstudio.shared.bundle.dialog_tokens import dialog_tokens
from hexstudio.shared.data import BUILTIN_MODELS, builtin_model_dir


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = sub.add_parser(
        "bundle", help="Genie bundle: preview genie_config.json, list devices, verify a bundle"
    )
    bs = p.add_subparsers(dest="bundle_command", metavar="ACTION", required=True)
    pc = bs.add_parser("config", help="print the genie_config.json HexStudio would write for a model")
    pc.add_argument(
        "--model",
        required=True,
        help="a folder holding config.json and the tokenizer files (weights not needed), or builtin:tiny-llama",
    )
    pc.add_argument("--device", default="Dragonwing IQ-9075 EVK")
    pc.add_argument("--context-length", type=setting_range("context_length"), default=4096)
    pc.add_argument("--ar-n", type=setting_range("ar_n"), default=128)
    pc.add_argument("--parts", type=setting_range("parts"), default=None)
    pc.set_defaults(func=cmd_config)
    pd = bs.add_parser("devices", help="devices HexStudio knows offline, or (--aihub) the live AI Hub list")
    pd.add_argument(
        "--aihub",
        action="store_true",
        help="ask Qualcomm AI Hub (token from the keyring, $HEXSTUDIO_AIHUB_TOKEN or ~/.qai_hub/client.ini)",
    )
    set_action(pd, cmd_devices)
    pv = bs.add_parser("verify", help="check every file of a bundle against its bundle.json")
    pv.add_argument("bundle_dir", type=Path)
    set_action(pv, cmd_verify)
    pk = bs.add_parser(
        "check",
        help="check a bundle against Genie's contract (config schema, graphs, rope, "
        "quantization, tokens; with --board: dsp_arch, soc_model, QAIRT); where "
        "onnxruntime-qnn is installed, with Genie's own parser and QNN's binary reader",
    )
    pk.add_argument("bundle_dir", type=Path, metavar="PATH")
    pk.add_argument(
        "--no-qualcomm",
        action="store_true",
        help="skip Qualcomm's own checks (Genie's parser, QNN's reader): HexStudio's checks only",
    )
    pk.add_argument(
        "--board", default=None, metavar="NAME", help="also check against this board (the doctor's facts)"
    )
    add_trust_flag(pk)  # a board never connected to: its host key is trusted here, as `board probe` does
    set_action(pk, cmd_check)


def cmd_config(args: argparse.Namespace) -> int:
    folder = builtin_model_dir(args.model) if args.model in BUILTIN_MODELS else Path(args.model).expanduser()
    if not folder.is_dir():  # a Hugging Face id, say: this command reads the model's files, not the Hub
        raise CliError(
            f"--model takes a model folder here (config.json and the tokenizer files); '{args.model}' is not one.",
            "Give the model's folder: a run's runs/<RUN>/artifacts/model/hf, or the Hugging Face cache's snapshot "
            "folder; or builtin:tiny-llama.",
        )
    try:
        cfg = modelinfo.read_config(folder)
        dev = gb.device_info(args.device)
        gb.check_device(dev)
    except (modelinfo.ModelInfoError, gb.BundleError) as exc:
        raise CliError.of(exc) from None
    info = modelinfo.inspect_config(cfg)
    if not info["supported"]:
        raise CliError(info["reason"])
    err = modelinfo.check_context(info, args.context_length, args.ar_n)
    if err:
        raise CliError(err)
    parts = args.parts or modelinfo.default_parts(info)
    if bad := modelinfo.check_parts(info, parts):
        raise CliError(*bad)
    slug = gb.model_slug(str(cfg.get("_name_or_path") or folder.resolve().name))
    bins = [gb.ctx_bin_name(slug, k, parts) for k in range(1, parts + 1)]
    try:
        out = gb.genie_config(
            cfg, args.context_length, bins, int(info["head_dim"]), tokens=dialog_tokens(folder)
        )
        # the graphs would be exported and compiled at --context-length (names `_cl<N>_`)
        gb.check_genie_config(out, cfg, args.context_length)
    except gb.BundleError as exc:
        raise CliError.of(exc) from None
    print_json(out)
    return 0


def cmd_devices(args: argparse.Namespace) -> int:
    if args.aihub:
        return _aihub_devices(args)
    rows = [{"name": n, **d} for n, d in gb.KNOWN_DEVICES.items()]
    if args.json:
        print_json({"devices": rows})
    else:
        for r in rows:
            print(f"{r['name']:28s} soc_model {r['soc_model']:3d}  {r['dsp_arch']}  {r['os']}")
    return 0


def _aihub_devices(args: argparse.Namespace) -> int:
    import asyncio

    from hexstudio.core.services.aihub_devices import list_aihub_devices

    listing = asyncio.run(list_aihub_devices())  # ServiceError: no token, AI Hub unreachable, ...
    if args.json:
        print_json(listing.to_json())
        return 0
    for d in listing.devices:
        print(
            f"{'ok ' if d.supported else 'no '} {d.name:28s} {d.dsp_arch:5s} soc_model {d.soc_model:3d}  weight "
            f"sharing {'yes' if d.weight_sharing else 'no ':3s}  {d.os}{'  (EMULATED)' if d.emulated else ''}"
        )
    return 0


def cmd_verify(args: argparse.Namespace) -> int:
    problems = gb.verify_bundle(args.bundle_dir)
    try:  # a malformed bundle.json is one of the problems already: its "simulated" is unknown
        doc = json.loads((args.bundle_dir / "bundle.json").read_text(encoding="utf-8"))
    except (OSError, ValueError):
        doc = {}
    doc = doc if isinstance(doc, dict) else {}
    if args.json:
        print_json({"ok": not problems, "problems": problems, "simulated": doc.get("simulated")})
    else:
        print("bundle OK" if not problems else "\n".join(problems))
    return 0 if not problems else 1


def _board_facts(name: str, args: argparse.Namespace) -> dict[str, Any]:
    import asyncio

    from hexstudio.core.device.doctor import probe
    from hexstudio.core.device.errors import BoardError

    async def go() -> dict[str, Any]:
        b = await open_named_board(name, args)
        try:
            if b.simulated:
                return {"simulated": True}
            return dict((await probe(b, only=("soc", "qairt"))).facts)
        finally:
            await b.transport.close()

    try:
        return asyncio.run(go())
    except BoardError as exc:
        raise CliError(exc.message, exc.hint) from None


def cmd_check(args: argparse.Namespace) -> int:
    from hexstudio.core.services.bundle_check import check
    from hexstudio.shared.bundle.check import errors, report_text

    if not args.bundle_dir.is_dir():
        raise CliError(
            f"{args.bundle_dir} is not a folder.", "Give the bundle folder (it holds genie_config.json)."
        )
    facts = _board_facts(args.board, args) if args.board else None
    findings = check(args.bundle_dir, facts, qualcomm=not args.no_qualcomm)
    bad = errors(findings)
    if args.json:
        print_json(
            {
                "ok": not bad,
                "errors": len(bad),
                "board": args.board,
                "board_facts": facts,
                "findings": [f.to_dict() for f in findings],
            }
        )
    else:
        if findings:
            print(report_text(findings))
        print(
            f"bundle check: {'OK' if not bad else f'{len(bad)} error(s): Genie would refuse or mis-run it'}"
            f" ({len(findings) - len(bad)} other finding(s))"
        )
    return 0 if not bad else 1
