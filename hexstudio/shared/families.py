"""Model families: what HexStudio knows that differs between Hugging Face decoder architectures, one
`ModelFamily` declaration each (issue 30, "Extension points"). A new architecture is one declaration and one
`register_family` call; the code that differs per family reads it here:

- hexstudio.shared.modelinfo: `architectures` and `exported` (supported or not), `keys` and
  `tie_word_embeddings` (`normalized_config`), `qk_norm` and `qkv_bias` (the parameter count);
- hexstudio.shared.bundle.geniex: `geniex_prefix` (metadata.json's model_id);
- hexstudio.core.genie.prompts: `chat_template_fallback` (a model whose files cannot be read);
- hexstudio.core.eval.toolcall: `tool_calls` (the format when the chat template shows no marker).

Not here because nothing branches on the family: the rope (hexstudio.shared.rope reads config.json's
rope_theta / rope_scaling / rope_parameters alone) and the export (hexstudio.workers.export follows the
transformers modules: a `q_norm` is applied where the layer has one).

Standard library only: worker hosts import it through modelinfo.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field, fields
from typing import Any


@dataclass(frozen=True)
class ConfigKeys:
    """The config.json key that holds each shape field HexStudio reads (transformers' Llama names by default)."""

    hidden_size: str = "hidden_size"
    num_hidden_layers: str = "num_hidden_layers"
    num_attention_heads: str = "num_attention_heads"
    num_key_value_heads: str = "num_key_value_heads"
    head_dim: str = "head_dim"
    intermediate_size: str = "intermediate_size"
    vocab_size: str = "vocab_size"
    max_position_embeddings: str = "max_position_embeddings"

    def renamed(self) -> Iterator[tuple[str, str]]:
        """(our name, the family's config.json key) for each field the family names otherwise."""
        for f in fields(self):
            theirs = getattr(self, f.name)
            if theirs != f.name:
                yield f.name, theirs


@dataclass(frozen=True)
class ToolCalls:
    """How the family's models write tool calls."""

    format: str  # one of hexstudio.core.eval.toolcall.FORMATS
    name_hints: tuple[str, ...] = ()  # lower-case model-name pieces that say this format (no template marker)


@dataclass(frozen=True)
class ModelFamily:
    key: str
    title: str
    architectures: tuple[str, ...]  # config.json `architectures[0]` names
    model_types: tuple[str, ...]  # config.json `model_type` values (lower case)
    exported: bool = True  # HexStudio's export handles it; False: known for its runtime metadata only
    keys: ConfigKeys = field(default_factory=ConfigKeys)
    tie_word_embeddings: bool = False  # when config.json does not say
    qk_norm: bool = False  # an RMSNorm on each head's query and key (q_norm, k_norm)
    qkv_bias: bool = False  # q/k/v projections with biases whatever config.json's attention_bias says
    chat_template_fallback: str | None = None  # hexstudio.core.genie.prompts template; None: the default
    tool_calls: ToolCalls | None = None
    geniex_prefix: str | None = None  # GenieX qairt plugin pipeline (model_id prefix); None: it has none


_REGISTRY: dict[str, ModelFamily] = {}


def register_family(fam: ModelFamily) -> ModelFamily:
    """Add `fam`; refuses a key, architecture or model_type another family already declares."""
    for other in _REGISTRY.values():
        clash = (
            {fam.key} & {other.key}
            or set(fam.architectures) & set(other.architectures)
            or set(fam.model_types) & set(other.model_types)
        )
        if clash:
            raise ValueError(f"model family {fam.key!r}: {sorted(clash)} already declared by {other.key!r}")
    _REGISTRY[fam.key] = fam
    return fam


def unregister_family(key: str) -> None:
    _REGISTRY.pop(key, None)


def families() -> tuple[ModelFamily, ...]:
    """Every declared family, in declaration order."""
    return tuple(_REGISTRY.values())


def family_of_architecture(name: str) -> ModelFamily | None:
    return next((f for f in _REGISTRY.values() if name in f.architectures), None)


def family_of_model_type(model_type: str) -> ModelFamily | None:
    mt = model_type.lower()
    return next((f for f in _REGISTRY.values() if mt and mt in f.model_types), None)


def family_of(config: Mapping[str, Any]) -> ModelFamily | None:
    """The family of a config.json: by its first architecture, else by its model_type."""
    archs = config.get("architectures")
    if isinstance(archs, list) and archs and isinstance(archs[0], str):
        fam = family_of_architecture(archs[0])
        if fam is not None:
            return fam
    mt = config.get("model_type")
    return family_of_model_type(mt) if isinstance(mt, str) else None


def supported_architectures() -> dict[str, str]:
    """architecture name -> family key, for every family HexStudio's export handles."""
    return {a: f.key for f in _REGISTRY.values() if f.exported for a in f.architectures}


def normalized_config(config: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of `config` in our names: the family's renamed keys copied under ours, its defaults where the
    config says nothing. Unchanged for a config of no family."""
    out = dict(config)
    fam = family_of(config)
    if fam is None:
        return out
    for ours, theirs in fam.keys.renamed():
        if ours not in out and theirs in out:
            out[ours] = out[theirs]
    out.setdefault("tie_word_embeddings", fam.tie_word_embeddings)
    return out


LLAMA = register_family(
    ModelFamily(
        key="llama",
        title="Llama",
        architectures=("LlamaForCausalLM",),
        model_types=("llama",),
        chat_template_fallback="llama3",
        tool_calls=ToolCalls("llama3", ("llama-3", "llama3")),
        geniex_prefix="llama_v3_",
    )
)
QWEN2 = register_family(
    ModelFamily(
        key="qwen2",
        title="Qwen 2",
        architectures=("Qwen2ForCausalLM",),
        model_types=("qwen2",),
        qkv_bias=True,
        tool_calls=ToolCalls("qwen", ("qwen",)),
        geniex_prefix="qwen2_5_",
    )
)
QWEN3 = register_family(
    ModelFamily(
        key="qwen3",
        title="Qwen 3",
        architectures=("Qwen3ForCausalLM",),
        model_types=("qwen3",),
        qk_norm=True,
        tool_calls=ToolCalls("qwen", ("qwen",)),
        geniex_prefix="qwen3_",
    )
)
MISTRAL = register_family(
    ModelFamily(
        key="mistral",
        title="Mistral",
        architectures=("MistralForCausalLM",),
        model_types=("mistral",),
        tool_calls=ToolCalls("mistral", ("mistral",)),
    )
)
# GenieX runs Phi 3.5 bundles; HexStudio's export does not make them (fused qkv_proj and gate_up_proj)
PHI3 = register_family(
    ModelFamily(
        key="phi3",
        title="Phi 3",
        architectures=("Phi3ForCausalLM",),
        model_types=("phi3",),
        exported=False,
        geniex_prefix="phi_3_5_",
    )
)
