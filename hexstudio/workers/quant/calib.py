"""Calibration data: text -> token windows -> feed dicts for one part's prompt processor and
token generator. numpy only (the tokenizer comes from the `tokenizers` package)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hexstudio.shared import data
from hexstudio.workers.runtime import WorkerError, map_path

MASK_VALUE = -1000.0
BUILTIN_TEXT = data.data_path(*data.BUILTIN_TEXT)  # package data: calibration.txt, validation.txt


def resolve_text(setting: Any, kind: str) -> Path:
    """`builtin` or a path to a user's UTF-8 text file; a clear error when missing or empty."""
    name = "calibration" if kind == "calibration" else "validation"
    if setting in (None, "", "builtin"):
        path = BUILTIN_TEXT / f"{name}.txt"
    else:
        path = Path(str(setting)).expanduser()
    if not path.is_file():
        raise WorkerError(
            f"{name}_text_missing",
            f"The {name} text file {path} does not exist.",
            f'Set {name}_text to an existing UTF-8 text file, or to "builtin".',
        )
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise WorkerError(
            f"{name}_text_unreadable",
            f"The {name} text file {path} cannot be read: {exc}.",
            "Save it as UTF-8 plain text.",
        ) from None
    if not text.strip():
        raise WorkerError(
            f"{name}_text_empty",
            f"The {name} text file {path} is empty.",
            f"Use a file with a few thousand words of representative text for {name}.",
        )
    return path


def load_tokenizer(hf_dir: str | Path) -> Any:
    from tokenizers import Tokenizer

    p = Path(hf_dir) / "tokenizer.json"
    if not p.is_file():
        raise WorkerError(
            "tokenizer_missing",
            f"{p} does not exist.",
            "The model folder needs a tokenizer.json (fast tokenizer).",
        )
    return Tokenizer.from_file(str(p))


def token_windows(
    hf_dir: str | Path, text_path: Path, samples: int, seq_len: int, bos_id: int | None = None
) -> list[list[int]]:
    """`samples` windows of `seq_len` tokens, spread over the text."""
    tok = load_tokenizer(hf_dir)
    ids = tok.encode(text_path.read_text(encoding="utf-8"), add_special_tokens=False).ids
    if len(ids) < seq_len:
        raise WorkerError(
            "calibration_text_short",
            f"{text_path} has {len(ids)} tokens; one sample needs {seq_len}.",
            "Use a longer text or a smaller calibration_seq_len.",
        )
    starts = np.linspace(0, len(ids) - seq_len, num=max(1, samples)).astype(int).tolist()
    wins = []
    for s in starts[:samples]:
        w = ids[s : s + seq_len]
        if bos_id is not None:
            w = [bos_id, *w[:-1]]
        wins.append(w)
    return wins


def calibration_bos(hf_dir: Path, bos_token_id: Any) -> int | None:
    """The BOS id each calibration sample starts with: the one Genie pushes on the board (genie_config.json's
    `bos-token`, hexstudio.shared.bundle.dialog_tokens.genie_bos), so the first position is calibrated on what
    the board feeds there. None where the tokenizer adds no BOS (Qwen2's config.json names <|endoftext|> as its
    bos_token_id, which its tokenizer never adds)."""
    from hexstudio.shared.bundle.dialog_tokens import dialog_tokens, genie_bos

    if not isinstance(bos_token_id, int) or isinstance(bos_token_id, bool):
        return None
    bos = genie_bos(bos_token_id, dialog_tokens(hf_dir))
    return bos if bos >= 0 else None


@dataclass
class Block:
    """One prompt-processor block of one calibration sample (standalone, empty KV cache)."""

    ids: list[int]  # S token ids (padded with the last id)
    n_valid: int
    start_pos: int


def pp_mask(s: int, cl: int, n_valid: int) -> np.ndarray:
    m: np.ndarray = np.full((1, 1, s, cl), MASK_VALUE, dtype=np.float32)
    past = cl - s
    for i in range(s):
        m[0, 0, i, past : past + min(i, n_valid - 1) + 1] = 0.0
    return m


def blocks_from_windows(windows: list[list[int]], ar_n: int) -> list[Block]:
    out = []
    for w in windows:
        for off in range(0, len(w), ar_n):
            chunk = w[off : off + ar_n]
            n = len(chunk)
            out.append(Block(chunk + [chunk[-1]] * (ar_n - n), n, off))
    return out


def resolve_hf_dir(model_json: dict[str, Any], model_dir: Path) -> Path:
    """model.json's hf_dir; a copy inside the model stage's folder may have been recorded with the
    stage's temporary name (artifacts/model.partial/...): map it to the final folder."""
    p = Path(map_path(str(model_json.get("hf_dir") or "")))  # on a worker host: the uploaded copy
    if (p / "config.json").is_file():
        return p
    parts = p.parts
    if "model.partial" in parts:
        i = parts.index("model.partial")
        q = model_dir.joinpath(*parts[i + 1 :])
        if (q / "config.json").is_file():
            return q
    if (model_dir / "hf" / "config.json").is_file():
        return model_dir / "hf"
    raise WorkerError(
        "hf_dir_missing", f"The model folder {p} has no config.json.", "Run the model stage again."
    )
