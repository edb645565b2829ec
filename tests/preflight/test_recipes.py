"""The recipes (hexstudio/shared/data/recipes/): the parser, version matching, and the preflight checks against both recipes."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from hexstudio.shared import recipes
from hexstudio.shared.preflight_checks import run_checks
from tests.preflight.test_checks import BASE_PROBE, by_id, needs_8b

ROOT = Path(__file__).resolve().parents[2]
RECIPES = recipes.load_recipes()  # the shipped recipes (package data)

VALIDATED_PACKAGES = {
    "aimet-onnx": "2.26.0",
    "onnxruntime": None,
    "onnxruntime-gpu": "1.23.2",
    "torch": "2.7.1+cu128",
    "torchvision": "0.22.1+cu128",
    "onnx": "1.18.0",
    "transformers": "4.45.0",
    "qai-hub": "0.50.0",
    "qai-hub-models": "0.56.0",
}
CPU_DEV_PACKAGES = {
    "aimet-onnx": "2.42.0",
    "onnxruntime": "1.32.0",
    "onnxruntime-gpu": None,
    "torch": "2.13.0+cpu",
    "onnx": "1.23.2",
    "transformers": "5.23.0",
    "qai-hub": "0.56.0",
    "numpy": "2.4.6",
    "tokenizers": "0.23.3",
    "safetensors": "0.8.0",
    "huggingface-hub": "2.4.0",
    "torchvision": None,
    "qai-hub-models": None,
}


def probe(**changes: Any) -> dict[str, Any]:
    p = copy.deepcopy(BASE_PROBE)
    p["recipes"] = copy.deepcopy(RECIPES)
    p["aimet_build"] = {"build": "cuda", "evidence": "recorded"}
    p.update(changes)
    return p


def test_validated_recipe_pins_the_stack_that_worked() -> None:
    v = RECIPES["validated"]
    assert v["python"] == "3.10"
    assert v["pins"]["torch"] == "2.7.1+cu128"
    assert v["pins"]["aimet-onnx"].startswith("2.26")
    assert v["pins"]["onnxruntime-gpu"] == "1.23.2"
    assert v["pins"]["transformers"] == "4.45.0"
    assert "onnxruntime" not in v["pins"]  # never both runtimes
    assert v["directives"]["aimet-build"] == "cuda"
    assert "cu128" in v["directives"]["torch-index"]


def test_current_recipe_is_in_step_with_the_dev_constraints() -> None:
    dev = {}
    for line in (ROOT / "packaging" / "constraints" / "dev.txt").read_text().splitlines():
        if "==" in line:
            n, v = line.split("==", 1)
            dev[recipes.canonical(n)] = v.strip()
    setup = (ROOT / "packaging" / "setup-venv.sh").read_text()
    aimet = re.search(r"aimet-onnx==([0-9.]+)", setup)
    assert aimet
    dev["aimet-onnx"] = aimet.group(1)
    cur = RECIPES["current"]["pins"]
    assert cur, "current.txt pins nothing"
    for name, pinned in cur.items():
        assert dev.get(name) == pinned, f"{name}: current.txt {pinned}, dev constraints {dev.get(name)}"
    assert "onnxruntime-gpu" not in cur


@pytest.mark.parametrize(
    ("pinned", "installed", "ok"),
    [
        ("2.7.1+cu128", "2.7.1+cu128", True),
        ("2.7.1+cu128", "2.7.1+cpu", False),  # the build matters
        ("2.7.1+cu128", "2.7.1", False),
        ("2.13.0", "2.13.0+cpu", True),  # an untagged pin accepts any build
        ("1.23", "1.23.0", True),
        ("1.23.2", "1.23.20", False),
        ("1.23.2", None, False),
    ],
)
def test_version_matching(pinned: str, installed: str | None, ok: bool) -> None:
    assert recipes.version_matches(pinned, installed) is ok


def test_parser_rejects_ranges_and_duplicates_with_file_and_line() -> None:
    with pytest.raises(recipes.RecipeError, match=r"r\.txt:3: 'torch>=2' is not an exact pin"):
        recipes.parse_recipe("# python: 3.10\nonnx==1.18.0\ntorch>=2\n", path="r.txt")
    with pytest.raises(recipes.RecipeError, match="pinned twice"):
        recipes.parse_recipe("Huggingface_Hub==1.0\nhuggingface-hub==1.0\n", path="r.txt")
    r = recipes.parse_recipe(
        "# recipe: x\n# python: 3.12\n# a comment: not a directive\nonnx==1.18.0  # why\n"
    )
    assert r.name == "x" and r.python == "3.12" and r.pins == {"onnx": "1.18.0"}
    assert "a comment" not in r.directives


def test_validated_workstation_matches_validated_and_warns_about_the_tested_stack() -> None:
    c = by_id(run_checks(probe(packages=VALIDATED_PACKAGES), needs_8b()))
    assert c["recipe_validated"]["status"] == "ok", c["recipe_validated"]
    cur = c["recipe_current"]
    assert cur["status"] == "warn"
    assert "torch 2.7.1+cu128 (recipe 2.13.0)" in cur["message"]
    assert cur["measured"]["torch"] == "2.7.1+cu128" and cur["required"]["torch"] == "2.13.0"


def test_cpu_dev_machine_matches_current_and_lists_what_differs_from_validated() -> None:
    gpu = {"torch": "2.13.0+cpu", "cuda": False, "arch_list": [], "devices": []}
    c = by_id(run_checks(probe(python="3.11.7", packages=CPU_DEV_PACKAGES, gpu=gpu), needs_8b()))
    assert c["recipe_current"]["status"] == "ok"
    v = c["recipe_validated"]
    assert v["status"] == "warn"
    assert "torch 2.13.0+cpu (recipe 2.7.1+cu128)" in v["message"]
    assert "onnxruntime-gpu missing (recipe 1.23.2)" in v["message"]
    assert "python 3.11.7 (recipe 3.10)" in v["message"]
    assert "install-workstation.sh" in v["fix"]


def test_readme_install_with_a_small_model_says_something_true_not_9_of_9_pins() -> None:
    """Issue 32: on the README's own install (./dev setup: the current recipe) preflight warned "9 of 9 pins
    differ from the validated recipe". That install is HexStudio's tested stack, by design not the 8B GPU
    recipe: with a small model the check passes and says which stack it is and when the other one matters."""
    gpu = {"torch": "2.13.0+cpu", "cuda": False, "arch_list": [], "devices": []}
    small = {**needs_8b(), "num_parameters": 15_000_000}
    c = by_id(run_checks(probe(python="3.11.7", packages=CPU_DEV_PACKAGES, gpu=gpu), small))
    assert c["recipe_current"]["status"] == "ok" and "README" in c["recipe_current"]["message"]
    v = c["recipe_validated"]
    assert v["status"] == "ok", v
    assert "pins differ" not in v["message"] and "README's install" in v["message"]
    assert "aimet-onnx 2.26.0" in v["message"] and "install-workstation.sh" in v["message"]
    # an 8B on the same install: a warning that says why (the only proven stack), with the differences
    v8 = by_id(run_checks(probe(python="3.11.7", packages=CPU_DEV_PACKAGES, gpu=gpu), needs_8b()))[
        "recipe_validated"
    ]
    assert v8["status"] == "warn" and "README's install" in v8["message"] and "8B" in v8["message"]


def test_wrong_torch_build_is_named() -> None:
    pk = {**VALIDATED_PACKAGES, "torch": "2.7.1+cu121"}
    v = by_id(run_checks(probe(packages=pk), needs_8b()))["recipe_validated"]
    assert v["status"] == "warn" and "1 of 9 pins" in v["message"] and "torch 2.7.1+cu121" in v["message"]


def test_probe_without_recipes_skips_and_broken_recipe_warns() -> None:
    old = copy.deepcopy(BASE_PROBE)  # a probe recorded before recipes existed
    assert by_id(run_checks(old, needs_8b()))["recipe_validated"]["status"] == "skip"
    c = by_id(run_checks(probe(recipes={"error": "validated.txt:3: bad"}), needs_8b()))["recipe_validated"]
    assert c["status"] == "warn" and "bad" in c["message"]


def test_cpu_aimet_build_on_a_cuda_machine_fails() -> None:
    c = by_id(
        run_checks(
            probe(
                aimet_build={"build": "cpu", "evidence": "version tag +cpu"},
                packages={**VALIDATED_PACKAGES, "aimet-onnx": "2.26.0+cpu"},
            ),
            needs_8b(),
        )
    )
    b = c["aimet_build"]
    assert b["status"] == "fail" and "aimet.customop.cuda" in b["message"]
    assert "aimet-onnx==2.26.0" in b["fix"] and "+cpu" not in b["fix"].split("(")[0]


def test_cuda_aimet_build_on_cpu_machine_is_fine() -> None:
    gpu = {"torch": "2.13.0+cpu", "cuda": False, "arch_list": [], "devices": []}
    b = by_id(run_checks(probe(gpu=gpu), needs_8b()))["aimet_build"]
    assert b["status"] == "ok"


def test_live_probe_records_recipes_and_versions(tmp_path: Path) -> None:
    from hexstudio.shared.preflight_checks import probe as live_probe

    p = live_probe(tmp_path, tmp_path, smoke=False)
    assert set(p["recipes"]) == {"validated", "current"}
    assert "torchvision" in p["packages"] and "numpy" in p["packages"]
    assert p["aimet_build"]["build"] in ("cuda", "cpu")
    ids = {c["id"] for c in run_checks(p, needs_8b())}
    assert {"recipe_validated", "recipe_current", "aimet_build"} <= ids


def test_the_stack_that_failed_silently_is_named() -> None:
    pk = {**VALIDATED_PACKAGES, "aimet-onnx": "2.33.0", "onnxruntime-gpu": "1.22.0"}
    c = by_id(run_checks(probe(python="3.12.4", packages=pk), needs_8b()))
    bad = c["known_bad_stack"]
    assert (
        bad["status"] == "fail" and "token salad" in bad["message"] and "install-workstation.sh" in bad["fix"]
    )
    # one version off is not that stack (the recipe checks still list the differences)
    ok = by_id(run_checks(probe(python="3.10.20", packages=pk), needs_8b()))
    assert "known_bad_stack" not in ok and ok["recipe_validated"]["status"] == "warn"
