"""Compiling a spec to files: `fgc compile` and its Python API.

    from compiler.emit import compile_spec
    result = compile_spec("specs/gpt2.fgpt", "out/", target="torch", preset="small",
                          weights="gpt2.safetensors")
    result = compile_spec("specs/gpt2.fgpt", "out/", target="onnx", optimize="ort")

Files are written to a temporary name in the output folder and renamed into place, so a
failure never leaves half a file behind.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

from .errors import FgcError
from .pipeline import load


@dataclass
class Compiled:
    out_dir: Path
    files: list[Path]
    ignored: list[str] = field(default_factory=list)
    extras: list[str] = field(default_factory=list)
    total: int = 0


def prepare_output(out_dir: str) -> Path:
    """The output folder, created if needed; refuses a symlink or an unwritable folder."""
    p = Path(out_dir)
    if p.is_symlink():
        raise FgcError(f"output folder {out_dir} is a symbolic link; give a real folder", None)
    if p.exists() and not p.is_dir():
        raise FgcError(f"output path {out_dir} exists and is not a folder", None)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise FgcError(f"cannot create output folder {out_dir}: {e.strerror or e}", None) from None
    if not os.access(p, os.W_OK | os.X_OK):
        raise FgcError(f"output folder {out_dir} is not writable", None)
    return p


def readable(path: str) -> None:
    """Temporary files are created 0600; what fgc writes is read by others as usual."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, 0o666 & ~umask)


def write_text(path: Path, text: str) -> None:
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            f.write(text)
        readable(tmp)
        os.replace(tmp, path)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def compile_spec(spec_path: str, out_dir: str, target: str = "torch", preset: str | None = None,
                 sets: dict | None = None, weights: str | None = None, *,
                 opset: int | None = None, optimize: str | None = None,
                 external_data: bool = False, seed: int = 0, kv_cache: bool = False) -> Compiled:
    """Check a spec, then write the target's files; raises FgcError on any problem.

    torch: `model.py` (+ `weights.safetensors` with `weights`). onnx: `model.onnx` (+
    `model.onnx.data` past protobuf's 2 GiB or with `external_data`); `opset` (default
    23), `optimize="ort"` for onnxruntime's fused operators, `seed` for the random
    initialisation used without `weights`, `kv_cache` for the incremental form (past
    keys and values in, present ones out: see compiler/incremental.py); the torch
    module of an autoregressive spec always has it, as `step()`."""
    if target not in ("torch", "onnx"):
        raise FgcError(f"unknown target `{target}` (targets: torch, onnx)", None)
    spec = load(spec_path)
    errors, _ = spec.check()
    if errors:
        raise FgcError.many(errors)
    if preset is None and not sets:
        preset = spec.default_preset()
    if preset is not None and preset not in spec.presets():
        raise FgcError(f"`{spec.model.name}` has no preset `{preset}` (presets: "
                       f"{', '.join(spec.presets()) or 'none'})", None)
    cfg = spec.configure(preset, sets or {})
    if target == "onnx":
        return _compile_onnx(spec, cfg, preset, out_dir, weights, opset, optimize,
                             external_data, seed, kv_cache)
    if opset is not None or optimize is not None or external_data or kv_cache:
        raise FgcError("--opset, --optimize, --external-data and --kv-cache are for --target "
                       "onnx (the torch module has step())", None)
    from .backends.torch.codegen import Generator, Unsupported
    try:
        source = Generator(spec, spec.symbolic(), cfg.values, spec.sources, preset).generate()
    except Unsupported as e:
        raise FgcError(f"the torch backend cannot lower this spec: {e}", spec.model.span) \
            from None
    imported = None
    if weights is not None:
        from .weights import import_checkpoint
        imported = import_checkpoint(cfg, spec.model.checkpoint, weights)
    out = prepare_output(out_dir)
    files = [out / "model.py"]
    write_text(files[0], source)
    result = Compiled(out, files, total=cfg.total)
    if imported is not None:
        from .weights import write_safetensors
        write_safetensors(imported.tensors, out / "weights.safetensors")
        files.append(out / "weights.safetensors")
        result.ignored, result.extras = imported.ignored, imported.extras
    return result


def _check_room(total_params: int, out: Path) -> None:
    """Refuse sizes that cannot be written or held: float32 weights need 4 bytes each."""
    need = 4 * total_params
    free = shutil.disk_usage(out).free
    if need > free:
        raise FgcError(f"the weights take {_gib(need)} in float32 but {out} has {_gib(free)} "
                       "free", None, "choose a smaller preset, or --set smaller sizes")
    try:
        avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
    except (ValueError, OSError, AttributeError):
        return
    if need > avail:
        raise FgcError(f"the weights take {_gib(need)} in float32 but this machine has "
                       f"{_gib(avail)} of memory available to build them", None,
                       "choose a smaller preset, or --set smaller sizes")


def _gib(n: int) -> str:
    return f"{n / 2**30:,.1f} GiB"


def _compile_onnx(spec, cfg, preset, out_dir, weights, opset, optimize, external_data,
                  seed, kv_cache=False) -> Compiled:
    from .backends.onnx.graph import PROTOBUF_LIMIT
    from .backends.onnx.lower import DEFAULT_OPSET, Lowerer, Unsupported
    if optimize not in (None, "none", "ort"):
        raise FgcError(f"unknown --optimize `{optimize}` (choose ort)", None)
    out = prepare_output(out_dir)
    _check_room(cfg.total, out)
    imported = None
    if weights is not None:
        from .weights import import_checkpoint, onnx_key
        imported = import_checkpoint(cfg, spec.model.checkpoint, weights, key=onnx_key)
    external = external_data or 4 * cfg.total > PROTOBUF_LIMIT - 2**26  # room for the graph
    from .progress import note
    note(f"lowering {cfg.model.name} ({cfg.total:,} parameters) to ONNX"
         + ("" if imported else f", random weights (seed {seed})"))
    try:
        lw = Lowerer(spec, spec.symbolic(), cfg.values, opset=opset or DEFAULT_OPSET,
                     optimize=None if optimize == "none" else optimize,
                     weights=imported.tensors if imported else None, seed=seed,
                     preset=preset, kv_cache=kv_cache)
        model, blobs = lw.lower(DATA_FILE if external else None, stream=not external)
    except Unsupported as e:
        raise FgcError(f"the ONNX backend cannot lower this spec: {e}", spec.model.span) \
            from None
    files = write_onnx(model, blobs, out, external)
    result = Compiled(out, files, total=cfg.total)
    if imported is not None:
        result.ignored, result.extras = imported.ignored, imported.extras
    return result


DATA_FILE = "model.onnx.data"


def write_onnx(model, blobs: list, out: Path, external: bool) -> list[Path]:
    """model.onnx (and model.onnx.data) written in a temporary folder inside `out`, then
    renamed into place; a stale data file from an earlier compile is removed."""
    from .backends.onnx.graph import write_data, write_model
    from .progress import Progress, ProgressFile
    tmp = Path(tempfile.mkdtemp(dir=out, prefix=".fgc-"))
    progress = Progress(f"writing {out}", sum(arr.nbytes for _, arr in blobs))
    try:
        files = []
        with open(tmp / "model.onnx", "wb") as f:
            write_model(ProgressFile(f, progress), model, [] if external else blobs)
        files.append("model.onnx")
        if external:
            with open(tmp / DATA_FILE, "wb") as f:
                write_data(ProgressFile(f, progress), blobs)
            files.append(DATA_FILE)
        progress.close()
        for name in files:
            readable(str(tmp / name))
        for name in reversed(files):  # the data file first: model.onnx never points nowhere
            os.replace(tmp / name, out / name)
        if not external and (out / DATA_FILE).is_file():
            (out / DATA_FILE).unlink()
        return [out / name for name in files]
    finally:
        shutil.rmtree(tmp, ignore_errors=True)

