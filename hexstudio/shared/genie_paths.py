"""The path rules of a genie_config.json that must hold on the board too: which keys name files of the bundle,
where in a config they sit, the characters a path part may use, and how a file that is not a regular one is
named in a refusal.

Standard library only, importing nothing of HexStudio's: hexstudio.shared.bundle.safepath builds the studio's
checks on it, and it is copied to the board beside the chat helper hexstudio/workers/board/genie_session.py
(hexstudio.workers.board.helper_files), which refuses a bundle pushed by an older studio, or edited on the
board, by the same rules.
"""

from __future__ import annotations

import re
import stat

SAFE_PART = re.compile(r"^[A-Za-z0-9._+-]+$")

# keys of genie_config.json whose values (a string or a list of strings) name files of the bundle, wherever they
# sit (one engine or a list of them for speculative decoding's target and draft, LoRA adapters, embeddings)
GENIE_PATH_KEYS = frozenset(
    {
        "ctx-bins",
        "bin-sections",
        "extensions",
        "path",
        "lut-path",
        "model-bin",
        "model-path",
        "draft-model",
        "lora-bin",
        "tokenizer-path",
    }
)


def genie_config_paths(cfg: object, where: str = "") -> list[tuple[str, object]]:
    """(entry, path) of every file a genie_config.json names, anywhere in it (ctx-bins, tokenizer, extensions,
    LoRA bin-sections, a draft model's engine)."""
    out: list[tuple[str, object]] = []
    if isinstance(cfg, dict):
        for k, v in cfg.items():
            here = f"{where}.{k}" if where else str(k)
            if k in GENIE_PATH_KEYS and not isinstance(v, (dict, bool, int, float)):
                if isinstance(v, list):
                    out += [(f"{here}[{i}]", x) for i, x in enumerate(v)]
                elif v is not None:
                    out.append((here, v))
            else:
                out += genie_config_paths(v, here)
    elif isinstance(cfg, list):
        for i, x in enumerate(cfg):
            out += genie_config_paths(x, f"{where}[{i}]")
    return out


def not_regular_kind(mode: int) -> str | None:
    """What a file of this st_mode is when it is not a regular file ("a folder", "a named pipe (FIFO)", ...):
    a FIFO would hang whoever opens it, a device would read forever. None for a regular file."""
    if stat.S_ISREG(mode):
        return None
    return (
        "a folder"
        if stat.S_ISDIR(mode)
        else "a named pipe (FIFO)"
        if stat.S_ISFIFO(mode)
        else "a device"
        if stat.S_ISCHR(mode) or stat.S_ISBLK(mode)
        else "a socket"
        if stat.S_ISSOCK(mode)
        else "not a regular file"
    )
