"""onnxruntime sessions for what `fgc compile --target onnx` wrote.

    from runtime import load
    model = load("out/gpt2")              # provider="auto": TensorRT/CUDA on a GPU, else CPU
    print(model.provider, model.reason)   # which execution provider runs, and why
    probs = model.run({"x": ids})["GPT"]

Loading checks what it loads: the .onnx parses, every external-data file it names lies
inside the model's folder and is long enough, and inputs have the names, dtypes, ranks
and ranges the model declares (its `fgc.*` metadata). The graph onnxruntime optimised for
a provider is cached next to the model, so a later session skips the optimisation.
"""

from __future__ import annotations

import ctypes
import json
import os
from pathlib import Path

import numpy as np

from runtime.protoscan import ModelSummary, WireError, scan

CPU = "CPUExecutionProvider"
CUDA = "CUDAExecutionProvider"
TENSORRT = "TensorrtExecutionProvider"
REQUESTS = {"auto": [TENSORRT, CUDA], "tensorrt": [TENSORRT, CUDA], "cuda": [CUDA], "cpu": []}
CACHE_STAMP = ".fgc-session-cache.json"


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
        target = (folder / loc).resolve()
        if not loc or os.path.isabs(loc) or ".." in Path(loc).parts or \
                folder not in target.parents:
            raise RuntimeError_(f"{path}: tensor `{t.name}` points outside the model's folder "
                                f"({loc!r}); refusing to load it")
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
                 threads: int | None = None, cache: bool = True):
        import onnxruntime as ort
        ort.set_default_logger_severity(3)
        folder = Path(folder)
        path = folder / "model.onnx" if folder.is_dir() else folder
        self.path = path
        summary = check_model_file(path)
        self.meta = summary.metadata
        self.outputs = summary.outputs
        self.output_specs = json.loads(self.meta.get("fgc.outputs", "[]")) or [
            {"name": name, "dims": []} for name in self.outputs]
        self.max_length = json.loads(self.meta.get("fgc.max_length", "{}"))
        # outputs that are the next call's inputs (`Mem'` -> `Mem`): state, empty at first
        self.state = json.loads(self.meta.get("fgc.state", "{}"))
        # the incremental form (--kv-cache): the token input, its cache tensors' names and dims
        self.incremental = json.loads(self.meta.get("fgc.incremental", "null"))
        providers, self.reason = choose_providers(provider)
        opts = ort.SessionOptions()
        if threads:
            opts.intra_op_num_threads = threads
        load_path = path
        self.cached = False
        if not optimize:
            opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
        elif cache:
            load_path = self._cache(opts, providers[0], ort)
        try:
            self.session = ort.InferenceSession(str(load_path), opts, providers=providers)
        except Exception as e:  # noqa: BLE001 - onnxruntime's errors are one class per cause
            raise RuntimeError_(f"onnxruntime cannot load {path}: {str(e)[:300]}") from None
        self.inputs = json.loads(self.meta.get("fgc.inputs", "[]")) or [
            _io_of(v) for v in self.session.get_inputs()]
        self.provider = self.session.get_providers()[0]
        if self.provider != providers[0]:
            self.reason = f"{providers[0]} did not start; falling back to {self.provider}"
        self.notes: list[str] = []

    def _cache(self, opts, provider: str, ort) -> Path:
        """The optimised graph for this provider, saved next to the model on first load."""
        tag = {CPU: "cpu", CUDA: "cuda", TENSORRT: "tensorrt"}[provider]
        cached = self.path.with_name(f"{self.path.stem}.{tag}.opt.onnx")
        stamp_file = self.path.with_name(CACHE_STAMP)
        stamp = {"source": _stamp(self.path), "onnxruntime": ort.__version__}
        data = self.path.with_name(self.path.name + ".data")
        if data.exists():
            stamp["data"] = _stamp(data)
        try:
            known = json.loads(stamp_file.read_text()) if stamp_file.is_file() else {}
        except (OSError, ValueError):
            known = {}
        if known.get(tag) == stamp and cached.is_file():
            try:
                check_model_file(cached)
                opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_DISABLE_ALL
                self.cached = True
                return cached
            except RuntimeError_:
                pass
        if not os.access(self.path.parent, os.W_OK):
            return self.path
        opts.optimized_model_filepath = str(cached)
        # Weights beside the cached graph, not inside it: onnxruntime then maps them from
        # disk instead of parsing a protobuf the size of the model.
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_file_name", cached.name + ".data")
        opts.add_session_config_entry(
            "session.optimized_model_external_initializers_min_size_in_bytes", "1024")
        self._stamp = (stamp_file, known, tag, stamp)
        return self.path

    def _save_stamp(self) -> None:
        if getattr(self, "_stamp", None) is None:
            return
        stamp_file, known, tag, stamp = self._stamp
        known[tag] = stamp
        try:
            tmp = stamp_file.with_name(stamp_file.name + ".tmp")
            tmp.write_text(json.dumps(known, indent=1, sort_keys=True))
            os.replace(tmp, stamp_file)
        except OSError:
            pass
        self._stamp = None

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
        first = self.inputs[0]["name"] if self.inputs else None
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
            if name in out:
                continue
            dims = [batch if d == "batch" else length if isinstance(d, str) else d
                    for d in spec["dims"]]
            if name in self.state.values():  # no state yet: no rows on its length axes
                out[name] = np.zeros([batch if d == "batch" else 0 if isinstance(d, str) else d
                                      for d in spec["dims"]], np.float32)
                self.notes.append(f"{name} not given: empty (the first segment)")
            elif spec["dtype"] != "int":
                out[name] = np.zeros(dims, np.float32)
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
        """The inputs as the graph takes them, or a RuntimeError_ naming what is wrong."""
        missing = [i["name"] for i in self.inputs if i["name"] not in feeds]
        if missing:
            raise RuntimeError_(f"missing input {', '.join(missing)}")
        out = {}
        lengths: dict[str, int] = {}
        batch = None
        for spec in self.inputs:
            name = spec["name"]
            x = np.asarray(feeds[name])
            want = np.int64 if spec["dtype"] == "int" else np.float32 if \
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
        if self.incremental:
            out.update(self._check_cache(feeds, batch, lengths))
        for spec in self.inputs:
            x = out[spec["name"]]
            if spec["dtype"] == "int" and x.size:
                top = spec["hi"] - spec["lo"]
                if spec.get("hi_run") in lengths:  # a position: within this run's length
                    top = lengths[spec["hi_run"]] - spec["lo"]
                if x.min() < 0 or x.max() > top:
                    raise RuntimeError_(f"input {spec['name']} holds values outside 0..{top} "
                                        f"(0-based for {spec['lo']}..{spec['hi']})")
        return out

    def _check_cache(self, feeds: dict, batch: int | None, lengths: dict) -> dict:
        """The past keys and values of the incremental form: all or none (none: the
        prompt, no positions before it), each with the dims the graph declares and one
        past length, which with this call's tokens stays within the model's maximum."""
        cache = self.incremental["cache"]
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
                out[c["past"]] = np.zeros([(batch or 1) if d == "batch" else 0 if d == "past"
                                           else d for d in dims], np.float32)
                continue
            x = np.asarray(feeds[c["past"]])
            ok = x.ndim == len(dims) and all(
                d in ("batch", "past") or got == d for got, d in zip(x.shape, dims))
            if ok and batch is not None:
                ok = x.shape[dims.index("batch")] == batch
            here = x.shape[dims.index("past")] if ok else None
            if not ok or (past is not None and here != past):
                raise RuntimeError_(f"input {c['past']} has shape {list(x.shape)}; it takes "
                                    f"{_dims_text(dims)} with the batch of the tokens and "
                                    "the past length of the other keys and values")
            past = here
            out[c["past"]] = np.ascontiguousarray(x, dtype=np.float32)
        length = self.incremental["length"]
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
        self._save_stamp()
        return dict(zip(self.outputs, values))

    def run_segments(self, inputs: dict[str, np.ndarray], segment: int | None = None,
                     state: dict[str, np.ndarray] | None = None):
        """A long sequence, segment by segment, carrying the state: see runtime.segments."""
        from .segments import run_segments
        return run_segments(self, inputs, segment, state)

    def describe(self, result: dict[str, np.ndarray], top: int = 5) -> list[str]:
        lines = []
        for name, value in result.items():
            lines.append(f"output {name}: {value.dtype}{list(value.shape)}")
            if name == "logits" or value.dtype != np.float32 or value.ndim < 2 or top < 1:
                continue
            last = value[0, -1] if value.ndim == 3 else value[0]
            if not np.all(np.isfinite(last)) or abs(float(last.sum()) - 1) > 1e-3:
                continue
            best = np.argsort(-last, kind="stable")[:top]
            where = "last position of sequence 1" if value.ndim == 3 else "sequence 1"
            lines.append(f"  most likely ids at the {where}: " +
                         ", ".join(f"{int(k)} ({last[k]:.4f})" for k in best))
        return lines


def _stamp(p: Path) -> list:
    st = p.stat()
    return [st.st_size, st.st_mtime_ns]


def _io_of(arg) -> dict:
    """An input of a model fgc did not write, described from onnxruntime's view of it."""
    dims = [d if isinstance(d, int) else d or ("batch" if i == 0 else f"d{i}")
            for i, d in enumerate(arg.shape)]
    dtype = {"tensor(int64)": "int", "tensor(int32)": "int", "tensor(bool)": "bool"}.get(
        arg.type, "real")
    return {"name": arg.name, "dtype": dtype, "dims": dims, "lo": 0, "hi": 2**62}


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
    arr = np.array(data, dtype=np.int64 if spec["dtype"] == "int" else np.float32)
    if len(spec["dims"]) == 1:
        arr = arr[:, 0] if arr.shape[1] == 1 else arr.reshape(-1)
    return arr


def load(folder: str | Path, provider: str = "auto", **options) -> Model:
    return Model(folder, provider, **options)
