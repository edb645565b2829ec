"""genie_config.json as Genie 1.13 validates it, with Genie's own message texts.

What Genie checks (QAIRT 2.40, Genie API 1.13: `examples/Genie/Genie/src/Dialog.cpp` validate*Config,
`Sampler.cpp` validateSamplerConfig, `Macro.hpp` JSON_ENFORCE_*; read in the public copy
github:kyungraekim/qnn, docs/genie.md):

- a section is first checked to be an object (`<section> config is not an object`), then its
  mandatory keys, in alphabetical order (`Missing <section> field: <key>`), then every key present,
  in alphabetical order (qualla's json is a std::map): an unknown key is `Unknown <section> config
  key: <key>`, a wrong JSON type `Invalid <section> config: <key> is not numeric` (boolean, a string,
  an object, an array...), `version` other than 1 `Invalid <section> config: unsupported version: 2`;
  a nested section is validated when its key is reached;
- positional-encoding and rope-scaling have no `version` (and no mandatory keys at all);
- Genie stops at the first error and genie-t2t-run then prints `Failed to create the dialog config.`

`genie_config_errors` walks the declarations below the way Genie does and returns every message in
the order Genie meets them (the first is the one a real board prints); it continues after an error so
that one run lists every problem. `dialog_create_errors` adds what the validator lets through but
loading the dialog then fails on (qualla's mandatory sampler and rope-dim, the kv-dim the translator
reads unconditionally).

Pure Python (hexstudio.core imports it through `hexstudio bundle check`).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CONFIG_FAILED = "Failed to create the dialog config."  # genie-t2t-run, after any message below
DIALOG_FAILED = "Failed to create the dialog."  # genie-t2t-run, after a load-time error

# JSON types as Genie's JSON_ENFORCE_* macros name them (Macro.hpp)
NUM, BOOL, STR, OBJ, ARR, ARR_OR_NUM, ARR_OR_OBJ, ANY = (
    "numeric",
    "boolean",
    "a string",
    "an object",
    "an array",
    "an array or numeric",
    "an array or object",
    "any",
)


def _is(kind: str, v: Any) -> bool:
    num = isinstance(v, (int, float)) and not isinstance(v, bool)
    return {
        NUM: num,
        BOOL: isinstance(v, bool),
        STR: isinstance(v, str),
        OBJ: isinstance(v, dict),
        ARR: isinstance(v, list),
        ARR_OR_NUM: num or isinstance(v, list),
        ARR_OR_OBJ: isinstance(v, (list, dict)),
        ANY: True,
    }[kind]


def dump(v: Any) -> str:
    """nlohmann's json::dump() of a value (compact)."""
    return json.dumps(v, separators=(",", ":"), ensure_ascii=False)


@dataclass(frozen=True)
class Key:
    kind: str = ANY
    section: str | None = None  # a nested section validated when this key is reached
    later: bool = False  # stored in the loop, validated after it (backend.QnnHtp, model.binary...)
    values: tuple[str, ...] = ()  # allowed string values
    bad_value: str = ""  # the message for another value ({v}: the value, {d}: its dump)
    elements: str | None = None  # arrays: every element must be a string; the message otherwise


@dataclass(frozen=True)
class Section:
    name: str  # as Genie's messages spell it
    keys: dict[str, Key]
    mandatory: tuple[str, ...] = ()
    versioned: bool = True  # `version` must be 1
    not_object: str = ""  # default: "<name> config is not an object"
    unknown: str = ""  # default: "Unknown <name> config key: {k}"
    missing: str = ""  # default: "Missing <name> field: {k}"
    check_object: bool = True  # positional-encoding/rope-scaling: no object check, no mandatory keys
    after: tuple[Callable[[dict[str, Any], Walk], None], ...] = ()


class Walk:
    """The state of one validation: the messages so far and Genie's static flags."""

    def __init__(self) -> None:
        self.errors: list[str] = []
        self.pos_id_dim_set = False
        self.rope_theta_set = False
        self.dialog_type = "basic"

    def error(self, msg: str) -> None:
        self.errors.append(msg)


def _v(kind: str = ANY, **kw: Any) -> Key:
    return Key(kind, **kw)


_STRINGS = "must be an array of strings"


# -- cross checks run after a section's key loop (Genie does these after the loop too) ------------------
def _typed_sub(cfg: dict[str, Any], w: Walk, subs: tuple[str, ...], kind: str, missing: str) -> None:
    """`type` picks one of the sub-sections `subs`: that one must be there (Genie: "Missing <sub> <missing>
    config") and is walked; another one that is there is for the wrong type ("<sub> <kind> config for incorrect
    <kind> type: <type>")."""
    t = cfg.get("type")
    tname = t if isinstance(t, str) else ""
    for sub in subs:
        obj = cfg.get(sub)
        if t == sub:
            if not isinstance(obj, dict):
                w.error(f"Missing {sub} {missing} config")
            else:
                _walk(SECTIONS[sub], obj, w)
        elif isinstance(obj, dict):
            w.error(f"{sub} {kind} config for incorrect {kind} type: {tname}")


def _backend_after(cfg: dict[str, Any], w: Walk) -> None:
    _typed_sub(cfg, w, ("QnnHtp", "QnnGenAiTransformer"), "backend", missing="dialog")


def _htp_after(cfg: dict[str, Any], w: Walk) -> None:
    if cfg.get("graph-switching-lora-policy") == "lazy" and cfg.get("enable-graph-switching") is not True:
        w.error("Invalid QnnHtp config. Lazy LoRA application policy requires graph switching enabled")
    if cfg.get("shared-engine") is True and cfg.get("allow-async-init") is not True:
        w.error("Invalid QnnHtp config. Engine sharing is only supported with async Init enabled")


def _model_after(cfg: dict[str, Any], w: Walk) -> None:
    _typed_sub(cfg, w, ("binary", "library"), "model", missing="model")
    pe = cfg.get("positional-encoding")
    if isinstance(pe, dict):
        _walk(SECTIONS["positional-encoding"], pe, w)


def _pe_after(cfg: dict[str, Any], w: Walk) -> None:
    if w.pos_id_dim_set:
        w.error("Specify one config from pos-id-dim and positional-encoding")
    if w.rope_theta_set:
        w.error("Specify one config from rope-theta and positional-encoding")
    rs = cfg.get("rope-scaling")
    if isinstance(rs, dict):
        _walk(SECTIONS["rope-scaling"], rs, w)


def _sampler_after(cfg: dict[str, Any], w: Walk) -> None:
    t, cb = cfg.get("type"), "callback-name" in cfg
    if cb and t != "custom":
        w.error(f"callback-name specified but type is set to: {dump(t)} Type must be custom")
    if t == "custom" and not cb:
        w.error("callback-name not specified but type is set to custom")
    if t == "custom" and any(k in cfg for k in ("temp", "top-p", "top-k", "greedy")):
        w.error("Provided keys are not compatible with custom sampler type.")


def _embedding_after(cfg: dict[str, Any], w: Walk) -> None:
    if (cfg.get("type") == "lut") != ("lut-path" in cfg):
        w.error("lut-path config option should be used with type lut")


def _dialog_after(cfg: dict[str, Any], w: Walk) -> None:
    eng = cfg.get("engine")
    if isinstance(eng, dict):
        _walk(SECTIONS["engine"], eng, w)
        if w.dialog_type in ("spd", "kv-share"):
            w.error(f"engine config for {w.dialog_type} is not an array")
        if "role" in eng:
            w.error("engine role is only for the engines of an spd dialog (an array of draft and target)")
    elif isinstance(eng, list) and w.dialog_type in ("spd", "kv-share", "eaglet"):
        for e in eng:
            _walk(SECTIONS["engine"], e, w)
        roles = sorted(str(e.get("role")) for e in eng if isinstance(e, dict))
        if w.dialog_type == "spd" and roles != ["draft", "target"]:
            w.error(f"spd needs exactly two engines, roles draft and target (found {roles})")
    elif eng is not None:
        w.error("engine config is not an object or an array")
    for sub in ("ssd-q1", "lade", "spd"):
        if w.dialog_type == sub and not isinstance(cfg.get(sub), dict):
            w.error(f"Missing {sub} dialog config")
        elif w.dialog_type != sub and isinstance(cfg.get(sub), dict):
            w.error(f"{sub} dialog config for incorrect dialog type: {w.dialog_type}")
    if w.dialog_type != "kv-share" and isinstance(cfg.get("kv-share"), dict):
        w.error(f"kv-share dialog config for incorrect dialog type: {w.dialog_type}")


DIALOG_TYPES = ("basic", "ssd-q1", "lade", "spd", "multistream", "eaglet", "kv-share")
BACKEND_TYPES = ("QnnHtp", "QnnGenAiTransformer", "QnnGpu")
MODEL_TYPES = ("binary", "library")
PE_TYPES = ("rope", "absolute", "alibi")
ROPE_TYPES = ("llama3", "default", "longrope")  # Genie 1.13's validateRopeScalingConfig

# One declaration per section: Genie's mandatory keys, allowed keys and their JSON types.
SECTIONS: dict[str, Section] = {
    s.name: s
    for s in (
        Section(
            "top",
            {"dialog": _v(OBJ, section="dialog")},
            mandatory=("dialog",),
            versioned=False,
            not_object="Dialog config is not an object",
            unknown="Unknown dialog config key: {k}",
            missing="Missing dialog field: {k}",
        ),
        Section(
            "dialog",
            {
                "version": _v(NUM),
                "type": _v(STR, values=DIALOG_TYPES, bad_value="Invalid dialog type: {v}"),
                "accumulator-size": _v(ANY),
                "ssd-q1": _v(OBJ),
                "lade": _v(OBJ),
                "spd": _v(OBJ),
                "kv-share": _v(OBJ),
                "multistream": _v(OBJ),
                "eaglet": _v(OBJ),
                "stop-sequence": _v(ARR, elements=f"stop-sequence {_STRINGS}"),
                "max-num-tokens": _v(NUM),
                "context": _v(OBJ, section="context"),
                "tokenizer": _v(OBJ, section="tokenizer"),
                "sampler": _v(OBJ, section="sampler"),
                "engine": _v(ARR_OR_OBJ),
                "embedding": _v(OBJ, section="embedding"),
                "debug": _v(OBJ, section="debug"),
            },
            mandatory=("version", "type", "context", "tokenizer", "engine"),
            not_object="Dialog config is not an object",
            after=(_dialog_after,),
        ),
        Section(
            "context",
            {
                "version": _v(NUM),
                "bos-token": _v(NUM),
                "eos-token": _v(ARR_OR_NUM),
                "eot-token": _v(NUM),
                "size": _v(NUM),
                "n-vocab": _v(NUM),
                "draft-n-vocab": _v(NUM),
                "pad-token": _v(NUM),
                "n-embd": _v(NUM),
            },
            mandatory=("version", "bos-token", "eos-token", "size", "n-vocab"),
        ),
        Section("tokenizer", {"version": _v(NUM), "path": _v(STR)}, mandatory=("version", "path")),
        Section(
            "sampler",
            {
                "version": _v(NUM),
                "seed": _v(NUM),
                "temp": _v(NUM),
                "top-k": _v(NUM),
                "top-p": _v(NUM),
                "greedy": _v(BOOL),
                "type": _v(STR),
                "callback-name": _v(STR),
                "token-penalty": _v(OBJ, section="token-penalty"),
            },
            mandatory=("version",),
            after=(_sampler_after,),
        ),
        Section(
            "token-penalty",
            {
                "version": _v(NUM),
                "penalize-last-n": _v(NUM),
                "repetition-penalty": _v(NUM),
                "presence-penalty": _v(NUM),
                "frequency-penalty": _v(NUM),
            },
            mandatory=("version",),
        ),
        Section(
            "embedding",
            {
                "version": _v(NUM),
                "size": _v(NUM),
                "type": _v(STR, values=("lut", "callback"), bad_value="Unknown embedding type: {v}"),
                "datatype": _v(
                    STR,
                    values=("float32", "native", "ufixed8", "ufixed16", "sfixed8", "sfixed16"),
                    bad_value="Unknown embedding datatype: {v}",
                ),
                "lut-path": _v(STR),
                "quant-param": _v(OBJ),
            },
            mandatory=("version", "size"),
            after=(_embedding_after,),
        ),
        # Genie's debug section reuses the multistream message for an unknown key (a copy-paste slip upstream)
        Section(
            "debug",
            {"path": _v(STR), "dump-tensors": _v(BOOL), "dump-specs": _v(BOOL), "dump-outputs": _v(BOOL)},
            versioned=False,
            unknown="Unknown multistream config key: {k}",
        ),
        Section(
            "engine",
            {
                "version": _v(NUM),
                "backend": _v(OBJ, section="backend"),
                "model": _v(OBJ, section="model"),
                "n-threads": _v(NUM),
                "longcontext": _v(OBJ),
                "cache-groups": _v(ARR),
                # Genie 1.21's schema: an engine of spd's array names its role (draft | target)
                "role": _v(STR, values=("draft", "target"), bad_value="Invalid engine role: {v}"),
            },
            mandatory=("version", "backend", "model", "n-threads"),
        ),
        Section(
            "backend",
            {
                "version": _v(NUM),
                "type": _v(
                    STR, values=BACKEND_TYPES, bad_value="Invalid backend config: unsupported type: {d}"
                ),
                "extensions": _v(STR),
                "QnnHtp": _v(OBJ, later=True),
                "QnnGenAiTransformer": _v(OBJ, later=True),
            },
            mandatory=("version", "type"),
            after=(_backend_after,),
        ),
        Section(
            "QnnHtp",
            {
                "version": _v(NUM),
                "spill-fill-bufsize": _v(NUM),
                "data-alignment-size": _v(NUM),
                "mmap-budget": _v(NUM),
                "use-mmap": _v(BOOL),
                "pos-id-dim": _v(NUM),
                "cpu-mask": _v(STR),
                "poll": _v(BOOL),
                "kv-dim": _v(NUM),
                "kv-update-method": _v(STR),
                "allow-async-init": _v(BOOL),
                "rope-theta": _v(NUM),
                "enable-graph-switching": _v(BOOL),
                "shared-engine": _v(BOOL),
                "graph-switching-lora-policy": _v(
                    STR,
                    values=("lazy", "eager"),
                    bad_value=(
                        "Invalid QnnHtp config. graph-switching-lora-policy option must either be lazy or "
                        "eager"
                    ),
                ),
                "skip-lora-validation": _v(BOOL),
            },
            mandatory=("version", "spill-fill-bufsize", "mmap-budget", "use-mmap", "cpu-mask", "poll"),
            after=(_htp_after,),
        ),
        Section(
            "QnnGenAiTransformer",
            {
                "version": _v(NUM),
                "use-mmap": _v(BOOL),
                "kv-quantization": _v(BOOL),
                "n-logits": _v(NUM),
                "n-layer": _v(NUM),
                "n-embd": _v(NUM),
                "n-heads": _v(NUM),
                "n-kv-heads": _v(NUM),
                "model-input": _v(STR),
                "shared-engine": _v(BOOL),
            },
            mandatory=("version",),
        ),
        Section(
            "model",
            {
                "version": _v(NUM),
                "type": _v(STR, values=MODEL_TYPES, bad_value="Invalid model config: unsupported type: {d}"),
                "binary": _v(OBJ, later=True),
                "library": _v(OBJ, later=True),
                "positional-encoding": _v(OBJ, later=True),
                "draft-token-map": _v(STR),
            },
            mandatory=("version", "type"),
            after=(_model_after,),
        ),
        Section(
            "binary",
            {"version": _v(NUM), "ctx-bins": _v(ARR, elements=f"ctx-bins {_STRINGS}"), "lora": _v(OBJ)},
            mandatory=("version", "ctx-bins"),
        ),
        Section(
            "library",
            {"version": _v(NUM), "model-bin": _v(STR), "lora": _v(OBJ)},
            mandatory=("version", "model-bin"),
        ),
        Section(
            "positional-encoding",
            {
                "type": _v(ANY, values=PE_TYPES, bad_value="positional-encoding type not supported"),
                "rope-dim": _v(NUM),
                "rope-theta": _v(NUM),
                "rope-scaling": _v(OBJ, later=True),
            },
            versioned=False,
            check_object=False,
            unknown="Unknown positional encoding config key: {k}",
            after=(_pe_after,),
        ),
        Section(
            "rope-scaling",
            {
                "rope-type": _v(STR, values=ROPE_TYPES, bad_value="Rope type not supported{v}"),
                "factor": _v(NUM),
                "low-freq-factor": _v(NUM),
                "high-freq-factor": _v(NUM),
                "original-max-position-embeddings": _v(NUM),
                "short-factor": _v(ARR),
                "long-factor": _v(ARR),
            },
            versioned=False,
            check_object=False,
            unknown="Rope scaling parameter not supported {k}",
        ),
    )
}


def _walk(sec: Section, cfg: Any, w: Walk) -> None:
    if not isinstance(cfg, dict):
        if sec.check_object:
            w.error(sec.not_object or f"{sec.name} config is not an object")
        return
    if sec.check_object:
        for k in sorted(sec.mandatory):
            if k not in cfg:
                w.error((sec.missing or "Missing {s} field: {k}").format(s=sec.name, k=k))
    for k in sorted(cfg):  # std::map: keys in byte order
        v = cfg[k]
        rule = sec.keys.get(k)
        if rule is None or (k == "version" and not sec.versioned):
            w.error((sec.unknown or "Unknown {s} config key: {k}").format(s=sec.name, k=k))
            continue
        if sec.name == "positional-encoding" and k == "type" and not isinstance(v, str):
            # read with get<string>() and no type check: nlohmann's own exception text
            w.error(f"[json.exception.type_error.302] type must be string, but is {_json_type(v)}")
            continue
        if not _is(rule.kind, v):
            w.error(f"Invalid {sec.name} config: {k} is not {rule.kind}")
            continue
        if k == "version" and sec.versioned and int(v) != 1:
            w.error(f"Invalid {sec.name} config: unsupported version: {dump(v)}")
            continue
        if rule.values and v not in rule.values:
            w.error(rule.bad_value.format(v=v, d=dump(v), k=k))
            continue
        if rule.elements and any(not isinstance(e, str) for e in v):
            w.error(rule.elements)
            continue
        if sec.name == "dialog" and k == "type":
            w.dialog_type = v
        if sec.name == "dialog" and k == "max-num-tokens" and int(v) < 0:
            w.error(f"number of tokens must be > 0. provided: {dump(v)}")
        if sec.name == "QnnHtp" and k == "pos-id-dim":
            w.pos_id_dim_set = True
        if sec.name == "QnnHtp" and k == "rope-theta":
            w.rope_theta_set = True
        if sec.name == "engine" and k == "cache-groups" and not v:
            w.error("cache-groups cannot be an empty array.")
        if rule.section and not rule.later:
            _walk(SECTIONS[rule.section], v, w)
    for hook in sec.after:
        hook(cfg, w)


def _json_type(v: Any) -> str:
    if v is None:
        return "null"
    if isinstance(v, bool):
        return "boolean"
    if isinstance(v, (int, float)):
        return "number"
    return "array" if isinstance(v, list) else "object" if isinstance(v, dict) else "string"


def genie_config_errors(doc: Any) -> list[str]:
    """Genie 1.13's validation messages for a parsed genie_config.json, in the order Genie meets them
    (a real board prints the first, then `Failed to create the dialog config.`). Empty when Genie
    accepts the config."""
    w = Walk()
    _walk(SECTIONS["top"], doc, w)
    return w.errors


def genie_config_text_errors(text: str) -> list[str]:
    """As genie_config_errors, from the file's text: also Genie's parse-time checks (a duplicate
    top-level key: `Multiple dialog config key: "dialog"`)."""
    seen: list[str] = []

    def hook(pairs: list[tuple[str, Any]]) -> dict[str, Any]:
        return dict(pairs)

    try:
        top_pairs = json.loads(text, object_pairs_hook=lambda p: p)
    except json.JSONDecodeError as exc:
        return [
            f"[json.exception.parse_error.101] parse error at line {exc.lineno}, column {exc.colno}: {exc.msg}"
        ]
    if isinstance(top_pairs, list):
        for k, _ in top_pairs:
            if k in seen:
                return [f"Multiple dialog config key: {dump(k)}"]
            seen.append(k)
    return genie_config_errors(json.loads(text, object_pairs_hook=hook))


# -- what passes the validator but fails when the dialog is created ---------------------------------------
@dataclass
class LoadIssue:
    key: str
    message: str  # qualla's text where it has one, else a HexStudio sentence
    genie_text: bool  # True: the message is what Genie/qualla prints
    notes: list[str] = field(default_factory=list)


def dialog_create_errors(doc: Any) -> list[LoadIssue]:
    """Keys Genie's validator does not require but loading needs: qualla's dialog requires `sampler`;
    qualla's rope parser requires `rope-dim`; the config translator reads `QnnHtp.kv-dim` and
    `positional-encoding.type` unconditionally (undefined behaviour when absent). Only for a config
    genie_config_errors accepts."""
    out: list[LoadIssue] = []
    try:
        d = doc["dialog"]
        eng = d["engine"]
    except (KeyError, TypeError):
        return out
    if "sampler" not in d:
        out.append(
            LoadIssue("dialog.sampler", "qualla: mandatory config key : (sampler) not found in : {...}", True)
        )
    if not isinstance(eng, dict):
        return out
    backend, model = eng.get("backend") or {}, eng.get("model") or {}
    if backend.get("type") == "QnnHtp" and "kv-dim" not in (backend.get("QnnHtp") or {}):
        out.append(
            LoadIssue(
                "dialog.engine.backend.QnnHtp.kv-dim",
                "QnnHtp has no kv-dim: Genie reads it unconditionally when it builds the engine "
                "(undefined behaviour, a crash or a wrong KV layout). It must equal the model's "
                "head_dim.",
                False,
            )
        )
    pe = model.get("positional-encoding")
    if isinstance(pe, dict):
        if "type" not in pe:
            out.append(
                LoadIssue(
                    "dialog.engine.model.positional-encoding.type",
                    "positional-encoding has no type: Genie reads it unconditionally (undefined "
                    'behaviour). Write "type": "rope".',
                    False,
                )
            )
        if pe.get("type", "rope") == "rope" and "rope-dim" not in pe:
            out.append(
                LoadIssue(
                    "dialog.engine.model.positional-encoding.rope-dim",
                    "qualla: mandatory config key : (rope-dim) not found in : {...}",
                    True,
                )
            )
        rs = pe.get("rope-scaling")
        if isinstance(rs, dict):
            out.extend(_rope_scaling_load(rs, pe))
    eos = (d.get("context") or {}).get("eos-token") if isinstance(d.get("context"), dict) else None
    if isinstance(eos, list) and (not eos or any(not isinstance(e, int) or isinstance(e, bool) for e in eos)):
        out.append(
            LoadIssue(
                "dialog.context.eos-token",
                f"eos-token {dump(eos)} must be a non-empty array of "
                "token ids (integers): Genie reads it as an int32 list.",
                False,
            )
        )
    return out


_LLAMA3_NEEDS = ("factor", "low-freq-factor", "high-freq-factor", "original-max-position-embeddings")
_LONGROPE_NEEDS = ("original-max-position-embeddings", "long-factor", "short-factor", "factor")


def _rope_scaling_load(rs: dict[str, Any], pe: dict[str, Any]) -> list[LoadIssue]:
    t = rs.get("rope-type")
    needs = _LLAMA3_NEEDS if t == "llama3" else _LONGROPE_NEEDS if t == "longrope" else ()
    missing = [k for k in needs if k not in rs]
    out = []
    if missing:
        out.append(
            LoadIssue(
                "dialog.engine.model.positional-encoding.rope-scaling",
                f"Error in positional-encoding - Parsing error for {t} rope scaling - missing "
                f"{', '.join(missing)}",
                True,
                ["the text after 'Parsing error for ...' is HexStudio's summary"],
            )
        )
    if t == "longrope" and not missing and isinstance(pe.get("rope-dim"), int):
        d = pe["rope-dim"]
        lf, sf = rs.get("long-factor") or [], rs.get("short-factor") or []
        if len(lf) != d or len(sf) != d:
            out.append(
                LoadIssue(
                    "dialog.engine.model.positional-encoding.rope-scaling",
                    f"long-factor (len={len(lf)}) and short-factor (len={len(sf)}) must have length "
                    f"rope-dim={d}",
                    True,
                )
            )
    return out
