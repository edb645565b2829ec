"""The BOS and EOS a Genie dialog pushes around each query, chosen so that the cache reads as the model's own
chat template renders the conversation.

Genie (qualla dialog.cpp, Dialog::query) pushes, before every query after the first, the context's EOS and
then its BOS; before the first, the BOS. qualla context.cpp takes that EOS from genie_config.json's
`eos-token`: the first entry of an array (an integer: `eot-token` when set, else the integer); every entry
stops a reply. config.json's order is the model's, not the template's: Llama-3.1-Instruct lists
<|end_of_text|> (128001) before <|eot_id|> (128009), which ends its turns, so a later turn would follow
`reply<|end_of_text|>` where the template writes `reply<|eot_id|>`. And Qwen's config.json names a
bos_token_id (151643, <|endoftext|>) its tokenizer never adds (tokenizer_config.json: bos_token null), so
Genie would start every query with it; so does a tokenizer that names a bos_token with `add_bos_token:
false`. The tokenizer says which token ends a turn (its eos_token) and whether there is a BOS.

Every id that stops transformers' generate must stop Genie too: generation_config.json's eos_token_id (what
generate reads) may list ids config.json lacks (Meta-Llama-3-8B-Instruct's first release: config.json 128001,
generation_config.json [128001, 128009]), and the tokenizer's eos_token may be missing from both; Genie then
never stops at the turn's end and every reply runs to the token limit.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import TypeGuard

from hexstudio.shared.chat_template import added_bos, read_json_object, token_text


@dataclass(frozen=True)
class DialogTokens:
    """What the tokenizer says: the id of its eos_token (None: unknown) and whether it has a BOS; and
    generation_config.json's eos ids (`stops`), which end a reply as config.json's do."""

    turn_end: int | None
    has_bos: bool
    stops: tuple[int, ...] = ()


def dialog_tokens(hf_dir: Path) -> DialogTokens | None:
    """The tokenizer's word on BOS and the turn's end (None: the folder has no tokenizer_config.json, and
    config.json's ids are kept as they are)."""
    tc = read_json_object(hf_dir / "tokenizer_config.json")
    if not tc:
        return None
    eos = token_text(tc.get("eos_token"))
    turn_end = None
    if eos is not None:
        # tokenizer_config.json's added_tokens_decoder, else tokenizer.json's added tokens and vocabulary
        ids = {
            token_text(t): int(k)
            for k, t in (tc.get("added_tokens_decoder") or {}).items()
            if str(k).isdigit()
        }
        tok = read_json_object(hf_dir / "tokenizer.json") if eos not in ids else {}
        for t in tok.get("added_tokens") or []:
            if isinstance(t, dict) and isinstance(t.get("id"), int) and isinstance(t.get("content"), str):
                ids.setdefault(t["content"], t["id"])
        vocab = (tok.get("model") or {}).get("vocab")
        if eos not in ids and isinstance(vocab, dict) and isinstance(vocab.get(eos), int):
            ids[eos] = int(vocab[eos])
        turn_end = ids.get(eos)
    gen = read_json_object(hf_dir / "generation_config.json").get("eos_token_id")
    stops = tuple(e for e in (gen if isinstance(gen, list) else [gen]) if _token_id(e))
    return DialogTokens(turn_end, added_bos(tc) is not None, stops)


def _token_id(v: object) -> TypeGuard[int]:
    return isinstance(v, int) and not isinstance(v, bool) and v >= 0


def genie_eos(eos: int | list[int], tokens: DialogTokens | None) -> int | list[int]:
    """config.json's eos ids as genie_config.json's `eos-token`: the token that ends a turn first (Genie
    pushes the first between queries), then config.json's ids, then any generation_config.json adds (an
    integer stays one where nothing is added)."""
    if tokens is None:
        return eos
    ids = eos if isinstance(eos, list) else [eos]
    out = list(dict.fromkeys([*ids, *tokens.stops]))
    if tokens.turn_end is not None:
        out = [tokens.turn_end, *(e for e in out if e != tokens.turn_end)]
    return eos if out == [eos] else out


def genie_bos(bos: int, tokens: DialogTokens | None) -> int:
    """config.json's bos id as genie_config.json's `bos-token`: -1 (none) when the tokenizer adds no BOS."""
    return -1 if tokens is not None and not tokens.has_bos else bos
