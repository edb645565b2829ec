"""Differences between the ML stacks HexStudio runs on, found by looking at what the installed packages
offer (never by their version strings): the validated recipe (hexstudio/shared/data/recipes/validated.txt: aimet-onnx
2.26, onnx 1.18, transformers 4.45) and the current one (hexstudio/shared/data/recipes/current.txt).

Light: imports torch/transformers/onnx only inside the functions that need them.

- transformers: `from_config`/`from_pretrained` take `dtype=` since the rename of `torch_dtype` (4.56);
  older releases ignore an unknown `dtype` silently on from_config and fail on from_pretrained.
- onnx: the version converter of some releases (1.18) drops the external-data references of the
  initializers it copies, so onnxruntime then reads empty tensors: `convert_version` puts them back.
- aimet-onnx: hexstudio/workers/quant/aimet_compat.py.
"""

from __future__ import annotations

from functools import lru_cache
from typing import Any


@lru_cache(maxsize=1)
def transformers_takes_dtype() -> bool:
    """Whether this transformers names the weights' dtype `dtype` (else `torch_dtype`): its configs carry
    a `dtype` attribute since the rename."""
    import transformers

    cfg = transformers.PretrainedConfig()
    return "dtype" in vars(cfg) or isinstance(getattr(type(cfg), "dtype", None), property)


def dtype_kwargs(dtype: Any) -> dict[str, Any]:
    """`{"dtype": dtype}` or `{"torch_dtype": dtype}`, whichever this transformers reads."""
    return {"dtype": dtype} if transformers_takes_dtype() else {"torch_dtype": dtype}


def convert_version(model: Any, version: int) -> Any:
    """onnx.version_converter.convert_version that keeps every initializer's external-data reference
    (location/offset/length) as it was: onnx 1.18's converter drops them, leaving tensors with no data."""
    from onnx import TensorProto, version_converter

    refs = {
        i.name: [(e.key, e.value) for e in i.external_data]
        for i in model.graph.initializer
        if i.data_location == TensorProto.EXTERNAL
    }
    out = version_converter.convert_version(model, version)
    for init in out.graph.initializer:
        ref = refs.get(init.name)
        if ref is None:
            continue
        if init.data_location != TensorProto.EXTERNAL or not any(
            e.key == "location" for e in init.external_data
        ):
            del init.external_data[:]
            for key, value in ref:
                entry = init.external_data.add()
                entry.key, entry.value = key, value
            init.data_location = TensorProto.EXTERNAL
    return out
