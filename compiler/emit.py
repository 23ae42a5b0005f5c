"""Compiling a spec to files: `fgc compile` and its Python API.

    from compiler.emit import compile_spec
    result = compile_spec("specs/gpt2.fgpt", "out/", target="torch", preset="small",
                          weights="gpt2.safetensors")
    result = compile_spec("specs/gpt2.fgpt", "out/", target="onnx", optimize="ort")

The output folder changes as one unit (`OutputFolder`): every file is written into a
private staging folder first, and only when all of them are complete are they renamed into
place, under a lock on the folder, with fgc's outputs of an earlier compile that this one
does not write removed. A refused, failed or interrupted compile (Ctrl-C, SIGTERM, a full
disk) leaves the folder as it was and no temporaries; two compiles into one folder leave
one compile's files, never a mix; a folder that did not exist is created only on success.
"""

from __future__ import annotations

import contextlib
import copy
import fcntl
import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from runtime.files import (
    atomic_write,
    fsync_dir,
    interrupts_as_exceptions,
    open_atomic,
    umask_mode,
)

from .errors import FgcError
from .pipeline import load


@dataclass
class Compiled:
    out_dir: Path
    files: list[Path]
    ignored: list[str] = field(default_factory=list)
    total: int = 0
    warnings: list[str] = field(default_factory=list)  # NaN/Inf in the checkpoint


OUTPUTS = ("model.py", "weights.safetensors", "model.onnx", "model.onnx.data",
           "genai_config.json")  # a model folder's tokenizer files, copied with --genai,
# are not among them: a later compile leaves them as it finds them
# what fgc before 0.2 wrote beside a model: onnxruntime's optimised graphs and their stamp
# (now in the user's cache, see runtime/session.py); stale once the model changes
LEGACY = tuple(f"model.{tag}.opt.onnx{data}" for tag in ("cpu", "cuda", "tensorrt")
               for data in ("", ".data")) + (".fgc-session-cache.json",)
STAGE = ".fgc-stage-"


def prepare_output(out_dir: str) -> Path:
    """Check that `out_dir` can become fgc's output folder, without creating anything:
    refuses a symlink, a file, an empty name and a folder fgc cannot write. Returns it."""
    if not out_dir or not out_dir.strip():
        raise FgcError("the output folder is an empty name; give -o DIR", None)
    if "\0" in out_dir:
        raise FgcError("the output folder's name holds a NUL character", None)
    p = Path(out_dir)
    if p.is_symlink():
        raise FgcError(f"output folder {out_dir} is a symbolic link; give a real folder", None)
    if p.exists():
        if not p.is_dir():
            raise FgcError(f"output path {out_dir} exists and is not a folder", None)
        if not os.access(p, os.W_OK | os.X_OK):
            raise FgcError(f"output folder {out_dir} is not writable", None)
        return p
    ancestor = _existing_ancestor(p)
    if not ancestor.is_dir():
        raise FgcError(f"cannot create output folder {out_dir}: {ancestor} is not a folder",
                       None)
    if not os.access(ancestor, os.W_OK | os.X_OK):
        raise FgcError(f"cannot create output folder {out_dir}: {ancestor} is not writable",
                       None)
    return p


def _existing_ancestor(p: Path) -> Path:
    p = Path(os.path.abspath(p))
    while not p.exists() and not p.is_symlink() and p != p.parent:
        p = p.parent
    return p


class OutputFolder:
    """`-o DIR` as one unit: files are written into `self.stage`, then `commit` moves them
    into DIR together. Use as a context manager; leaving it without `commit` (an error, an
    interrupt) removes the staging folder and leaves DIR untouched.

        with OutputFolder("out/") as out:
            write_something(out.stage / "model.py")
            files = out.commit(["model.py"])
    """

    def __init__(self, out_dir: str):
        self.path = prepare_output(out_dir)
        self.stage: Path | None = None
        self._stage_fd: int | None = None
        self._signals = None

    def __enter__(self) -> OutputFolder:
        self._signals = interrupts_as_exceptions()
        self._signals.__enter__()
        try:
            if self.path.is_dir():
                where, prefix = self.path, STAGE
            else:
                where, prefix = _existing_ancestor(self.path), f".{self.path.name}{STAGE}"
            try:
                self.stage = Path(tempfile.mkdtemp(dir=where, prefix=prefix))
            except OSError as e:
                raise FgcError(f"cannot write in {where}: {e.strerror or e}", None) from None
            # held for the compile's life: another fgc knows a stage it cannot lock is live
            self._stage_fd = _lock(self.stage, blocking=True)
        except BaseException:
            self._signals.__exit__(None, None, None)
            raise
        return self

    def __exit__(self, kind, error, tb) -> None:
        try:
            self._discard()
        finally:
            self._signals.__exit__(kind, error, tb)
        if isinstance(error, OSError):  # a full disk, a quota, a file too large
            raise FgcError(f"cannot write {self.path}: {error.strerror or error}; the folder "
                           "is as it was", None) from None

    def _discard(self) -> None:
        if self._stage_fd is not None:
            os.close(self._stage_fd)
            self._stage_fd = None
        if self.stage is not None:
            shutil.rmtree(self.stage, ignore_errors=True)
            self.stage = None

    def commit(self, names: list[str]) -> list[Path]:
        """Move the staged `names` into the output folder, in order (a data file before the
        graph that points into it), remove fgc's other outputs there, and return the paths."""
        out = self.path
        if not out.exists() and not out.is_symlink():
            out.parent.mkdir(parents=True, exist_ok=True)
            os.chmod(self.stage, umask_mode(0o777))
            try:
                os.rename(self.stage, out)  # fails if another compile made DIR meanwhile
            except OSError:
                pass
            else:
                self.stage = None
                fsync_dir(out.parent)
                return [out / name for name in names]
        try:
            dir_fd = os.open(out, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
        except OSError as e:
            raise FgcError(f"cannot write output folder {out}: {e.strerror or e}", None) \
                from None
        try:
            fcntl.flock(dir_fd, fcntl.LOCK_EX)  # one commit at a time in one folder
            for name in names:
                os.replace(self.stage / name, name, dst_dir_fd=dir_fd)
            for name in OUTPUTS + LEGACY:
                if name not in names:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(name, dir_fd=dir_fd)
            os.fsync(dir_fd)
            _remove_dead_stages(out, STAGE, keep=self.stage)
        finally:
            os.close(dir_fd)  # closing releases the lock
        self._discard()
        return [out / name for name in names]


def _lock(path: Path, blocking: bool) -> int | None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | (0 if blocking else fcntl.LOCK_NB))
    except OSError:
        os.close(fd)
        return None
    return fd


def _remove_dead_stages(folder: Path, prefix: str, keep: Path | None) -> None:
    """Staging folders of compiles that were killed (SIGKILL, power loss): nobody holds
    their lock any more."""
    with contextlib.suppress(OSError):
        for entry in os.scandir(folder):
            path = Path(entry.path)
            if not entry.name.startswith(prefix) or path == keep or \
                    not entry.is_dir(follow_symlinks=False):
                continue
            fd = _lock(path, blocking=False)
            if fd is not None:
                shutil.rmtree(path, ignore_errors=True)
                os.close(fd)


UNREAD = object()  # compile_spec's `reading` when the caller has not read config.json


def compile_spec(spec_path: str, out_dir: str, target: str = "torch", preset: str | None = None,
                 sets: dict | None = None, weights: str | None = None, *,
                 opset: int | None = None, optimize: str | None = None,
                 external_data: bool = False, seed: int = 0, kv_cache: bool = False,
                 strict: bool = False, dtype: str | None = None, quantize: str | None = None,
                 block_size: int | None = None, quantize_embeddings: bool = False,
                 genai: bool = False, last_position: bool = False,
                 outputs: list[str] | None = None, reading=UNREAD) -> Compiled:
    """Check a spec, then write the target's files; raises FgcError on any problem.

    torch: `model.py` (+ `weights.safetensors` with `weights`). onnx: `model.onnx` (+
    `model.onnx.data` past protobuf's 2 GiB or with `external_data`); `opset` (default
    23), `optimize="ort"` for onnxruntime's fused operators, `seed` for the random
    initialisation used without `weights`, `kv_cache` for the incremental form (past
    keys and values in, present ones out: see compiler/passes/incremental.py); the torch
    module of an autoregressive spec always has it, as `step()`. Checkpoint tensors
    holding NaN or Inf are named in `Compiled.warnings`; with `strict`, they are an error.
    `dtype` (float32 by default, float16, bfloat16 for torch) is the precision of the
    weights, the real inputs and outputs and the computations, but for what accumulates in
    float32 (compiler/lowering/precision.py): torch's weights.safetensors and `build()`'s
    module, the ONNX graph's initializers, inputs, outputs and nodes.
    `quantize` ("int4", "int8"; ONNX) stores each product's weight matrix in blocks of
    `block_size` (32) as onnxruntime's MatMulNBits reads them, and with
    `quantize_embeddings` the lookups' tables too (compiler/backends/onnx/quantize.py).
    `genai` (ONNX, with `kv_cache`) names the graph's tensors as onnxruntime-genai does and
    writes its genai_config.json, with a model folder's tokenizer files when `weights` is
    one (compiler/backends/onnx/genai.py). `last_position` computes the outputs at the last
    position alone, [batch, 1, ...], as generation reads them (compiler/lowering/last.py).
    `outputs` (ONNX) names the outputs the graph computes: some of the spec's, and its
    `logits` (compiler/lowering/signature.py, `select_outputs`); the cache's presents and
    the state stay. With `genai` it is the logits alone unless given. `reading` is
    config_json.configuration's result for these arguments where the caller has it
    already (the CLI prints it first)."""
    if target not in ("torch", "onnx"):
        raise FgcError(f"unknown target `{target}` (targets: torch, onnx)", None)
    if genai and (target != "onnx" or not kv_cache):
        raise FgcError("--genai is for --target onnx with --kv-cache: onnxruntime-genai runs "
                       "the incremental form", None)
    from .lowering.precision import precision
    prec = precision(dtype, target)
    quant = _quantization(target, quantize, block_size, quantize_embeddings)
    spec = load(spec_path)
    errors, _ = spec.check()
    if errors:
        raise FgcError.many(errors)
    # `--weights FOLDER` with a config.json: the hyperparameters the spec's config block
    # reads from it, with --set over them (config_json.configuration), unless the caller
    # has read them already (`reading`: what configuration() gave it, None included)
    if reading is UNREAD:
        from .config_json import configuration
        reading = configuration(spec, weights, preset, sets)
    if reading is not None:
        sets = reading.sets
    if preset is None and not sets:
        preset = spec.default_preset()
    if preset is not None and preset not in spec.presets():
        raise FgcError(f"`{spec.model.name}` has no preset `{preset}` (presets: "
                       f"{', '.join(spec.presets()) or 'none'})", None)
    cfg = spec.configure(preset, sets or {}, reading and reading.label(sets))
    from .lowering.precision import check_range
    check_range(prec, cfg.model, cfg.functions)  # a constant the precision cannot hold
    from .passes.budget import check_budget
    # refuse what cannot finish, before any work
    check_budget(spec, cfg, target, kv_cache, optimize if target == "onnx" else None)
    sym = _lowered(spec, last_position)
    if target == "onnx":
        from .lowering.signature import logits_alone, select_outputs, signature_form
        if genai and outputs is None:  # onnxruntime-genai reads the logits alone
            outputs = logits_alone(sym.model, sym.functions)
        if outputs is not None:  # an output the model lacks: refused before any work
            select_outputs(signature_form(sym.model, sym.functions), outputs)
        prepare_output(out_dir)
        return _compile_onnx(spec, cfg, preset, out_dir, weights, opset, optimize,
                             external_data, seed, kv_cache, strict, prec, quant, genai=genai,
                             sym=sym, outputs=outputs)
    if opset is not None or optimize is not None or external_data or kv_cache or \
            outputs is not None:
        raise FgcError("--opset, --optimize, --external-data, --kv-cache and --outputs are for "
                       "--target onnx (the torch module has step() and logits())", None)
    prepare_output(out_dir)  # refuse an unusable folder before the work, create it after
    from .backends.torch.codegen import Generator, Unsupported
    try:
        source = Generator(spec, sym, cfg.values, spec.sources, preset,
                           prec).generate()
    except Unsupported as e:
        raise FgcError(f"the torch backend cannot lower this spec: {e}",
                       e.span or spec.model.span) from None
    imported = None
    if weights is not None:
        from .weights import import_checkpoint
        imported = _imported(import_checkpoint(cfg, spec.model.checkpoint, weights), weights)
    with imported or contextlib.nullcontext(), OutputFolder(out_dir) as out:
        names = []
        if imported is not None:
            from runtime.progress import Progress

            from .lazy import converted, float_dtype
            from .weights import write_safetensors
            tensors = imported.tensors
            if prec.half:  # each converted as it is written (compiler/lazy.py)
                tensors = {k: converted(t, float_dtype(prec.name)) for k, t in tensors.items()}
            progress = Progress(f"writing {out.path / 'weights.safetensors'}",
                                sum(t.nbytes for t in tensors.values()), items=len(tensors))
            write_safetensors(tensors, out.stage / "weights.safetensors", progress)
            progress.close()
            names.append("weights.safetensors")
        # the tensors were scanned as they were written: refused here, nothing is in place
        warnings = _nonfinite(imported, weights, strict)
        atomic_write(out.stage / "model.py", source)
        names.append("model.py")
        result = Compiled(out.path, out.commit(names), total=cfg.total, warnings=warnings)
    if imported is not None:
        result.ignored = imported.ignored
    return result


def _quantization(target: str, kind: str | None, block: int | None, embeddings: bool):
    """The ONNX backend's Quantization for --quantize (None without it); FgcError for a
    flag that goes with it given without it, or given for torch."""
    if kind is None and block is None and not embeddings:
        return None
    if target != "onnx":
        raise FgcError("--quantize, --block-size and --quantize-embeddings are for --target "
                       "onnx", None)
    if kind is None:
        raise FgcError("--block-size and --quantize-embeddings go with --quantize int4|int8",
                       None)
    from .backends.onnx.quantize import quantization
    try:
        return quantization(kind, block, embeddings)
    except ValueError as e:
        raise FgcError(str(e), None) from None


def _check_room(total_params: int, out: Path, prec) -> None:
    """Refuse sizes that cannot be written: float32 weights need 4 bytes each on disk,
    float16 2 (not in memory: the weights are written one tensor at a time,
    compiler/lazy.py)."""
    need = prec.itemsize * total_params
    free = shutil.disk_usage(out).free
    if need > free:
        raise FgcError(f"the weights take {_gib(need)} in {prec.name} but {out} has "
                       f"{_gib(free)} free", None, "choose a smaller preset, or --set smaller "
                       "sizes")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _imported(imported, weights: str):
    """A checkpoint just imported (headers read, nothing else), said as a phase line."""
    from runtime.progress import human_size, note
    note(f"read {weights}: {len(imported.tensors):,} tensors, "
         f"{human_size(sum(t.nbytes for t in imported.tensors.values()))} in float32")
    return imported


def _nonfinite(imported, weights: str | None, strict: bool) -> list[str]:
    """The checkpoint's tensors that hold NaN or Inf: a warning, or with `strict` an error.
    Called once the tensors were written (each is scanned as it is read); any the writing
    did not read are read now."""
    if imported is None:
        return []
    imported.scan_rest()
    if not imported.nonfinite:
        return []
    from .weights import nonfinite_message
    message = nonfinite_message(imported.nonfinite, weights)
    if strict:
        raise FgcError(message, None, "fix or drop these tensors, or compile without --strict")
    return [message]


def _lowered(spec, last_position: bool):
    """The symbolic configuration both backends lower: the spec's, or with
    `last_position` its outputs at the last position alone (lowering/last.py)."""
    sym = spec.symbolic()
    if not last_position:
        return sym
    from .lowering.last import last_position as at_last
    cut = copy.copy(sym)  # its functions too, which the pipeline attaches
    cut.model = at_last(sym.model, sym.functions)
    return cut


def _compile_onnx(spec, cfg, preset, out_dir, weights, opset, optimize, external_data,
                  seed, kv_cache, strict, prec, quant, genai, sym, outputs=None) -> Compiled:
    if optimize not in (None, "none", "ort"):
        raise FgcError(f"unknown --optimize `{optimize}` (choose ort)", None)
    _check_room(cfg.total, _existing_ancestor(prepare_output(out_dir)), prec)
    imported = None
    if weights is not None:
        from .weights import import_checkpoint, onnx_key
        imported = _imported(import_checkpoint(cfg, spec.model.checkpoint, weights,
                                               key=onnx_key), weights)
    with imported or contextlib.nullcontext():
        return _lower_onnx(spec, cfg, preset, out_dir, weights, opset, optimize,
                           external_data, seed, kv_cache, strict, imported, prec, quant,
                           genai=genai, sym=sym, outputs=outputs)


def _lower_onnx(spec, cfg, preset, out_dir, weights, opset, optimize, external_data, seed,
                kv_cache, strict, imported, prec, quant, genai, sym, outputs=None) -> Compiled:
    from .backends.onnx.graph import PROTOBUF_LIMIT
    from .backends.onnx.lower import DEFAULT_OPSET, Lowerer, Unsupported
    # past protobuf's limit, less room for the graph, the weights go to model.onnx.data
    external = external_data or prec.itemsize * cfg.total > PROTOBUF_LIMIT - 2**26
    from runtime.progress import note
    note(f"lowering {cfg.model.name} ({cfg.total:,} parameters) to ONNX"
         + ("" if imported else f", random weights (seed {seed})"))
    try:
        lw = Lowerer(spec, sym, cfg.values, opset=opset or DEFAULT_OPSET,
                     optimize=None if optimize == "none" else optimize,
                     weights=imported.tensors if imported else None, seed=seed,
                     preset=preset, kv_cache=kv_cache, precision=prec, quantize=quant,
                     genai=genai, outputs=outputs)
        model, blobs = lw.lower(DATA_FILE if external else None, stream=not external)
    except Unsupported as e:
        raise FgcError(f"the ONNX backend cannot lower this spec: {e}",
                       e.span or spec.model.span) from None
    warnings: list[str] = []

    def checked() -> None:  # the weights were scanned as they were written
        warnings.extend(_nonfinite(imported, weights, strict))
    also = None
    if genai:  # genai_config.json and the model folder's tokenizer files beside the graph
        from .backends.onnx import genai as og
        folder = weights if weights is not None and os.path.isdir(weights) else None
        config, tokenizer, said = og.prepare(lw, folder)
        warnings.extend(said)

        def also(stage: Path) -> list[str]:
            return og.write(stage, config, tokenizer)
    files = write_onnx(model, blobs, out_dir, external, checked, also)
    result = Compiled(Path(out_dir), files, total=cfg.total, warnings=warnings)
    if imported is not None:
        result.ignored = imported.ignored
    return result


DATA_FILE = "model.onnx.data"


def write_onnx(model, blobs: list, out_dir: str | Path, external: bool,
               before_commit=None, also=None) -> list[Path]:
    """model.onnx (and model.onnx.data) into `out_dir` as one unit (`OutputFolder`): a data
    file of an earlier compile that this one does not write is removed. The initializers
    (numpy arrays or Lazy tensors) are materialized and written one at a time;
    `before_commit()` runs once all are written, and an error it raises leaves `out_dir`
    as it was."""
    from runtime.progress import Progress, ProgressFile

    from .backends.onnx.graph import write_data, write_model
    with OutputFolder(str(out_dir)) as out:
        progress = Progress(f"writing {out.path}", sum(arr.nbytes for _, arr in blobs),
                            items=len(blobs))
        names = []
        if external:
            with open_atomic(out.stage / DATA_FILE) as f:
                write_data(ProgressFile(f, progress), blobs)
            names.append(DATA_FILE)
        with open_atomic(out.stage / "model.onnx") as f:
            write_model(ProgressFile(f, progress), model, [] if external else blobs)
        names.append("model.onnx")
        progress.close()
        if also is not None:  # more files beside the graph: also(stage) writes them there
            names += also(out.stage)
        if before_commit is not None:
            before_commit()
        return out.commit(names)
