"""The model-family seam (issue 30): a new architecture is one ModelFamily declaration and one register_family call;
nothing else in the studio changes. Here a made-up DummyForCausalLM (Llama shapes under other config.json key
names, with qk-norm and tied embeddings by default) is declared in the test only: model inspection accepts and
sizes it, and its GenieX model_id, chat-template fallback and tool-call format come from the declaration."""

from __future__ import annotations

import ast
import json
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from hexstudio.core.eval.toolcall import detect_format
from hexstudio.core.genie.prompts import template_for
from hexstudio.shared import families, modelinfo
from hexstudio.shared.bundle.geniex import GenieXMetadataError, model_id_for
from hexstudio.shared.data import builtin_model_dir

RENAMED = {"hidden_size": "d_model", "num_hidden_layers": "n_layers", "num_attention_heads": "n_heads"}
DUMMY = families.ModelFamily(
    key="dummy",
    title="Dummy (test only)",
    architectures=("DummyForCausalLM",),
    model_types=("dummy",),
    keys=families.ConfigKeys(**RENAMED),
    tie_word_embeddings=True,
    qk_norm=True,
    chat_template_fallback="plain",
    tool_calls=families.ToolCalls("qwen", ("dummy",)),
    geniex_prefix="falcon_v3_",  # a pipeline no built-in family takes: it can only come from here
)


def llama_config() -> dict[str, Any]:
    return dict(json.loads((builtin_model_dir() / "config.json").read_text()))


def dummy_config() -> dict[str, Any]:
    cfg = {RENAMED.get(k, k): v for k, v in llama_config().items() if k != "tie_word_embeddings"}
    return {**cfg, "architectures": ["DummyForCausalLM"], "model_type": "dummy"}


@pytest.fixture
def dummy_family() -> Iterator[families.ModelFamily]:
    families.register_family(DUMMY)
    try:
        yield DUMMY
    finally:
        families.unregister_family(DUMMY.key)
    assert families.family_of(dummy_config()) is None


def test_a_dummy_family_plugs_in_without_touching_anything_else(
    dummy_family: families.ModelFamily, tmp_path: Path
) -> None:
    cfg = dummy_config()
    assert families.family_of(cfg) is dummy_family and dummy_family in families.families()

    info = modelinfo.inspect_config(cfg)
    assert info["supported"], info["reason"]
    assert info["architecture"] == "DummyForCausalLM" and info["model_type"] == "dummy"
    base = llama_config()
    assert (info["hidden_size"], info["num_layers"], info["num_heads"]) == (
        base["hidden_size"],
        base["num_hidden_layers"],
        base["num_attention_heads"],
    )
    assert info["tie_word_embeddings"] is True  # the family's default: config.json does not say
    tied_llama = modelinfo.count_parameters({**base, "tie_word_embeddings": True})
    qk_norms = base["num_hidden_layers"] * 2 * base["head_dim"]
    assert info["num_parameters"] == tied_llama + qk_norms
    assert (
        "DummyForCausalLM"
        in modelinfo.inspect_config({**cfg, "architectures": ["NopeForCausalLM"]})["reason"]
    )

    assert model_id_for("acme_dummy_1b", cfg) == "falcon_v3_acme_dummy_1b"

    run_model = tmp_path / "model"  # a run's model folder whose Hugging Face files are gone
    run_model.mkdir()
    (run_model / "model.json").write_text(
        json.dumps({"model": "acme/Dummy-1B", "hf_dir": "hf", "info": info})
    )
    assert template_for(run_model) == "plain"

    assert detect_format(None, "acme/Dummy-1B") == "qwen"


def test_without_its_declaration_the_dummy_is_refused_everywhere(tmp_path: Path) -> None:
    cfg = dummy_config()
    assert families.family_of(cfg) is None
    info = modelinfo.inspect_config(cfg)
    assert not info["supported"] and "not a supported architecture" in info["reason"]
    with pytest.raises(GenieXMetadataError):
        model_id_for("acme_dummy_1b", cfg)
    run_model = tmp_path / "model"
    run_model.mkdir()
    (run_model / "model.json").write_text(json.dumps({"model": "acme/Dummy-1B", "info": info}))
    assert template_for(run_model) == "llama3"
    assert detect_format(None, "acme/Dummy-1B") == "json"


def test_a_family_cannot_claim_another_ones_architecture(dummy_family: families.ModelFamily) -> None:
    with pytest.raises(ValueError, match="LlamaForCausalLM"):
        families.register_family(
            families.ModelFamily("llama-again", "Llama again", ("LlamaForCausalLM",), ("llama_again",))
        )
    with pytest.raises(ValueError, match="dummy"):
        families.register_family(DUMMY)


def test_the_built_in_families_say_what_the_literals_said() -> None:
    assert families.supported_architectures() == {
        "LlamaForCausalLM": "llama",
        "Qwen2ForCausalLM": "qwen2",
        "Qwen3ForCausalLM": "qwen3",
        "MistralForCausalLM": "mistral",
    }
    prefixes = {mt: model_id_for("m", {"model_type": mt}) for mt in ("llama", "qwen2", "qwen3", "phi3")}
    assert prefixes == {"llama": "llama_v3_m", "qwen2": "qwen2_5_m", "qwen3": "qwen3_m", "phi3": "phi_3_5_m"}
    with pytest.raises(GenieXMetadataError):
        model_id_for("m", {"model_type": "mistral"})
    assert not modelinfo.inspect_config({**llama_config(), "architectures": ["Phi3ForCausalLM"]})["supported"]
    names = ("Qwen/Qwen3-4B", "mistralai/Mistral-7B", "meta-llama/Llama-3.1-8B", "NousResearch/Hermes-3")
    assert [detect_format(None, n) for n in names] == ["qwen", "mistral", "llama3", "qwen"]


def test_families_imports_the_standard_library_only() -> None:
    tops: set[str] = set()
    for node in ast.walk(ast.parse(Path(families.__file__).read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            tops |= {a.name.split(".")[0] for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            tops.add((node.module or "").split(".")[0])
    assert tops <= set(sys.stdlib_module_names), tops
