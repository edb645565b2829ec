"""A genie-t2t-run compatible runner that executes a simulation bundle with onnxruntime.

    python -m hexstudio.workers.genie_sim.t2t -c genie_config.json --prompt_file prompt.txt --profile p.json

Same flags, stdout shape and --profile JSON as Qualcomm's genie-t2t-run (facts/genie.md), so the
studio drives it exactly like the board's runtime. It runs the prompt processor over AR-N blocks,
then the token generator, measures its own real rates, and says everywhere that it is a
SIMULATOR: its numbers are CPU numbers, never device results.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path
from typing import Any

from hexstudio.shared.errors import ActionableError
from hexstudio.workers.genie_sim.t2t_args import build_parser

# Not Genie: HexStudio's onnxruntime twin, which enforces the contract of Genie 1.13's sources (Dialog.cpp,
# nsp-model.cpp). Its version says so; the real Genie (1.21, onnxruntime-qnn) runs real bundles instead.
GENIE_API_VERSION = "1.13.0-twin"
RUNNER = "HexStudio's onnxruntime twin of Genie (Genie 1.13's contract; not Genie)"
BANNER = (
    f"Using libGenie.so version {GENIE_API_VERSION} ({RUNNER}: onnxruntime on the CPU, simulated, "
    "not a device)"
)


UNSUPPORTED = {
    "lora": "--lora: the HexStudio simulator has no LoRA adapters. Run without --lora, or on a real board.",
    "save": "--save: the HexStudio simulator cannot save the dialog's KV state. Run without --save, or on a real "
    "board.",
    "restore": "--restore: the HexStudio simulator cannot restore a saved dialog state. Run without --restore, "
    "or on a real board.",
}


def refusal(args: argparse.Namespace) -> str | None:
    """A flag genie-t2t-run has but the simulator does not implement: refuse it, never ignore it silently."""
    for key, message in UNSUPPORTED.items():
        if getattr(args, key) is not None:
            return message
    if args.action == "PAUSE":
        return (
            "--action PAUSE: the HexStudio simulator implements --action ABORT only (pause and resume are not "
            "simulated). Use --action ABORT, or a real board."
        )
    if args.sleep is not None and args.action is None:
        return "--sleep says when to send --action: give --action ABORT with it."
    if args.sleep is not None and args.sleep < 0:
        return "--sleep must be 0 or more milliseconds."
    return None


def log(level: str, want: str | None, msg: str) -> None:
    order = ["error", "warn", "info", "verbose"]
    if want is not None and order.index(level) <= order.index(want):
        print(f'[{level.upper()}]  "{msg}"', flush=True)


# Genie's values for a sampler key the config leaves out (qualla sampler.cpp): greedy only when asked for
SAMPLER_DEFAULTS = {"temp": 0.1, "top-k": 0, "top-p": 0.8, "seed": -1}


def sample(logits: Any, sampler: dict[str, Any], rng: Any) -> int:
    """One token as Genie's sampler draws it: greedy at temp <= 0 or top-k 1; top-k 0 keeps every token."""
    import numpy as np

    temp = float(sampler.get("temp", SAMPLER_DEFAULTS["temp"]))
    top_k = int(sampler.get("top-k", SAMPLER_DEFAULTS["top-k"]))
    if temp <= 0 or top_k == 1:
        return int(np.argmax(logits))
    z = logits.astype(np.float64) / temp
    order = np.argsort(-z)
    idx = order if top_k <= 0 else order[:top_k]
    p = np.exp(z[idx] - z[idx].max())
    p /= p.sum()
    top_p = float(sampler.get("top-p", SAMPLER_DEFAULTS["top-p"]))
    keep = int(np.searchsorted(np.cumsum(p), top_p) + 1)
    idx, p = idx[:keep], p[:keep] / p[:keep].sum()
    return int(rng.choice(idx, p=p))


def profile_doc(init_us: float, q: dict[str, Any]) -> dict[str, Any]:
    def us(v: float) -> dict[str, Any]:
        return {"value": int(v), "unit": "us"}

    now = int(time.time() * 1e6)
    return {
        "header": {
            "header_version": {"major": 0, "minor": 1, "patch": 0},
            "version": {"major": 0, "minor": 1, "patch": 0},
            "artifact_type": "GENIE_PROFILE",
        },
        "metadata": {
            "timestamp": now,
            "simulated": True,
            "runtime": "HexStudio simulator (onnxruntime, CPU)",
        },
        "components": [
            {
                "name": "dialog0",
                "type": "dialog",
                "events": [
                    {
                        "type": "GenieDialog_create",
                        "duration": int(init_us),
                        "start": now - int(init_us) - int(q["total_us"]),
                        "stop": now - int(q["total_us"]),
                        "init-time": us(init_us),
                    },
                    {
                        "type": "GenieDialog_query",
                        "duration": int(q["total_us"]),
                        "start": now - int(q["total_us"]),
                        "stop": now,
                        "num-prompt-tokens": {"value": q["prompt_tokens"], "unit": ""},
                        "prompt-processing-rate": {"value": q["prompt_rate"], "unit": "toks/sec"},
                        "time-to-first-token": us(q["ttft_us"]),
                        "num-generated-tokens": {"value": q["generated"], "unit": ""},
                        "token-generation-rate": {"value": q["gen_rate"], "unit": "toks/sec"},
                        "token-generation-time": us(q["gen_us"]),
                    },
                    {"type": "GenieDialog_free", "duration": 0, "start": now, "stop": now},
                ],
            }
        ],
    }


class GenieLoadError(ActionableError, RuntimeError):
    """The bundle fails a check Genie makes while it creates the dialog: `lines` are what Genie prints
    (stderr), `final` what genie-t2t-run says last."""

    def __init__(self, lines: list[str], final: str) -> None:
        super().__init__("\n".join(lines))
        self.lines, self.final = lines, final


DTYPE_BITS = {"uint8": 8, "uint16": 16, "int8": 8, "int16": 16}


def legacy_positional_encoding(cfg: dict[str, Any]) -> dict[str, Any]:
    """Genie without model.positional-encoding: rope with QnnHtp pos-id-dim (default 64) and rope-theta
    (default 10000), no scaling (qnn-htp.cpp)."""
    htp = cfg["engine"]["backend"].get("QnnHtp") or {}
    return {
        "type": "rope",
        "rope-dim": int(htp.get("pos-id-dim", 64)),
        "rope-theta": htp.get("rope-theta", 10000),
    }


def load_simulated_model(
    cfg: dict[str, Any], root: Path
) -> tuple[list[dict[str, Any]], dict[str, Path], dict[str, tuple[float, int, int]]]:
    """What Genie does with the ctx-bins before it runs them: open each (relative paths from the working
    directory, as Genie resolves them), read the graphs' I/O, validate them (hexstudio/shared/bundle/genie_model.py:
    names, shapes, split order, chaining, identical quantization) and order the splits of each AR/CL by
    graph name. Returns (graph entries for the deployment pair, ONNX path per graph, I/O quantization)."""
    from hexstudio.shared.bundle import safepath
    from hexstudio.shared.bundle.genie_model import genie_lines, model_issues, splits
    from hexstudio.workers.genie_sim.simbin import SimBinError, read_sim_bin

    specs: dict[str, dict[str, Any]] = {}
    paths: dict[str, Path] = {}
    for b in cfg["engine"]["model"]["binary"]["ctx-bins"]:
        p = safepath.resolve_under(root, b, "genie_config.json ctx-bins")
        if not p.is_file():
            raise GenieLoadError([f"NSPModel: Can't access model file : {b}"], "Failed to create the dialog.")
        try:
            graphs = read_sim_bin(p)
        except SimBinError as exc:
            raise GenieLoadError([str(exc)], "Failed to create the dialog.") from None
        for g in graphs:
            specs[g["name"]] = {"inputs": g["inputs"], "outputs": g["outputs"]}
            paths[g["name"]] = safepath.resolve_under(
                root, g["onnx"], f"{b} graph {g['name']}", must_exist=True
            )
    htp = cfg["engine"]["backend"].get("QnnHtp") or {}
    pe = cfg["engine"]["model"].get("positional-encoding") or legacy_positional_encoding(cfg)
    lines = genie_lines(
        model_issues(
            specs, int(cfg["context"]["size"]), kv_dim=htp.get("kv-dim"), rope_dim=pe.get("rope-dim")
        )
    )
    if lines:
        raise GenieLoadError(lines, "Failed to create the dialog.")
    variants, _ = splits(specs)
    cls = sorted({cl for _, cl in variants})
    if len(cls) != 1:
        raise GenieLoadError(
            [f"the HexStudio simulator runs bundles of one context length; this one has {cls}"],
            "Failed to create the dialog.",
        )
    ars = sorted({ar for ar, _ in variants})
    entries: list[dict[str, Any]] = []
    for (ar, _cl), names in variants.items():
        kind = "token_generator" if ar == ars[0] and len(ars) > 1 else "prompt_processor"
        for i, name in enumerate(names, start=1):  # Genie's order: the graph names, lexicographically
            entries.append({"name": name, "kind": kind, "part": i, "seq_len": ar})
    quant: dict[str, tuple[float, int, int]] = {}
    for spec in specs.values():
        for t, ts in (*spec["inputs"].items(), *spec["outputs"].items()):
            qp = ts.get("quantization_parameters")
            if qp and ts.get("dtype") in DTYPE_BITS:
                quant.setdefault(t, (float(qp["scale"]), int(qp["offset"]), DTYPE_BITS[ts["dtype"]]))
    return entries, paths, quant


def refuse_what_a_board_would_run_wrong(root: Path) -> None:
    """After Genie's own checks pass: what Genie would load and then run wrong (parts that do not chain by
    name, a rope that is not the model's, cos/sin or KV encodings the board misreads; hexstudio/shared/bundle/
    check.py). A real board gives degenerate output; the simulator refuses, saying so."""
    from hexstudio.shared.bundle.check import check_bundle, errors

    found = errors(check_bundle(root))
    if found:
        lines = [f"[HexStudio simulator] {f.code}: {f.message}" for f in found]
        lines.append(
            "[HexStudio simulator] A real board's Genie would load this bundle without a word and compute "
            f"wrong output. Fix: {found[0].fix}"
        )
        raise GenieLoadError(lines, "Failed to create the dialog.")


class SimDialog:
    """A loaded simulation bundle that answers queries like a GenieDialog: the KV cache persists
    between queries (Genie injects EOS + BOS between them), `reset()` clears it.

    Loading follows Genie: the config's schema (Genie's messages; genie-t2t-run then says "Failed to
    create the dialog config."), then the context binaries and the graphs' I/O (GenieLoadError with
    Genie's lines), then the inputs fed as Genie feeds them, quantized I/O included (hexstudio/workers/arloop.py
    GenieFeeds)."""

    def __init__(self, config_path: Path, sampler: dict[str, Any] | None = None) -> None:
        from tokenizers import Tokenizer

        from hexstudio.shared.bundle import safepath
        from hexstudio.shared.bundle.genie_schema import (
            dialog_create_errors,
            genie_config_text_errors,
        )
        from hexstudio.workers.arloop import DeploymentPair

        t_init = time.perf_counter()
        text = config_path.read_text(encoding="utf-8")
        errors = genie_config_text_errors(text)
        if errors:
            raise GenieLoadError([errors[0]], "Failed to create the dialog config.")
        doc = json.loads(text)
        load = [i for i in dialog_create_errors(doc)]
        if load:
            raise GenieLoadError([i.message for i in load], "Failed to create the dialog.")
        root = config_path.parent
        # every path the bundle names stays inside the bundle folder (issue 18): refused before any is opened
        safepath.check_genie_config(doc, root)
        cfg = doc["dialog"]
        self.cfg = cfg
        tok_path = safepath.resolve_under(
            root, cfg["tokenizer"]["path"], "genie_config.json dialog.tokenizer.path"
        )
        if not tok_path.is_file():
            raise GenieLoadError(
                [f"{cfg['tokenizer']['path']}: file does not exist"], "Failed to create the dialog."
            )
        self.tok = Tokenizer.from_file(str(tok_path))
        entries, paths, quant = load_simulated_model(cfg, root)
        refuse_what_a_board_would_run_wrong(root)
        pe = cfg["engine"]["model"].get("positional-encoding") or legacy_positional_encoding(cfg)
        self.pair = DeploymentPair.from_graphs(
            entries,
            root,
            positional_encoding=pe,
            paths=paths,
            quant=quant,
            context_length=int(cfg["context"]["size"]),
            intra_op_threads=int(os.environ.get("HEXSTUDIO_SIM_THREADS", "2")),
        )
        self.sampler: dict[str, Any] = dict(cfg.get("sampler", {}))
        self.apply_sampler(sampler or {})
        eos = cfg["context"].get("eos-token")
        self.eos = set(eos if isinstance(eos, list) else [eos] if isinstance(eos, int) else [])
        # the EOS Genie pushes between queries (qualla context.cpp): an array's first, or eot-token
        eot = cfg["context"].get("eot-token")
        first = eos[0] if isinstance(eos, list) and eos else eot if isinstance(eot, int) and eot >= 0 else eos
        self.eos_between: int | None = first if isinstance(first, int) else None
        if self.eos_between is not None:
            self.eos.add(self.eos_between)
        bos = cfg["context"].get("bos-token")
        self.bos = bos if isinstance(bos, int) and bos >= 0 else None  # a negative bos-token: no BOS (Genie)
        self.queries = 0
        self.init_us = (time.perf_counter() - t_init) * 1e6

    @property
    def capacity(self) -> int:
        return int(self.pair.capacity)

    # GenieX's qairt pipeline (geniex-qairt-plugin llm_pipeline.cpp generate) prepends bos only while the cache
    # is empty; Genie's dialog (the default) starts every later query with eos, bos
    bos_on_fresh_cache_only = False

    def apply_sampler(self, values: dict[str, Any]) -> dict[str, Any]:
        """Sampler values (Genie's keys: seed, temp, top-k, top-p) for the next queries, the random state
        seeded again from the seed (GenieSampler_applyConfig; GenieX takes them per generate())."""
        import numpy as np

        self.sampler = {**self.sampler, **values}
        seed = int(self.sampler.get("seed", SAMPLER_DEFAULTS["seed"]))
        self.rng = np.random.default_rng(None if seed < 0 else seed)  # Genie: a negative seed is the clock's
        return self.sampler

    def reset(self) -> None:
        self.pair.reset()
        self.queries = 0

    def query(
        self, prompt: str, max_new: int | None, on_text: Any, should_stop: Any = lambda: False
    ) -> dict[str, Any]:
        """Run one query; `on_text(text, tokens)` gets text as it is generated with the number of tokens it
        holds (usually 1; more when a character spans tokens and was held back). Returns the query's numbers
        (prompt_tokens, ttft_us, generated, prompt_rate, gen_rate, gen_us, total_us, state)."""
        from hexstudio.workers.arloop import ContextFull

        pre: list[int] = []
        if not self.bos_on_fresh_cache_only:  # Genie: every query after the first starts eos, bos
            if self.queries and self.eos_between is not None:
                pre.append(self.eos_between)
            if isinstance(self.bos, int):
                pre.append(self.bos)
        elif isinstance(self.bos, int) and self.pair.n_past == 0:
            pre.append(self.bos)  # GenieX's pipeline: bos on a fresh cache only
        ids = pre + self.tok.encode(prompt, add_special_tokens=False).ids
        self.queries += 1
        room = self.pair.capacity - self.pair.n_past - len(ids)
        cap = max_new or int(self.cfg.get("max-num-tokens", 0) or 0) or None  # the dialog's reply budget
        budget = max(0, min(cap, room) if cap else room)
        t0 = time.perf_counter()
        generated: list[int] = []
        printed = ""
        printed_tokens = 0
        ttft_us = gen_us = 0.0
        state = "complete"
        try:
            logits = self.pair.prefill(ids)
            t_first = time.perf_counter()
            ttft_us = (t_first - t0) * 1e6
            while len(generated) < budget:
                if should_stop():
                    state = "aborted"
                    break
                nxt = sample(logits, self.sampler, self.rng)
                if nxt in self.eos:
                    break
                generated.append(nxt)
                text = self.tok.decode(generated)
                if not text.endswith("\ufffd"):  # never print half a UTF-8 character
                    on_text(text[len(printed) :], len(generated) - printed_tokens)
                    printed, printed_tokens = text, len(generated)
                if self.pair.n_past >= self.pair.capacity:
                    break
                logits = self.pair.step(nxt)
            gen_us = (time.perf_counter() - t_first) * 1e6
            if state == "complete" and len(generated) >= room and (cap is None or room < cap):
                # the reply was cut short by the context length, with or without a reply budget (Genie throws
                # "Context limit exceeded" once n_past reaches the context size: qualla basic.cpp)
                state = "context_full"
        except ContextFull:
            state = "context_full"
            gen_us = max(0.0, (time.perf_counter() - t0) * 1e6 - ttft_us)
        n_prompt = len(ids)
        return {
            "prompt_tokens": n_prompt,
            "ttft_us": ttft_us,
            "generated": len(generated),
            "prompt_rate": round(n_prompt / max(ttft_us / 1e6, 1e-9), 4) if ttft_us else 0.0,
            "gen_rate": round(len(generated) / max(gen_us / 1e6, 1e-9), 4) if generated else 0.0,
            "gen_us": gen_us,
            "total_us": ttft_us + gen_us,
            "state": state,
            "n_past": self.pair.n_past,
        }


def holds_real_binaries(config: str) -> bool:
    """True when the config's first ctx-bin is a real QNN context binary (a local or AI Hub compile), not
    the twin's simulated stand-in: then Qualcomm's libGenie runs it (hexstudio.workers.qnn.genie_t2t)."""
    from hexstudio.workers.genie_sim.simbin import is_sim_bin

    try:
        cfg = json.loads(Path(config).read_text(encoding="utf-8"))
        bins = cfg["dialog"]["engine"]["model"]["binary"]["ctx-bins"]
        first = Path(config).parent / str(bins[0])
    except (OSError, ValueError, KeyError, IndexError, TypeError):
        return False
    return first.is_file() and not is_sim_bin(first)


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.config:
        print("ERROR: Please provide config using --config.", file=sys.stderr)
        return 1
    if args.prompt and args.prompt_file:
        print("ERROR: Please provide only one of --prompt or --prompt_file.", file=sys.stderr)
        return 1
    if not args.prompt and not args.prompt_file:
        print("ERROR:: Please provide prompt using --prompt or --prompt_file.", file=sys.stderr)
        return 1
    if args.prompt_file and not os.path.isfile(args.prompt_file):
        print(f"ERROR: Cannot read the prompt file {args.prompt_file}: no such file.", file=sys.stderr)
        return 1
    why = refusal(args)
    if why is not None:
        print(f"ERROR: {why}", file=sys.stderr)
        return 1
    # the same checks for both runners: Qualcomm's libGenie takes over only a command line they pass
    if holds_real_binaries(args.config):
        from hexstudio.workers.qnn.genie_t2t import main as real_genie

        return real_genie(argv)
    if args.profile and os.path.exists(args.profile):
        print(
            f"ERROR: Invalid --profile argument. Output file {args.profile} already exists.", file=sys.stderr
        )
        return 1
    prompt = args.prompt if args.prompt is not None else Path(args.prompt_file).read_text(encoding="utf-8")
    print(BANNER, flush=True)
    try:
        dialog = SimDialog(Path(args.config))
    except GenieLoadError as exc:  # Genie's own texts, on stderr as genie-t2t-run prints them
        for line in exc.lines:
            print(line, file=sys.stderr, flush=True)
        print(exc.final, file=sys.stderr, flush=True)
        return 1
    except Exception as exc:
        log("error", "error", f"Create From Binary FAILED! ({type(exc).__name__}: {exc})")
        print("Failure to initialize model", flush=True)
        print("Failed to create the dialog.", flush=True)
        return 1
    log("info", args.log, "Using create From Binary (simulated: ONNX parts)")
    print(f"\n[PROMPT]: {prompt}\n", flush=True)

    stamps: list[tuple[float, int]] = []  # (monotonic time, reply characters so far): bench/stream.py
    written = 0

    def on_text(text: str, tokens: int = 1) -> None:
        nonlocal written
        if (
            not stamps
        ):  # genie-t2t-run prints [BEGIN] with the first token: a reply that is EOS at once has none
            sys.stdout.write("[BEGIN]: ")
        written += len(text)
        stamps.append((time.monotonic(), written))  # taken just before the write
        sys.stdout.write(text)
        sys.stdout.flush()

    # --action ABORT: GenieDialog_signal(ABORT) --sleep ms after the query starts
    abort_at = time.monotonic() + (args.sleep or 0) / 1000 if args.action == "ABORT" else None

    def should_stop() -> bool:
        return abort_at is not None and time.monotonic() >= abort_at

    q = dialog.query(prompt, args.max_tokens, on_text, should_stop)
    if os.environ.get("HEXSTUDIO_SIM_TOKEN_LOG"):
        Path(os.environ["HEXSTUDIO_SIM_TOKEN_LOG"]).write_text(json.dumps(stamps))
    if q["state"] == "aborted":
        sys.stdout.write("[ABORT]: \nQuery successfully aborted\n")
    else:
        sys.stdout.write("[END]\n")
    sys.stdout.flush()
    if args.profile and q["state"] != "context_full":  # Genie's exception path writes no profile (main.cpp)
        Path(args.profile).write_text(json.dumps(profile_doc(dialog.init_us, q), indent=2))
    if q["state"] == "context_full":  # after [END]: a log line inside the reply would become reply text
        log("warn", "warn", "context full: the prompt and reply do not fit in the context length")
        # as Qualcomm's genie-t2t-run does: GenieDialog_query's GENIE_STATUS_WARNING_CONTEXT_EXCEEDED is neither
        # success, abort nor pause, so it throws "Failed to query." and exits with EXIT_FAILURE (main.cpp)
        sys.stderr.write("Failed to query.\n")
        sys.stderr.flush()
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
