"""The simulator board's GenieX face: GenieX's `geniex` CLI (qairt plugin) over the simulator's SimDialog.

Genie's twin (hexstudio/workers/genie_sim/t2t.py) loads and runs the bundle; this face adds what GenieX itself
does differently (docs/genie.md, "GenieX"): the qairt plugin's bundle rules (tokenizer.json and
metadata.json required, the pipeline chosen by metadata.json's model_id prefix, bundles compiled with
a QAIRT newer than the plugin's refused, a tokenizer_config.json with a chat_template required), `geniex version`'s three lines, `pull --local-path`,
`list`, `infer` with its `> prompt` echo and its profile lines, and the per-turn profile fields of
geniex_ProfileData. Everything it prints says it is simulated.

    python -m hexstudio.workers.genie_sim.geniex version
    python -m hexstudio.workers.genie_sim.geniex pull local/NAME --local-path BUNDLE_DIR
    python -m hexstudio.workers.genie_sim.geniex list
    python -m hexstudio.workers.genie_sim.geniex infer local/NAME|BUNDLE_DIR -p TEXT [-p TEXT ...] | -i FILE
                                       [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
                                       [--seed S] [--verbose]
    python -m hexstudio.workers.genie_sim.geniex session -m BUNDLE_DIR [--sampler JSON]
    python -m hexstudio.workers.genie_sim.geniex serve [--host 127.0.0.1:18181] [--keepalive 300]   (geniex_serve.py)

`session` is the twin of HexStudio's board helper for GenieX (hexstudio/workers/board/geniex_session.py,
the `geniex` Python package): the JSON-lines protocol of hexstudio/workers/genie_sim/session.py, with
`"runtime": "geniex"` in `ready` and GenieX's profile (`geniex_profile`) in each `end`.

Differences from the real CLI, said here rather than hidden: `pull` records the folder instead of
copying it into the cache; `infer` keeps the conversation and applies the bundle's chat template as the
plugin does (SimGenieX.apply_chat_template). `infer` without -p/-i is the REPL (/?, /exit, /clear) over lines of stdin
(the real one needs a terminal). No llama_cpp plugin, no geniex-bench.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.shared.bundle.geniex import CLI_VERSION, QAIRT_PLUGIN_VERSION
from hexstudio.workers.board.helper_io import emit
from hexstudio.workers.genie_sim.commands import OnText, serve_commands
from hexstudio.workers.genie_sim.geniex_model import (
    SIM_LABEL,
    GenieXError,
    SimGenieX,
    _registry,
    _resolve,
    data_dir,
    version_lines,
)
from hexstudio.workers.genie_sim.geniex_serve import serve


# -- the CLI ---------------------------------------------------------------------------------------
def _err(msg: str) -> int:
    print(f"Error: {msg}", file=sys.stderr)
    return 1


def cmd_pull(args: argparse.Namespace) -> int:
    if not args.local_path:
        return _err("the simulator pulls local bundles only: pass --local-path DIR")
    src = Path(args.local_path).resolve()
    if not src.is_dir() or not (src / "metadata.json").is_file():
        return _err(
            f"{src} is not a Qualcomm AI Hub bundle: a bundle folder holds metadata.json and .bin shards"
        )
    dd = data_dir(args.data_dir)
    dd.mkdir(parents=True, exist_ok=True)
    reg = _registry(dd)
    reg[args.model] = str(src)
    # whole or not at all: a torn registry reads as empty, and the next pull would keep only its own model
    tmp = dd / f".hexstudio-sim-models.json.{os.getpid()}.tmp"
    with open(tmp, "w", encoding="utf-8") as fh:
        fh.write(json.dumps(reg, indent=2))
        fh.flush()
        os.fsync(fh.fileno())
    os.replace(tmp, dd / "hexstudio-sim-models.json")
    print(f"Pulled {args.model} from {src} {SIM_LABEL}: registered, not copied")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    reg = _registry(data_dir(args.data_dir))
    print(f"{'NAME':<40} {'RUNTIME':<8} PATH")
    for name, path in sorted(reg.items()):
        print(f"{name:<40} {'qairt':<8} {path}")
    return 0


REPL_HELP = (
    ("/?, /h, /help", "Show this help message"),
    ("/exit", "Exit the REPL"),
    ("/clear", "Clear the screen and conversation history"),
)


def repl_lines(stdin: Any) -> Any:
    """GenieX's REPL (cli/cmd/geniex/common/repl.go) over lines of stdin: yields the prompts; answers /?, /h,
    /help, /exit, /clear (yields None: reset) and unknown commands itself. A line whose first word holds a
    second '/' or a '.' is a prompt (a path), not a command. The real one reads a terminal in raw mode."""
    while True:
        sys.stdout.write("> ")
        sys.stdout.flush()
        line = stdin.readline()
        if not line:
            print()
            return
        line = line.rstrip("\n")
        print(line)  # what a terminal would have echoed
        if not line.startswith("/"):
            yield line
            continue
        first = line.strip().split()[0] if line.strip() else "/"
        if "/" in first[1:] or "." in first:
            yield line
            continue
        if first in ("/?", "/h", "/help"):
            print("Commands:")
            for cmd, what in REPL_HELP:
                print(f"  {cmd:<25} {what}")
            print()
        elif first == "/exit":
            return
        elif first == "/clear":
            print("\033[H\033[2J", end="")
            yield None
        else:
            print(f"Unknown command: {first}")
            print()


def cmd_infer(args: argparse.Namespace) -> int:
    bundle = _resolve(args.model, data_dir(args.data_dir))
    if bundle is None:
        return _err(
            f"model {args.model} not found: pull it first (geniex pull {args.model} --local-path DIR)"
        )
    prompts: list[str] = list(args.prompt or [])
    if args.input:
        prompts.insert(0, Path(args.input).read_text(encoding="utf-8").strip())
    sampler = {
        k: v
        for k, v in (
            ("temp", args.temperature),
            ("top-k", args.top_k),
            ("top-p", args.top_p),
            ("seed", args.seed),
        )
        if v
    }
    try:
        model = SimGenieX(bundle, sampler or None)
    except GenieXError as exc:
        for line in exc.lines:
            print(f"[ERROR] {line}", file=sys.stderr)
        return _err(f"GenieXError({exc.code}): model load failed")
    if args.verbose:
        print(f"Model loaded: runtime=qairt compute=npu {SIM_LABEL}")
    # infer keeps the conversation and sends the chat template of it (infer.go): the plugin formats what is new
    system = [{"role": "system", "content": args.system_prompt}] if args.system_prompt else []
    history: list[dict[str, str]] = list(system)
    source = iter(prompts) if prompts else repl_lines(sys.stdin)
    for p in source:
        if p is None:  # /clear: the cache and the conversation
            model.reset()
            history = list(system)
            continue
        if prompts:
            first, *rest = p.splitlines() or [""]
            print(f"> {first}")
            for line in rest:
                print(f". {line}")
        history.append({"role": "user", "content": p})

        parts: list[str] = []

        def on_text(text: str, tokens: int = 1, parts: list[str] = parts) -> None:
            parts.append(text)
            sys.stdout.write(text)
            sys.stdout.flush()

        pd, _ = model.generate(model.apply_chat_template(history), args.max_tokens, on_text)
        history.append({"role": "assistant", "content": "".join(parts)})
        print("\n")
        if args.verbose:
            total = pd["media_time"] + pd["prompt_time"] + pd["decode_time"]
            print(
                f"total time:     {total / 1e6:f}s\nttft:           {pd['ttft'] / 1e6:f}s\n"
                f"prompt time:    {pd['prompt_time'] / 1e6:f}s\nprompt tokens:  {pd['prompt_tokens']} token(s)\n"
                f"prompt speed:   {pd['prefill_speed']:f} tok/s\ndecode time:    {pd['decode_time'] / 1e6:f}s\n"
                f"decode tokens:  {pd['generated_tokens']} token(s)\ndecode speed:   {pd['decoding_speed']:f} tok/s\n"
                f"stop reason:    {pd['stop_reason']}"
            )
        elif pd["decoding_speed"]:
            print(
                f"— {pd['decoding_speed']:.1f} tok/s • {pd['generated_tokens']} tok • {pd['ttft'] / 1e6:.1f} s "
                "first token —"
            )
        print(f"(simulated {SIM_LABEL})\n")
        if pd["stop_reason"] == "context_length":
            model.reset()
            history = list(system)
            print("Model context length exceeded; conversation is reset.")
    return 0


def cmd_session(args: argparse.Namespace) -> int:
    sampler = json.loads(args.sampler) if args.sampler else None
    try:
        model = SimGenieX(Path(args.model_dir).resolve(), sampler)
    except GenieXError as exc:
        emit({"event": "error", "code": "model_load_failed", "message": "\n".join([*exc.lines, exc.code])})
        return 1
    except Exception as exc:
        emit({"event": "error", "code": "model_load_failed", "message": f"{type(exc).__name__}: {exc}"})
        return 1
    emit(
        {
            "event": "ready",
            "runtime": "geniex",
            "simulated": True,
            "pid": os.getpid(),
            "runtime_version": f"GenieX {CLI_VERSION} {SIM_LABEL}, qairt plugin {QAIRT_PLUGIN_VERSION}",
            "init_ms": round(model.init_us / 1000, 3),
            "context_length": model.capacity,
            "profile": True,
        }
    )

    def query(msg: dict[str, Any], on_text: OnText, aborted: Callable[[], bool]) -> dict[str, Any]:
        pd, q = model.generate(str(msg.get("prompt", "")), msg.get("max_tokens"), on_text, aborted)
        return {"state": q["state"], "status": 0, "geniex_profile": pd, "n_past": q["n_past"]}

    # GenieX takes the sampler per generate(): from the next query on, no reload
    return serve_commands(model.reset, model.dialog.apply_sampler, query)


def cmd_serve(args: argparse.Namespace) -> int:
    return serve(args.host, data_dir(args.data_dir), args.keepalive)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="geniex", description=f"GenieX CLI {SIM_LABEL}")
    p.add_argument("--data-dir", default=None)
    p.add_argument("--log", default="none")
    p.add_argument("--verbose", action="store_true")
    p.add_argument("--skip-update", action="store_true")
    p.add_argument("-v", "--version", action="store_true")
    sub = p.add_subparsers(dest="cmd")
    sub.add_parser("version")
    pl = sub.add_parser("pull")
    pl.add_argument("model")
    pl.add_argument("--local-path", default=None)
    pl.add_argument("--model-hub", default=None)
    pl.add_argument("--model-type", default=None)
    sub.add_parser("list", aliases=["ls"])
    inf = sub.add_parser("infer")
    inf.add_argument("model")
    inf.add_argument("-p", "--prompt", action="append")
    inf.add_argument("-i", "--input", default=None)
    inf.add_argument("--max-tokens", type=int, default=2048)
    inf.add_argument("--temperature", type=float, default=0.0)
    inf.add_argument("--top-k", type=int, default=0)
    inf.add_argument("--top-p", type=float, default=0.0)
    inf.add_argument("--seed", type=int, default=0)
    inf.add_argument("-c", "--compute", default="")
    inf.add_argument("-s", "--system-prompt", default="")
    inf.add_argument("--verbose", action="store_true")
    srv = sub.add_parser("serve")
    srv.add_argument("--host", default=os.environ.get("GENIEX_HOST", "127.0.0.1:18181"))
    srv.add_argument("--keepalive", type=float, default=float(os.environ.get("GENIEX_KEEPALIVE", 300)))
    srv.add_argument("-c", "--compute", default="")
    ses = sub.add_parser("session")
    ses.add_argument("-m", "--model-dir", required=True)
    ses.add_argument("--sampler", default=None)
    return p


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.version or args.cmd == "version":
        print("\n".join(version_lines()))
        return 0
    if args.cmd == "infer" and args.compute and args.compute.lower() not in ("npu", "auto"):
        print(
            f"Warning: qairt runs on the NPU only; --compute {args.compute} coerced to npu", file=sys.stderr
        )
    handlers = {
        "pull": cmd_pull,
        "list": cmd_list,
        "ls": cmd_list,
        "infer": cmd_infer,
        "session": cmd_session,
        "serve": cmd_serve,
    }
    if args.cmd not in handlers:
        build_parser().print_help()
        return 0
    if args.cmd == "infer":
        args.verbose = args.verbose or bool(getattr(args, "verbose", False))
    return handlers[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
