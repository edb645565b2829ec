"""GenieX's qairt plugin as the simulator board plays it: the bundle checks it makes before loading a bundle
folder, a loaded model (SimGenieX: generate, reset, its chat template turn by turn) and its per-turn profile, and
the local model cache (`geniex pull` registers a bundle folder under a name). The faces over it: the CLI
(hexstudio/workers/genie_sim/geniex.py) and the OpenAI-compatible server (hexstudio/workers/genie_sim/geniex_serve.py);
docs/genie.md, "GenieX", says where each fact was read."""

from __future__ import annotations

import json
import os
import re
import time
from pathlib import Path
from typing import Any

from hexstudio.shared.bundle.geniex import CLI_VERSION, QAIRT_PLUGIN_VERSION, chat_template_problem
from hexstudio.shared.chat_template import load_chat_format
from hexstudio.shared.errors import ActionableError

LLAMA_CPP_HASH = "simulated"
DEFAULT_SYSTEM_PROMPT = "You are a helpful AI assistant."  # the qairt plugin's (llm.cpp kDefaultSystemPrompt)
SIM_LABEL = "(HexStudio simulator)"
# metadata.json model_id prefix -> the plugin's pipeline (models/dispatch.h), in its order
DISPATCH: tuple[tuple[str, str], ...] = (
    ("qwen2_5_vl_", "vlm"),
    ("qwen3_vl_", "vlm"),
    ("qwen3_", "qwen3"),
    ("qwen2_5_", "qwen2_5"),
    ("falcon_v3_", "falcon3"),
    ("llama_v3_", "llama3"),
    ("phi_3_5_", "phi3_5"),
)
GRAPH_KEY = re.compile(r"(?:([a-zA-Z]+)_)?ar(\d+)_cl(\d+)_(\d+)_of_(\d+)")
PART_KEY = re.compile(r"(?:.*_)?part(\d+)_of_(\d+)\.bin")
_VER = re.compile(r"(\d+)\.(\d+)(?:\.(\d+))?")


class GenieXError(ActionableError, RuntimeError):
    """A load failure as GenieX reports it: the plugin's log lines, then the SDK's error."""

    def __init__(self, lines: list[str], code: str) -> None:
        super().__init__("\n".join(lines) or code)
        self.lines = lines
        self.code = code  # GENIEX_ERROR_COMMON_FILE_NOT_FOUND | GENIEX_ERROR_COMMON_MODEL_LOAD


def version_tuple(text: str) -> tuple[int, int, int] | None:
    m = _VER.search(text or "")
    return (int(m.group(1)), int(m.group(2)), int(m.group(3) or 0)) if m else None


def version_lines(simulated: bool = True) -> list[str]:
    tag = f" {SIM_LABEL}" if simulated else ""
    return [
        f"{'GenieX CLI Version:':<23} {CLI_VERSION}{tag}",
        f"{'QAIRT Runtime Version:':<23} {QAIRT_PLUGIN_VERSION}",
        f"{'LlamaCPP Runtime Hash:':<23} {LLAMA_CPP_HASH}",
    ]


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
        raise GenieXError(
            [layout + f"llm_spec_loader: tokenizer.json not found in {d}"],
            "GENIEX_ERROR_COMMON_FILE_NOT_FOUND",
        )
    if not any(bundle.glob("*.bin")):
        raise GenieXError(
            [layout + f"llm_spec_loader: no .bin shards found in {d}"], "GENIEX_ERROR_COMMON_FILE_NOT_FOUND"
        )
    fail = f"Failed to create QAIRT LLM pipeline from bundle: {d}"
    meta_path = bundle / "metadata.json"
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except OSError:
        raise GenieXError(
            [f"dispatch: cannot read metadata.json: llm_spec_loader: cannot open {meta_path}", fail],
            "GENIEX_ERROR_COMMON_MODEL_LOAD",
        ) from None
    except ValueError as exc:
        raise GenieXError(
            [
                f"dispatch: cannot read metadata.json: llm_spec_loader: failed to parse {meta_path}: {exc}",
                fail,
            ],
            "GENIEX_ERROR_COMMON_MODEL_LOAD",
        ) from None
    files = meta.get("model_files") if isinstance(meta, dict) else None
    if not isinstance(files, dict):
        raise GenieXError(
            [
                "dispatch: cannot read metadata.json: llm_spec_loader: metadata.json missing "
                "'model_files' object",
                fail,
            ],
            "GENIEX_ERROR_COMMON_MODEL_LOAD",
        )
    if not any(GRAPH_KEY.fullmatch(k) or PART_KEY.fullmatch(k) for k in files):
        raise GenieXError(
            [
                "dispatch: cannot read metadata.json: llm_spec_loader: metadata.json contains no "
                "recognisable shard entries",
                fail,
            ],
            "GENIEX_ERROR_COMMON_MODEL_LOAD",
        )
    model_id = str(meta.get("model_id") or "")
    family = next((f for p, f in DISPATCH if model_id.startswith(p)), None)
    if model_id.endswith("_ssd"):
        family = "llama3_2_ssd"
    if not model_id or family is None or family == "vlm":
        raise GenieXError(
            [f"dispatch: no LLM factory matches model_id '{model_id}'", fail],
            "GENIEX_ERROR_COMMON_MODEL_LOAD",
        )
    q = bundle_qairt(bundle)
    if q and (version_tuple(q) or (0, 0, 0)) > (version_tuple(QAIRT_PLUGIN_VERSION) or (0, 0, 0)):
        raise GenieXError(
            [
                f"HexStudio simulator: the bundle was compiled with QAIRT {q}, newer than GenieX's qairt "
                f"plugin ({QAIRT_PLUGIN_VERSION}, which runs bundles compiled with it or earlier); a "
                "board cannot create the context from the binary (QNN error 5000).",
                fail,
            ],
            "GENIEX_ERROR_COMMON_MODEL_LOAD",
        )
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
        from hexstudio.workers.genie_sim.t2t import GenieLoadError, SimDialog

        t0 = time.perf_counter()
        self.bundle = bundle
        self.meta = check_bundle(bundle)
        try:
            self.dialog = SimDialog(bundle / "genie_config.json", sampler)
        except GenieLoadError as exc:
            raise GenieXError(
                [*exc.lines, exc.final, f"Failed to create QAIRT LLM pipeline from bundle: {bundle}"],
                "GENIEX_ERROR_COMMON_MODEL_LOAD",
            ) from None
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
        bundle's own (hexstudio.shared.chat_template, rendered as transformers does), with the generation prompt;
        a leading bos text is left to the pipeline, which adds bos itself on a fresh cache."""
        start = 0
        if not self.first_turn:
            last = max((i for i, m in enumerate(messages) if m.get("role") == "assistant"), default=-1)
            start = last + 1
            if start >= len(messages):
                raise ValueError("No new messages since last assistant turn")
        msgs = [dict(m) for m in messages[start:]]
        if self.first_turn and not any(m.get("role") == "system" for m in msgs):
            msgs.insert(0, {"role": "system", "content": DEFAULT_SYSTEM_PROMPT})
        fmt = load_chat_format(self.bundle, genie_bos=True)
        return fmt.strip_bos(fmt.render(msgs, add_generation_prompt=True))

    def generate(
        self, prompt: str, max_tokens: int | None, on_text: Any, should_stop: Any = lambda: False
    ) -> tuple[dict[str, Any], dict[str, Any]]:
        """One generation; returns (geniex_ProfileData as a dict, SimDialog's numbers)."""
        q = self.dialog.query(prompt, max_tokens, on_text, should_stop)
        self.first_turn = False
        return profile(q, max_tokens), q


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
    return {
        "ttft": int(q["ttft_us"]),
        "media_time": 0,
        "prompt_time": int(q["ttft_us"]),
        "decode_time": int(q["gen_us"]),
        "prompt_tokens": int(q["prompt_tokens"]),
        "generated_tokens": int(q["generated"]),
        "prefill_speed": float(q["prompt_rate"]),
        "decoding_speed": float(q["gen_rate"]),
        "draft_n_total": 0,
        "draft_n_accepted": 0,
        "stop_reason": stop,
        "simulated": True,
    }


# -- the model cache (`geniex pull` registers a local bundle folder under a name) --------------------
def data_dir(arg: str | None) -> Path:
    return Path(arg or os.environ.get("GENIEX_DATADIR") or Path.home() / ".cache" / "geniex")


def _registry(dd: Path) -> dict[str, str]:
    try:
        return dict(json.loads((dd / "hexstudio-sim-models.json").read_text()))
    except (OSError, ValueError):
        return {}


def _resolve(name: str, dd: Path) -> Path | None:
    reg = _registry(dd)
    if name in reg:
        return Path(reg[name])
    p = Path(name)
    return p if p.is_dir() else None
