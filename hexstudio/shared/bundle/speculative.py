"""Genie's speculative dialogs for a bundle: `lade` (lookahead decoding) and `spd` (a draft model), each written as
its own config file beside the basic genie_config.json (`genie_config.lade.json`, `genie_config.spd.json`), so one
pushed bundle serves every dialog and the basic one stays the reference the others are checked against.

What Genie 1.21 accepts and does (docs/genie.md, "Speculative dialogs", cites Qualcomm's sources):
- lade: `dialog.lade {version 1, update-mode, window, ngram, gcap}`, one engine. Each step runs
  (window + gcap) x (ngram - 1) tokens at once on the smallest AR variant that holds them (the prompt
  processor, AR-N), with every position's logits. Genie seeds the lookahead levels with token ids 1000 + i: an
  embedding of fewer rows would fail in the gather (`bad input in InputGather2DDMA; weight sel = 1000`), so the
  local compile clamps the ids of such a table (hexstudio.workers.qnn.htp_graph, note 2).
- spd: `dialog.spd {version 1, draft-len}` and `dialog.engine` an array of two engines with roles "draft" and
  "target", one context and tokenizer for both (the same vocabulary). Per step the draft generates draft-len
  tokens (AR-1) and the target verifies draft-len + 1 at once. Genie's sampler asserts temp > 0 for spd (a
  process abort, not a status); greedy decoding is "greedy": true with any temp > 0.
- ssd-q1 needs artifacts only Qualcomm's SSD training makes (forecast-token embeddings past the vocabulary and
  a learned prefix KV cache): refused with that reason.
- Genie reports the acceptance as the query event `token-acceptance-rate` (toks/iteration) in GenieProfile's JSON.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from hexstudio.shared.bundle import genie_sampler_keys, run_sampler_keys, version_tuple
from hexstudio.shared.errors import ActionableError

if TYPE_CHECKING:
    from hexstudio.shared.run_settings import RunSettings

DIALOG_TYPES = ("basic", "lade", "spd")
REFUSED = {
    "ssd-q1": "ssd-q1 needs forecast-token embeddings and a prefix KV cache that only Qualcomm's SSD "
    "training produces; HexStudio cannot make them for your checkpoint. Use lade or spd.",
    "eaglet": "eaglet needs a trained Eagle draft head; HexStudio cannot make one. Use lade or spd.",
}
# lhd-dec seeds window position i of each lookahead level past the first with id 1000 + i
LADE_SEED_BASE = 1000


@dataclass(frozen=True)
class Lade:
    """dialog.lade. Window and gcap as Qualcomm's Llama 2 lade example (8/4/8); ngram 2, not 4: Genie 1.21 keeps
    the KV of its level-initialisation batch (run only at ngram >= 3) for the first lookahead step, so that step's
    token can differ from the basic dialog's (measured with Genie's own tensor dumps: docs/genie.md)."""

    window: int = 8
    ngram: int = 2
    gcap: int = 8
    update_mode: str = "ALWAYS_FWD_ONE"  # FWD_MAX_HIT | FWD_LEVEL | ALWAYS_FWD_ONE

    @property
    def step_tokens(self) -> int:
        return (self.window + self.gcap) * (self.ngram - 1)

    def block(self) -> dict[str, Any]:
        return {
            "version": 1,
            "update-mode": self.update_mode,
            "window": self.window,
            "ngram": self.ngram,
            "gcap": self.gcap,
        }


@dataclass(frozen=True)
class Spd:
    """dialog.spd. draft: "self" (the model drafts for itself: checks the dialog end to end, no speed-up), or the
    folder of another model's compiled bundle with the same tokenizer (e.g. builtin:tiny-llama-draft's)."""

    draft_len: int = 3
    draft: str = "self"

    def block(self) -> dict[str, Any]:
        return {"version": 1, "draft-len": self.draft_len}


DRAFT_DIR = "draft"  # a draft model's context binaries inside the target's bundle


@dataclass(frozen=True)
class DraftHost:
    """What the target's bundle runs on, which the draft's context binaries must load beside: the dialog's
    context size (Genie loads both engines at it: nsp-model refuses a binary whose largest context is smaller,
    "Config specifies context->size=<n>, but loaded max-CL=<m>"), the Hexagon arch and SoC the binaries are
    prepared for, and the QAIRT that compiled the target (the board runs that runtime; a binary from a newer
    QAIRT does not load on an older one)."""

    context_length: int
    dsp_arch: str | None = None
    soc_model: int | str | None = None
    qairt_version: str | None = None

    @classmethod
    def on(cls, context_length: int, device: Mapping[str, Any], qairt_version: str | None) -> DraftHost:
        """For a device record (hexstudio.shared.bundle.KNOWN_DEVICES' shape: dsp_arch, soc_model)."""
        return cls(int(context_length), device.get("dsp_arch"), device.get("soc_model"), qairt_version)


def _cannot_load_beside(manifest: dict[str, Any], host: DraftHost) -> str | None:
    """Why the draft's binaries would not load beside the target's (None: they would)."""
    cl = manifest.get("context_length")
    if isinstance(cl, int) and cl < host.context_length:
        return (
            f"it was compiled for a context of {cl} tokens and this model's dialog has {host.context_length}: Genie "
            f"loads both models at the dialog's size. Compile the draft with context_length {host.context_length} "
            "or more"
        )
    dev = manifest.get("device") or {}
    for key, want in (("dsp_arch", host.dsp_arch), ("soc_model", host.soc_model)):
        have = dev.get(key)
        if want is not None and have is not None and str(have) != str(want):
            return (
                f"its binaries are prepared for {key} {have} and this bundle's for {want}. Compile the draft for the "
                "same device"
            )
    mine, theirs = (
        version_tuple(str(v or ""))[:2] for v in (host.qairt_version, manifest.get("qairt_version"))
    )
    if len(mine) == 2 and len(theirs) == 2 and theirs > mine:
        return (
            f"it was compiled with QAIRT {manifest.get('qairt_version')}, newer than this bundle's "
            f"{host.qairt_version}, whose runtime the board runs. Compile the draft with the same QAIRT (the same "
            "compile target)"
        )
    return None


def draft_engine(
    draft_bundle: Path, target_tokenizer: bytes, n_vocab: int, host: DraftHost | None = None
) -> tuple[dict[str, Any], list[Path]]:
    """The engine of a draft model's compiled bundle, its ctx-bins moved under draft/, and the binaries to copy.
    Raises SpeculativeError when it cannot draft for this target: not a compiled bundle of real context binaries
    (a local or AI Hub compile, not the twin's nor an emulated AI Hub's), another tokenizer or vocabulary (Genie's
    spd compares the two models' logits token id by token id), or (with `host`) binaries that would not load
    beside the target's."""
    try:
        cfg = json.loads((draft_bundle / "genie_config.json").read_text(encoding="utf-8"))
        manifest = json.loads((draft_bundle / "bundle.json").read_text(encoding="utf-8"))
        tok = (draft_bundle / "tokenizer.json").read_bytes()
    except (OSError, ValueError) as exc:
        raise SpeculativeError(
            f"The draft bundle {draft_bundle} cannot be read ({exc}): give the folder of a "
            "compiled bundle (a run's artifacts/compile/bundle)."
        ) from None
    if manifest.get("simulated") or manifest.get("emulated"):
        raise SpeculativeError(
            f"The draft bundle {draft_bundle} holds no real context binaries (compiled with the twin, or on an "
            "emulated AI Hub): compile the draft with compile_target local or aihub."
        )
    why = _cannot_load_beside(manifest, host) if host is not None else None
    if why is not None:
        raise SpeculativeError(f"The draft bundle {draft_bundle} cannot run beside this model: {why}.")
    d = cfg.get("dialog") or {}
    if tok != target_tokenizer:
        raise SpeculativeError(
            f"The draft bundle {draft_bundle} has another tokenizer than this model: Genie's spd "
            "compares both models' logits token by token, so the draft must share the tokenizer."
        )
    draft_vocab = int((d.get("context") or {}).get("n-vocab", -1))
    if draft_vocab != n_vocab:
        # the same tokenizer, but logits of another width (a model family's small and large sizes can differ
        # in their padded vocabulary): spec-dec.cpp reads both with one n_vocab
        raise SpeculativeError(
            f"The draft bundle {draft_bundle} has this model's tokenizer but {draft_vocab} logits per token, and "
            f"this model has {n_vocab}: Genie's spd reads both models' logits with one vocabulary size, so this "
            "pair cannot run spd. Choose a draft with the same vocabulary size, or use lade."
        )
    eng = copy.deepcopy(target_engine(d))
    bins = [draft_bundle / b for b in ctx_bins(d)]
    eng.setdefault("model", {}).setdefault("binary", {})["ctx-bins"] = [f"{DRAFT_DIR}/{b.name}" for b in bins]
    eng.pop("role", None)
    return eng, bins


class SpeculativeError(ActionableError, ValueError):
    """A dialog type this bundle cannot have; the message says why and what to do instead."""


def config_name(dialog_type: str) -> str:
    return "genie_config.json" if dialog_type == "basic" else f"genie_config.{dialog_type}.json"


def engines(dialog: dict[str, Any]) -> list[dict[str, Any]]:
    """Every engine of a dialog config (one object, or spd's array of draft and target)."""
    eng = dialog.get("engine")
    if isinstance(eng, list):
        return [e for e in eng if isinstance(e, dict)]
    return [eng] if isinstance(eng, dict) else []


def target_engine(dialog: dict[str, Any]) -> dict[str, Any]:
    """The engine whose logits the dialog emits: the only one, or spd's "target"."""
    all_ = engines(dialog)
    return next((e for e in all_ if e.get("role") == "target"), all_[0] if all_ else {})


def ctx_bins(dialog: dict[str, Any]) -> list[str]:
    """Every context binary a dialog config names, each once, in order."""
    out: list[str] = []
    for e in engines(dialog):
        for b in ((e.get("model") or {}).get("binary") or {}).get("ctx-bins") or []:
            if isinstance(b, str) and b not in out:
                out.append(b)
    return out


def lade_problem(ar_sizes: list[int], lade: Lade, n_vocab: int | None = None) -> str | None:
    """Why this lade block cannot run on these graphs, else None. `n_vocab`: given where the graphs are compiled as
    exported (AI Hub), whose embedding gather then refuses Genie's seed ids past the vocabulary; the local compile
    clamps them (hexstudio.workers.qnn.htp_graph) and passes None."""
    # Genie seeds ids 1000 .. 1000 + window - 1 (lhd-dec.cpp). Qualcomm's published source (API 1.13) sends them
    # only into the levels past the first, which exist at ngram >= 3; Genie 1.21 on the simulator was measured
    # refusing id 1000 (docs/genie.md) and not at every ngram since, so every ngram is refused here
    if n_vocab is not None and n_vocab < LADE_SEED_BASE + lade.window:
        return (
            f"lade seeds its lookahead with token ids {LADE_SEED_BASE}+ and this model's vocabulary has {n_vocab} "
            "tokens: AI Hub compiles the embedding as exported and the HTP would refuse those ids. Compile locally "
            "(compile_target local clamps the ids of so small a table), or use spd."
        )
    if lade.ngram < 2 or lade.window < 1 or lade.gcap < 1:
        # gcap 0: lhd-dec.cpp sizes its n-gram pool n_vocab x (ngram - 1) x gcap, and Genie 1.21 crashed (SIGSEGV)
        # on the first lookahead step when writing into the empty pool (measured on the x86 simulator)
        return "lade needs ngram >= 2, window >= 1 and gcap >= 1 (Genie 1.21 crashes with gcap 0)."
    if ar_sizes and lade.step_tokens > max(ar_sizes):
        return (
            f"A lade step runs (window + gcap) x (ngram - 1) = {lade.step_tokens} tokens, more than the largest "
            f"graph (AR-{max(ar_sizes)}): Genie would split every step. Lower window, gcap or ngram, or "
            "raise ar_n."
        )
    return None


def speculative_of(settings: RunSettings) -> tuple[list[str], Lade, Spd]:
    """The speculative dialogs a run asks for (settings `speculative_dialogs`, `spd_draft`, `spd_draft_len`,
    `lade_window`, `lade_ngram`, `lade_gcap`; their defaults are Qualcomm's example values)."""
    types = [t.strip() for t in settings.speculative_dialogs.split(",") if t.strip() and t.strip() != "none"]
    lade = Lade(window=settings.lade_window, ngram=settings.lade_ngram, gcap=settings.lade_gcap)
    return types, lade, Spd(draft_len=settings.spd_draft_len, draft=settings.spd_draft or "self")


def settings_problem(settings: RunSettings) -> str | None:
    """What the Compile stage would refuse of the speculative dialogs a run asks for, where the model is not needed
    to tell: a dialog Genie cannot run, lade's step against the graphs (AR-n and AR-1), spd's draft length. Told
    when the run is made or its settings change, not after the export and hours of quantizing. The draft bundle
    itself is checked at Compile: it may be compiled meanwhile."""
    types, lade, spd = speculative_of(settings)
    ar_sizes = sorted({int(settings.ar_n), 1})
    for t in types:
        problem = dialog_problem(t, lade, spd, ar_sizes)
        if problem is not None:
            return problem if t in REFUSED else f"{t}: {problem}"
    return None


def dialog_problem(
    dialog_type: str, lade: Lade, spd: Spd, ar_sizes: list[int], n_vocab: int | None = None
) -> str | None:
    """Why a speculative dialog of this type cannot run on graphs of these AR sizes, else None: one Genie cannot run
    at all (REFUSED), an unknown type, lade's step or spd's draft length. `n_vocab`: the model's, where it is known
    (spd's draft is then taken to have it; lade_problem says when a small vocabulary matters)."""
    if dialog_type in REFUSED:
        return REFUSED[dialog_type]
    if dialog_type == "lade":
        return lade_problem(ar_sizes, lade, n_vocab)
    if dialog_type == "spd":
        return spd_problem(spd, n_vocab or 0, n_vocab or 0, ar_sizes)
    return f"Unknown speculative dialog '{dialog_type}' (use lade or spd)."


def spd_problem(spd: Spd, target_vocab: int, draft_vocab: int, ar_sizes: list[int]) -> str | None:
    if spd.draft_len < 1:
        return "spd needs draft-len >= 1."
    if target_vocab != draft_vocab:
        return (
            f"The draft's vocabulary ({draft_vocab}) differs from the target's ({target_vocab}): Genie's spd "
            "compares both models' logits token by token, so they need the same tokenizer."
        )
    if ar_sizes and spd.draft_len + 1 > max(ar_sizes):
        return f"draft-len {spd.draft_len} + 1 exceeds the largest graph (AR-{max(ar_sizes)})."
    return None


def spd_sampler(sampler: dict[str, Any], *, genie_keys: bool = False) -> dict[str, Any]:
    """Genie asserts temp > 0 in spd's draft sampler, so a greedy sampler (temp 0) cannot say so with its
    temperature: it becomes temp 1 with top-k 1, greedy under either reading of Genie's sampler (qualla
    sampler.cpp reads "greedy", then the basic sampler sets it again from temp <= 0 or top-k == 1), and
    "greedy": true. A sampled one says "greedy": false, so that a greedy bundle's key cannot outlive it.
    `genie_keys`: the values use Genie's key names (top-k) rather than ours (top_k)."""
    out = dict(sampler)
    greedy = float(out.get("temp", 0.0) or 0.0) <= 0.0
    if greedy:
        out["temp"] = 1.0
        out["top-k" if genie_keys else "top_k"] = 1
    out["greedy"] = greedy
    return out


def dialog_config(
    basic: dict[str, Any],
    dialog_type: str,
    *,
    lade: Lade | None = None,
    spd: Spd | None = None,
    draft_engine: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The `dialog_type` config derived from the basic one (which is not changed). spd's draft engine defaults to
    a copy of the target's (the model drafting for itself)."""
    if dialog_type in REFUSED:
        raise SpeculativeError(REFUSED[dialog_type])
    if dialog_type not in DIALOG_TYPES:
        raise SpeculativeError(f"Unknown dialog type '{dialog_type}'. Use one of: {', '.join(DIALOG_TYPES)}.")
    cfg = copy.deepcopy(basic)
    d = cfg["dialog"]
    if dialog_type == "basic":
        return cfg
    d["type"] = dialog_type
    if dialog_type == "lade":
        d["lade"] = (lade or Lade()).block()
        return cfg
    target = copy.deepcopy(d["engine"])
    draft = copy.deepcopy(draft_engine if draft_engine is not None else target)
    target["role"], draft["role"] = "target", "draft"
    d["engine"] = [draft, target]
    d["spd"] = (spd or Spd()).block()
    d["sampler"] = {
        **d.get("sampler", {}),
        **genie_sampler_keys(spd_sampler(run_sampler_keys(d.get("sampler", {})))),
    }
    return cfg


def acceptance(profile: Any) -> float | None:
    """Genie's token-acceptance-rate (tokens per step) from a GenieProfile JSON document, when it has one."""
    if not isinstance(profile, dict):
        return None
    for comp in profile.get("components") or []:
        for ev in (comp.get("events") or []) if isinstance(comp, dict) else []:
            rate = ev.get("token-acceptance-rate") if isinstance(ev, dict) else None
            if isinstance(rate, dict) and isinstance(rate.get("value"), (int, float)):
                return float(rate["value"])
    return None
