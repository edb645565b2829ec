"""The BOS and EOS a Genie dialog pushes around each query, chosen so that the cache reads as the model's own
chat template renders the conversation.

Genie (qualla dialog.cpp, Dialog::query) pushes, before every query after the first, the context's EOS and
then its BOS; before the first, the BOS. qualla context.cpp takes that EOS from genie_config.json's
`eos-token`: the first entry of an array (an integer: `eot-token` when set, else the integer); every entry
stops a reply. config.json's order is the model's, not the template's: Llama-3.1-Instruct lists
<|end_of_text|> (128001) before <|eot_id|> (128009), which ends its turns, so a later turn would follow
`reply<|end_of_text|>` where the template writes `reply<|eot_id|>`. And Qwen's config.json names a
bos_token_id (151643, <|endoftext|>) its tokenizer never adds (tokenizer_config.json: bos_token null), so
Genie would start every query with it; so does a tokenizer that names a bos_token with `add_bos_token: false`. The tokenizer says which token ends a turn (its eos_token) and
whether there is a BOS.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from hexstudio.shared.chat_template import added_bos, read_json_object, token_text


@dataclass(frozen=True)
class DialogTokens:
    """What the tokenizer says: the id of its eos_token (None: unknown) and whether it has a BOS."""

    turn_end: int | None
    has_bos: bool


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
    return DialogTokens(turn_end, added_bos(tc) is not None)


def genie_eos(eos: int | list[int], tokens: DialogTokens | None) -> int | list[int]:
    """config.json's eos ids as genie_config.json's `eos-token`: the token that ends a turn first (Genie
    pushes the first between queries); the same ids, only reordered."""
    if tokens is None or tokens.turn_end is None or not isinstance(eos, list) or tokens.turn_end not in eos:
        return eos
    return [tokens.turn_end, *(e for e in eos if e != tokens.turn_end)]


def genie_bos(bos: int, tokens: DialogTokens | None) -> int:
    """config.json's bos id as genie_config.json's `bos-token`: -1 (none) when the tokenizer adds no BOS."""
    return -1 if tokens is not None and not tokens.has_bos else bos
