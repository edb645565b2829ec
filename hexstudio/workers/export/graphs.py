"""Static-shape ONNX graphs for one part of a Llama-family decoder, as the board runs it."""

from __future__ import annotations

import gc
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from hexstudio.shared.bundle import part_label
from hexstudio.shared.modelinfo import layer_ranges
from hexstudio.workers.export.segments import Dims, embed_module, head_module, layer_module
from hexstudio.workers.export.stitch import PartGraphWriter, SharedData
from hexstudio.workers.export.weights import CheckpointWeights, InMemoryWeights, StreamedWeight

MASK_VALUE = -1000.0  # additive mask; Qualcomm's -100 did not mask on larger models (facts/quantization.md)
OPSET = 17


ROPE_INPUTS = ("position_ids_cos", "position_ids_sin")


def graph_name(kind: str, ar: int, context_length: int, part: int, parts: int) -> str:
    """`{prompt|token}_ar{AR}_cl{CL}_{i}_of_{n}`: Genie reads AR and CL from it (qai-hub-models' names)."""
    prefix = "prompt" if kind == "prompt_processor" else "token"
    return f"{prefix}_ar{ar}_cl{context_length}_{part_label(part, parts)}"


def boundary_name(layer: int) -> str:
    """The hidden state leaving decoder layer `layer`, where a part ends: one name in the part that writes it
    and the part that reads it (Genie chains parts by tensor name). qai-hub-models' name for the same
    tensor (its layer's second residual add), as QNN spells it."""
    return f"_model_model_layers_{layer}_Add_1_output_0"


def graph_io_names(part: int, parts: int, layers: range) -> tuple[list[str], list[str]]:
    """A part's input and output names in Genie's order (docs/CONTRACTS.md §2)."""
    inputs = ["input_ids" if part == 1 else boundary_name(layers.start - 1), "attention_mask", *ROPE_INPUTS]
    outputs = ["logits" if part == parts else boundary_name(layers.stop - 1)]
    for li in layers:
        inputs += [f"past_key_{li}_in", f"past_value_{li}_in"]
        outputs += [f"past_key_{li}_out", f"past_value_{li}_out"]
    return inputs, outputs


def load_hf_model(hf_dir: str | Path) -> Any:
    """The whole model in fp32 (tests and small models only: the quantize stage loads one part at a
    piece at a time from the checkpoint: export_deployment_graphs)."""
    import torch
    from transformers import AutoModelForCausalLM

    from hexstudio.workers.compat import dtype_kwargs

    model = AutoModelForCausalLM.from_pretrained(str(hf_dir), **dtype_kwargs(torch.float32))
    model.eval()
    return model


PartHook = Callable[[list[dict[str, Any]], list[str]], None]


def export_deployment_graphs(
    hf_dir: str | Path | None,
    out_dir: str | Path,
    context_length: int,
    ar_n: int,
    parts: int,
    model: Any = None,
    kinds: tuple[str, ...] = ("prompt_processor", "token_generator"),
    seq_lens: dict[str, int] | None = None,
    after_part: PartHook | None = None,
    extra_context_lengths: tuple[int, ...] = (),
    extra_ar_sizes: tuple[int, ...] = (),
) -> list[dict[str, Any]]:
    """Export float ONNX graphs for every part and kind into out_dir/<graph>.onnx (weights named by
    checkpoint name, in ONE data file per part, the first kind's `<graph>.onnx.data`, which the part's
    other graph references too: entry key `float_data`); returns the quantize.json "graphs" entries
    (paths relative to out_dir's parent), prompt processors first.

    Piece by piece (hexstudio.workers.export.segments): the rotary prologue with the embedding, each decoder
    layer, the head; each piece is exported for every kind, stitched into the part's graphs and its
    weights dropped before the next is read. Without `model`, a piece's weights are read from
    hf_dir's safetensors just before its export, so memory holds one decoder layer's (or the
    embedding's, or the head's) fp32 weights. `after_part(entries, names)` is called after each
    part with its graph entries and the checkpoint names of the weights it read.

    `extra_context_lengths`: more context lengths to export every kind at (Genie switches between a bundle's CL
    variants as a dialog grows): their entries carry "context_length" and "variant_of" (the graph at
    `context_length` whose encodings they take), share the part's data file, and come after the main ones.
    `extra_ar_sizes`: more prompt-processor lengths (AR) to export at every context length (Genie runs the
    smallest AR that holds a call, e.g. spd's draft_len+1 verification tokens): their entries carry "variant_of"
    too (the main prompt processor), and "context_length" when not the main one."""
    import tempfile

    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    if model is not None:
        src: InMemoryWeights | CheckpointWeights = InMemoryWeights(model)
    elif hf_dir is None:
        raise ValueError("export_deployment_graphs needs hf_dir or model")
    else:
        src = CheckpointWeights(hf_dir)
    cfg = src.config
    dims = Dims.of(cfg)
    inner = src.model.model
    seq = {kind: (seq_lens or {}).get(kind, ar_n if kind == "prompt_processor" else 1) for kind in kinds}
    cls = [context_length, *sorted({int(c) for c in extra_context_lengths} - {context_length})]
    # one writer per (kind, AR, CL) variant; the main CL's keys are the kinds themselves
    variants: dict[str, tuple[str, int, int]] = {
        (kind if cl == context_length else f"{kind}@cl{cl}"): (kind, seq[kind], cl)
        for cl in cls
        for kind in kinds
    }
    if "prompt_processor" in kinds:
        for ar in sorted({int(a) for a in extra_ar_sizes} - {seq["prompt_processor"], 1}):
            for cl in cls:
                key = f"prompt_processor@ar{ar}" + ("" if cl == context_length else f"@cl{cl}")
                variants[key] = ("prompt_processor", ar, cl)
    graphs: list[dict[str, Any]] = []
    tmp = Path(tempfile.mkdtemp(prefix=".pieces-", dir=out))
    try:
        for k, (start, stop) in enumerate(layer_ranges(cfg.num_hidden_layers, parts), start=1):
            first, last = k == 1, k == parts
            names = {key: graph_name(kind, ar, cl, k, parts) for key, (kind, ar, cl) in variants.items()}
            ins, outs = graph_io_names(k, parts, range(start, stop))
            # one data file per part (the first kind's `<graph>.onnx.data`): every graph references the same weights
            shared = SharedData(out / f"{names[kinds[0]]}.onnx.data")
            writers = {
                key: PartGraphWriter(out / f"{names[key]}.onnx", ins, outs, shared) for key in variants
            }
            shapes = {key: (ar, cl) for key, (kind, ar, cl) in variants.items()}
            pieces = _Pieces(src, writers, shapes, dims, tmp)
            try:
                read = pieces.part(inner, src.model, start, stop, first, last)
                for w in writers.values():
                    w.save()
            except BaseException:
                for w in writers.values():
                    w.abort()
                raise
            entries = [
                {
                    "name": names[key],
                    "kind": kind,
                    "part": k,
                    "seq_len": ar,
                    "layers": list(range(start, stop)),
                    "float_onnx": f"{out.name}/{names[key]}.onnx",
                    "float_data": f"{out.name}/{shared.name}",
                    "inputs": ins,
                    "outputs": outs,
                    **({} if cl == context_length else {"context_length": cl}),
                    **({} if key == kind else {"variant_of": names[kind]}),
                }
                for key, (kind, ar, cl) in variants.items()
            ]
            if after_part is not None:
                after_part(entries, read)
            graphs.extend(entries)
            gc.collect()
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    order = {kind: i for i, kind in enumerate(kinds)}
    graphs.sort(
        key=lambda g: (
            "variant_of" in g,
            g.get("context_length", 0),
            order[g["kind"]],
            g["seq_len"],
            g["part"],
        )
    )
    return graphs


class _Pieces:
    """Exports one part's pieces for every kind and hands them to the part's writers."""

    def __init__(
        self,
        src: InMemoryWeights | CheckpointWeights,
        writers: dict[str, PartGraphWriter],
        shapes: dict[str, tuple[int, int]],
        dims: Dims,
        tmp: Path,
    ) -> None:
        """`shapes`: per writer, the (sequence length, context length) its graph is exported at."""
        self.src, self.writers, self.shapes, self.dims, self.tmp = src, writers, shapes, dims, tmp

    def part(self, inner: Any, causal_lm: Any, start: int, stop: int, first: bool, last: bool) -> list[str]:
        import torch

        d = self.dims
        read: list[str] = []
        if first:
            h = "/embed/hidden"
            read += self.piece(
                "/embed",
                embed_module(inner.embed_tokens),
                [("embed", "model.embed_tokens.")],
                lambda s, cl: (torch.zeros((1, s), dtype=torch.int32),),
                ["input_ids"],
                ["hidden"],
                {"input_ids": "input_ids", "hidden": h},
            )
        else:
            h = boundary_name(start - 1)
        for i in range(start, stop):
            block = layer_module(inner.layers[i], d)

            def layer_args(s: int, cl: int) -> tuple[Any, ...]:
                return (
                    torch.zeros((1, s, d.hidden)),
                    torch.zeros((1, 1, s, cl)),
                    torch.zeros((1, 1, s, d.head_dim // 2)),
                    torch.zeros((1, 1, s, d.head_dim // 2)),
                    torch.zeros((d.kv_heads, 1, d.head_dim, cl - s)),
                    torch.zeros((d.kv_heads, 1, cl - s, d.head_dim)),
                )

            h_out = boundary_name(i) if i == stop - 1 and not last else f"/layers.{i}/hidden"
            read += self.piece(
                f"/layers.{i}",
                block,
                [("layer", f"model.layers.{i}.")],
                layer_args,
                ["hidden", "attention_mask", "cos", "sin", "past_key", "past_value"],
                ["hidden_out", "key", "value"],
                {
                    "hidden": h,
                    "attention_mask": "attention_mask",
                    "cos": "position_ids_cos",
                    "sin": "position_ids_sin",
                    "past_key": f"past_key_{i}_in",
                    "past_value": f"past_value_{i}_in",
                    "hidden_out": h_out,
                    "key": f"past_key_{i}_out",
                    "value": f"past_value_{i}_out",
                },
            )
            h = h_out
        if last:
            head = head_module(inner.norm, causal_lm.lm_head)
            read += self.piece(
                "/head",
                head,
                [("norm", "model.norm."), ("lm_head", "lm_head.")],
                lambda s, cl: (torch.zeros((1, s, d.hidden)),),
                ["hidden"],
                ["logits"],
                {"hidden": h, "logits": "logits"},
                vocab_output="logits",
            )
        return read

    def piece(
        self,
        prefix: str,
        root: Any,
        owned: list[tuple[str, str]],
        args: Callable[[int, int], tuple[Any, ...]],
        in_names: list[str],
        out_names: list[str],
        io: dict[str, str],
        vocab_output: str | None = None,
    ) -> list[str]:
        """Export `root` for every kind and stitch it in; `owned`: (attribute of root, checkpoint
        prefix) of the modules whose weights this piece reads (and frees afterwards). The embedding
        table and the lm_head, read from a checkpoint, are exported with a placeholder of a few rows
        and streamed into the part's data file by the stitcher (never held whole); `vocab_output`:
        the part tensor whose last axis is then the vocabulary."""
        import torch

        read: list[str] = []
        streamed: dict[str, StreamedWeight] = {}
        widened: dict[str, int] = {}
        padding: list[tuple[Any, Any]] = []
        try:
            direct: dict[str, str] = {}
            params: dict[str, Any] = {}
            for attr, ckpt in owned:
                sub = getattr(root, attr)
                sw = (
                    self.src.stand_in(sub, ckpt)
                    if isinstance(self.src, CheckpointWeights) and attr in ("embed", "lm_head")
                    else None
                )
                if sw is None:
                    read += self.src.load(sub, ckpt)
                else:
                    streamed[sw.name] = sw
                    read.append(sw.name)
                    if vocab_output is not None:
                        widened[io[vocab_output]] = sw.rows
                    if getattr(sub, "padding_idx", None) is not None:  # must index the placeholder
                        padding.append((sub, sub.padding_idx))
                        sub.padding_idx = None
                for local, p in sub.named_parameters(remove_duplicate=False):
                    direct[f"{attr}.{local}"] = ckpt + local
                    params[ckpt + local] = p.detach().numpy()
            for key, writer in self.writers.items():
                path = self.tmp / f"{prefix.strip('/')}.{key}.onnx"
                with torch.no_grad():
                    torch.onnx.export(
                        root,
                        args(*self.shapes[key]),
                        str(path),
                        input_names=in_names,
                        output_names=out_names,
                        opset_version=OPSET,
                        dynamo=False,
                        do_constant_folding=True,
                    )
                writer.add(path, prefix, io, direct, params, streamed, widened)
                for f in self.tmp.iterdir():
                    f.unlink()
            del params
        finally:
            for sub, idx in padding:
                sub.padding_idx = idx
            for attr, _ in owned:
                self.src.release(getattr(root, attr))
            gc.collect()
        return read
