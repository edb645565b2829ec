"""The simulator board's GenieX face: GenieX's `geniex` CLI (qairt plugin) over the simulator's SimDialog.

Genie's twin (workers/genie_sim/t2t.py) loads and runs the bundle; this face adds what GenieX itself
does differently (docs/genie.md, "GenieX"): the qairt plugin's bundle rules (tokenizer.json and
metadata.json required, the pipeline chosen by metadata.json's model_id prefix, bundles compiled with
a QAIRT newer than the plugin's refused, a tokenizer_config.json with a chat_template required), `geniex version`'s three lines, `pull --local-path`,
`list`, `infer` with its `> prompt` echo and its profile lines, and the per-turn profile fields of
geniex_ProfileData. Everything it prints says it is simulated.

    python -m workers.genie_sim.geniex version
    python -m workers.genie_sim.geniex pull local/NAME --local-path BUNDLE_DIR
    python -m workers.genie_sim.geniex list
    python -m workers.genie_sim.geniex infer local/NAME|BUNDLE_DIR -p TEXT [-p TEXT ...] | -i FILE
                                       [--max-tokens N] [--temperature T] [--top-k K] [--top-p P]
                                       [--seed S] [--verbose]
    python -m workers.genie_sim.geniex session -m BUNDLE_DIR [--sampler JSON]
    python -m workers.genie_sim.geniex serve [--host 127.0.0.1:18181] [--keepalive 300]   (geniex_serve.py)

`session` is the twin of HexStudio's board helper for GenieX (app/core/genie/helpers/geniex_session.py,
the `geniex` Python package): the JSON-lines protocol of workers/genie_sim/session.py, with
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
import queue
import re
import sys
import threading
import time
from pathlib import Path
from typing import Any

from workers.shared.bundle.geniex import CLI_VERSION, QAIRT_PLUGIN_VERSION, chat_template_problem
from workers.shared.errors import ActionableError

LLAMA_CPP_HASH = "simulated"
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant."   # the qairt plugin's (llm.cpp kDefaultSystemPrompt)
SIM_LABEL = "(HexStudio simulator)"
PREFILL_CHUNK = 128                         # the qairt engine pads a prompt to 128-token prefill chunks
# metadata.json model_id prefix -> the plugin's pipeline (models/dispatch.h), in its order
DISPATCH: tuple[tuple[str, str], ...] = (
    ("qwen2_5_vl_", "vlm"), ("qwen3_vl_", "vlm"), ("qwen3_", "qwen3"), ("qwen2_5_", "qwen2_5"),
    ("falcon_v3_", "falcon3"), ("llama_v3_", "llama3"), ("phi_3_5_", "phi3_5"))
GRAPH_KEY = re.compile(r"(?:([a-zA-Z]+)_)?ar(\d+)_cl(\d+)_(\d+)_of_(\d+)")
PART_KEY = re.compile(r"(?:.*_)?part(\d+)_of_(\d+)\.bin")
_VER = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class GenieXError(ActionableError, RuntimeError):
    """A load failure as GenieX reports it: the plugin's log lines, then the SDK's error."""

    def __init__(self, lines: list[str], code: str) -> None:
        super().__init__("\n".join(lines) or code)
        self.lines = lines
        self.code = code   # GENIEX_ERROR_COMMON_FILE_NOT_FOUND | GENIEX_ERROR_COMMON_MODEL_LOAD


def version_tuple(text: str) -> tuple[int, int, int] | None:
    m = _VER.search(text or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def version_lines(simulated: bool = True) -> list[str]:
    tag = f" {SIM_LABEL}" if simulated else ""
    return [f"{'GenieX CLI Version:':<23} {CLI_VERSION}{tag}",
            f"{'QAIRT Runtime Version:':<23} {QAIRT_PLUGIN_VERSION}",
            f"{'LlamaCPP Runtime Hash:':<23} {LLAMA_CPP_HASH}"]


def bundle_qairt(bundle: Path) -> str | None:
    """`qairt:` of the bundle's tool-versions.yaml (read without a YAML library: one `qairt: X` line)."""
    p = bundle / "tool-versions.yaml"
    if not p.is_file():
        return None
    for line in p.read_text(encoding="utf-8", errors="replace").splitlines():
        k, _, v = line.strip().partition(":")
        if k.strip() == "qairt" and v.strip():
            return v.strip().strip("'\"")
    return None


def check_bundle(bundle: Path) -> dict[str, Any]:
    """The qairt plugin's checks before it loads a bundle folder (llm_spec_loader.cpp, dispatch.h): returns
    metadata.json, or raises GenieXError with the plugin's texts."""
    d = str(bundle)
    layout = f"Failed to resolve QAIRT bundle layout in {d}: "
    if not (bundle / "tokenizer.json").is_file():
        raise GenieXError([layout + f"llm_spec_loader: tokenizer.json not found in {d}"],
                          "GENIEX_ERROR_COMMON_FILE_NOT_FOUND")
    if not any(bundle.glob("*.bin")):
        raise GenieXError([layout + f"llm_spec_loader: no .bin shards found in {d}"],
                          "GENIEX_ERROR_COMMON_FILE_NOT_FOUND")
    fail = f"Failed to create QAIRT LLM pipeline from bundle: {d}"
    meta_path = bundle / "metadata.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except OSError:
        raise GenieXError([f"dispatch: cannot read metadata.json: llm_spec_loader: cannot open {meta_path}", fail],
                          "GENIEX_ERROR_COMMON_MODEL_LOAD") from None
    except ValueError as exc:
        raise GenieXError([f"dispatch: cannot read metadata.json: llm_spec_loader: failed to parse {meta_path}: "
                           f"{exc}", fail], "GENIEX_ERROR_COMMON_MODEL_LOAD") from None
    files = meta.get("model_files") if isinstance(meta, dict) else None
    if not isinstance(files, dict):
        raise GenieXError(["dispatch: cannot read metadata.json: llm_spec_loader: metadata.json missing "
                           "'model_files' object", fail], "GENIEX_ERROR_COMMON_MODEL_LOAD")
    if not any(GRAPH_KEY.fullmatch(k) or PART_KEY.fullmatch(k) for k in files):
        raise GenieXError(["dispatch: cannot read metadata.json: llm_spec_loader: metadata.json contains no "
                           "recognisable shard entries", fail], "GENIEX_ERROR_COMMON_MODEL_LOAD")
    model_id = str(meta.get("model_id") or "")
    family = next((f for p, f in DISPATCH if model_id.startswith(p)), None)
    if model_id.endswith("_ssd"):
        family = "llama3_2_ssd"
    if not model_id or family is None or family == "vlm":
        raise GenieXError([f"dispatch: no LLM factory matches model_id '{model_id}'", fail],
                          "GENIEX_ERROR_COMMON_MODEL_LOAD")
    q = bundle_qairt(bundle)
    if q and (version_tuple(q) or (0, 0, 0)) > (version_tuple(QAIRT_PLUGIN_VERSION) or (0, 0, 0)):
        raise GenieXError([f"HexStudio simulator: the bundle was compiled with QAIRT {q}, newer than GenieX's qairt "
                           f"plugin ({QAIRT_PLUGIN_VERSION}, which runs bundles compiled with it or earlier); a "
                           "board cannot create the context from the binary (QNN error 5000).", fail],
                          "GENIEX_ERROR_COMMON_MODEL_LOAD")
    tc_path = bundle / "tokenizer_config.json"
    try:
        tc = json.loads(tc_path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        tc = None
    no_template = chat_template_problem(tc, str(tc_path))
    if no_template:
        raise GenieXError([no_template, fail], "GENIEX_ERROR_COMMON_MODEL_LOAD")
    return meta


class SimGenieX:
    """A loaded bundle as GenieX's qairt plugin holds it: generate() keeps the KV cache, reset() clears it."""

    def __init__(self, bundle: Path, sampler: dict[str, Any] | None = None) -> None:
        from workers.genie_sim.t2t import GenieLoadError, SimDialog

        t0 = time.perf_counter()
        self.bundle = bundle
        self.meta = check_bundle(bundle)
        try:
            self.dialog = SimDialog(bundle / "genie_config.json", sampler)
        except GenieLoadError as exc:
            raise GenieXError([*exc.lines, exc.final, f"Failed to create QAIRT LLM pipeline from bundle: {bundle}"],
                              "GENIEX_ERROR_COMMON_MODEL_LOAD") from None
        self.dialog.bos_on_fresh_cache_only = True
        self.first_turn = True
        self.init_us = (time.perf_counter() - t0) * 1e6

    @property
    def capacity(self) -> int:
        return self.dialog.capacity

    def reset(self) -> None:
        self.dialog.reset()
        self.first_turn = True

    def apply_chat_template(self, messages: list[dict[str, str]]) -> str:
        """The qairt plugin's apply_chat_template (sdk/plugins/qairt/src/llm.cpp): on a fresh cache the whole
        history, with its default system prompt when there is none; after a turn only the messages since the
        last assistant message (the cache holds the rest; none is INVALID_INPUT). The template is the
        bundle's tokenizer_config.json chat_template, with the generation prompt; a leading bos text is left
        to the pipeline, which adds bos itself on a fresh cache."""
        start = 0
        if not self.first_turn:
            last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
            start = last + 1
            if start >= len(messages):
                raise ValueError("No new messages since last assistant turn")
        msgs = [dict(m) for m in messages[start:]]
        if self.first_turn and not any(m.get("role") == "system" for m in msgs):
            msgs.insert(0, {"role": "system", "content": DEFAULT_SYSTEM_PROMPT})
        return render_chat_template(self.bundle, msgs)

    def generate(self, prompt: str, max_tokens: int | None, on_text: Any,
                 should_stop: Any = lambda: False) -> tuple[dict[str, Any], dict[str, Any]]:
        """One generation; returns (geniex_ProfileData as a dict, SimDialog's numbers)."""
        q = self.dialog.query(prompt, max_tokens, on_text, should_stop)
        self.first_turn = False
        return profile(q, max_tokens), q


def render_chat_template(bundle: Path, messages: list[dict[str, str]]) -> str:
    """tokenizer_config.json's chat_template over `messages` with the generation prompt (Jinja, as
    transformers renders it); a leading bos text dropped."""
    import jinja2

    tc = json.loads((bundle / "tokenizer_config.json").read_text(encoding="utf-8"))
    tmpl = tc["chat_template"]
    if isinstance(tmpl, list):
        tmpl = next((t["template"] for t in tmpl if t.get("name") == "default"), tmpl[0]["template"])

    def tok(v: Any) -> str:
        return str(v.get("content") if isinstance(v, dict) else v or "")

    def refuse(msg: str) -> None:
        raise ValueError(msg)

    env = jinja2.Environment(trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)
    env.globals["raise_exception"] = refuse
    bos = tok(tc.get("bos_token"))
    text = env.from_string(tmpl).render(messages=messages, add_generation_prompt=True, bos_token=bos,
                                        eos_token=tok(tc.get("eos_token")))
    return text[len(bos):] if bos and text.startswith(bos) else text


def profile(q: dict[str, Any], max_tokens: int | None) -> dict[str, Any]:
    """geniex_ProfileData's fields (geniex.h): times in microseconds, speeds in tok/s."""
    if q["state"] == "aborted":
        stop = "user"
    elif q["state"] == "context_full":
        stop = "context_length"
    elif max_tokens and q["generated"] >= max_tokens:
        stop = "length"
    else:
        stop = "eos"
    return {"ttft": int(q["ttft_us"]), "media_time": 0, "prompt_time": int(q["ttft_us"]),
            "decode_time": int(q["gen_us"]), "prompt_tokens": int(q["prompt_tokens"]),
            "generated_tokens": int(q["generated"]), "prefill_speed": float(q["prompt_rate"]),
            "decoding_speed": float(q["gen_rate"]), "draft_n_total": 0, "draft_n_accepted": 0,
            "stop_reason": stop, "simulated": True}


# -- the CLI ---------------------------------------------------------------------------------------
def data_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("GENIEX_DATADIR") or Path.home() / ".cache" / "geniex")


def _registry(dd: Path) -> dict[str, str]:
    try:
        return dict(json.loads((dd / "hexstudio-sim-models.json").read_text()))
    except (OSError, ValueError):
        return {}


def _err(msg: str) -> int:
    print(f"Error: {msg}", file=sys.stderr)
    return 1


def cmd_pull(args: argparse.Namespace) -> int:
    if not args.local_path:
        return _err("the simulator pulls local bundles only: pass --local-path DIR")
    src = Path(args.local_path).resolve()
    if not src.is_dir() or not (src / "metadata.json").is_file():
        return _err(f"{src} is not a Qualcomm AI Hub bundle: a bundle folder holds metadata.json and .bin shards")
    dd = data_dir(args.data_dir)
    dd.mkdir(parents=True, exist_ok=True)
    reg = _registry(dd)
    reg[args.model] = str(src)
    (dd / "hexstudio-sim-models.json").write_text(json.dumps(reg, indent=2))
    print(f"Pulled {args.model} from {src} {SIM_LABEL}: registered, not copied")
    return 0


def cmd_list(args: argparse.Namespace) -> int:
    reg = _registry(data_dir(args.data_dir))
    print(f"{'NAME':<40} {'RUNTIME':<8} PATH")
    for name, path in sorted(reg.items()):
        print(f"{name:<40} {'qairt':<8} {path}")
    return 0


def _resolve(name: str, dd: Path) -> Path | None:
    reg = _registry(dd)
    if name in reg:
        return Path(reg[name])
    p = Path(name)
    return p if p.is_dir() else None


REPL_HELP = (("/?, /h, /help", "Show this help message"), ("/exit", "Exit the REPL"),
             ("/clear", "Clear the screen and conversation history"))


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
        print(line)              # what a terminal would have echoed
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
        return _err(f"model {args.model} not found: pull it first (geniex pull {args.model} --local-path DIR)")
    prompts: list[str] = list(args.prompt or [])
    if args.input:
        prompts.insert(0, Path(args.input).read_text(encoding="utf-8").strip())
    sampler = {k: v for k, v in (("temp", args.temperature), ("top-k", args.top_k), ("top-p", args.top_p),
                                 ("seed", args.seed)) if v}
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
        if p is None:                  # /clear: the cache and the conversation
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
            print(f"total time:     {total / 1e6:f}s\nttft:           {pd['ttft'] / 1e6:f}s\n"
                  f"prompt time:    {pd['prompt_time'] / 1e6:f}s\nprompt tokens:  {pd['prompt_tokens']} token(s)\n"
                  f"prompt speed:   {pd['prefill_speed']:f} tok/s\ndecode time:    {pd['decode_time'] / 1e6:f}s\n"
                  f"decode tokens:  {pd['generated_tokens']} token(s)\ndecode speed:   {pd['decoding_speed']:f} tok/s\n"
                  f"stop reason:    {pd['stop_reason']}")
        elif pd["decoding_speed"]:
            print(f"— {pd['decoding_speed']:.1f} tok/s • {pd['generated_tokens']} tok • {pd['ttft'] / 1e6:.1f} s "
                  "first token —")
        print(f"(simulated {SIM_LABEL})\n")
        if pd["stop_reason"] == "context_length":
            model.reset()
            history = list(system)
            print("Model context length exceeded; conversation is reset.")
    return 0


_out_lock = threading.Lock()


def emit(obj: dict[str, Any]) -> None:
    line = json.dumps(obj, ensure_ascii=True) + "\n"
    with _out_lock:
        sys.stdout.write(line)
        sys.stdout.flush()


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
    emit({"event": "ready", "runtime": "geniex", "simulated": True, "pid": os.getpid(),
          "runtime_version": f"GenieX {CLI_VERSION} {SIM_LABEL}, qairt plugin {QAIRT_PLUGIN_VERSION}",
          "init_ms": round(model.init_us / 1000, 3), "context_length": model.capacity, "profile": True})
    ops: queue.Queue[dict[str, Any] | None] = queue.Queue()
    abort = threading.Event()

    def reader() -> None:
        for line in sys.stdin:
            if not line.strip():
                continue
            try:
                msg = json.loads(line)
            except json.JSONDecodeError:
                emit({"event": "error", "code": "bad_request", "message": "not a JSON line"})
                continue
            if msg.get("op") == "abort":
                abort.set()
            else:
                ops.put(msg)
        ops.put(None)

    threading.Thread(target=reader, daemon=True).start()
    while True:
        msg = ops.get()
        if msg is None or msg.get("op") == "quit":
            return 0
        op = msg.get("op")
        if op == "reset":
            model.reset()
            emit({"event": "reset"})
        elif op == "sampler":   # GenieX takes the sampler per generate(): from the next query on, no reload
            import numpy as np

            given = msg.get("sampler")
            model.dialog.sampler = {**model.dialog.sampler, **(given if isinstance(given, dict) else {})}
            model.dialog.rng = np.random.default_rng(int(model.dialog.sampler.get("seed", 42)))
            emit({"event": "sampler", "applied": True, "sampler": model.dialog.sampler})
        elif op == "query":
            qid = msg.get("id")
            abort.clear()

            def on_text(text: str, tokens: int = 1, qid: Any = qid) -> None:
                emit({"event": "text", "id": qid, "text": text, "tokens": tokens, "mono": time.monotonic()})

            pd, q = model.generate(str(msg.get("prompt", "")), msg.get("max_tokens"), on_text, abort.is_set)
            state = q["state"]
            emit({"event": "end", "id": qid, "state": state, "status": 0, "geniex_profile": pd,
                  "n_past": q["n_past"]})
        else:
            emit({"event": "error", "code": "bad_request", "message": f"unknown op {op!r}"})


def cmd_serve(args: argparse.Namespace) -> int:
    from workers.genie_sim.geniex_serve import serve

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
        print(f"Warning: qairt runs on the NPU only; --compute {args.compute} coerced to npu", file=sys.stderr)
    handlers = {"pull": cmd_pull, "list": cmd_list, "ls": cmd_list, "infer": cmd_infer, "session": cmd_session,
                "serve": cmd_serve}
    if args.cmd not in handlers:
        build_parser().print_help()
        return 0
    if args.cmd == "infer":
        args.verbose = args.verbose or bool(getattr(args, "verbose", False))
    return handlers[args.cmd](args)


if __name__ == "__main__":
    raise SystemExit(main())
