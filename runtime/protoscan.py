"""What the runtime needs from an .onnx file, read from protobuf's wire format without
decoding the weights.

`onnx.load` decodes every initializer, which for GPT-2 small means copying half a gigabyte
before onnxruntime parses the same bytes again. The runtime only needs the model's metadata
and the external-data references of its tensors, so this walks the message structure over a
memory map, skipping every payload by its length. Field numbers are those of onnx.proto3.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass, field
from pathlib import Path

# ModelProto
MODEL_IR_VERSION, MODEL_OPSET_IMPORT, MODEL_GRAPH, MODEL_METADATA, MODEL_FUNCTIONS = \
    1, 8, 7, 14, 25
# OperatorSetIdProto
OPSET_DOMAIN, OPSET_VERSION = 1, 2
# GraphProto
GRAPH_NODE, GRAPH_INITIALIZER, GRAPH_OUTPUT, GRAPH_SPARSE_INITIALIZER = 1, 5, 12, 15
# NodeProto / AttributeProto / FunctionProto
NODE_ATTRIBUTE, FUNCTION_NODE = 5, 7
ATTR_T, ATTR_G, ATTR_TENSORS, ATTR_GRAPHS, ATTR_SPARSE_TENSOR, ATTR_SPARSE_TENSORS = \
    5, 6, 10, 11, 22, 23
# SparseTensorProto
SPARSE_VALUES, SPARSE_INDICES = 1, 2
# TensorProto
TENSOR_NAME, TENSOR_EXTERNAL_DATA, TENSOR_DATA_LOCATION = 8, 13, 14
# StringStringEntryProto
ENTRY_KEY, ENTRY_VALUE = 1, 2
# ValueInfoProto
VALUE_NAME = 1


class WireError(ValueError):
    """The bytes are not a well-formed protobuf message (corrupt or truncated)."""


@dataclass
class ExternalTensor:
    name: str
    location: str
    offset: int
    length: int


@dataclass
class ModelSummary:
    metadata: dict[str, str] = field(default_factory=dict)
    outputs: list[str] = field(default_factory=list)
    nodes: int = 0
    external: list[ExternalTensor] = field(default_factory=list)
    ir_version: int = 0
    opsets: dict[str, int] = field(default_factory=dict)  # domain ("" is ai.onnx) -> version


def _fields(buf, start: int, end: int):
    """(field number, wire type, value) for each field of the message in buf[start:end]; a
    length-delimited value is given as its (start, end) span."""
    pos = start
    while pos < end:
        key, pos = _varint(buf, pos, end)
        number, wire = key >> 3, key & 7
        if number == 0:
            raise WireError(f"field number 0 at byte {pos}")
        if wire == 0:
            value, pos = _varint(buf, pos, end)
        elif wire == 2:
            size, pos = _varint(buf, pos, end)
            if pos + size > end:
                raise WireError(f"a field of {size:,} bytes runs past the end at byte {pos:,}")
            value, pos = (pos, pos + size), pos + size
        elif wire in (1, 5):
            width = 8 if wire == 1 else 4
            if pos + width > end:
                raise WireError(f"a fixed-width field runs past the end at byte {pos:,}")
            value, pos = None, pos + width
        else:
            raise WireError(f"unsupported wire type {wire} at byte {pos:,}")
        yield number, wire, value


def _varint(buf, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end or shift > 63:
            raise WireError(f"a varint runs past the end at byte {pos:,}")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result, pos
        shift += 7


def _text(buf, span) -> str:
    return bytes(buf[span[0]:span[1]]).decode("utf-8", errors="replace")


def _spans(buf, span, number: int):
    for n, wire, value in _fields(buf, *span):
        if n == number and wire == 2:
            yield value


def _entry(buf, span) -> tuple[str, str]:
    key = value = ""
    for n, wire, v in _fields(buf, *span):
        if wire == 2 and n == ENTRY_KEY:
            key = _text(buf, v)
        elif wire == 2 and n == ENTRY_VALUE:
            value = _text(buf, v)
    return key, value


def _opset(buf, span) -> tuple[str, int]:
    domain, version = "", 0
    for n, wire, v in _fields(buf, *span):
        if n == OPSET_DOMAIN and wire == 2:
            domain = _text(buf, v)
        elif n == OPSET_VERSION and wire == 0:
            version = v
    return domain, version


def _tensor(buf, span, out: list[ExternalTensor]) -> None:
    name, location, entries = "", 0, {}
    for n, wire, v in _fields(buf, *span):
        if n == TENSOR_NAME and wire == 2:
            name = _text(buf, v)
        elif n == TENSOR_EXTERNAL_DATA and wire == 2:
            k, val = _entry(buf, v)
            entries[k] = val
        elif n == TENSOR_DATA_LOCATION and wire == 0:
            location = v
    if location != 1:  # TensorProto.EXTERNAL
        return
    try:
        offset, length = int(entries.get("offset", 0)), int(entries.get("length", 0))
    except ValueError:
        raise WireError(f"tensor `{name}` has a non-numeric external offset or length") \
            from None
    out.append(ExternalTensor(name, entries.get("location", ""), offset, length))


def _sparse(buf, span, out: list[ExternalTensor]) -> None:
    for n, wire, v in _fields(buf, *span):
        if n in (SPARSE_VALUES, SPARSE_INDICES) and wire == 2:
            _tensor(buf, v, out)


def _nodes(buf, span, number: int, summary: ModelSummary) -> None:
    for node in _spans(buf, span, number):
        summary.nodes += 1
        for attr in _spans(buf, node, NODE_ATTRIBUTE):
            for n, wire, v in _fields(buf, *attr):
                if wire != 2:
                    continue
                if n in (ATTR_T, ATTR_TENSORS):
                    _tensor(buf, v, summary.external)
                elif n in (ATTR_SPARSE_TENSOR, ATTR_SPARSE_TENSORS):
                    _sparse(buf, v, summary.external)
                elif n in (ATTR_G, ATTR_GRAPHS):
                    _graph(buf, v, summary, top=False)


def _graph(buf, span, summary: ModelSummary, top: bool) -> None:
    _nodes(buf, span, GRAPH_NODE, summary)
    for n, wire, v in _fields(buf, *span):
        if wire != 2:
            continue
        if n == GRAPH_INITIALIZER:
            _tensor(buf, v, summary.external)
        elif n == GRAPH_SPARSE_INITIALIZER:
            _sparse(buf, v, summary.external)
        elif n == GRAPH_OUTPUT and top:
            for m, w, name in _fields(buf, *v):
                if m == VALUE_NAME and w == 2:
                    summary.outputs.append(_text(buf, name))


def scan(path: Path) -> ModelSummary:
    """Metadata, graph outputs, external-data references, IR version and opsets of the
    model at `path`; a WireError when its bytes are not a well-formed ModelProto."""
    summary = ModelSummary()
    with open(path, "rb") as f:
        if f.seek(0, 2) == 0:
            raise WireError("the file is empty")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            buf = memoryview(mm)
            try:
                graphs = 0
                for n, wire, v in _fields(buf, 0, len(buf)):
                    if n == MODEL_IR_VERSION and wire == 0:
                        summary.ir_version = v
                    if wire != 2:
                        continue
                    if n == MODEL_OPSET_IMPORT:
                        domain, version = _opset(buf, v)
                        summary.opsets[domain] = version
                    elif n == MODEL_GRAPH:
                        graphs += 1
                        _graph(buf, v, summary, top=True)
                    elif n == MODEL_METADATA:
                        key, value = _entry(buf, v)
                        summary.metadata[key] = value
                    elif n == MODEL_FUNCTIONS:
                        _nodes(buf, v, FUNCTION_NODE, summary)
                if graphs == 0:
                    raise WireError("it holds no graph")
            finally:
                buf.release()
    return summary
