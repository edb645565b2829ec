"""Join separately exported pieces (hexstudio.workers.export.segments) into one part graph.

Each piece's ONNX is read once; its nodes are renamed into the part's name space (`/layers.3/...`),
its inputs and outputs wired to the part's tensors, and its weights appended to the part's
`<graph>.onnx.data` one tensor at a time, so the part graph never holds its weights in memory.
Weights get their checkpoint names (`model.layers.3.self_attn.q_proj.weight`): directly where the
exporter kept the parameter's name, by content (also transposed: the exporter folds Linear's
transpose into the weight) where it made an anonymous constant of it. Both graphs of a part thus
name each weight the same way, which is what lets their encodings be shared.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path
from typing import Any

import numpy as np

from hexstudio.shared.errors import ActionableError
from hexstudio.workers.export.weights import StreamedWeight

INLINE_BYTES = 1024  # smaller initializers stay in the .onnx (as onnx.save's size_threshold)


class StitchError(ActionableError, ValueError):
    pass


def _digest(a: np.ndarray) -> str:
    return hashlib.sha1(str(a.shape).encode() + np.ascontiguousarray(a).tobytes()).hexdigest()


def checkpoint_names(
    initializers: list[Any], direct: dict[str, str], params: dict[str, np.ndarray]
) -> dict[str, str]:
    """Exporter initializer name -> checkpoint name for the initializers that are parameters."""
    import onnx
    from onnx import numpy_helper

    out = {i.name: direct[i.name] for i in initializers if i.name in direct}
    taken = set(out.values())
    left = [
        i
        for i in initializers
        if i.name not in out and i.data_type == onnx.TensorProto.FLOAT and int(np.prod(list(i.dims))) >= 16
    ]
    if not left:
        return out
    index: dict[str, str] = {}
    for name, arr in params.items():
        if name in taken:
            continue
        a = np.asarray(arr, dtype=np.float32)
        index.setdefault(_digest(a), name)
        if a.ndim == 2:
            index.setdefault(_digest(a.T), name)
    for init in left:
        target = index.get(_digest(numpy_helper.to_array(init)))
        if target is not None and target not in taken:
            out[init.name] = target
            taken.add(target)
    return out


class SharedData:
    """One external-data file that several part graphs (the prompt processor and token generator of a
    part) write their weights into: a weight already written under the same name with the same bytes
    (or, for a streamed vocabulary weight, the same shape) is referenced again, not written twice, so
    the part's weights are stored once on disk. The file is removed if any writer aborts."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path
        self.name = path.name
        self.fh = open(path, "wb")  # noqa: SIM115 (closed in release/abort)
        self.offset = 0
        self.index: dict[tuple[str, str], tuple[int, int]] = {}
        self.users = 0

    def find(self, name: str, key: str) -> tuple[int, int] | None:
        return self.index.get((name, key))

    def release(self) -> None:
        self.users -= 1
        if self.users <= 0 and not self.fh.closed:
            self.fh.close()

    def abort(self) -> None:
        if not self.fh.closed:
            self.fh.close()
        self.path.unlink(missing_ok=True)


class PartGraphWriter:
    """One part graph (one kind) assembled from pieces; `add` each piece in order, then `save`.
    `shared`: the part's data file, shared with its other graph (else `<graph>.onnx.data` of its own)."""

    def __init__(
        self, path: Path, inputs: list[str], outputs: list[str], shared: SharedData | None = None
    ) -> None:
        self.path = path
        self.inputs, self.outputs = inputs, outputs
        self._in_info: dict[str, Any] = {}
        self._out_info: dict[str, Any] = {}
        self._nodes: list[Any] = []
        self._inits: list[Any] = []
        self._value_info: list[Any] = []
        self._names: set[str] = set()
        self._opset: list[Any] = []
        self._ir = 0
        path.parent.mkdir(parents=True, exist_ok=True)
        self.shared = shared if shared is not None else SharedData(path.parent / (path.name + ".data"))
        if self.shared.path.parent != path.parent:
            raise ValueError("a graph's external data must be beside it")
        self.shared.users += 1
        self.data_name = self.shared.name
        self._data = self.shared.fh

    def add(
        self,
        piece: Path,
        prefix: str,
        io: dict[str, str],
        direct: dict[str, str],
        params: dict[str, np.ndarray],
        streamed: dict[str, StreamedWeight] | None = None,
        widened: dict[str, int] | None = None,
    ) -> list[str]:
        """Append the exported piece at `piece`. io: the piece's input/output names -> the part's
        tensor names; direct/params: for checkpoint naming (see checkpoint_names). `streamed`:
        checkpoint name -> the real tensor of a weight the piece was exported with a placeholder of
        (written block by block in its place); `widened`: part tensor name -> the size of its last axis
        once the placeholder is replaced (the logits: the vocabulary). Returns the checkpoint names of
        the weights it added."""
        import onnx

        seg = onnx.load(str(piece))
        g = seg.graph
        if not self._opset:
            self._opset = [
                onnx.OperatorSetIdProto(domain=o.domain, version=o.version) for o in seg.opset_import
            ]
            self._ir = seg.ir_version
        init_names = {i.name for i in g.initializer}
        rename: dict[str, str] = {}
        for vi in [*(i for i in g.input if i.name not in init_names), *g.output]:
            if vi.name not in io:
                raise StitchError(
                    f"{piece.name}: the exported piece has an input/output {vi.name!r} the part does not wire"
                )
            rename[vi.name] = io[vi.name]
        canon = checkpoint_names(list(g.initializer), direct, params)

        def local(n: str) -> str:
            if not n:
                return n
            if n in rename:
                return rename[n]
            if n in canon:
                return canon[n]
            return f"{prefix}{n}" if n.startswith("/") else f"{prefix}/{n}"

        for vi in g.input:
            if vi.name in rename and rename[vi.name] in self.inputs and rename[vi.name] not in self._in_info:
                self._in_info[rename[vi.name]] = self._renamed_info(vi, rename[vi.name])
        for vi in g.output:
            if rename[vi.name] in self.outputs:
                info = self._renamed_info(vi, rename[vi.name])
                if widened and info.name in widened:
                    info.type.tensor_type.shape.dim[-1].dim_value = widened[info.name]
                self._out_info[rename[vi.name]] = info
        for node in g.node:
            if any(a.type in (onnx.AttributeProto.GRAPH, onnx.AttributeProto.GRAPHS) for a in node.attribute):
                raise StitchError(f"{piece.name}: node {node.name} has a sub-graph; pieces must be flat")
            n = onnx.NodeProto()
            n.CopyFrom(node)  # a copy: a kept sub-message would keep the whole piece (its weights) alive
            n.name = local(node.name) if node.name else ""
            n.input[:] = [local(x) for x in node.input]
            n.output[:] = [local(x) for x in node.output]
            self._nodes.append(n)
        for vi in g.value_info:
            info = self._renamed_info(vi, local(vi.name))
            if widened and info.name in widened:
                info.type.tensor_type.shape.dim[-1].dim_value = widened[info.name]
            self._value_info.append(info)
        added: list[str] = []
        for init in g.initializer:
            name = local(init.name)
            if name in self._names:
                raise StitchError(f"{piece.name}: weight {name} is already in {self.path.name}")
            self._names.add(name)
            if streamed and name in streamed:
                self._inits.append(self._write_streamed(init, streamed[name], piece.name))
            else:
                self._inits.append(self._externalize(init, name))
            if init.name in canon:
                added.append(name)
        del seg, g
        return added

    @staticmethod
    def _renamed_info(vi: Any, name: str) -> Any:
        import onnx

        out = onnx.ValueInfoProto()
        out.CopyFrom(vi)
        out.name = name
        return out

    def _externalize(self, init: Any, name: str) -> Any:
        """The initializer under `name`: small ones inline, the others as a reference into the part's
        data file. A fresh message gets only the metadata: protobuf keeps a message's bytes in an
        arena that clearing a field does not shrink, so copying the weight in would keep it alive."""
        import onnx
        from onnx import numpy_helper

        if not init.HasField("raw_data"):
            init = numpy_helper.from_array(numpy_helper.to_array(init), init.name)
        raw = init.raw_data
        t = onnx.TensorProto()
        if len(raw) < INLINE_BYTES:
            t.CopyFrom(init)
            t.name = name
            return t
        key = hashlib.sha1(raw).hexdigest()
        hit = self.shared.find(name, key)
        if hit is not None:
            return self._reference(name, init.data_type, [int(d) for d in init.dims], hit[1], at=hit[0])
        self.shared.index[(name, key)] = (self.shared.offset, len(raw))
        self._data.write(raw)
        return self._reference(name, init.data_type, [int(d) for d in init.dims], len(raw))

    def _reference(
        self, name: str, data_type: int, dims: list[int], nbytes: int, at: int | None = None
    ) -> Any:
        """A tensor of the part's data file: the `nbytes` just written at the current offset (or, `at`,
        bytes written earlier for the part's other graph)."""
        import onnx

        t = onnx.TensorProto(name=name, data_type=data_type, dims=dims)
        t.data_location = onnx.TensorProto.EXTERNAL
        for k, v in (
            ("location", self.data_name),
            ("offset", str(self.shared.offset if at is None else at)),
            ("length", str(nbytes)),
        ):
            e = t.external_data.add()
            e.key, e.value = k, v
        if at is None:
            self.shared.offset += nbytes
        return t

    def _write_streamed(self, init: Any, sw: StreamedWeight, piece: str) -> Any:
        """The real tensor of a placeholder weight, written a block of rows at a time: as is where the
        exporter kept the checkpoint's layout (an embedding table), transposed where it folded a
        Linear's transpose into the weight (the lm_head: [hidden, vocab]; each block's columns go to
        their place in every row)."""
        import onnx

        dims = [int(d) for d in init.dims]
        if init.data_type != onnx.TensorProto.FLOAT or dims not in (
            [sw.stand_in_rows, sw.cols],
            [sw.cols, sw.stand_in_rows],
        ):
            raise StitchError(f"{piece}: the placeholder of {sw.name} came out as {dims}")
        transposed = dims == [sw.cols, sw.stand_in_rows]
        total = 4 * sw.rows * sw.cols
        out_dims = [sw.cols, sw.rows] if transposed else [sw.rows, sw.cols]
        key = f"streamed:{out_dims}"
        hit = self.shared.find(sw.name, key)
        if hit is not None:  # the part's other graph streamed it already
            return self._reference(sw.name, onnx.TensorProto.FLOAT, out_dims, hit[1], at=hit[0])
        self.shared.index[(sw.name, key)] = (self.shared.offset, total)
        self._data.flush()
        base, done = self.shared.offset, 0
        fd = self._data.fileno()
        if transposed:
            os.ftruncate(fd, base + total)
        for block in sw.blocks():
            b = np.ascontiguousarray(block, dtype=np.float32)
            if b.ndim != 2 or b.shape[1] != sw.cols or done + b.shape[0] > sw.rows:
                raise StitchError(
                    f"{sw.name}: a block of shape {b.shape} does not fit [{sw.rows}, {sw.cols}]"
                )
            if transposed:
                bt = np.ascontiguousarray(b.T)
                for h in range(sw.cols):
                    os.pwrite(fd, memoryview(bt[h]), base + 4 * (h * sw.rows + done))
                del bt
            else:
                os.pwrite(fd, memoryview(b), base + 4 * done * sw.cols)
            done += b.shape[0]
            del b
        if done != sw.rows:
            raise StitchError(f"{sw.name}: streamed {done} of {sw.rows} rows")
        self._data.seek(base + total)
        return self._reference(sw.name, onnx.TensorProto.FLOAT, out_dims, total)

    def save(self) -> None:
        import onnx

        self._data.flush()
        self.shared.release()
        missing = [n for n in self.inputs if n not in self._in_info] + [
            n for n in self.outputs if n not in self._out_info
        ]
        if missing:
            self.abort()
            raise StitchError(f"{self.path.name}: no piece provides {', '.join(missing)}")
        graph = onnx.helper.make_graph(
            self._nodes,
            self.path.stem,
            [self._in_info[n] for n in self.inputs],
            [self._out_info[n] for n in self.outputs],
            self._inits,
            value_info=self._value_info,
        )
        model = onnx.helper.make_model(graph, opset_imports=self._opset, producer_name="hexstudio")
        model.ir_version = self._ir
        tmp = self.path.with_name(self.path.name + ".tmp")
        onnx.save(model, str(tmp))
        tmp.replace(self.path)

    def abort(self) -> None:
        """Remove what this writer and its part wrote: the shared data file, and this graph even when it was saved
        already (it would point at the removed data)."""
        self.shared.abort()
        self.path.with_name(self.path.name + ".tmp").unlink(missing_ok=True)
        self.path.unlink(missing_ok=True)
