"""Environment recipes (hexstudio/shared/data/recipes/*.txt, package data): read them and compare an environment with them.

A recipe is a pip constraints file (`name==version` lines) whose header comments carry
`# key: value` directives (python, torch-index, aimet-build, ...). Stdlib only, no Qt, no app:
the preflight probe embeds the parsed recipes so that its checks stay pure.

Version matching: a pin with a local tag (`torch==2.7.1+cu128`) needs the same local tag (the
build matters: +cpu and +cu121 torch are different programs); a pin without one (`onnx==1.18.0`)
matches any build of that public version.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hexstudio.shared.data import recipes_dir
from hexstudio.shared.errors import ActionableError

RECIPES_DIR = recipes_dir()  # package data (importlib.resources)
RECIPE_NAMES = ("validated", "current")
DIRECTIVES = ("recipe", "python", "torch-index", "aimet-build")

_DIRECTIVE = re.compile(r"^#\s*([a-z][a-z0-9-]*)\s*:\s*(.+?)\s*$")
_PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)\s*==\s*([A-Za-z0-9.+!_-]+)\s*(?:#.*)?$")


class RecipeError(ActionableError, ValueError):
    """A recipe file that cannot be read; the message names the file and line."""


def canonical(name: str) -> str:
    """PEP 503 name: `Huggingface_Hub` and `huggingface-hub` are the same distribution."""
    return re.sub(r"[-_.]+", "-", name).lower()


@dataclass
class Recipe:
    name: str
    pins: dict[str, str]  # canonical name -> version as pinned
    directives: dict[str, str] = field(default_factory=dict)
    path: str = ""

    @property
    def python(self) -> str | None:
        return self.directives.get("python")

    def to_json(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "path": self.path,
            "python": self.python,
            "pins": dict(self.pins),
            "directives": dict(self.directives),
        }


def parse_recipe(text: str, name: str = "recipe", path: str = "") -> Recipe:
    """Parse a recipe's text. Only exact pins are allowed: a recipe is a record, not a range."""
    pins: dict[str, str] = {}
    directives: dict[str, str] = {}
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _DIRECTIVE.match(line)
            if m and m.group(1) in DIRECTIVES and m.group(1) not in directives:
                directives[m.group(1)] = m.group(2)
            continue
        m = _PIN.match(line)
        if not m:
            raise RecipeError(f"{path or name}:{lineno}: '{line}' is not an exact pin (name==version).")
        key = canonical(m.group(1))
        if key in pins:
            raise RecipeError(f"{path or name}:{lineno}: {m.group(1)} is pinned twice.")
        pins[key] = m.group(2)
    title = directives.pop("recipe", None)
    return Recipe(name=title or name, pins=pins, directives=directives, path=path)


def load_recipe(path: str | Path) -> Recipe:
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except OSError as exc:
        raise RecipeError(f"Cannot read recipe {p}: {exc.strerror or exc}.") from None
    return parse_recipe(text, name=p.stem, path=str(p))


def load_recipes(directory: Path = RECIPES_DIR) -> dict[str, dict[str, Any]]:
    """The shipped recipes as JSON-able dicts ({} entries are skipped when a file is missing)."""
    out: dict[str, dict[str, Any]] = {}
    for n in RECIPE_NAMES:
        f = directory / f"{n}.txt"
        if f.is_file():
            out[n] = load_recipe(f).to_json()
    return out


def split_version(v: str) -> tuple[str, str | None]:
    public, _, local = v.partition("+")
    return public, (local or None)


def _normal(public: str) -> tuple[Any, ...]:
    """1.23 == 1.23.0; compares numerically where it can."""
    parts: list[Any] = [int(x) if x.isdigit() else x for x in re.split(r"[.]", public)]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def version_matches(pinned: str, installed: str | None) -> bool:
    if not installed:
        return False
    pp, pl = split_version(pinned)
    ip, il = split_version(installed)
    if _normal(pp) != _normal(ip):
        return False
    return pl is None or pl == il


def python_matches(pinned: str | None, installed: str) -> bool:
    if not pinned:
        return True
    want = pinned.split(".")
    return installed.split(".")[: len(want)] == want


def compare(recipe: dict[str, Any], python: str, packages: dict[str, str | None]) -> list[dict[str, Any]]:
    """One row per pin (and one for Python): package, pinned, installed, match."""
    have = {canonical(k): v for k, v in packages.items()}
    rows: list[dict[str, Any]] = []
    if recipe.get("python"):
        rows.append(
            {
                "package": "python",
                "pinned": recipe["python"],
                "installed": python,
                "match": python_matches(recipe["python"], python),
            }
        )
    for name, pinned in recipe.get("pins", {}).items():
        inst = have.get(canonical(name))
        rows.append(
            {"package": name, "pinned": pinned, "installed": inst, "match": version_matches(pinned, inst)}
        )
    return rows


def pinned_names(recipes: dict[str, dict[str, Any]]) -> list[str]:
    names: list[str] = []
    for r in recipes.values():
        for n in r.get("pins", {}):
            if n not in names:
                names.append(n)
    return names
