"""spd with a smaller draft, verified on an AR-4 graph, against Genie's basic dialog (issue 29): real Genie 1.21 on
the HTP simulator, SIMULATED (Qualcomm's simulator on this CPU, never a device figure).

    .venv/bin/python bench/speculative.py [--runs 3] [--tokens 24] [--draft-len 3] [--workspace DIR]

Builds two runs through the studio's own pipeline (`hexstudio run`): builtin:tiny-llama-draft compiled locally
(the draft: 1 layer, the target's tokenizer), and builtin:tiny-llama with `ar_sizes=4` and
`speculative_dialogs=spd` pointing at the draft's bundle, compiled locally and pushed to the simulator board.
Then `hexstudio chat --dialog basic|spd` answers the same prompts greedily, `--runs` times each, alternating
so that a busy machine slows both alike, and prints each dialog's median decode rate (Genie's profile), the
tokens accepted per step, whether spd's text equals basic's, and the ratio spd / basic (the anchor: basic).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from hexstudio.shared.run_settings import spec  # noqa: E402
from tests.support.cli import python_m_hexstudio  # noqa: E402

PROMPTS = ("Once upon a time, Emma", "The sky was grey and")


def hexstudio(ws: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return python_m_hexstudio(*args, env={"HEXSTUDIO_WORKSPACE": str(ws)}, timeout=3600, cwd=REPO)


def must(r: subprocess.CompletedProcess[str], what: str) -> str:
    if r.returncode != 0:
        raise SystemExit(f"{what} failed:\n{r.stdout[-2000:]}\n{r.stderr[-2000:]}")
    return r.stdout


def build(ws: Path, draft_len: int) -> str:
    common = ["--board", "sim", "--set", "calibration_samples=4", "--set", "compile_target=local", "--json"]
    out = must(
        hexstudio(ws, "run", "--model", "builtin:tiny-llama-draft", "--until", "compile", *common),
        "the draft run",
    )
    draft_bundle = ws / "runs" / json.loads(out)["run_id"] / "artifacts" / "compile" / "bundle"
    out = must(
        hexstudio(
            ws,
            "run",
            "--model",
            "builtin:tiny-llama",
            "--until",
            "board",
            *common,
            "--set",
            "ar_sizes=4",
            "--set",
            "speculative_dialogs=spd",
            "--set",
            f"spd_draft={draft_bundle}",
            "--set",
            f"spd_draft_len={draft_len}",
        ),
        "the target run",
    )
    return str(json.loads(out)["run_id"])


def chat(ws: Path, run_id: str, dialog: str, prompt: str, tokens: int) -> dict[str, Any]:
    out = must(
        hexstudio(
            ws,
            "chat",
            "--run",
            run_id,
            "--board",
            "sim",
            "--dialog",
            dialog,
            "--template",
            "plain",
            "--max-tokens",
            str(tokens),
            "--prompt",
            prompt,
            "--json",
        ),
        f"chat --dialog {dialog}",
    )
    turn: dict[str, Any] = json.loads(out)["turns"][0]
    return turn


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=24)
    ap.add_argument("--draft-len", type=int, default=3)
    ap.add_argument("--workspace", type=Path, default=None)
    ap.add_argument(
        "--run", default=None, help="reuse a target run built by an earlier call (with --workspace)"
    )
    args = ap.parse_args()
    if args.runs < 1 or args.tokens < 1:
        ap.error("--runs and --tokens must be at least 1")
    ws = args.workspace or Path(tempfile.mkdtemp(prefix="hexstudio-bench-spd-"))
    run_id = args.run or build(ws, args.draft_len)
    rates: dict[str, list[float]] = {"basic": [], "spd": []}
    accepted: list[float] = []
    same = True
    for i in range(args.runs):
        for prompt in PROMPTS:
            texts = {}
            for dialog in ("basic", "spd") if i % 2 == 0 else ("spd", "basic"):
                t = chat(ws, run_id, dialog, prompt, args.tokens)
                k = t.get("kpis") or {}
                if k.get("gen_tok_s"):
                    rates[dialog].append(float(k["gen_tok_s"]))
                if dialog == "spd" and k.get("accepted_per_step") is not None:
                    accepted.append(float(k["accepted_per_step"]))
                texts[dialog] = t["text"]
            same = same and texts["basic"] == texts["spd"]
    q = json.loads((ws / "runs" / run_id / "artifacts" / "quantize" / "quantize.json").read_text())
    shape = f"AR-{q['ar_n']} + AR-4, CL-{q['context_length']}, {q['parts']} parts"
    if not rates["basic"] or not rates["spd"]:
        print(
            f"no token rate came back (basic {len(rates['basic'])}, spd {len(rates['spd'])} replies with one)"
        )
        return 1
    basic, spd = statistics.median(rates["basic"]), statistics.median(rates["spd"])
    # a reused run (--run) was built with its own draft length: say that one, not the flag's
    sp = spec("spd_draft_len")
    settings = json.loads((ws / "runs" / run_id / "run.json").read_text())["inputs"]["settings"]
    draft_len = settings.get("spd_draft_len", sp.default if sp is not None else args.draft_len)
    acc = f"{statistics.median(accepted):.2f}" if accepted else "n/a"
    print(
        f"SIMULATED real Genie 1.21 on the HTP simulator, builtin:tiny-llama ({shape}), spd with "
        f"builtin:tiny-llama-draft, draft-len {draft_len}, {args.tokens} tokens, {len(rates['spd'])} queries "
        f"per dialog: basic {basic:.2f} tok/s, spd {spd:.2f} tok/s; {acc} tokens accepted per step; "
        f"spd text {'identical to' if same else 'DIFFERENT from'} basic's"
    )
    print(f"ratio to the anchor (basic dialog): {spd / basic:.3f}")
    print(f"workspace {ws}, run {run_id}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
