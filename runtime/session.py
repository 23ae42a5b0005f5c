"""onnxruntime sessions for what `fgc compile --target onnx` wrote.

    from runtime import load
    model = load("out/gpt2")              # provider="auto": TensorRT/CUDA on a GPU, else CPU
    print(model.provider, model.reason)   # which execution provider runs, and why
    probs = model.run({"x": ids})["GPT"]

Loading checks what it loads: the .onnx parses, every external-data file it names lies
inside the model's folder and is long enough, and inputs have the names, dtypes, ranks
and ranges the model declares (its `fgc.*` metadata).

The graph onnxruntime optimised for a provider is kept in the user's cache folder
(`$XDG_CACHE_HOME/fgc/onnxruntime/`, created 0700), never in the model's folder: one entry
per model content (the SHA-256 of model.onnx and its data files), provider and onnxruntime
version, written by onnxruntime into a private staging folder and renamed into place, the
least recently used entries dropped past `FGC_ORT_CACHE_MAX` bytes (default 16 GiB). A
line on stderr says what was written and how big; `fgc cache clear` removes it all.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import hashlib
import json
import os
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np

from runtime.compat import plain, too_old
from runtime.files import atomic_write, cache_home, open_regular, private_dir, read_entry
from runtime.pages import asked as huge_asked
from runtime.pages import onto_huge_pages
from runtime.progress import Ticker, human_size
from runtime.protoscan import ModelSummary, WireError, scan
from runtime.signature import Signature, SignatureError, from_metadata

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
REQUESTS = {"auto": [TENSORRT, CUDA], "tensorrt": [TENSORRT, CUDA], "cuda": [CUDA], "cpu": []}
CACHE_LIMIT = 16 * 2**30  # bytes of optimised graphs kept; FGC_ORT_CACHE_MAX overrides


class RuntimeError_(Exception):
    """A problem with the model folder or the inputs, worded for the user."""


# ---------------------------------------------------------------- providers


def cuda_device() -> tuple[bool, str]:
    """Whether a CUDA device is usable, asked of the driver itself (cheap, no CUDA runtime):
    (True, name) or (False, why not)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
    except OSError:
        return False, "no NVIDIA driver (libcuda.so.1 not found)"
    if lib.cuInit(0) != 0:
        return False, "the NVIDIA driver found no usable GPU (cuInit failed)"
    count = ctypes.c_int(0)
    if lib.cuDeviceGetCount(ctypes.byref(count)) != 0 or count.value < 1:
        return False, "no CUDA device"
    name = ctypes.create_string_buffer(100)
    lib.cuDeviceGet(ctypes.byref(ctypes.c_int()), 0)
    lib.cuDeviceGetName(name, 100, 0)
    return True, name.value.decode(errors="replace") or "CUDA device 0"


def _tensorrt_libraries() -> bool:
    for lib in ("libnvinfer.so.10", "libnvinfer.so"):
        try:
            ctypes.CDLL(lib)
            return True
        except OSError:
            continue
    return False


def choose_providers(request: str = "auto") -> tuple[list[str], str]:
    """Execution providers to try, best first and always ending with CPU, and why."""
    import onnxruntime as ort
    if request not in REQUESTS:
        raise RuntimeError_(f"unknown provider `{request}` (auto, tensorrt, cuda, cpu)")
    if request == "cpu":
        return [CPU], "requested"
    gpu, why = cuda_device()
    if not gpu:
        return [CPU], f"{why}; falling back to CPU"
    available = ort.get_available_providers()
    wanted = [p for p in REQUESTS[request] if p in available]
    notes = []
    if TENSORRT in wanted and not _tensorrt_libraries():
        wanted.remove(TENSORRT)
        notes.append("TensorRT libraries not found")
    if not wanted:
        notes.append("this onnxruntime has no CUDA execution provider (onnxruntime-gpu has)")
        return [CPU], f"{'; '.join(notes)}; falling back to CPU"
    return wanted + [CPU], f"GPU: {why}" + (f" ({'; '.join(notes)})" if notes else "")


# ---------------------------------------------------------------- checking the files


def padding_problem(mask: np.ndarray) -> str | None:
    """What is wrong with a padding mask (batch, positions), or None: values other than 1
    and 0, a row without a token, padding between tokens (padding goes at either end)."""
    if mask.size and (mask.min() < 0 or mask.max() > 1):
        return "holds values other than 1 (a token) and 0 (padding)"
    for b, row in enumerate(np.asarray(mask) != 0):
        kept = np.flatnonzero(row)
        if not kept.size:
            return f"row {b + 1} has no token"
        if kept[-1] - kept[0] + 1 != kept.size:
            return f"row {b + 1} has padding between tokens; pad at either end"
    return None


def check_model_file(path: Path) -> ModelSummary:
    """Read the model's structure (not its weights) and check every external-data reference:
    a plain relative name inside the model's folder, in a file long enough for it."""
    if not path.is_file():
        raise RuntimeError_(f"{path} does not exist")
    try:
        summary = scan(path)
    except (WireError, OSError) as e:
        raise RuntimeError_(f"{path} is not a readable ONNX model (corrupt or truncated?): "
                            f"{e}") from None
    if not summary.nodes and not summary.outputs:
        raise RuntimeError_(f"{path} holds no graph (corrupt or truncated?)")
    folder = path.parent.resolve()
    sizes: dict[Path, int] = {}
    for t in summary.external:
        loc = t.location
        if not loc or "\0" in loc or os.path.isabs(loc) or ".." in Path(loc).parts or \
                folder not in (folder / loc).resolve().parents:
            raise RuntimeError_(f"{path}: tensor `{t.name}` points outside the model's folder "
                                f"({loc!r}); refusing to load it")
        target = (folder / loc).resolve()
        if target not in sizes:
            if not target.is_file():
                raise RuntimeError_(f"{path}: tensor `{t.name}` is stored in {loc}, which is "
                                    "missing")
            sizes[target] = target.stat().st_size
        end = t.offset + t.length
        if end > sizes[target]:
            raise RuntimeError_(f"{path}: tensor `{t.name}` ends at byte {end:,} but {loc} has "
                                f"{sizes[target]:,} (truncated?)")
    return summary


# ---------------------------------------------------------------- the model


class Model:
    def __init__(self, folder: str | Path, provider: str = "auto", optimize: bool = True,
                 threads: int | None = None, cache: bool = True, quiet: bool = False,
                 huge_pages: bool | None = None):
        import onnxruntime as ort
        ort.set_default_logger_severity(3)
        folder = Path(folder)
        path = folder / "model.onnx" if folder.is_dir() else folder
        self.path = path
        summary = check_model_file(path)
        self.meta = summary.metadata
        self.outputs = summary.outputs
        # the signature (runtime/signature.py): None for a graph fgc did not write
        try:
            sig = from_metadata(self.meta)
        except SignatureError as e:
            raise RuntimeError_(f"{path}: its metadata `fgc.signature`: {e}") from None
        providers, self.reason = choose_providers(provider)
        self.notes: list[str] = []
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        # the nodes run one after another (ORT_SEQUENTIAL, the default): an inter-op pool
        # would only keep threads waiting beside the intra-op ones (6-9 % of a decoding
        # step on 2 cores, measured), as onnxruntime-genai leaves it at 1 too
        opts.inter_op_num_threads = 1
        self.cached = False
        entry = None
        if not optimize:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        elif cache:
            entry = GraphCache.open(path, summary, providers[0], ort.__version__)
        load_path = path
        if entry is not None and entry.hit:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
            load_path, self.cached = entry.model, True
        elif entry is not None:
            entry.prepare(opts)
        verb = "loading" if self.cached or not optimize else "optimising"
        # on CPU, where asked: what onnxruntime maps for the session onto 2 MiB pages
        pages = onto_huge_pages() if providers[0] == CPU and huge_asked(huge_pages) \
            else contextlib.nullcontext(None)
        try:
            with Ticker(f"{verb} {path} ({human_size(sum(_sizes(path, summary)))}) with "
                        "onnxruntime", show=False if quiet else None), pages as placed:
                self.session = ort.InferenceSession(str(load_path), opts, providers=providers)
        except Exception as e:  # noqa: BLE001 - onnxruntime's errors are one class per cause
            if entry is not None:
                entry.discard()
            why = (too_old(summary.ir_version, summary.opsets, ort.__version__)
                   or plain(str(e))[:300])
            raise RuntimeError_(f"onnxruntime cannot load {path}: {why}") from None
        if entry is not None and not entry.hit:
            written = entry.commit()
            if written and not quiet:
                print(f"fgc: cached onnxruntime's optimised graph of {path} for "
                      f"{providers[0]} in {written[0]} ({human_size(written[1])}; `fgc cache "
                      "clear` removes it)", file=sys.stderr)
        self.signature = sig or Signature([_io_of(v) for v in self.session.get_inputs()],
                                          [{"name": name, "dtype": "real", "dims": []}
                                           for name in self.outputs])
        self.inputs = self.signature.inputs
        self.max_length = self.signature.max_length
        # outputs that are the next call's inputs (`Mem'` -> `Mem`): state, empty at first
        self.state = self.signature.state
        # the incremental form (--kv-cache): the token input, its cache tensors' names and dims
        self.incremental = self.signature.incremental
        # what the graph's real inputs and outputs hold (float32, or float16 from `--dtype`)
        self.real = _real_type(self.session)
        self.provider = self.session.get_providers()[0]
        # bytes of the session's memory on huge pages (runtime/pages.py)
        self.huge_pages = placed.moved if placed is not None else 0
        if self.provider != providers[0]:
            self.reason = f"{providers[0]} did not start; falling back to {self.provider}"

    # -- inputs
    def feeds(self, tokens: str | None = None, values: dict[str, str] | None = None,
              ) -> dict[str, np.ndarray]:
        """Inputs from text (`1,2,3`, sequences separated by `;`): `tokens` for the first
        input, `values` by name; inputs not given get a neutral default (see notes)."""
        values = dict(values or {})
        self.notes = []
        unknown = set(values) - {i["name"] for i in self.inputs}
        if unknown:
            raise RuntimeError_(f"the model has no input {', '.join(sorted(unknown))} (inputs: "
                                f"{', '.join(i['name'] for i in self.inputs)})")
        out: dict[str, np.ndarray] = {}
        first = next((i["name"] for i in self.inputs if not i.get("pad")), None)
        if tokens is not None and first is not None:
            values.setdefault(first, tokens)
        shape = None
        for spec in self.inputs:
            name = spec["name"]
            if name in values:
                out[name] = _parse(values[name], spec)
                if len(spec["dims"]) == 2:
                    shape = out[name].shape
        batch, length = shape if shape is not None else (1, 8)
        if shape is None and first is not None and first not in out:
            self.notes.append(f"no --tokens: {first} is {length} random ids (seed 0)")
        rng = np.random.default_rng(0)
        for spec in self.inputs:
            name = spec["name"]
            if name in out or spec.get("pad"):  # no padding mask: none (check() adds it)
                continue
            dims = [batch if d == "batch" else length if isinstance(d, str) else d
                    for d in spec["dims"]]
            if name in self.state.values():  # no state yet: no rows on its length axes
                out[name] = np.zeros([batch if d == "batch" else 0 if isinstance(d, str) else d
                                      for d in spec["dims"]], self.real)
                self.notes.append(f"{name} not given: empty (the first segment)")
            elif spec["dtype"] != "int":
                out[name] = np.zeros(dims, self.real)
                self.notes.append(f"{name} not given: zeros")
            elif spec.get("perm"):
                out[name] = np.broadcast_to(np.arange(dims[-1]), dims).astype(np.int64).copy()
                self.notes.append(f"{name} not given: the identity permutation")
            elif name == first:
                out[name] = rng.integers(0, spec["hi"] - spec["lo"] + 1, dims).astype(np.int64)
            else:
                out[name] = np.zeros(dims, np.int64)
                self.notes.append(f"{name} not given: {spec['lo']} (stored 0-based as 0)")
        return out

    def check(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        """The inputs as the graph takes them, or a RuntimeError_ naming what is wrong. A
        padding mask (`pad`) may be left out: no padding."""
        missing = [i["name"] for i in self.inputs if i["name"] not in feeds and
                   not i.get("pad")]
        if missing:
            raise RuntimeError_(f"missing input {', '.join(missing)}")
        out = {}
        lengths: dict[str, int] = {}
        batch = None
        for spec in self.inputs:
            name = spec["name"]
            if spec.get("pad"):
                continue
            x = np.asarray(feeds[name])
            want = np.int64 if spec["dtype"] == "int" else self.real if \
                spec["dtype"] == "real" else np.bool_
            if spec["dtype"] == "int" and x.dtype.kind not in "iu":
                raise RuntimeError_(f"input {name} holds {x.dtype}; it takes integers")
            if spec["dtype"] == "real" and x.dtype.kind not in "fiu":
                raise RuntimeError_(f"input {name} holds {x.dtype}; it takes numbers")
            if x.ndim != len(spec["dims"]):
                raise RuntimeError_(f"input {name} has shape {list(x.shape)}; it takes "
                                    f"{_dims_text(spec['dims'])}")
            for got, d in zip(x.shape, spec["dims"]):
                if d == "batch":
                    if batch is not None and got != batch:
                        raise RuntimeError_(f"input {name} has a batch of {got}, others {batch}")
                    batch = got
                elif isinstance(d, str):
                    if d in lengths and lengths[d] != got:
                        raise RuntimeError_(f"input {name} has {got} positions, others "
                                            f"{lengths[d]}")
                    lengths[d] = got
                    limit = self.max_length.get(d)
                    if limit is not None and got > limit:
                        raise RuntimeError_(f"input {name} has {got} positions; the model "
                                            f"takes at most {limit}")
                    if got < 1 and name not in self.state.values():  # state may be empty
                        raise RuntimeError_(f"input {name} is empty")
                elif got != d:
                    raise RuntimeError_(f"input {name} has shape {list(x.shape)}; it takes "
                                        f"{_dims_text(spec['dims'])}")
            out[name] = np.ascontiguousarray(x.astype(want, copy=False))
        past = 0
        if self.incremental:
            out.update(self._check_cache(feeds, batch, lengths))
            axis = self.incremental["past"]
            first = self.incremental["cache"][0] if self.incremental["cache"] else None
            if first is not None:
                past = out[first["past"]].shape[first["dims"].index(axis)]
        for spec in self.inputs:
            if spec.get("pad"):
                out[spec["name"]] = self._check_padding(spec, feeds.get(spec["name"]), batch,
                                                        lengths, past)
        for spec in self.inputs:
            x = out[spec["name"]]
            if spec.get("pad"):
                continue
            if spec["dtype"] == "int" and x.size:
                top = spec["hi"] - spec["lo"]
                if spec.get("hi_run") in lengths:  # a position: within this run's length
                    top = lengths[spec["hi_run"]] - spec["lo"]
                if x.min() < 0 or x.max() > top:
                    raise RuntimeError_(f"input {spec['name']} holds values outside 0..{top} "
                                        f"(0-based for {spec['lo']}..{spec['hi']})")
        return out

    def _check_padding(self, spec: dict, x, batch: int | None, lengths: dict,
                       past: int) -> np.ndarray:
        """A padding mask as the graph takes it: all ones where none is given; else 1 at a
        token and 0 at padding, the past's positions and this call's (past + T wide), the
        padding at either end of each row, which holds a token."""
        name = spec["name"]
        T = lengths.get(spec["dims"][-1])
        if T is None:
            raise RuntimeError_(f"input {name}: no input gives its positions' number")
        width = past + T if self.incremental and spec["dims"][-1] == \
            self.incremental["length"] else T
        if x is None:
            return np.ones((batch or 1, width), np.int64)
        x = np.asarray(x)
        if x.dtype.kind not in "iub":
            raise RuntimeError_(f"input {name} holds {x.dtype}; it takes 1 and 0")
        if x.ndim != 2 or x.shape[0] != (batch or x.shape[0]) or x.shape[1] != width:
            raise RuntimeError_(f"input {name} has shape {list(x.shape)}; it takes "
                                f"[{batch or 'batch'}, {width}]" +
                                (f" (the {past} past positions and the {T} new ones)"
                                 if width != T else ""))
        problem = padding_problem(x)
        if problem:
            raise RuntimeError_(f"input {name}: {problem}")
        return np.ascontiguousarray(x.astype(np.int64))

    def _check_cache(self, feeds: dict, batch: int | None, lengths: dict) -> dict:
        """The past keys and values of the incremental form: all or none (none: the
        prompt, no positions before it), each with the dims the graph declares and one
        past length, which with this call's tokens stays within the model's maximum."""
        cache = self.incremental["cache"]
        axis = self.incremental["past"]  # the positions the cache holds
        given = [c["past"] for c in cache if c["past"] in feeds]
        if given and len(given) < len(cache):
            missing = [c["past"] for c in cache if c["past"] not in feeds]
            raise RuntimeError_(f"missing input {', '.join(missing[:3])}"
                                f"{' …' if len(missing) > 3 else ''}: give every past key "
                                "and value, or none for the prompt")
        out, past = {}, None
        for c in cache:
            dims = c["dims"]
            if not given:
                out[c["past"]] = np.zeros([(batch or 1) if d == "batch" else 0 if d == axis
                                           else d for d in dims], self.real)
                continue
            x = np.asarray(feeds[c["past"]])
            ok = x.ndim == len(dims) and all(
                d in ("batch", axis) or got == d for got, d in zip(x.shape, dims))
            if ok and batch is not None:
                ok = x.shape[dims.index("batch")] == batch
            here = x.shape[dims.index(axis)] if ok else None
            if not ok or (past is not None and here != past):
                raise RuntimeError_(f"input {c['past']} has shape {list(x.shape)}; it takes "
                                    f"{_dims_text(dims)} with the batch of the tokens and "
                                    "the past length of the other keys and values")
            past = here
            out[c["past"]] = np.ascontiguousarray(x, dtype=self.real)
        length = self.incremental["length"]
        chunk = self.incremental.get("chunk_batch")
        if past and chunk is not None and lengths.get(length, 1) > 1 and (batch or 1) > chunk:
            raise RuntimeError_(f"{lengths[length]} new positions after a past at batch "
                                f"{batch}: this graph's attention (onnxruntime's "
                                "GroupQueryAttention, --optimize ort) takes several after a "
                                f"past only at batch {chunk}; give them one at a time, or "
                                "compile without --optimize ort")
        limit = self.max_length.get(length)
        if past and limit is not None and past + lengths.get(length, 0) > limit:
            raise RuntimeError_(f"{past} past positions and {lengths.get(length, 0)} new ones "
                                f"exceed the model's {limit}")
        return out

    def run(self, feeds: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        feeds = self.check(feeds)
        try:
            values = self.session.run(None, feeds)
        except Exception as e:  # noqa: BLE001
            raise RuntimeError_(f"onnxruntime failed: {str(e)[:300]}") from None
        return dict(zip(self.outputs, values))

    def describe(self, result: dict[str, np.ndarray], top: int = 5) -> list[str]:
        lines = []
        for name, value in result.items():
            lines.append(f"output {name}: {value.dtype}{list(value.shape)}")
            if name == "logits" or value.dtype.kind != "f" or value.ndim < 2 or top < 1:
                continue
            last = value[0, -1] if value.ndim == 3 else value[0]
            if not np.all(np.isfinite(last)) or \
                    abs(float(last.sum(dtype=np.float64)) - 1) > 1e-3:
                continue
            best = np.argsort(-last, kind="stable")[:top]
            where = "last position of sequence 1" if value.ndim == 3 else "sequence 1"
            lines.append(f"  most likely ids at the {where}: " +
                         ", ".join(f"{int(k)} ({last[k]:.4f})" for k in best))
        return lines


# ---------------------------------------------------------------- the optimised-graph cache


def cache_folder() -> Path:
    return cache_home() / "onnxruntime"


def cache_limit() -> int:
    try:
        return int(os.environ.get("FGC_ORT_CACHE_MAX", CACHE_LIMIT))
    except ValueError:
        return CACHE_LIMIT


class GraphCache:
    """One entry of the optimised-graph cache: `<key>/model.onnx` (+ `model.onnx.data`)."""

    def __init__(self, root: Path, key: str, size: int):
        self.root, self.key, self.size = root, key, size
        self.dir = root / key
        self.model = self.dir / "model.onnx"
        self.hit = False
        self.stage: Path | None = None
        self._lock: int | None = None

    @classmethod
    def open(cls, path: Path, summary: ModelSummary, provider: str,
             version: str) -> GraphCache | None:
        """The entry for this model, provider and onnxruntime, or None when nothing can be
        cached (no private cache folder, a cap of 0, or a model bigger than the cap)."""
        size = sum(_sizes(path, summary))
        if size > cache_limit():
            return None
        root = private_dir(cache_folder())
        if root is None:
            return None
        digest = content_key(root, [path] + _data_files(path, summary))
        tag = {CPU: "cpu", CUDA: "cuda", TENSORRT: "tensorrt"}[provider]
        entry = cls(root, f"{digest}-{tag}-{version}", size)
        if entry._valid():
            entry.hit = True
            with contextlib.suppress(OSError):
                os.utime(entry.dir)  # recently used: evicted last
        return entry

    def _valid(self) -> bool:
        try:
            st = os.lstat(self.dir)
            if not os.path.isdir(self.dir) or os.path.islink(self.dir) or \
                    st.st_uid != os.geteuid():
                return False
            check_model_file(self.model)
            return not os.path.islink(self.model)
        except (OSError, RuntimeError_):
            return False

    def prepare(self, opts) -> None:
        """Have onnxruntime write its optimised graph into a fresh private staging folder,
        with the weights in a side file that later sessions map instead of parsing."""
        self.stage = Path(tempfile.mkdtemp(dir=self.root, prefix=".stage-"))
        self._lock = os.open(self.stage, os.O_RDONLY | os.O_DIRECTORY)
        fcntl.flock(self._lock, fcntl.LOCK_EX)
        opts.optimized_model_filepath = str(self.stage / "model.onnx")
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", "model.onnx.data")
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024")

    def commit(self) -> tuple[Path, int] | None:
        """Rename the staged graph into place; (folder, bytes), or None when another session
        got there first or the graph did not check."""
        if self.stage is None:
            return None
        try:
            check_model_file(self.stage / "model.onnx")
            size = sum(f.stat().st_size for f in self.stage.iterdir())
            os.rename(self.stage, self.dir)
        except (OSError, RuntimeError_):
            self.discard()
            return None
        self.stage = None
        self._unlock()
        evict(self.root, keep=self.dir)
        return self.dir, size

    def discard(self) -> None:
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None
        self._unlock()

    def _unlock(self) -> None:
        if self._lock is not None:
            os.close(self._lock)
            self._lock = None

    def __del__(self):
        self.discard()


def content_key(root: Path, files: list[Path]) -> str:
    """SHA-256 of the files' bytes. Hashing a large model costs a second or two, so a file's
    digest is remembered in `root/digests.json` against its identity (device, inode, size,
    modification time) and recomputed only when that changes."""
    index_path = root / "digests.json"
    raw = read_entry(index_path, 2**22)
    try:
        index = json.loads(raw) if raw else {}
        index = index if isinstance(index, dict) else {}
    except ValueError:
        index = {}
    h = hashlib.sha256()
    changed = False
    for f in files:
        st = f.stat()
        ident = f"{st.st_dev}:{st.st_ino}:{st.st_size}:{st.st_mtime_ns}"
        digest = index.get(ident)
        if not (isinstance(digest, str) and len(digest) == 64):
            digest = _sha256(f)
            index[ident] = digest
            changed = True
        h.update(digest.encode())
    if changed:
        if len(index) > 4096:
            index = dict(list(index.items())[-2048:])
        with contextlib.suppress(OSError):
            atomic_write(index_path, json.dumps(index), fsync=False, file_mode=0o600)
    return h.hexdigest()[:32]


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    fd = open_regular(path)
    with os.fdopen(fd, "rb") as f:
        for block in iter(lambda: f.read(2**24), b""):
            h.update(block)
    return h.hexdigest()


def evict(root: Path, keep: Path | None = None) -> None:
    """Past the cap, remove the least recently used entries (and dead staging folders)."""
    entries, total = [], 0
    with contextlib.suppress(OSError):
        for e in os.scandir(root):
            if not e.is_dir(follow_symlinks=False):
                continue
            if e.name.startswith(".stage-"):
                _remove_if_dead(Path(e.path))
                continue
            size = sum(f.stat(follow_symlinks=False).st_size for f in os.scandir(e.path))
            entries.append((e.stat(follow_symlinks=False).st_mtime, Path(e.path), size))
            total += size
    entries.sort(key=lambda x: x[0])
    limit = cache_limit()
    for _, path, size in entries:
        if total <= limit:
            break
        if path != keep:
            shutil.rmtree(path, ignore_errors=True)
            total -= size


def _remove_if_dead(stage: Path) -> None:
    """A staging folder whose session died before renaming it (nobody holds its lock)."""
    try:
        fd = os.open(stage, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    except OSError:
        return
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return
    shutil.rmtree(stage, ignore_errors=True)
    os.close(fd)


def cache_info() -> tuple[Path, int, int]:
    """(folder, entries, bytes) of the optimised-graph cache."""
    root, count, total = cache_folder(), 0, 0
    with contextlib.suppress(OSError):
        for e in os.scandir(root):
            if e.is_dir(follow_symlinks=False) and not e.name.startswith("."):
                count += 1
                total += sum(f.stat(follow_symlinks=False).st_size for f in os.scandir(e.path))
    return root, count, total


def clear_cache() -> int:
    """Remove every optimised graph; the bytes freed."""
    _, _, total = cache_info()
    root = cache_folder()
    if root.is_dir() and not root.is_symlink():
        shutil.rmtree(root, ignore_errors=True)
    return total


def _data_files(path: Path, summary: ModelSummary) -> list[Path]:
    return sorted({(path.parent / t.location) for t in summary.external})


def _sizes(path: Path, summary: ModelSummary) -> list[int]:
    return [f.stat().st_size for f in [path] + _data_files(path, summary)]


def _io_of(arg) -> dict:
    """An input of a model fgc did not write, described from onnxruntime's view of it."""
    dims = [d if isinstance(d, int) else d or ("batch" if i == 0 else f"d{i}")
            for i, d in enumerate(arg.shape)]
    dtype = {"tensor(int64)": "int", "tensor(int32)": "int", "tensor(bool)": "bool"}.get(
        arg.type, "real")
    return {"name": arg.name, "dtype": dtype, "dims": dims, "lo": 0, "hi": 2**62}


def _real_type(session) -> np.dtype:
    """The type of the graph's real inputs and outputs, as onnxruntime reads them (fgc
    writes them all in the precision it compiled for); float32 where it has none."""
    kinds = {"tensor(float)": np.float32, "tensor(float16)": np.float16,
             "tensor(double)": np.float64}
    for arg in [*session.get_inputs(), *session.get_outputs()]:
        if arg.type in kinds:
            return np.dtype(kinds[arg.type])
    return np.dtype(np.float32)


def _dims_text(dims: list) -> str:
    return "[" + ", ".join(str(d) for d in dims) + "]"


def _parse(text: str, spec: dict) -> np.ndarray:
    rows = [r for r in text.replace(" ", "").split(";") if r]
    try:
        data = [[float(x) if spec["dtype"] == "real" else int(x) for x in r.split(",") if x]
                for r in rows]
    except ValueError:
        raise RuntimeError_(f"input {spec['name']}: `{text}` is not a list of numbers") \
            from None
    if not data or any(len(r) != len(data[0]) for r in data):
        raise RuntimeError_(f"input {spec['name']}: sequences must have equal lengths")
    try:
        arr = np.array(data, dtype=np.int64 if spec["dtype"] == "int" else np.float32)
    except OverflowError:
        raise RuntimeError_(f"input {spec['name']}: a value does not fit a 64-bit integer") \
            from None
    if len(spec["dims"]) == 1:
        arr = arr[:, 0] if arr.shape[1] == 1 else arr.reshape(-1)
    return arr


def load(folder: str | Path, provider: str = "auto", **options) -> Model:
    return Model(folder, provider, **options)
