"""Compiling a spec to files: `fgc compile` and its Python API.

    from compiler.emit import compile_spec
    result = compile_spec("specs/gpt2.fgpt", "out/", target="torch", preset="small",
                          weights="gpt2.safetensors")

Files are written to a temporary name in the output folder and renamed into place, so a
failure never leaves half a file behind.
"""

from __future__ import annotations

import os
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
                 sets: dict | None = None, weights: str | None = None) -> Compiled:
    """Check a spec, then write the target's files; raises FgcError on any problem."""
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
    if target != "torch":
        raise FgcError(f"target `{target}` is not available in this version", None)
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
