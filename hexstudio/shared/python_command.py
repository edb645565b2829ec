"""How a HexStudio process runs one of its own modules in a child process: `python -m MODULE ARGS`, or what a
frozen (PyInstaller) build runs instead. Shared: the studio's job runner (hexstudio.core.jobs) and the workers
(the compile stage's Qualcomm checks, the predictor's graph timings) both start such children."""

from __future__ import annotations

import sys

RUN_MODULE_CODE = (
    "import runpy, sys; m = sys.argv.pop(1); sys.argv[0] = m; "
    "runpy.run_module(m, run_name='__main__', alter_sys=True)"
)


def frozen() -> bool:
    """A PyInstaller build: sys.executable is hexstudio itself, and there is no separate Python."""
    return bool(getattr(sys, "frozen", False))


def python_command(module: str, *args: str) -> list[str]:
    """`python -m MODULE ARGS` as this process runs it. A frozen build has no separate Python: its own
    executable is the CLI (`hexstudio ARGS` for the module "hexstudio"), a worker (`hexstudio --worker STAGE ARGS`
    for hexstudio.workers.STAGE) and any other module (`hexstudio -c RUN_MODULE_CODE MODULE ARGS`);
    hexstudio/__main__.py dispatches them."""
    if not frozen():
        return [sys.executable, "-m", module, *args]
    if module == "hexstudio":
        return [sys.executable, *args]
    package, _, name = module.rpartition(".")
    if package == "hexstudio.workers" and name:
        return [sys.executable, "--worker", name, *args]
    return [sys.executable, "-c", RUN_MODULE_CODE, module, *args]
