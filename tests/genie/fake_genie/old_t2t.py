"""A TEST-ONLY genie-t2t-run as QAIRT before 2.35 behaved (facts/genie.md): it prints the old
`[KPIS]:` block after the reply and writes no --profile file. It runs no model: it prints words from
a fixed list at a set pace, one word a token. Like the real tool it knows only genie-t2t-run's flags
and refuses anything else (there is no --max-tokens flag): the reply budget comes from the config's
`dialog.max-num-tokens`. It also prints a log line in the middle of the reply, as the real runtime's
logging interleaves with streamed text.

Config knobs (dialog keys): "fake-token-ms" (pace, default 15), "fake-tokens" (reply length without a
budget, default 12), "fake-kpis-file" (write the numbers it printed as JSON there, for the test).
"""

from __future__ import annotations

import json
import sys
import time

WORDS = [
    "the",
    "board",
    "answers",
    "quickly",
    "and",
    "every",
    "token",
    "arrives",
    "on",
    "time",
    "with",
    "care",
]
KNOWN = {"-c": 1, "--config": 1, "-p": 1, "--prompt": 1, "--prompt_file": 1, "--profile": 1, "--log": 1}


def main(argv: list[str]) -> int:
    opts: dict[str, str] = {}
    i = 0
    while i < len(argv):
        a = argv[i]
        if a not in KNOWN or i + 1 >= len(argv):
            print(f"ERROR: Unknown option or missing value: {a}", flush=True)
            return 1
        opts[a.lstrip("-")[0] if a in ("-c", "--config", "-p", "--prompt") else a.lstrip("-")] = argv[i + 1]
        i += 2
    if "c" not in opts:
        print("ERROR: Please provide config using --config.", flush=True)
        return 1
    if "prompt_file" in opts:
        with open(opts["prompt_file"], encoding="utf-8", newline="") as fh:
            prompt = fh.read()
    elif "p" in opts:
        prompt = opts["p"]
    else:
        print("ERROR:: Please provide prompt using --prompt or --prompt_file.", flush=True)
        return 1
    with open(opts["c"], encoding="utf-8") as fh:
        dialog = json.load(fh)["dialog"]
    pace = int(dialog.get("fake-token-ms", 15)) / 1000
    n = int(dialog.get("max-num-tokens") or dialog.get("fake-tokens", 12))
    t_init = time.perf_counter()
    print("Using libGenie.so version 1.11.0\n", flush=True)
    time.sleep(0.05)
    init_us = (time.perf_counter() - t_init) * 1e6
    print(f"[PROMPT]: {prompt}\n", flush=True)
    t0 = time.perf_counter()
    time.sleep(pace)
    prompt_us = (time.perf_counter() - t0) * 1e6
    prompt_tokens = max(1, len(prompt.encode("utf-8")) // 4)
    sys.stdout.write("[BEGIN]: ")
    t1 = time.perf_counter()
    for k in range(n):
        if k:
            time.sleep(pace)
        sys.stdout.write(("" if k == 0 else " ") + WORDS[k % len(WORDS)])
        sys.stdout.flush()
        if k == 1:
            sys.stdout.write('[INFO]  "KV cache update"\n')  # a logger writes its own line, mid-reply
            sys.stdout.flush()
    gen_us = (time.perf_counter() - t1) * 1e6
    sys.stdout.write("[END]\n")
    kpis = {
        "init_us": int(init_us),
        "prompt_us": int(prompt_us),
        "prompt_rate": round(prompt_tokens / (prompt_us / 1e6), 2),
        "gen_us": int(gen_us),
        "gen_rate": round(n / (gen_us / 1e6), 2),
    }
    print(
        f"\n[KPIS]:\nInit Time: {kpis['init_us']} us\nPrompt Processing Time: {kpis['prompt_us']} us, Prompt "
        f"Processing Rate : {kpis['prompt_rate']} toks/sec\nToken Generation Time: {kpis['gen_us']} us, Token "
        f"Generation Rate: {kpis['gen_rate']} toks/sec",
        flush=True,
    )
    if dialog.get("fake-kpis-file"):
        with open(dialog["fake-kpis-file"], "w", encoding="utf-8") as fh:
            json.dump({**kpis, "generated": n, "prompt_tokens": prompt_tokens}, fh)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
