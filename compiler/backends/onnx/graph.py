"""A small builder for ONNX graphs: nodes with readable names and spec-line doc strings,
initializers, constants, and the model around them.

Names are paths: `layer3/attn/W_Q` for an initializer, `layer3/attn/head` for the value a
node computes. Every name is made unique once, in the order the lowering asks for it, so
the same spec always gives the same graph, byte for byte.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass, field

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from ...lazy import converted

# "real": the model's precision (a Graph's own `types`: float32 unless --dtype says
# otherwise); "float32": float32 whatever the precision (compiler/lowering/precision.py)
DTYPES = {"real": TensorProto.FLOAT, "float32": TensorProto.FLOAT, "int": TensorProto.INT64,
          "bool": TensorProto.BOOL}
NP = {"real": np.float32, "float32": np.float32, "int": np.int64, "bool": np.bool_}
ORT_DOMAIN = "com.microsoft"
EXTERNAL_MIN = 1024  # smaller initializers stay inside the .onnx file
ALIGN = 4096  # external tensors start on page boundaries, so onnxruntime can map them
PROTOBUF_LIMIT = 2**31 - 1  # one serialized protobuf message


@dataclass
class Node:
    op: str
    inputs: list[str]
    outputs: list[str]
    name: str
    doc: str = ""
    domain: str = ""
    attrs: dict = field(default_factory=dict)


class Joined:
    """Matrices side by side (their last axes joined; vectors end to end), as one
    initializer: joined only when written, part by part into the result, so the parts
    (Lazy checkpoint tensors, compiler/lazy.py) are read then and one at a time."""

    def __init__(self, parts: list):
        self.parts = parts
        self.dtype = np.dtype(parts[0].dtype)
        self.shape = (*parts[0].shape[:-1], sum(p.shape[-1] for p in parts))
        self.nbytes = sum(p.nbytes for p in parts)
        self.ndim, self.size = len(self.shape), self.nbytes // self.dtype.itemsize

    def __array__(self, dtype=None, copy=None) -> np.ndarray:
        out = np.empty(self.shape, self.dtype)
        at = 0
        for part in self.parts:
            width = part.shape[-1]
            out[..., at: at + width] = np.asarray(part)
            at += width
        return out if dtype is None else out.astype(dtype, copy=False)


class Graph:
    def __init__(self, real: int = TensorProto.FLOAT) -> None:
        """`real`: the element type of the graph's real values (its `--dtype`)."""
        self.precision = helper.tensor_dtype_to_np_dtype(real)  # of the stored weights
        # what "real" means for what is added now: the precision, or float32 (`wide`)
        self.types = {**DTYPES, "real": real}
        self.np = {**NP, "real": self.precision}
        self.nodes: list[Node | None] = []  # None: a node a fusion replaced
        # float32 ones are stored in the precision (converted when written), but `exact`'s
        self.initializers: dict[str, np.ndarray | Joined] = {}
        self.exact: set[str] = set()
        self.init_doc: dict[str, str] = {}
        self.value_info: dict[str, tuple[int, list]] = {}  # name -> (elem type, dims)
        self.taken: set[str] = set()
        self.consts: dict[tuple, str] = {}
        self.producer: dict[str, int] = {}  # tensor -> index of the node making it
        self.domains: set[str] = set()
        self.doc = ""  # doc string for nodes added now (the spec line being lowered)

    # -- names
    def fresh(self, base: str) -> str:
        base = base.strip("/") or "v"
        name, k = base, 2
        while name in self.taken:
            name = f"{base}_{k}"
            k += 1
        self.taken.add(name)
        return name

    # -- nodes
    def node(self, op: str, inputs: list[str], name: str, n_out: int = 1, domain: str = "",
             exact: bool = False, **attrs) -> list[str]:
        """Add a node named `name` (made unique unless `exact`: a graph output's name,
        reserved up front); returns its output tensor names."""
        node_name = name if exact else self.fresh(name)
        outs = [node_name] if n_out == 1 else [f"{node_name}:{k}" for k in range(n_out)]
        for o in outs:
            self.taken.add(o)
            self.producer[o] = len(self.nodes)
        if domain:
            self.domains.add(domain)
        self.nodes.append(Node(op, list(inputs), outs, node_name, self.doc, domain,
                               {k: v for k, v in attrs.items() if v is not None}))
        return outs

    def op(self, op: str, inputs: list[str], name: str, domain: str = "", **attrs) -> str:
        return self.node(op, inputs, name, 1, domain, **attrs)[0]

    def producer_of(self, tensor: str) -> Node | None:
        k = self.producer.get(tensor)
        return self.nodes[k] if k is not None else None

    def rename(self, tensor: str, new: str) -> bool:
        """Give a node's output the name `new` (a graph output's, reserved up front), so the
        output needs no Identity copy; False when no node makes `tensor`."""
        k = self.producer.get(tensor)
        if k is None or self.nodes[k] is None:
            return False
        for node in self.nodes:
            if node is not None:
                node.inputs = [new if t == tensor else t for t in node.inputs]
                node.outputs = [new if t == tensor else t for t in node.outputs]
        self.producer[new] = self.producer.pop(tensor)
        if tensor in self.value_info:
            self.value_info[new] = self.value_info.pop(tensor)
        return True

    def replace(self, tensor: str, node: Node) -> None:
        """Put `node` where the producer of `tensor` was (it must compute `tensor` too)."""
        k = self.producer[tensor]
        self.nodes[k] = node
        for o in node.outputs:
            if o:
                self.producer[o] = k
        if node.domain:
            self.domains.add(node.domain)

    def take(self, make, *args) -> tuple[str, list[Node]]:
        """The tensor `make(*args)` returns and the nodes it added, taken out of the graph
        to be put elsewhere (`splice`)."""
        mark = len(self.nodes)
        out = make(*args)
        made = self.nodes[mark:]
        del self.nodes[mark:]
        return out, made

    def splice(self, at: dict[int, list[Node]], renamed: dict[str, str]) -> None:
        """Each list of nodes in place of the node at its index (an empty one drops the
        node), and each tensor of `renamed` read under its new name."""
        nodes: list[Node | None] = []
        for k, n in enumerate(self.nodes):
            nodes.extend(at.get(k, [n]))
        for n in nodes:
            if n is not None:
                n.inputs = [renamed.get(t, t) for t in n.inputs]
        self.nodes = nodes
        self.producer = {o: k for k, n in enumerate(nodes) if n is not None
                         for o in n.outputs if o}
        for old, new in renamed.items():
            if old in self.value_info:
                self.value_info[new] = self.value_info.pop(old)

    # -- initializers and constants
    def initializer(self, name: str, array: np.ndarray, doc: str = "",
                    convert: bool = True) -> str:
        """An array (a parameter, a table), float32 ones stored in the graph's precision
        (converted when written) unless not `convert`."""
        name = self.fresh(name)
        self.initializers[name] = array
        if not convert:
            self.exact.add(name)
        if doc:
            self.init_doc[name] = doc
        return name

    def stored(self, name: str):
        """An initializer as it is written: a float32 one in the graph's precision."""
        arr = self.initializers[name]
        if arr.dtype != np.float32 or name in self.exact or self.precision == np.float32:
            return arr
        return converted(arr, self.precision)

    @contextlib.contextmanager
    def wide(self):
        """Real values (constants, Casts, shapes' types) made meanwhile are float32: a
        half-precision graph computing something in float32 (lowering/precision.py)."""
        saved = self.types["real"], self.np["real"]
        self.types["real"], self.np["real"] = self.types["float32"], self.np["float32"]
        try:
            yield
        finally:
            self.types["real"], self.np["real"] = saved

    def const(self, value, dtype: str, shape: tuple = ()) -> str:
        """A small constant, shared by every use of the same value."""
        arr = np.full(shape, value, dtype=self.np[dtype]) if np.isscalar(value) else \
            np.asarray(value, dtype=self.np[dtype]).reshape(shape)
        key = (dtype, arr.dtype.str, arr.shape, arr.tobytes())
        if key not in self.consts:
            text = repr(value) if np.isscalar(value) else "x".join(map(str, arr.shape))
            self.consts[key] = self.initializer(f"const/{dtype}/{text}", arr, convert=False)
        return self.consts[key]

    def ints(self, values: list[int]) -> str:
        return self.const(list(values), "int", (len(values),))

    def info(self, tensor: str, dtype: str, dims: list) -> None:
        self.value_info[tensor] = (self.types[dtype], list(dims))

    # -- the model
    def model(self, inputs: list[tuple[str, str, list]], outputs: list[tuple[str, str, list]],
              opset: int, name: str, doc: str, metadata: dict[str, str],
              external: str | None = None, stream: bool = False,
              ) -> tuple[onnx.ModelProto, list]:
        """The ModelProto, and with `external` (a file name) the initializers' bytes that go
        to that file instead: [(offset, array)]; the proto then only points at them. With
        `stream`, large initializers are left out of the proto and returned as
        [(TensorProto without data, array)] for `write_model` to append."""
        nodes = [n for n in self.nodes if n is not None]
        used = {i for n in nodes for i in n.inputs}
        protos = []
        for n in nodes:
            p = helper.make_node(n.op, n.inputs, n.outputs, name=n.name, domain=n.domain or None,
                                 **n.attrs)
            if n.doc:
                p.doc_string = n.doc
            protos.append(p)
        inits = []
        blobs: list[tuple[int, np.ndarray]] = []
        offset = 0
        for k in self.initializers:
            if k not in used:
                continue
            arr = self.stored(k)
            if external and arr.nbytes >= EXTERNAL_MIN:
                t = _header(k, arr, self.init_doc.get(k, ""))
                offset = -(-offset // ALIGN) * ALIGN
                t.data_location = TensorProto.EXTERNAL
                for key, value in (("location", external), ("offset", str(offset)),
                                   ("length", str(arr.nbytes))):
                    entry = t.external_data.add()
                    entry.key, entry.value = key, value
                blobs.append((offset, arr))
                offset += arr.nbytes
            elif stream and arr.nbytes >= EXTERNAL_MIN:
                blobs.append((_header(k, arr, self.init_doc.get(k, "")), arr))
                continue
            else:
                t = numpy_helper.from_array(np.asarray(arr), k)
                t.doc_string = self.init_doc.get(k, "")
            inits.append(t)
        graph_inputs = [helper.make_tensor_value_info(n, self.types[d], dims)
                        for n, d, dims in inputs]
        graph_outputs = [helper.make_tensor_value_info(n, self.types[d], dims)
                         for n, d, dims in outputs]
        io = {n for n, _, _ in inputs} | {n for n, _, _ in outputs}
        produced = {o for n in nodes for o in n.outputs}
        infos = [helper.make_tensor_value_info(k, t, dims) for k, (t, dims) in
                 self.value_info.items() if k in produced and k not in io]
        graph = helper.make_graph(protos, name, graph_inputs, graph_outputs, inits,
                                  doc_string=doc, value_info=infos)
        opsets = [helper.make_opsetid("", opset)]
        if ORT_DOMAIN in self.domains:
            opsets.append(helper.make_opsetid(ORT_DOMAIN, 1))
        model = helper.make_model(graph, opset_imports=opsets, producer_name="fgc",
                                  ir_version=ir_version(opset))
        for k, v in sorted(metadata.items()):
            entry = model.metadata_props.add()
            entry.key, entry.value = k, v
        return model, blobs


def ir_version(opset: int) -> int:
    """The oldest IR version that carries this opset: what onnxruntime reads most widely."""
    return helper.find_min_ir_version_for([helper.make_opsetid("", opset)], True)


def _header(name: str, arr: np.ndarray, doc: str) -> TensorProto:
    """A tensor's name, type and shape, without its data."""
    return TensorProto(name=name, dims=arr.shape, doc_string=doc,
                       data_type=helper.np_dtype_to_tensor_dtype(arr.dtype))


def write_data(f, blobs: list) -> None:
    """The external-data file: each array at its offset (Graph.model(external=...))."""
    pos = 0
    for offset, arr in blobs:
        if offset > pos:
            f.write(b"\0" * (offset - pos))
        _write_tensor(f, arr)
        pos = offset + arr.nbytes


def _write_tensor(f, arr) -> None:
    """One initializer's bytes: a Lazy or Joined one is materialized here, written, and
    dropped before the next (what keeps a compile's memory to about one tensor)."""
    data = np.ascontiguousarray(arr)
    if data.nbytes != arr.nbytes:  # the header written before it promised arr.nbytes
        raise ValueError(f"an initializer of {arr.nbytes:,} bytes gave {data.nbytes:,}")
    f.write(memoryview(data).cast("B"))
    del data
    if hasattr(f, "tensor"):  # runtime.progress.ProgressFile counts tensors too
        f.tensor()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte = n & 0x7F
        n >>= 7
        if n:
            out.append(byte | 0x80)
        else:
            out.append(byte)
            return bytes(out)


_GRAPH = 7  # ModelProto.graph
_INITIALIZER = 5  # GraphProto.initializer
_RAW_DATA = 9  # TensorProto.raw_data


def _tag(field: int) -> bytes:
    return _varint(field << 3 | 2)  # length-delimited


def write_model(f, model: onnx.ModelProto, blobs: list) -> None:
    """Serialize `model` with the streamed initializers appended to its graph, writing
    each array's bytes straight from memory: the same protobuf message as if they had been
    in the graph (fields may come in any order), without copying 100s of MB through
    protobuf. `blobs` is what Graph.model(stream=True) returned."""
    graph = model.graph
    head = graph.SerializeToString()
    rest = onnx.ModelProto()
    rest.CopyFrom(model)
    rest.ClearField("graph")
    pieces = []
    total = len(head)
    for t, arr in blobs:
        meta = t.SerializeToString()
        raw = _tag(_RAW_DATA) + _varint(arr.nbytes)
        size = len(meta) + len(raw) + arr.nbytes
        prefix = _tag(_INITIALIZER) + _varint(size) + meta + raw
        pieces.append((prefix, arr))
        total += len(prefix) + arr.nbytes
    f.write(rest.SerializeToString())
    f.write(_tag(_GRAPH) + _varint(total))
    f.write(head)
    for prefix, arr in pieces:
        f.write(prefix)
        _write_tensor(f, arr)
