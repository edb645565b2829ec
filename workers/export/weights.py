"""Where an export reads its weights: a checkpoint folder read one module at a time (a meta-device
skeleton whose modules are filled from the safetensors files just before their piece is exported
and emptied right after), or a model already in memory (tests, small models)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any


def safetensors_index(hf_dir: str | Path) -> dict[str, Path]:
    """Tensor name -> the safetensors file holding it (reads only the files' headers)."""
    from safetensors import safe_open

    d = Path(hf_dir)
    idx = d / "model.safetensors.index.json"
    if idx.is_file():
        wm = json.loads(idx.read_text(encoding="utf-8")).get("weight_map") or {}
        return {str(k): d / str(v) for k, v in wm.items()}
    out: dict[str, Path] = {}
    for f in sorted(d.glob("*.safetensors")):
        with safe_open(str(f), framework="pt") as sf:
            for k in sf.keys():  # noqa: SIM118 (safe_open is not a dict)
                out[k] = f
    if not out:
        raise OSError(f"no *.safetensors files in {d}")
    return out


class InMemoryWeights:
    """The model is loaded already: nothing to read or free."""

    def __init__(self, model: Any) -> None:
        self.model = model
        self.config = model.config

    def load(self, module: Any, prefix: str) -> list[str]:
        return [prefix + n for n, _ in module.named_parameters()]

    def release(self, module: Any) -> None:
        return None


class CheckpointWeights:
    """A CausalLM skeleton on the meta device; `load(module, prefix)` materializes one of its modules
    in fp32 from the tensors named `prefix + parameter name`, `release(module)` returns it to meta.
    Memory: the module being exported, not the model."""

    def __init__(self, hf_dir: str | Path) -> None:
        import torch
        from transformers import AutoConfig, AutoModelForCausalLM

        self.hf_dir = Path(hf_dir)
        self.config = AutoConfig.from_pretrained(str(hf_dir))
        with torch.device("meta"):
            self.model = AutoModelForCausalLM.from_config(self.config, dtype=torch.float32)
        self.model.eval()
        self.index = safetensors_index(hf_dir)
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))

    def _key(self, name: str) -> str | None:
        for cand in (name, name[len("model."):] if name.startswith("model.") else f"model.{name}"):
            if cand in self.index:
                return cand
        if name == "lm_head.weight" and self.tied:   # the head shares the embedding's tensor
            return self._key("model.embed_tokens.weight")
        return None

    def load(self, module: Any, prefix: str) -> list[str]:
        import torch
        from safetensors import safe_open

        names = {local: prefix + local for local, _ in module.named_parameters()}
        keys = {local: self._key(full) for local, full in names.items()}
        missing = [names[k] for k, v in keys.items() if v is None]
        if missing:
            raise OSError(f"{self.hf_dir}: the safetensors files lack {len(missing)} tensors of {prefix.rstrip('.')} "
                          f"(e.g. {missing[0]})")
        by_file: dict[Path, list[str]] = {}
        for local, key in keys.items():
            assert key is not None
            by_file.setdefault(self.index[key], []).append(local)
        state: dict[str, Any] = {}
        for f, locals_ in by_file.items():
            with safe_open(str(f), framework="pt") as sf:
                for local in locals_:
                    t = sf.get_tensor(str(keys[local]))
                    state[local] = t.to(torch.float32)
                    del t
        module.load_state_dict(state, strict=True, assign=True)
        return list(names.values())

    def release(self, module: Any) -> None:
        module.to("meta")
