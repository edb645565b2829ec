"""DESIGN.md's layering rules, enforced with import-linter."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def test_import_linter_contracts_hold() -> None:
    exe = Path(sys.executable).with_name("lint-imports")
    proc = subprocess.run([str(exe)], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    declared = (REPO / "pyproject.toml").read_text().count("[[tool.importlinter.contracts]]")
    m = re.search(r"Contracts: (\d+) kept, (\d+) broken", proc.stdout)
    assert m is not None, proc.stdout
    assert (int(m.group(1)), int(m.group(2))) == (declared, 0), proc.stdout


def _module_imports() -> tuple[dict[str, set[str]], list[tuple[str, str, int]]]:
    """(module -> project modules it imports when it is imported, [(module, imported, line) of imports inside
    functions]). Imports under `if TYPE_CHECKING:` count as neither; importing a.b.c also imports a and a.b."""
    import ast

    files: dict[str, Path] = {}
    for pkg in ("hexstudio",):
        for f in (REPO / pkg).rglob("*.py"):
            parts = f.relative_to(REPO).with_suffix("").parts
            files[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = f

    def resolve(node: ast.Import | ast.ImportFrom, cur: str) -> list[str]:
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = cur.split(".")[: None if files[cur].name == "__init__.py" else -1]
                base = base[: len(base) - (node.level - 1)]
                mod = ".".join(base + ([node.module] if node.module else []))
            else:
                mod = node.module or ""
            names = [f"{mod}.{a.name}" if f"{mod}.{a.name}" in files else mod for a in node.names]
        else:
            names = [a.name for a in node.names]
        out = []
        for n in names:
            if n.split(".")[0] != "hexstudio":
                continue
            while n and n not in files:
                n = n.rpartition(".")[0]
            out += [p for p in (".".join(n.split(".")[:i]) for i in range(1, n.count(".") + 2)) if p in files]
        return out

    top: dict[str, set[str]] = {m: set() for m in files}
    inner: list[tuple[str, str, int]] = []
    for mod, f in files.items():
        tree = ast.parse(f.read_text(encoding="utf-8"))
        skip: set[int] = set()
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                for sub in ast.walk(node):
                    if isinstance(sub, (ast.Import, ast.ImportFrom)) and id(sub) not in skip:
                        skip.add(id(sub))
                        inner += [(mod, t, sub.lineno) for t in resolve(sub, mod)]
            elif isinstance(node, ast.If) and "TYPE_CHECKING" in ast.unparse(node.test):
                skip.update(id(sub) for sub in ast.walk(node))
        for node in ast.walk(tree):
            if isinstance(node, (ast.Import, ast.ImportFrom)) and id(node) not in skip:
                top[mod].update(resolve(node, mod))
    return top, inner


def test_no_function_level_import_dodges_a_cycle() -> None:
    """Issue 21: an import inside a function is there to keep start-up light, never to hide a cycle: no
    module imported from inside a function imports (at its top, transitively) the module that imports it."""
    top, inner = _module_imports()
    assert sum(len(v) for v in top.values()) > 500 and len(inner) > 100  # the walk saw the tree

    def chain(a: str, b: str) -> list[str] | None:
        seen, stack = {a}, [[a]]
        while stack:
            path = stack.pop()
            for n in top[path[-1]]:
                if n == b:
                    return [*path, n]
                if n not in seen:
                    seen.add(n)
                    stack.append([*path, n])
        return None

    dodged = [
        f"{src}:{line} imports {dst} inside a function; {dst} imports it back: {' -> '.join(c)}"
        for src, dst, line in sorted(set(inner))
        if dst != src and (c := chain(dst, src))
    ]
    assert not dodged, "\n".join(dodged)


def test_every_code_folder_is_a_regular_package() -> None:
    """A folder of modules without __init__.py is a namespace package: PyInstaller's collect_submodules does not
    walk it, so a module only imported by name at run time (the AIMET smoke test, hexstudio.workers.quant.smoke) was
    missing from the frozen build and its preflight failed. Every folder of hexstudio/ holding modules
    has an __init__.py."""
    missing = sorted(
        str(d.relative_to(REPO))
        for pkg in ("hexstudio",)
        for d in (REPO / pkg).rglob("*")
        if d.is_dir()
        and "__pycache__" not in d.parts
        and any(d.glob("*.py"))
        and not (d / "__init__.py").is_file()
    )
    assert not missing, f"folders of modules without __init__.py: {missing}"


def test_every_built_in_stage_action_is_registered_not_named_by_path() -> None:
    """The studio's own stages name their action and recheck in hexstudio/core/stage_actions.py (imported with
    plain import statements, which the contracts see); "module:function" is left to stages from outside."""
    from hexstudio.core.stage_actions import ACTIONS, RECHECKS
    from hexstudio.core.stages import STAGES

    actions = [s for s in STAGES if s.action is not None]
    assert actions and all(s.action in ACTIONS for s in actions), [s.action for s in actions]
    assert all(s.recheck in RECHECKS for s in STAGES if s.recheck is not None)
