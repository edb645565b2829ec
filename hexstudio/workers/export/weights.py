"""Where an export reads its weights: a checkpoint folder read one module at a time (a meta-device
skeleton whose modules are filled from the safetensors files just before their piece is exported
and emptied right after), or a model already in memory (tests, small models)."""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

STAND_IN_ROWS = 8  # rows of the placeholder a vocabulary-sized weight is exported with
BLOCK_BYTES = 16 << 20  # fp32 bytes of one block of a streamed weight


@dataclass(frozen=True)
class StreamedWeight:
    """A vocabulary-sized 2-D checkpoint tensor (embedding table, lm_head) that is never materialized:
    its piece is exported with a `stand_in_rows`-row placeholder and the stitcher writes the real
    tensor into the part's data file from `blocks()` (fp32 blocks of rows, in order)."""

    name: str
    rows: int
    cols: int
    stand_in_rows: int
    blocks: Callable[[], Iterator[np.ndarray]]


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
            from hexstudio.workers.compat import dtype_kwargs

            self.model = AutoModelForCausalLM.from_config(self.config, **dtype_kwargs(torch.float32))
        self.model.eval()
        self.index = safetensors_index(hf_dir)
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))

    def _key(self, name: str) -> str | None:
        for cand in (name, name[len("model.") :] if name.startswith("model.") else f"model.{name}"):
            if cand in self.index:
                return cand
        if name == "lm_head.weight" and self.tied:  # the head shares the embedding's tensor
            return self._key("model.embed_tokens.weight")
        return None

    def load(self, module: Any, prefix: str) -> list[str]:
        import torch
        from safetensors import safe_open

        names = {local: prefix + local for local, _ in module.named_parameters()}
        keys = {local: self._key(full) for local, full in names.items()}
        missing = [names[k] for k, v in keys.items() if v is None]
        if missing:
            raise OSError(
                f"{self.hf_dir}: the safetensors files lack {len(missing)} tensors of {prefix.rstrip('.')} "
                f"(e.g. {missing[0]})"
            )
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

    def stand_in(self, module: Any, prefix: str) -> StreamedWeight | None:
        """Give `module` (an Embedding or a bias-free Linear over the vocabulary) a small random
        placeholder weight and return how to stream the real one; None when the module has other
        parameters (then `load` it)."""
        import torch
        from safetensors import safe_open

        params = [n for n, _ in module.named_parameters()]
        if params != ["weight"]:
            return None
        name = prefix + "weight"
        key = self._key(name)
        if key is None:
            raise OSError(f"{self.hf_dir}: the safetensors files lack {name}")
        path = self.index[key]
        with safe_open(str(path), framework="pt") as sf:
            shape = list(sf.get_slice(key).get_shape())
        if len(shape) != 2:
            return None
        rows, cols = int(shape[0]), int(shape[1])
        gen = torch.Generator().manual_seed(len(name) * 7919 + rows)
        module.weight = torch.nn.Parameter(
            torch.randn(STAND_IN_ROWS, cols, generator=gen), requires_grad=False
        )

        def blocks() -> Iterator[np.ndarray]:
            step = max(1, BLOCK_BYTES // (4 * cols))
            with safe_open(str(path), framework="pt") as sf:
                sl = sf.get_slice(key)
                for r0 in range(0, rows, step):
                    yield sl[r0 : min(rows, r0 + step)].to(torch.float32).numpy()

        return StreamedWeight(name, rows, cols, STAND_IN_ROWS, blocks)

    def release(self, module: Any) -> None:
        module.to("meta")
