"""Where things live: the built-in model (package data), the default workspace, config.

Shipped data is package data found through importlib.resources (hexstudio.shared.data, and each
package's own), never through the repository root: a wheel installed with pip or pipx has no checkout.
REPO_ROOT is the folder holding the `hexstudio` package: a checkout's root when run from one (then it also has
docs/), site-packages when installed. Only the studio's links to the checkout's docs/ use it.
"""

from __future__ import annotations

import os
from pathlib import Path

from hexstudio.shared.data import builtin_model_dir, package_path

REPO_ROOT = Path(__file__).resolve().parents[2]
# The folder that holds the hexstudio package, workers included (a checkout's root, or site-packages): a child
# Python given it on PYTHONPATH runs `python -m hexstudio.workers...` of this very install; a worker host's copy
# mirrors it.
WORKERS_ROOT = package_path("hexstudio").parent
BUILTIN_MODEL_DIR = builtin_model_dir()
BUILTIN_MODEL_ID = "builtin:tiny-llama"


def config_dir() -> Path:
    base = os.environ.get("HEXSTUDIO_CONFIG_DIR") or os.path.join(
        os.environ.get("XDG_CONFIG_HOME") or os.path.expanduser("~/.config"), "hexstudio"
    )
    return Path(base)


def default_workspace(configured: str | None = None) -> Path:
    """The workspace when no --workspace is given: $HEXSTUDIO_WORKSPACE, else `configured` (settings.json's
    "workspace"), else ~/hexstudio-workspace: inside the Linux (WSL) filesystem, as /mnt/c is slow for
    hundreds of GB. The studio and the CLI both choose it here, so both show the same runs."""
    env = os.environ.get("HEXSTUDIO_WORKSPACE")
    # absolute: the simulator board's home is inside it, and a board's home must be an absolute path
    if env:
        return Path(env).expanduser().absolute()
    if configured:
        return Path(configured).expanduser().absolute()
    return Path(os.path.expanduser("~/hexstudio-workspace"))
