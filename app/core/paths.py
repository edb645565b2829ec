"""Where things live: the repository's resources, the default workspace, config."""

from __future__ import annotations

import os
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
RESOURCES = REPO_ROOT / "resources"
BUILTIN_MODEL_DIR = RESOURCES / "builtin_model" / "tiny-llama"
BUILTIN_MODEL_ID = "builtin:tiny-llama"


def config_dir() -> Path:
    base = os.environ.get("HEXSTUDIO_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "hexstudio")
    return Path(base)


def default_workspace() -> Path:
    """Inside the Linux (WSL) filesystem by default: /mnt/c is slow for hundreds of GB."""
    env = os.environ.get("HEXSTUDIO_WORKSPACE")
    if env:
        return Path(env).expanduser()
    return Path(os.path.expanduser("~/hexstudio-workspace"))
