"""`hexstudio model inspect M`: what a model is, whether HexStudio supports it, and what each stage
will cost — from config.json alone, before downloading the weights."""

from __future__ import annotations

import argparse
import sys

from hexstudio.cli.common import add_actions, int_in, number_in, print_json, set_action, setting_range
from hexstudio.core.jobs import human_bytes
from hexstudio.core.services.model import inspect
from hexstudio.shared.run_settings import DEFAULTS


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    ms = add_actions(sub, "model", help="inspect a model (built-in, Hugging Face id or folder)")
    pi = ms.add_parser("inspect", help="architecture, size, support and per-stage memory/disk estimates")
    pi.add_argument("model", help="builtin:tiny-llama, a Hugging Face id, or a folder holding config.json")
    pi.add_argument(
        "--revision",
        default=None,
        metavar="REV",
        help="Hugging Face revision: a branch, tag or commit hash (default: main)",
    )
    pi.add_argument("--context-length", type=int_in(1, 1 << 24), default=None)
    pi.add_argument(
        "--ar-n",
        type=int_in(1, 1 << 16),
        default=None,
        help=f"prompt processor length (default: {DEFAULTS.ar_n})",
    )
    pi.add_argument("--parts", type=setting_range("parts"), default=None)
    pi.add_argument(
        "--board-ram-gib",
        type=number_in(float, 0.25, 4096.0),
        default=None,
        help="the target board's RAM in GiB: part sizes and whether the bundle fits (default: unknown)",
    )
    set_action(pi, cmd_inspect)


def cmd_inspect(args: argparse.Namespace) -> int:
    out = inspect(args.model, args.context_length, args.ar_n, args.parts, args.board_ram_gib, args.revision)
    if args.json:
        print_json(out)
        return 0 if out["supported"] else 1
    print(
        f"{out['model']}"
        + (f" @ {out['revision']}" if out.get("revision") else "")
        + f": {out['architecture']}"
    )
    if not out["supported"]:
        print(f"  not supported: {out['reason']}", file=sys.stderr)
        return 1
    print(
        f"  {out['num_parameters']:,} parameters, {out['num_layers']} layers, {out['num_heads']} heads "
        f"({out['num_kv_heads']} KV), hidden {out['hidden_size']}, vocabulary {out['vocab_size']:,}"
    )
    rs = out.get("rope_scaling")
    print(
        f"  rope theta {out['rope_theta']:g}"
        + (f", scaling {rs.get('rope_type')} x{rs.get('factor')}" if rs else "")
    )
    e = out["estimates"]
    print(f"  context {out['context_length']}, AR-{out['ar_n']}, {out['parts']} part(s)")
    plan = out["part_plan"]
    for line in plan["explanation"]:
        print(f"    {line}")
    ram = plan.get("board_ram_bytes")
    print(
        f"  bundle ~{human_bytes(plan['bundle_bytes'])} (W4A16 + 8-bit KV), largest part "
        f"~{human_bytes(plan['largest_part_bytes'])}; board memory "
        + (
            f"{human_bytes(ram)}: " + ("fits" if plan["fits_board"] else "does NOT fit")
            if ram
            else "unknown (--board-ram-gib N)"
        )
    )
    print(
        f"  download {human_bytes(e['hf_download_bytes'])}; disk {human_bytes(e['disk_bytes'])}; "
        f"bundle {human_bytes(e['bundle_bytes'])}"
    )
    print(
        f"  quantize peak RSS ~{human_bytes(e['quantize_peak_rss_bytes'])} part-wise "
        f"(whole-model QuantSim ~{human_bytes(e['whole_model_quantsim_rss_bytes'])}; reference recipe "
        f"{human_bytes(e['reference']['quantize_peak_rss_bytes'])})"
    )
    if not e.get("fits_64_gib", True):
        fit = e.get("parts_to_fit_64_gib")
        print(
            f"  does not fit a 64 GiB workstation with {out['parts']} part(s)"
            + (
                f": {fit} parts would (hexstudio run --set parts={fit})"
                if fit
                else ": no split fits (one decoder layer or the lm_head alone needs more)"
            )
            + "; `hexstudio preflight --model M` checks this machine"
        )
    return 0
