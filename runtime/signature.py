"""What a compiled model takes and returns: its signature, read from either backend.

fgc decides the signature once (compiler/lowering/signature.py) and both backends print the
same dict: the PyTorch module returns it from `signature()` (with the numbers of its own
`config`), the ONNX graph stores it, JSON-encoded, as its metadata `fgc.signature`. This is
the one place the runtime reads it:

    {"inputs": [{"name", "dtype", "dims", and for ids "lo", "hi", "hi_run", "zero_based",
                 "perm"}, ...],
     "outputs": [{"name", "dtype", "dims"}, ...],    # the spec's, in order
     "logits": {"name": "logits", "of": "GPT"} or None,
     "state": {"Mem'": "Mem"},                       # outputs fed back as inputs
     "max_length": {"T": 1024},                      # each run length's most
     "incremental": None or {"tokens", "length", "past",
                             "cache": [{"past", "present", "kind", "block", "layers",
                                        "dims"}, ...]}}

A dim is "batch", a whole number, or the name of a run length (or a size computed from
them). The cache is printed compactly, one entry per cache site and kind whatever the
number of layers: `past.{l}.key` names the tensor of each layer l = 0..layers-1 of its
`block` (0: outside the layers, one tensor). `Signature.incremental["cache"]` holds it
expanded (`expand_cache`): one entry per tensor, {"past", "present", "layer" (from 1; 0
outside the layers), "kind", "dims"}, in the order of the ONNX graph's inputs and outputs
and of the torch module's step() (key, value) pairs. It imports only the standard library:
nothing of `compiler`.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field

KEY = "fgc.signature"  # the ONNX graph's metadata key
DTYPES = ("real", "int", "bool")
LAYER = "{l}"  # in a cache entry's names: the layer's index, from 0
KINDS = ("key", "value")


class SignatureError(ValueError):
    """A signature that is not one fgc writes; the message says what is wrong."""


@dataclass(frozen=True)
class Signature:
    inputs: list[dict]
    outputs: list[dict]
    logits: dict | None = None
    state: dict[str, str] = field(default_factory=dict)
    max_length: dict[str, int] = field(default_factory=dict)
    incremental: dict | None = None  # its cache expanded: one entry per tensor
    cache_entries: list | None = field(default=None, compare=False, repr=False)  # as printed

    @classmethod
    def parse(cls, data) -> Signature:
        """The signature in the dict both backends print; SignatureError if it is not."""
        if not isinstance(data, dict):
            raise SignatureError("the signature is not a dict")
        inputs = [_io(x, "input") for x in _list(data.get("inputs"), "inputs")]
        outputs = [_io(x, "output") for x in _list(data.get("outputs"), "outputs")]
        logits = data.get("logits")
        if logits is not None and not (isinstance(logits, dict) and
                                       isinstance(logits.get("name"), str) and
                                       isinstance(logits.get("of"), str)):
            raise SignatureError("`logits` is not {name, of}")
        state = _str_map(data.get("state", {}), "state", str)
        max_length = _str_map(data.get("max_length", {}), "max_length", int)
        inc = _incremental(data.get("incremental"))
        if inc is None:
            return cls(inputs, outputs, logits, state, max_length)
        return cls(inputs, outputs, logits, state, max_length,
                   {**inc, "cache": expand_cache(inc["cache"])}, inc["cache"])

    @classmethod
    def from_json(cls, text: str) -> Signature:
        try:
            data = json.loads(text)
        except ValueError as e:
            raise SignatureError(f"the signature is not JSON ({e})") from None
        return cls.parse(data)

    def to_dict(self) -> dict:
        """The dict as the backends print it (the cache compact)."""
        inc = self.incremental
        if inc is not None and self.cache_entries is not None:
            inc = {**inc, "cache": self.cache_entries}
        return {"inputs": self.inputs, "outputs": self.outputs, "logits": self.logits,
                "state": self.state, "max_length": self.max_length, "incremental": inc}

    def input(self, name: str) -> dict:
        return next(i for i in self.inputs if i["name"] == name)

    def output_names(self) -> list[str]:
        """The outputs with their logits (the ONNX graph's outputs, less the cache)."""
        names = [o["name"] for o in self.outputs]
        return names + ([self.logits["name"]] if self.logits else [])


def from_metadata(meta: dict[str, str]) -> Signature | None:
    """The signature an ONNX graph's metadata holds, or None where it holds none (a graph
    fgc did not write)."""
    text = meta.get(KEY)
    return None if text is None else Signature.from_json(text)


def of(model) -> Signature | None:
    """The signature of a runtime.Model (read from its metadata when it was loaded) or of
    a PyTorch module fgc emitted (its `signature()`); None for anything else."""
    sig = getattr(model, "signature", None)
    if isinstance(sig, Signature) or sig is None:
        return sig
    return Signature.parse(sig()) if callable(sig) else None


def cache_tensors(cache: list[dict]) -> Iterator[tuple[int, int]]:
    """(entry's index, layer) of each cache tensor the compact `cache` stands for, in graph
    order: an entry of block 0 once, at layer 0; the entries of a block, consecutive, for
    each of its layers 1..layers in turn."""
    k = 0
    while k < len(cache):
        block = cache[k]["block"]
        end = k
        while end < len(cache) and cache[end]["block"] == block:
            end += 1
        if block == 0:
            yield from ((j, 0) for j in range(k, end))
        else:
            for layer in range(1, cache[k]["layers"] + 1):
                yield from ((j, layer) for j in range(k, end))
        k = end


def expand_cache(cache: list[dict]) -> list[dict]:
    """The compact cache as one entry per tensor (see the module's doc), `{l}` in its names
    the layer's index from 0."""
    out = []
    for k, layer in cache_tensors(cache):
        c = cache[k]
        index = str(max(layer - 1, 0))
        out.append({"past": c["past"].replace(LAYER, index),
                    "present": c["present"].replace(LAYER, index), "layer": layer,
                    "kind": c["kind"], "dims": c["dims"]})
    return out


# ---------------------------------------------------------------- checks


def _list(x, what: str) -> list:
    if not isinstance(x, list):
        raise SignatureError(f"`{what}` is not a list")
    return x


def _dims(x, what: str) -> list:
    if not isinstance(x, list) or not all(
            isinstance(d, str) or (isinstance(d, int) and not isinstance(d, bool) and d >= 0)
            for d in x):
        raise SignatureError(f"{what}: dims are not names and whole numbers")
    return x


def _io(x, what: str) -> dict:
    if not isinstance(x, dict) or not isinstance(x.get("name"), str):
        raise SignatureError(f"an {what} without a name")
    where = f"{what} {x['name']}"
    if x.get("dtype") not in DTYPES:
        raise SignatureError(f"{where}: dtype {x.get('dtype')!r} is not one of {DTYPES}")
    _dims(x.get("dims"), where)
    if what == "input" and x["dtype"] == "int":
        for k in ("lo", "hi"):
            if not isinstance(x.get(k), int) or isinstance(x.get(k), bool):
                raise SignatureError(f"{where}: `{k}` is not a whole number")
        if "hi_run" in x and not isinstance(x["hi_run"], str):
            raise SignatureError(f"{where}: `hi_run` is not a run length")
    return x


def _str_map(x, what: str, kind: type) -> dict:
    if not isinstance(x, dict) or not all(
            isinstance(k, str) and isinstance(v, kind) and not isinstance(v, bool)
            for k, v in x.items()):
        raise SignatureError(f"`{what}` is not a map of names to {kind.__name__}")
    return x


def _incremental(x) -> dict | None:
    if x is None:
        return None
    if not isinstance(x, dict) or not all(isinstance(x.get(k), str)
                                          for k in ("tokens", "length", "past")):
        raise SignatureError("`incremental` is not {tokens, length, past, cache}")
    blocks: dict[int, int] = {}  # block -> its number of layers
    for c in _list(x.get("cache"), "incremental.cache"):
        if not isinstance(c, dict) or not isinstance(c.get("past"), str) or \
                not isinstance(c.get("present"), str):
            raise SignatureError("a cache entry without its past and present names")
        where = f"cache entry {c['past']}"
        _dims(c.get("dims"), where)
        if x["past"] not in c["dims"] or "batch" not in c["dims"]:
            raise SignatureError(f"{where}: no batch or past axis")
        if c.get("kind") not in KINDS:
            raise SignatureError(f"{where}: kind {c.get('kind')!r} is not one of {KINDS}")
        block, layers = c.get("block"), c.get("layers")
        if not all(isinstance(v, int) and not isinstance(v, bool) and v >= 0
                   for v in (block, layers)):
            raise SignatureError(f"{where}: `block` and `layers` are not whole numbers")
        if block == 0 and (layers != 1 or LAYER in c["past"] + c["present"]):
            raise SignatureError(f"{where}: outside the layers, one tensor and no `{LAYER}`")
        if block and any(LAYER not in c[k] for k in ("past", "present")):
            raise SignatureError(f"{where}: a block's names without `{LAYER}`")
        if blocks and (block < max(blocks) or blocks.get(block, layers) != layers):
            raise SignatureError(f"{where}: block {block} out of order, or with another "
                                 "number of layers")
        blocks[block] = layers
    chunk = x.get("chunk_batch")
    if chunk is not None and not (isinstance(chunk, int) and not isinstance(chunk, bool)
                                  and chunk >= 1):
        raise SignatureError("`incremental.chunk_batch` is not a positive whole number")
    return x
