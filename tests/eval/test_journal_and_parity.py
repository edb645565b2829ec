"""Two small pieces of the Evaluate stage a crash or a second suite used to fool: the journal after a torn line,
and the greedy parity the gate judges when more than one suite scores parity."""

from __future__ import annotations

import io
import json
from pathlib import Path

from hexstudio.core.eval.stage import _emit_parity
from hexstudio.core.paths import BUILTIN_MODEL_DIR as BUILTIN_DIR
from hexstudio.shared.journal import append_journal, read_journal
from hexstudio.shared.protocol import Emitter


def test_a_record_after_a_torn_line_is_kept(tmp_path: Path) -> None:
    """A crash mid-write leaves a last line without its newline. The next record must start a line of its own:
    joined to the torn one, it would be unreadable and its finished case run again."""
    j = tmp_path / "board.jsonl"
    append_journal(j, {"leg": "board", "key": "a", "text": "A"})
    with open(j, "a", encoding="utf-8") as f:
        f.write('{"leg": "board", "key": "b", "te')
    append_journal(j, {"leg": "board", "key": "c", "text": "C"})
    assert sorted(read_journal(j)) == ["board\0a", "board\0c"]
    append_journal(j, {"leg": "board", "key": "d", "text": "D"})
    assert sorted(read_journal(j)) == ["board\0a", "board\0c", "board\0d"]
    assert j.read_bytes().count(b"\n") == 4


def _metrics(out: io.StringIO) -> dict[str, object]:
    return {
        e["name"]: e["value"] for e in map(json.loads, out.getvalue().splitlines()) if e["type"] == "metric"
    }


def test_every_parity_suite_counts_for_the_gate() -> None:
    """Two parity suites, 200/256 and 64/64: the gate sees 264/320, not the last suite's perfect 64/64."""
    out = io.StringIO()
    _emit_parity(Emitter(out), [{"matched": 200, "total": 256}, {"matched": 64, "total": 64}], "sim")
    assert _metrics(out) == {"parity_matched": 264, "parity_total": 320, "parity_reference": "sim"}


def test_a_continuation_cut_inside_a_character_is_not_a_parity_miss() -> None:
    """The token limit cut 'café' inside the é: the host's text ends in U+FFFD, the board leaves the partial
    character out. Identical replies read as 5/6 and failed the parity gate."""
    from tokenizers import Tokenizer

    from hexstudio.core.eval.scoring import parity
    from hexstudio.core.eval.stage import _encoded

    tok = Tokenizer.from_file(str(BUILTIN_DIR / "tokenizer.json"))

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    ids = encode("Le café au lait")[:6]
    host = {"ids": ids, "text": tok.decode(ids)}
    assert host["text"].endswith("\ufffd")
    board_text = host["text"].rstrip("\ufffd")  # as the board prints it
    assert parity(encode(board_text), _encoded(host, encode))["exact"]
    whole = encode("Le café")
    assert (
        _encoded({"ids": whole, "text": tok.decode(whole)}, encode) == whole
    )  # the usual case: the same ids


def test_a_split_the_tokenizer_never_makes_is_not_a_parity_miss() -> None:
    """The host's greedy continuation chose " h" + "ello" where the tokenizer encodes " hello" otherwise: the
    board, identical, prints " hello", which encodes to the other ids. Raw host ids against the board's text
    encoded again read as a miss at the first token."""
    from tokenizers import Tokenizer

    from hexstudio.core.eval.scoring import parity
    from hexstudio.core.eval.stage import _encoded

    tok = Tokenizer.from_file(str(BUILTIN_DIR / "tokenizer.json"))

    def encode(text: str) -> list[int]:
        return tok.encode(text, add_special_tokens=False).ids

    split = encode(" h") + encode("ello")
    assert split != encode(" hello") and tok.decode(split) == " hello"  # a split the tokenizer never makes
    host = {"ids": split, "text": tok.decode(split)}
    assert parity(encode(" hello"), _encoded(host, encode))["exact"]
