"""Importing a checkpoint: the spec's `checkpoint { ... }` block, applied to a model's files.

The block is data: for each spec parameter, the checkpoint tensor it comes from and the
steps that reshape it: `transpose`; `split(axis, parts, index)`; `heads(axis)`, which cuts
an axis of size A·D into the family's A members; `take(axis, index)`, one slice with the axis
dropped; `flatten(axis)`, which joins an axis and the next. Axes and indices are 1-based;
`{l}` in a name is the checkpoint's own 0-based layer number, and a family's index (`{e}`
for `W_e^gate`) its 0-based member, one tensor per member stacked as the family. A name is
found as written or behind the block's `prefix` (transformers' `model.`: a *ForCausalLM
state dict has it, a bare model's or a re-saved one has not, and the head outside the base
model never has it); a file holding both, or neither, is refused, naming the tensor.
Without a block, the file holds the compiled module's own names. Works on numpy arrays:
importing weights for the ONNX backend must not import torch.

`--weights` names the checkpoint as users hold it (`open_checkpoint`): a safetensors file
(`Checkpoint`), a sharded checkpoint's index, `model.safetensors.index.json` (`Shards`: one
`Checkpoint` per file of the index's folder), a model folder as transformers'
`save_pretrained` writes it, or a PyTorch `pytorch_model.bin` (`TorchFile`, read by torch's
`weights_only` loader; nothing else is ever unpickled). All four offer the same reading:
`tensors` (name -> TensorInfo, from the headers), `read(name)`, `close()`. A model folder's
files are read inside it and nowhere else (`_in_folder`).

A safetensors file is read lazily: its header lists every tensor (name, dtype, shape, where
its bytes lie), and only the tensors the spec uses are read, each with `pread` from one
descriptor of a regular file (`runtime.files.open_regular`: a FIFO or a device is refused,
not waited on). Tensors the spec does not use cost nothing, whatever their size. float16
and bfloat16 tensors become float32 (bfloat16 is the top half of a float32's bits, widened
a chunk at a time). Every used tensor is scanned for NaN and Inf as it is converted
(`Imported.nonfinite`, `nonfinite_message`).

Importing streams: `import_checkpoint` reads the headers only, checks every shape from
them (each step's shape worked out on a stand-in of no memory), and gives each parameter
as a `Lazy` tensor (compiler/lazy.py) that reads its checkpoint tensor and applies the
steps when materialized. The writers (`write_safetensors`, the ONNX graph's) materialize
one tensor at a time and drop it, so memory holds about one tensor, not the model.
"""

from __future__ import annotations

import difflib
import json
import os
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from runtime.files import FileError, open_atomic, open_regular, read_regular

from .elaborate import ir
from .elaborate.elaborator import Statics, member_key
from .elaborate.symbolic import Poly
from .errors import Diagnostic, FgcError, Span
from .lazy import Lazy, stacked
from .names import family_axis, family_layout, ident, layers_attr, member_layout
from .passes.params import Entry, as_int
from .syntax import nodes as S


@dataclass
class Imported:
    """A checkpoint mapped onto a configuration: each parameter a `Lazy` tensor, read from
    the still open checkpoint and put through its steps when materialized. Close it (or use
    it as a context manager) once the tensors are written."""

    tensors: dict[str, Lazy]  # the compiled module's state-dict names
    ignored: list[str] = field(default_factory=list)  # buffers the spec says to skip
    extras: list[str] = field(default_factory=list)  # tensors nothing reads: errors
    notes: list[Diagnostic] = field(default_factory=list)
    # checkpoint tensors read so far that hold NaN or Inf: (checkpoint name, NaN count, Inf
    # count), in the order the spec uses them; complete once every tensor was materialized
    nonfinite: list[tuple[str, int, int]] = field(default_factory=list)
    source: Checkpoint | Shards | TorchFile | None = field(default=None, repr=False)
    order: dict[str, int] = field(default_factory=dict, repr=False)  # name -> first use
    scanned: set[str] = field(default_factory=set, repr=False)

    def scan(self, name: str, x: np.ndarray) -> None:
        """Count the NaN and Inf of checkpoint tensor `name`, read as `x`, once."""
        if name not in self.scanned:
            self.record(name, *count_nonfinite(x))

    def record(self, name: str, nan: int, inf: int) -> None:
        """The NaN and Inf counts of checkpoint tensor `name`, counted by its reader."""
        if name in self.scanned:
            return
        self.scanned.add(name)
        if nan or inf:
            self.nonfinite.append((name, nan, inf))
            self.nonfinite.sort(key=lambda item: self.order.get(item[0], 0))

    def scan_rest(self) -> None:
        """Scan the used checkpoint tensors no materialization has read (a parameter the
        graph leaves out), so `nonfinite` names every one the spec uses."""
        for name in self.order:
            if name not in self.scanned and self.source is not None:
                self.scan(name, self.source.read(name).astype(np.float32, copy=False))

    def materialize(self) -> None:
        """Read every tensor once (and drop it): `nonfinite` is then complete."""
        for t in self.tensors.values():
            np.asarray(t)

    def close(self) -> None:
        if self.source is not None:
            self.source.close()
            self.source = None

    def __enter__(self) -> Imported:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


# ---------------------------------------------------------------- safetensors files
# The format: an 8-byte little-endian header length, a JSON header {name: {dtype, shape,
# data_offsets: [begin, end]}, "__metadata__": {...}}, then the tensors' bytes (offsets
# count from the end of the header). Read and written here rather than through the
# safetensors package, for a measured reason: its safe_open maps the whole file, so a
# checkpoint larger than the address-space limit fails even when the spec uses 16 bytes of
# it, and its load_file reads every tensor (a 2 GiB unused tensor cost 4.25 GB, a 6 GiB one
# a Rust panic that is not an Exception).

MAX_HEADER = 100_000_000  # bytes of JSON header: the safetensors package's own limit
_READ_CHUNK = 1 << 30  # one pread at most (Linux returns at most ~2 GiB per call)
_COMPARE_CHUNK = 1 << 26  # bytes of each tensor held at once when two are compared
_SCAN_CHUNK = 1 << 22  # elements per NaN/Inf scan: 4 MB of booleans, whatever the tensor
_CONVERT_CHUNK = 1 << 24  # bfloat16 elements read and widened at a time: 32 MB
_DTYPES = {"F64": "<f8", "F32": "<f4", "F16": "<f2", "BF16": "<u2", "I64": "<i8",
           "U64": "<u8", "I32": "<i4", "U32": "<u4", "I16": "<i2", "U16": "<u2", "I8": "i1",
           "U8": "u1", "BOOL": "?", "C64": "<c8"}
_SIZES = {"F8_E4M3": 1, "F8_E5M2": 1, "F8_E8M0": 1, "F4": 1, "F6_E2M3": 1, "F6_E3M2": 1,
          "C128": 16}  # known to the format, not readable here: named in the error
_CODES = {np.dtype(np.float64): "F64", np.dtype(np.float32): "F32",
          np.dtype(np.float16): "F16", np.dtype(np.int64): "I64", np.dtype(np.int32): "I32",
          np.dtype(np.int16): "I16", np.dtype(np.int8): "I8", np.dtype(np.uint8): "U8",
          np.dtype(np.bool_): "BOOL"}


@dataclass(frozen=True)
class TensorInfo:
    """One tensor as the header describes it."""

    dtype: str  # the format's code: F32, BF16, ...
    shape: tuple[int, ...]
    begin: int  # byte offsets in the file
    end: int

    @property
    def numpy_name(self) -> str:
        """The dtype as numpy names it (bfloat16 for BF16), for messages."""
        if self.dtype == "BF16":
            return "bfloat16"
        return np.dtype(_DTYPES[self.dtype]).name if self.dtype in _DTYPES else self.dtype

    @property
    def floats(self) -> bool:
        return self.dtype in ("F64", "F32", "F16", "BF16")


class Checkpoint:
    """A safetensors file opened for reading: its header now, each tensor when asked.

    Use as a context manager; every problem with the file is an FgcError naming it."""

    def __init__(self, path: str):
        self.path = str(path)
        self.fd = _open_weights(self.path)
        try:
            self.size = os.fstat(self.fd).st_size
            self.tensors = self._header()
        except BaseException:
            os.close(self.fd)
            raise

    def __enter__(self) -> Checkpoint:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1

    def _bad(self, why: str) -> FgcError:
        return FgcError(f"{self.path} is not a readable safetensors file ({why})", None)

    def _pread(self, n: int, offset: int, into: memoryview | None = None) -> memoryview:
        buf = into if into is not None else memoryview(bytearray(n))
        done = 0
        while done < n:
            try:
                got = os.preadv(self.fd, [buf[done: done + _READ_CHUNK]], offset + done)
            except OSError as e:
                raise FgcError(f"cannot read weights file {self.path}: {e.strerror or e}",
                               None) from None
            if got == 0:
                raise self._bad(f"it ends at byte {offset + done:,}, truncated")
            done += got
        return buf

    def _header(self) -> dict[str, TensorInfo]:
        if self.size < 8:
            raise self._bad(f"{self.size} bytes, shorter than the 8-byte header length")
        n = int.from_bytes(self._pread(8, 0), "little")
        if n < 2 or n > MAX_HEADER:
            raise self._bad(f"a header of {n:,} bytes; the format allows 2 to {MAX_HEADER:,}")
        if 8 + n > self.size:
            raise self._bad(f"a header of {n:,} bytes in a file of {self.size:,}, truncated")
        try:
            header = json.loads(bytes(self._pread(n, 8)).decode("utf-8"))
        except (UnicodeDecodeError, ValueError) as e:
            raise self._bad(f"its header is not JSON: {str(e)[:120]}") from None
        if not isinstance(header, dict):
            raise self._bad("its header is not a JSON object")
        start = 8 + n
        out: dict[str, TensorInfo] = {}
        for name, entry in header.items():
            if name == "__metadata__":
                continue
            info = self._entry(name, entry, start)
            out[name] = info
        return out

    def _entry(self, name: str, entry, start: int) -> TensorInfo:
        what = f"tensor `{name[:200]}`"
        if not isinstance(entry, dict):
            raise self._bad(f"{what} is not described by an object")
        dtype, shape, offsets = entry.get("dtype"), entry.get("shape"), \
            entry.get("data_offsets")
        if dtype not in _DTYPES and dtype not in _SIZES:
            raise self._bad(f"{what} has an unknown dtype {str(dtype)[:40]!r}")
        if not isinstance(shape, list) or not all(type(d) is int and d >= 0 for d in shape):
            raise self._bad(f"{what} has a shape that is not a list of sizes")
        if not (isinstance(offsets, list) and len(offsets) == 2 and
                all(type(x) is int for x in offsets) and 0 <= offsets[0] <= offsets[1]):
            raise self._bad(f"{what} has data_offsets that are not [begin, end]")
        numel = 1
        for d in shape:
            numel *= d
        itemsize = np.dtype(_DTYPES[dtype]).itemsize if dtype in _DTYPES else _SIZES[dtype]
        if offsets[1] - offsets[0] != numel * itemsize:
            raise self._bad(f"{what} of shape {shape} in {dtype} needs {numel * itemsize:,} "
                            f"bytes, its offsets give {offsets[1] - offsets[0]:,}")
        if start + offsets[1] > self.size:
            raise self._bad(f"{what} ends at byte {start + offsets[1]:,} of a file of "
                            f"{self.size:,}, truncated")
        return TensorInfo(dtype, tuple(shape), start + offsets[0], start + offsets[1])

    def read(self, name: str) -> np.ndarray:
        """One tensor, read now, in its own dtype (BF16 as float32)."""
        info = self.tensors[name]
        if info.dtype not in _DTYPES:
            raise FgcError(f"`{name}` in {self.path} holds {info.dtype}, which fgc cannot "
                           "read", None, "convert the checkpoint to float32 or float16")
        if info.dtype == "BF16":
            return self._read_bf16(info)
        raw = np.empty(info.end - info.begin, np.uint8)
        self._pread(raw.nbytes, info.begin, memoryview(raw))
        return raw.view(_DTYPES[info.dtype]).reshape(info.shape)

    def read_rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Rows lo .. hi - 1 (0-based, the first axis) of a tensor, read now, as float32."""
        info = self.tensors[name]
        if info.dtype not in _DTYPES:
            return self.read(name)[lo:hi]  # refused there, naming the dtype
        per_row = (info.end - info.begin) // max(info.shape[0], 1)
        raw = np.empty((hi - lo) * per_row, np.uint8)
        self._pread(raw.nbytes, info.begin + lo * per_row, memoryview(raw))
        shape = (hi - lo, *info.shape[1:])
        if info.dtype == "BF16":
            out = raw.view("<u2").astype(np.uint32)
            out <<= 16  # bfloat16 is the top half of a float32's bits (as _read_bf16)
            return out.view(np.float32).reshape(shape)
        return raw.view(_DTYPES[info.dtype]).reshape(shape).astype(np.float32, copy=False)

    def _read_bf16(self, info: TensorInfo) -> np.ndarray:
        """A bfloat16 tensor as float32 (bfloat16 is the top half of a float32's bits),
        converted a chunk at a time: the float32 result and one chunk in memory, not the
        bfloat16 copy beside it."""
        out = np.empty((info.end - info.begin) // 2, np.uint32)
        chunk = np.empty(min(out.size, _CONVERT_CHUNK), "<u2")
        for k in range(0, out.size, chunk.size):
            n = min(chunk.size, out.size - k)
            self._pread(2 * n, info.begin + 2 * k, memoryview(chunk[:n]).cast("B"))
            part = out[k: k + n]
            part[...] = chunk[:n]
            part <<= 16
        return out.view(np.float32).reshape(info.shape)


def _open_weights(path: str) -> int:
    """A descriptor of the regular file `path`, or an FgcError naming it."""
    try:
        return open_regular(path)
    except FileNotFoundError:
        raise FgcError(f"weights file {path} does not exist", None) from None
    except FileError as e:
        raise FgcError(f"weights file {path} {e.strerror}", None,
                       "give a safetensors file, a shard index or a model folder") from None
    except OSError as e:
        raise FgcError(f"cannot read weights file {path}: {e.strerror or e}", None) from None


class Shards:
    """A sharded checkpoint: an index (`model.safetensors.index.json`) whose `weight_map`
    names, for each tensor, the file beside it that holds it. Every shard's header is read
    at once, so `tensors` spans them all; a tensor's bytes come from its shard when asked.

    A shard is a file of the index's own folder, named without a folder: a name with `/` or
    `..`, or a shard that links outside the folder, is refused; so are a missing shard, a
    tensor two shards hold, and a tensor the index places in a shard that lacks it.
    `opener` reads one shard: Checkpoint, or TorchFile for `pytorch_model.bin.index.json`."""

    def __init__(self, index: str, opener=Checkpoint):
        self.path = str(index)
        folder = Path(self.path).parent
        weight_map = _weight_map(self.path)
        by_shard: dict[str, list[str]] = {}
        for name, shard in weight_map.items():
            if not _plain_name(shard):
                raise FgcError(f"{self.path} places `{name}` in `{shard}`, which is not a file "
                               "name: the shards lie beside the index", None,
                               "an index names each shard by its file name alone, without "
                               "`/` or `..`")
            by_shard.setdefault(shard, []).append(name)
        self.files: list[Checkpoint | TorchFile] = []
        self.tensors: dict[str, TensorInfo] = {}
        self._where: dict[str, Checkpoint | TorchFile] = {}  # tensor name -> its shard
        try:
            for shard, names in by_shard.items():
                path = folder / shard
                if not os.path.lexists(path):
                    raise FgcError(f"{self.path} places `{names[0]}` in {path}, which does "
                                   "not exist", None,
                                   "a sharded checkpoint needs every file its index names")
                part = opener(str(_in_folder(path, folder)))
                self.files.append(part)
                for name, info in part.tensors.items():
                    if name in self._where:
                        raise FgcError(f"`{name}` is in both {self._where[name].path} and "
                                       f"{part.path}", None,
                                       "a sharded checkpoint holds each tensor in one file")
                    self._where[name] = part
                    self.tensors[name] = info
                lacking = [name for name in names if name not in part.tensors]
                if lacking:
                    more = f" (nor {len(lacking) - 1:,} more tensors the index places " \
                        "there)" if len(lacking) > 1 else ""
                    raise FgcError(f"{self.path} places `{lacking[0]}` in {part.path}, which "
                                   f"does not hold it{more}", None)
        except BaseException:
            self.close()
            raise

    def __enter__(self) -> Shards:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        for part in self.files:
            part.close()
        self.files = []

    def read(self, name: str) -> np.ndarray:
        """One tensor, read now from its shard, in its own dtype (BF16 as float32)."""
        return self._where[name].read(name)

    def read_rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Rows lo .. hi - 1 of a tensor, from its shard, as float32."""
        return self._where[name].read_rows(name, lo, hi)


def _weight_map(path: str) -> dict[str, str]:
    """The `weight_map` of a checkpoint index (tensor name -> shard file), or an FgcError
    naming the index: not JSON, no map, or a tensor listed twice."""
    try:
        data = read_regular(path, MAX_HEADER)
    except FileNotFoundError:
        raise FgcError(f"checkpoint index {path} does not exist", None) from None
    except OSError as e:
        raise FgcError(f"cannot read checkpoint index {path}: {e.strerror or e}", None) \
            from None
    twice: list[tuple[str, str, str]] = []

    def pairs(items):  # json keeps the last of two equal keys; a listing must not
        out = {}
        for key, value in items:
            if key in out and isinstance(value, str):
                twice.append((key, out[key], value))
            out[key] = value
        return out
    try:
        index = json.loads(data.decode("utf-8"), object_pairs_hook=pairs)
    except (UnicodeDecodeError, ValueError) as e:
        raise FgcError(f"{path} is not a checkpoint index (not JSON: {str(e)[:120]})",
                       None) from None
    weight_map = index.get("weight_map") if isinstance(index, dict) else None
    if not isinstance(weight_map, dict) or \
            not all(isinstance(v, str) for v in weight_map.values()):
        raise FgcError(f"{path} is not a checkpoint index: it has no \"weight_map\" from "
                       "tensor names to shard files", None)
    if twice:
        name, first, second = twice[0]
        raise FgcError(f"{path} lists `{name}` twice, in `{first}` and in `{second}`", None,
                       "a sharded checkpoint holds each tensor in one file")
    return weight_map


def _plain_name(name: str) -> bool:
    """Whether `name` names a file of a folder: no folder part, not `.` or `..`."""
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\\0")


def _in_folder(path: Path, folder: Path) -> Path:
    """`path` when it is a file of `folder`, links followed; else an FgcError: a model
    folder's files are read inside it and nowhere else. A Hugging Face cache snapshot
    (`models--X/snapshots/REV/`) links each file into `models--X/blobs/`, which counts as
    the snapshot's own."""
    real, home = Path(os.path.realpath(path)), Path(os.path.realpath(folder))
    homes = [home]
    if home.parent.name == "snapshots" and home.parent.parent.name.startswith("models--"):
        homes.append(home.parent.parent / "blobs")
    if not any(real.is_relative_to(h) for h in homes):
        raise FgcError(f"{path} leads to {real}, outside {folder}: fgc reads a model "
                       "folder's own files only", None,
                       "copy the file into the folder, or give it to --weights itself")
    return path


class TorchFile:
    """A PyTorch checkpoint (`pytorch_model.bin`): a state dict read by torch's
    `weights_only` loader, which rebuilds tensors and plain containers and refuses anything
    else (a pickle that names a function is an error, never a call). The zip format is
    mapped (`mmap`), so a tensor's bytes are read when it is; the older format is read
    whole. Needs torch; without it, an FgcError saying how to convert the file."""

    def __init__(self, path: str):
        self.path = str(path)
        fd = _open_weights(self.path)
        try:
            zipped = os.pread(fd, 4, 0) == b"PK\x03\x04"  # torch.save's format since 1.6
        except OSError as e:
            raise FgcError(f"cannot read weights file {path}: {e.strerror or e}", None) \
                from None
        finally:
            os.close(fd)
        try:
            import torch
        except ImportError:
            raise FgcError(f"{path} is a PyTorch checkpoint, which fgc reads with torch, and "
                           "torch is not installed", None,
                           "install torch, or convert the checkpoint to safetensors where "
                           "torch is: transformers' `from_pretrained(FOLDER)` then "
                           "`save_pretrained(OUT, safe_serialization=True)`") from None
        try:
            state = torch.load(self.path, map_location="cpu", weights_only=True, mmap=zipped)
        except Exception as e:  # torch raises several kinds for a damaged or unsafe file
            raise FgcError(f"cannot read {path} as a PyTorch checkpoint: {_torch_reason(e)}",
                           None, "fgc reads a state dict of tensors with torch's "
                           "weights_only loader and unpickles nothing else") from None
        tensors = {k: v for k, v in state.items() if isinstance(k, str) and
                   isinstance(v, torch.Tensor)} if isinstance(state, dict) else {}
        if not tensors:
            raise FgcError(f"{path} holds no state dict (tensor names to tensors)", None,
                           "save the model's state_dict(), or use save_pretrained")
        codes = {torch.float64: "F64", torch.float32: "F32", torch.float16: "F16",
                 torch.bfloat16: "BF16", torch.int64: "I64", torch.int32: "I32",
                 torch.int16: "I16", torch.int8: "I8", torch.uint8: "U8", torch.bool: "BOOL"}
        self.state = tensors
        self.tensors = {}
        for name, t in tensors.items():
            code = codes.get(t.dtype, str(t.dtype).removeprefix("torch.")) \
                if t.layout == torch.strided else str(t.layout).removeprefix("torch.")
            self.tensors[name] = TensorInfo(code, tuple(t.shape), 0,
                                            t.numel() * t.element_size())

    def __enter__(self) -> TorchFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def close(self) -> None:
        self.state = {}

    def read(self, name: str) -> np.ndarray:
        """One tensor in its own dtype (BF16 as float32: numpy has no bfloat16)."""
        t = self.state[name]
        if self.tensors[name].dtype == "BF16":
            t = t.float()
        return t.numpy()

    def read_rows(self, name: str, lo: int, hi: int) -> np.ndarray:
        """Rows lo .. hi - 1 of a tensor (mapped: only those pages are read), as float32."""
        return self.state[name][lo:hi].float().numpy()


def _torch_reason(e: Exception) -> str:
    """The line of torch's message that says what is wrong (its first lines advise loading
    with weights_only=False, which fgc never does)."""
    lines = [line.strip() for line in str(e).splitlines() if line.strip()]
    why = next((line for line in lines if "GLOBAL" in line or "Unsupported" in line),
               lines[0] if lines else type(e).__name__)
    return why[:300]


# a model folder's checkpoint, found as transformers finds it: these names in this order
_FOLDER_FILES = ("model.safetensors", "model.safetensors.index.json", "pytorch_model.bin",
                 "pytorch_model.bin.index.json")


def open_checkpoint(path: str):
    """The checkpoint `--weights` names, opened for reading (a Checkpoint, Shards or
    TorchFile; a context manager): a safetensors file; a sharded checkpoint's index
    (`*.index.json`); a PyTorch file (`*.bin`, `*.pt`, `*.pth`, or torch's zip format by
    its bytes under another name, `*.ckpt`); or a model folder holding one of
    `_FOLDER_FILES` (or one safetensors file by another name), read inside that folder
    only. Every problem is an FgcError naming the file."""
    path = str(path)
    if os.path.isdir(path):
        return _model_folder(Path(path))
    return _open_file(path)


def _open_file(path: str, folder: Path | None = None):
    """One file by its kind; inside `folder` only, when given."""
    if folder is not None:
        path = str(_in_folder(Path(path), folder))
    name = os.path.basename(path)
    if name.endswith(".json"):
        return Shards(path, TorchFile if name.endswith(".bin.index.json") else Checkpoint)
    if name.endswith((".bin", ".pt", ".pth")) or \
            (not name.endswith(".safetensors") and _zipped(path)):
        return TorchFile(path)
    return Checkpoint(path)


def _zipped(path: str) -> bool:
    """Whether `path` is a regular file that starts as a zip archive (torch.save's format);
    anything unreadable is left to the safetensors reader, which names the trouble."""
    try:
        fd = open_regular(path)
    except OSError:
        return False
    try:
        return os.pread(fd, 4, 0) == b"PK\x03\x04"
    except OSError:
        return False
    finally:
        os.close(fd)


def _model_folder(folder: Path):
    """The checkpoint of a model folder, opened; an FgcError saying what the folder holds
    when none is found."""
    for name in _FOLDER_FILES:
        if os.path.lexists(folder / name):
            return _open_file(str(folder / name), folder)
    try:
        found = sorted(entry.name for entry in os.scandir(folder)
                       if entry.name.endswith(".safetensors"))
    except OSError as e:
        raise FgcError(f"cannot read the model folder {folder}: {e.strerror or e}", None) \
            from None
    if len(found) == 1:
        return _open_file(str(folder / found[0]), folder)
    what = (f"it holds {', '.join(found[:4])}{' …' if len(found) > 4 else ''} but no "
            "model.safetensors.index.json saying which tensor is where") if found else \
        "no model.safetensors, model.safetensors.index.json or pytorch_model.bin"
    raise FgcError(f"{folder} is a folder with no checkpoint fgc can find: {what}", None,
                   "give --weights a safetensors file, an index or a folder written by "
                   "save_pretrained")


def read_safetensors(path: str) -> dict[str, np.ndarray]:
    """All tensors of a safetensors file as numpy arrays, or a clear FgcError."""
    with Checkpoint(path) as ckpt:
        return {name: ckpt.read(name) for name in ckpt.tensors}


def count_nonfinite(x: np.ndarray) -> tuple[int, int]:
    """(NaN count, Inf count) of a float array, scanned in chunks: the booleans never take
    more than a few MB, whatever the tensor's size."""
    flat = x.reshape(-1)
    nan = inf = 0
    for k in range(0, flat.size, _SCAN_CHUNK):
        chunk = flat[k: k + _SCAN_CHUNK]
        if np.isfinite(chunk).all():
            continue
        nan += int(np.count_nonzero(np.isnan(chunk)))
        inf += int(np.count_nonzero(np.isinf(chunk)))
    return nan, inf


def nonfinite_message(nonfinite: list[tuple[str, int, int]], path: str | None = None,
                      limit: int = 8) -> str:
    """`2 checkpoint tensors hold NaN or Inf: h.0.attn.c_attn.weight (3 NaN), ...`, for a
    warning (or, with --strict, an error); the first `limit` tensors are named."""
    def counts(nan: int, inf: int) -> str:
        return ", ".join(f"{k:,} {what}" for k, what in ((nan, "NaN"), (inf, "Inf")) if k)

    n = len(nonfinite)
    named = ", ".join(f"{name} ({counts(nan, inf)})" for name, nan, inf in nonfinite[:limit])
    more = f", and {n - limit:,} more" if n > limit else ""
    where = f" in {path}" if path else ""
    return (f"{n:,} checkpoint tensor{'s' if n != 1 else ''}{where} "
            f"hold{'s' if n == 1 else ''} NaN or Inf: {named}{more}")


def state_key(entry: Entry, layer: int | None) -> str:
    """The compiled PyTorch module's name for one parameter tensor."""
    parts = [ident(p) for p in entry.path] + [ident(entry.name)]
    if layer is not None and not entry.shared:
        parts = [layers_attr(entry.loop), str(layer - 1)] + parts
    return ".".join(parts)


def onnx_key(entry: Entry, layer: int | None) -> str:
    """The ONNX graph's initializer name for one parameter tensor: its path, `layer3/attn/W_Q`
    (layers counted from 1, as in the spec)."""
    parts = [ident(p) for p in entry.path] + [ident(entry.name)]
    if layer is not None and not entry.shared:
        parts = [f"layer{layer}"] + parts
    return "/".join(parts)


def parameter_keys(cfg) -> list[tuple[str, str]]:
    """Every parameter tensor of a configuration as (torch state-dict name, ONNX name)."""
    return [(state_key(entry, layer), onnx_key(entry, layer))
            for entry in cfg.count.entries for layer in _layers_of(entry, cfg)]


def _layers_of(entry: Entry, cfg) -> list[int | None]:
    if not entry.in_layers or entry.shared:
        return [None]
    copies = as_int(entry.layers)
    loop = [item for item in cfg.model.body if isinstance(item, ir.Loop)][entry.loop]
    hi = as_int(loop.hi)
    if copies == hi:
        return list(range(1, hi + 1))
    from .elaborate.elaborator import guard_holds
    env = {k: v.const_value() for k, v in cfg.values.items() if hasattr(v, "const_value")}
    return [layer for layer in range(1, hi + 1)
            if all(guard_holds(g, {**env, loop.var: layer}) for g in entry.guards)]


def _expected(entry: Entry) -> tuple[int, ...]:
    dims = [as_int(d) for d in entry.shape]
    if entry.family is not None:
        dims = family_layout(dims, as_int(entry.family), entry.members_first)
    return tuple(dims)


def _apply(step: S.CkptStep, x: np.ndarray, family: int | None, source: str,
           size=None, first: bool = False) -> np.ndarray:
    """One step on a tensor (or on a stand-in of its shape); `size` evaluates a size
    expression at this configuration (`slice`'s ends); `first`: the target family is
    stored with its axis first (names.family_layout)."""
    args = step.args
    if step.name == "slice":
        if len(args) != 2 or not isinstance(args[0], int) or \
                not isinstance(args[1], S.RangeSlice) or size is None:
            raise FgcError("slice takes (axis, first .. last), 1-based and inclusive; the "
                           "ends may be size expressions: slice(1, A * D + 1 .. (A + G) * D)",
                           step.span)
        axis = args[0] - 1
        lo, hi = size(args[1].lo), size(args[1].hi)
        if not (0 <= axis < x.ndim) or not (1 <= lo <= hi <= x.shape[axis]):
            raise FgcError(f"cannot take entries {lo} .. {hi} of axis {args[0]} of {source} "
                           f"{list(x.shape)}", step.span)
        return x[(slice(None),) * axis + (slice(lo - 1, hi),)]
    if any(not isinstance(a, int) for a in args):
        raise FgcError(f"`{step.name}` takes numbers (axes, counts, indices); only `slice` "
                       "takes size expressions", step.span)
    if step.name in ("transpose", "T"):
        if x.ndim < 2:
            raise FgcError(f"`{step.name}` needs a matrix; {source} has shape {list(x.shape)}",
                           step.span)
        return np.swapaxes(x, -1, -2)
    if step.name == "split":
        if len(args) != 3:
            raise FgcError("split takes (axis, parts, index), 1-based", step.span)
        axis, parts, index = args[0] - 1, args[1], args[2]
        if not (0 <= axis < x.ndim) or not (1 <= index <= parts) or x.shape[axis] % parts:
            raise FgcError(f"cannot split axis {args[0]} of {source} {list(x.shape)} into "
                           f"{parts} parts and take part {index}", step.span)
        size = x.shape[axis] // parts
        return x[(slice(None),) * axis + (slice((index - 1) * size, index * size),)]
    if step.name == "heads":
        if len(args) != 1 or family is None:
            raise FgcError("heads(axis) splits one axis into the family's members and moves "
                           "them first; the target must be a family", step.span)
        axis = args[0] - 1
        if not (0 <= axis < x.ndim) or x.shape[axis] % family:
            raise FgcError(f"cannot split axis {args[0]} of {source} {list(x.shape)} into "
                           f"{family} heads", step.span)
        shape = list(x.shape)
        shape[axis: axis + 1] = [family, shape[axis] // family]
        x = x.reshape(shape)
        # stored with the family axis where family_layout puts it, and members first
        # each member (out, in)
        x = np.moveaxis(x, axis, family_axis(x.ndim - 1, first))
        return np.swapaxes(x, -1, -2) if first and x.ndim >= 3 else x
    if step.name == "take":
        if len(args) != 2:
            raise FgcError("take takes (axis, index), 1-based", step.span)
        axis, index = args[0] - 1, args[1]
        if not (0 <= axis < x.ndim) or not (1 <= index <= x.shape[axis]):
            raise FgcError(f"cannot take entry {index} of axis {args[0]} of {source} "
                           f"{list(x.shape)}", step.span)
        return x[(slice(None),) * axis + (index - 1,)]
    if step.name == "flatten":
        if len(args) != 1:
            raise FgcError("flatten takes (axis), 1-based: it joins that axis and the next",
                           step.span)
        axis = args[0] - 1
        if not (0 <= axis < x.ndim - 1):
            raise FgcError(f"cannot join axes {args[0]} and {args[0] + 1} of {source} "
                           f"{list(x.shape)}", step.span)
        shape = list(x.shape)
        shape[axis: axis + 2] = [shape[axis] * shape[axis + 1]]
        return x.reshape(shape)
    raise FgcError(f"unknown step `{step.name}`", step.span,
                   "steps are transpose, split(axis, parts, index), heads(axis), "
                   "take(axis, index), flatten(axis) and slice(axis, first .. last)")


def import_checkpoint(cfg, checkpoint: S.Checkpoint | None, path: str,
                      key=state_key) -> Imported:
    """Map a checkpoint (a file, a shard index or a model folder: `open_checkpoint`) onto
    one configuration's parameters, named by `key` (the torch module's names, or
    `onnx_key`); raises FgcError naming each missing or mis-shaped tensor, under a one-line
    count when there are several (`_summarised`). Without a checkpoint block the file holds
    the torch module's own names. Only the tensors the spec uses are read; each is scanned
    for NaN and Inf (`nonfinite`) when it is. The tensors are Lazy: nothing is read here
    but the headers, and each tensor is read (through its steps) when materialized, so the
    result stays open until closed (`Imported.close`, or `with import_checkpoint(...)`)."""
    ckpt = open_checkpoint(path)
    try:
        return _import(cfg, checkpoint, ckpt, path, key)
    except BaseException:
        ckpt.close()
        raise


def _import(cfg, checkpoint: S.Checkpoint | None, ckpt: Checkpoint | Shards | TorchFile,
            path: str, key) -> Imported:
    raw = ckpt.tensors  # the header: names, dtypes and shapes; no data read yet
    out = Imported({}, source=ckpt)
    errors: list[Diagnostic] = []
    used: set[str] = set()
    # (tensor, axis) -> the ranges `slice` reads of it: together they must cover the axis
    read_parts: dict[tuple[str, int], list[tuple[int, int, Span | None]]] = {}

    prefixes = checkpoint.prefixes if checkpoint else []
    statics = Statics(dict(cfg.values), path)

    def size(e: S.Expr) -> int:
        """A size expression of a step at this configuration: a whole number."""
        value = statics.eval(e)
        if not (isinstance(value, Poly) and value.is_const()
                and value.const_value().denominator == 1):
            raise FgcError("a step's size is not a whole number at this configuration",
                           getattr(e, "span", None))
        return int(value.const_value())
    missing = [0]
    # (kind, checkpoint tensor) of each missing or mis-shaped error, for the summary line
    problems: list[tuple[str, str]] = []

    def lookup(name: str, spec_name: str, layer: int | None, span) -> str | None:
        """The file's name for `name`: itself or behind one of the block's prefixes
        (`model.` in a *ForCausalLM state dict, none in a bare model's or a re-saved one).
        Both present, or neither, is an error naming the tensor."""
        found = [n for n in (name, *(p + name for p in prefixes)) if n in raw]
        if len(found) == 1:
            return found[0]
        where = f"(for `{spec_name}`{_at(layer)})"
        if found:
            errors.append(Diagnostic(
                "error", f"{path} holds both " + " and ".join(f"`{n}`" for n in found) +
                f" {where}: which one is meant is not clear", span,
                "a file holds each tensor once, with the prefix or without it"))
            return None
        names = [name, *(p + name for p in prefixes)]
        tried = f"no tensor `{name}`" if len(names) == 1 else \
            "neither " + " nor ".join(f"`{n}`" for n in names)
        missing[0] += 1
        problems.append(("missing", name))
        near = [m for n in names for m in difflib.get_close_matches(n, raw, 1, 0.75)] \
            if missing[0] <= 8 else []  # a few hints; a wrong file misses every name
        errors.append(Diagnostic(
            "error", f"{path} has {tried} {where}", span,
            f"the nearest name in the file is `{near[0]}`" if near else None))
        return None

    def read(source: str, steps: list[S.CkptStep], expected: tuple[int, ...],
             family: int | None, spec_name: str, layer: int | None, span,
             first: bool = False) -> Lazy | None:
        """One checkpoint tensor through its steps, checked against `expected`, as a Lazy
        tensor that reads it when materialized; None (and the error noted) when it is
        missing or does not fit. `first`: the target is stored members first
        (names.family_layout); read one member at a time (`family` None), each member is
        given (out, in) (names.member_layout)."""
        flip = first and family is None and len(expected) >= 2
        found = lookup(source, spec_name, layer, span)
        if found is None:
            return None
        used.add(found)
        info = raw[found]
        # the steps and the shape check run on the header's shape, with a stand-in of no
        # memory: every stride is 0, so each step (a view, or a reshape that is always one
        # at zero strides) gives the shape the data will have without copying anything
        x = np.broadcast_to(np.uint8(0), info.shape)
        try:
            for step in steps:
                x = _apply(step, x, family, source, size, first)
        except FgcError as e:
            errors.extend(e.diagnostics)
            problems.extend(("mis-shaped", found) for _ in e.diagnostics)
            return None
        if steps and steps[0].name == "slice":  # which entries of the file's tensor are read
            axis, ends = steps[0].args
            read_parts.setdefault((found, axis), []).append((size(ends.lo), size(ends.hi), span))
        if tuple(x.shape) != expected:
            problems.append(("mis-shaped", found))
            errors.append(Diagnostic(
                "error", f"`{source}` has shape {list(info.shape)}"
                + (f" (after {', '.join(s.name for s in steps)}) = {list(x.shape)}"
                   if steps else "") + f", but `{spec_name}`{_at(layer)} is {list(expected)}",
                span))
            return None
        if not info.floats:
            errors.append(Diagnostic("error", f"`{source}` holds {info.numpy_name}, not "
                                     "floats", span))
            return None
        out.order.setdefault(found, len(out.order))

        def make() -> np.ndarray:
            rest, swap = steps, flip
            if swap and rest and rest[-1].name in ("transpose", "T"):
                rest, swap = rest[:-1], False  # stored (out, in): the last transpose undone
            if rest and rest[0].name in ("transpose", "T") and len(info.shape) == 2:
                # nn.Linear's [out, in] read a block of rows at a time into its transpose:
                # the result and one block in memory, not the tensor and its copy
                x, rest = _transposed(ckpt, found, out), rest[1:]
            else:
                x = ckpt.read(found).astype(np.float32, copy=False)
                out.scan(found, x)
            for step in rest:
                x = _apply(step, x, family, source, size, first)
            return np.swapaxes(x, -1, -2) if swap else x
        return Lazy(tuple(member_layout(list(x.shape))) if flip else x.shape, make)

    rules: dict[tuple[str, bool], S.CkptMap] = {}
    if checkpoint is not None:
        for m in checkpoint.maps:
            rules[(".".join(m.path), m.per_layer)] = m

    for entry in cfg.count.entries:
        expected = _expected(entry)
        family = as_int(entry.family) if entry.family is not None else None
        spec_name = ".".join(entry.path + (entry.name,))
        for layer in _layers_of(entry, cfg):
            target = key(entry, layer)
            if checkpoint is None:
                source = state_key(entry, layer)
                steps: list[S.CkptStep] = []
                span = None
            else:
                rule = rules.get((spec_name, entry.in_layers and not entry.shared))
                if rule is None:
                    errors.append(Diagnostic(
                        "error", f"the checkpoint block says nowhere where `{spec_name}` comes "
                        "from", checkpoint.span,
                        f"add `{spec_name} = \"...\"`" + (" inside `layers { }`"
                                                           if entry.in_layers else "")))
                    break
                source = rule.source.replace("{l}", str((layer or 1) - 1))
                steps = rule.steps
                span = rule.span
            var = (member_key(entry.declared) or (None, None))[1]
            if family is not None and var is not None and f"{{{var}}}" in source:
                # one tensor per member (`experts.{e}.w1.weight`), stacked as a family
                member = tuple(as_int(d) for d in entry.shape)
                xs = [read(source.replace(f"{{{var}}}", str(k)), steps, member, None,
                           spec_name, layer, span, entry.members_first)
                      for k in range(family)]
                if all(x is not None for x in xs):
                    out.tensors[target] = stacked(
                        xs, family_axis(len(member), entry.members_first))
                continue
            x = read(source, steps, expected, family, spec_name, layer, span,
                     entry.members_first)
            if x is not None:
                out.tensors[target] = x
    for (name, axis), parts in read_parts.items():
        unread = _unread(name, axis, raw[name].shape, parts)
        problems.extend(("mis-shaped", name) for _ in unread)
        errors.extend(unread)
    ignore = _ignore_patterns(checkpoint, cfg)
    tied = {}  # a copy the file may hold -> the rule saying of which tensor
    for rule in checkpoint.tied if checkpoint else []:
        for name in (rule.name, *(p + rule.name for p in prefixes)):
            tied[name] = rule
    for name in sorted(raw):
        if name in used:
            continue
        bare = next((name[len(p):] for p in prefixes if name.startswith(p)), name)
        if bare in ignore or name in ignore:
            out.ignored.append(name)
        elif name in tied and not errors:
            rule = tied[name]
            same = lookup(rule.same, rule.name, None, rule.span)
            if same is not None and not _same(ckpt, name, same):
                errors.append(Diagnostic(
                    "error", f"`{name}` in {path} is not a copy of `{same}`: the checkpoint "
                    "has its own tensor there, and this spec ties it to that one", rule.span,
                    "the checkpoint's model is another (untied) one; use a spec, or its "
                    "setting, that reads this tensor"))
            out.ignored.append(name)
        else:
            out.extras.append(name)
            problems.append(("unused", name))
            errors.append(Diagnostic(
                "error", f"`{name}` in {path} is read by no parameter of the spec",
                checkpoint.span if checkpoint else None,
                "a buffer or a copy the file may hold is listed in the spec's checkpoint "
                "block (`ignore \"...\"`, `tied \"...\" = \"...\"`); otherwise the "
                "checkpoint is another model's"))
    if errors:
        raise FgcError.many(_summarised(errors, path, problems, out.extras))
    return out


def _transposed(ckpt, name: str, out: Imported) -> np.ndarray:
    """A 2-D checkpoint tensor's transpose as float32, filled a block of rows at a time
    (`read_rows`), its NaN and Inf counted on the way."""
    rows, cols = ckpt.tensors[name].shape
    res = np.empty((cols, rows), np.float32)
    step = max(1, _CONVERT_CHUNK // max(cols, 1))
    nan = inf = 0
    for lo in range(0, rows, step):
        block = ckpt.read_rows(name, lo, min(rows, lo + step))
        counts = count_nonfinite(block)
        nan, inf = nan + counts[0], inf + counts[1]
        res[:, lo:lo + block.shape[0]] = block.T
    out.record(name, nan, inf)
    return res


def _same(ckpt, a: str, b: str) -> bool:
    """Whether tensors `a` and `b` of a checkpoint hold the same values (a tied copy):
    safetensors bytes of one dtype compared a chunk at a time, so a tied embedding of
    gigabytes costs no memory; otherwise (a PyTorch file, two dtypes) as arrays."""
    ta, tb = ckpt.tensors[a], ckpt.tensors[b]
    if tuple(ta.shape) != tuple(tb.shape):
        return False
    files = [ckpt._where[n] if isinstance(ckpt, Shards) else ckpt for n in (a, b)]
    if ta.dtype != tb.dtype or not all(isinstance(f, Checkpoint) for f in files):
        return bool(np.array_equal(ckpt.read(a), ckpt.read(b)))
    for at in range(0, ta.end - ta.begin, _COMPARE_CHUNK):
        n = min(_COMPARE_CHUNK, ta.end - ta.begin - at)
        if files[0]._pread(n, ta.begin + at) != files[1]._pread(n, tb.begin + at):
            return False
    return True


SHOWN = 8  # errors shown in full under the summary line


def _summarised(errors: list[Diagnostic], path: str, problems: list[tuple[str, str]],
                unused: list[str]) -> list[Diagnostic]:
    """Several import errors as one line that counts the tensors (`3 tensors missing, 2
    mis-shaped, 1 unused in FILE`; `problems` gives the kind and tensor of each missing or
    mis-shaped error), then the first SHOWN errors in full and how many more: a checkpoint
    of another size or another model fails at every tensor, and the count says which."""
    if len(errors) < 2:
        return errors
    missing = len({name for kind, name in problems if kind == "missing"})
    misshaped = len({name for kind, name in problems if kind == "mis-shaped"})
    counts = [(k, what) for k, what in ((missing, "missing"), (misshaped, "mis-shaped"),
                                        (len(unused), "unused")) if k]
    parts = [f"{k:,} {what}" for k, what in counts]
    if parts:
        k, what = counts[0]
        parts[0] = f"{k:,} tensor{'s' if k != 1 else ''} {what}"
    other = len(errors) - len(problems)
    if other:
        parts.append(f"{other:,} other error{'s' if other != 1 else ''}")
    head = Diagnostic(
        "error", ", ".join(parts) + f" in {path}", None,
        "the sizes (--preset, --set) are not the checkpoint's" if misshaped else None,
        [f"unused: {', '.join(unused[:5])}{' …' if len(unused) > 5 else ''}"]
        if unused else [])
    more = len(errors) - SHOWN
    tail = [Diagnostic("note", f"... and {more:,} more errors", None)] if more > 0 else []
    return [head, *errors[:SHOWN], *tail]


def _unread(name: str, axis: int, shape: tuple, parts: list) -> list[Diagnostic]:
    """Entries of a tensor's axis that no `slice` reads: the file's sizes are not the
    configuration's (a qkv_proj of G = A heads read with G = 2 would lose rows silently)."""
    seen = np.zeros(shape[axis - 1] if 0 < axis <= len(shape) else 0, bool)
    for lo, hi, _ in parts:
        seen[lo - 1:hi] = True
    if seen.all():
        return []
    missing = np.flatnonzero(~seen)
    return [Diagnostic("error", f"entries {missing[0] + 1} .. {missing[-1] + 1} of axis {axis} "
                       f"of `{name}` {list(shape)} are read by no parameter: the file's sizes "
                       "are not this configuration's", parts[0][2],
                       "the slices of one tensor must cover it; check the hyperparameters "
                       "(--set) against the checkpoint's config")]


def _at(layer: int | None) -> str:
    return f" in layer {layer}" if layer is not None else ""


def _ignore_patterns(checkpoint: S.Checkpoint | None, cfg) -> set[str]:
    if checkpoint is None:
        return set()
    # `{l}` runs over the longest `layers` block
    layers = max((as_int(item.hi) for item in cfg.model.body if isinstance(item, ir.Loop)),
                 default=0)
    out: set[str] = set()
    for pattern in checkpoint.ignore:
        if "{l}" in pattern:
            out.update(pattern.replace("{l}", str(k)) for k in range(layers))
        else:
            out.add(pattern)
    return out


def write_safetensors(tensors: dict[str, np.ndarray | Lazy], path: Path,
                      progress=None) -> None:
    """Write a safetensors file that safetensors' own loaders read, atomically
    (`runtime.files.open_atomic`); tensors in name order, each materialized (a Lazy one
    read from its checkpoint), written and dropped before the next, so no copy of the whole
    file is built; `progress` (runtime.progress.Progress) counts tensors and bytes. Raises
    FgcError naming the file when it cannot be written."""
    header: dict[str, dict] = {}
    offset = 0
    order = sorted(tensors)
    for name in order:
        arr = tensors[name]
        # (ml_dtypes' bfloat16, which --dtype bfloat16 writes, by name: no import for it)
        code = _CODES.get(arr.dtype) or ("BF16" if arr.dtype.name == "bfloat16" else None)
        if code is None:
            raise ValueError(f"cannot write {arr.dtype} tensor `{name}` to safetensors")
        header[name] = {"dtype": code, "shape": list(arr.shape),
                        "data_offsets": [offset, offset + arr.nbytes]}
        offset += arr.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)  # the data starts 8-byte aligned, as the package does
    try:
        with open_atomic(path) as f:
            f.write(len(text).to_bytes(8, "little") + text)
            for name in order:
                arr = np.ascontiguousarray(tensors[name])
                if arr.dtype.byteorder == ">":
                    arr = arr.astype(arr.dtype.newbyteorder("<"))
                f.write(arr.reshape(-1).view(np.uint8))  # the bytes, not a copy
                del arr  # before the next is materialized
                if progress is not None:
                    progress.advance(tensors[name].nbytes, items=1)
    except OSError as e:
        raise FgcError(f"cannot write {path}: {e.strerror or e}", None) from None


__all__ = ["Imported", "Checkpoint", "Shards", "TorchFile", "TensorInfo", "open_checkpoint",
           "import_checkpoint", "read_safetensors", "write_safetensors", "count_nonfinite",
           "nonfinite_message", "Span"]
