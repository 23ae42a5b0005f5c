"""The `fgc` command line: check, params, compile, run, generate, diff, render, ir.

Exit codes (README's "Command line" lists them too): 0 success; 1 a problem in a spec
(printed as `file:line:col: error: message`, the line, a caret and `help:`) or in a file it
reads or writes (a checkpoint, a compiled model, an output that cannot be written); 2 a
usage error: the command line itself is wrong (an unknown option or a bad value, a missing
file, an unknown preset or `--set` name), checked before any work, ideally by argparse's
`type=` functions below; 3 an internal error, a bug in fgc, with a one-line summary and no
traceback (FGC_DEBUG=1 shows it). `fgc diff` answers like diff(1): 0 equivalent, 1
different, 2 trouble.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from fractions import Fraction

from runtime.files import Terminated

EXIT_OK, EXIT_SPEC, EXIT_USAGE, EXIT_INTERNAL = 0, 1, 2, 3


class _Parser(argparse.ArgumentParser):
    def error(self, message: str):  # usage errors exit 2 with one line, like argparse
        self.print_usage(sys.stderr)
        print(f"fgc: error: {message}", file=sys.stderr)
        raise SystemExit(EXIT_USAGE)


def build_parser() -> argparse.ArgumentParser:
    p = _Parser(prog="fgc", description="A compiler for transformer architectures written "
                "as boxed definitions (.fgpt).")
    p.add_argument("--version", action="version", version=_version())
    sub = p.add_subparsers(dest="command", required=True, parser_class=_Parser)

    c = sub.add_parser("check", help="check shapes, presets and expectations of specs")
    c.add_argument("files", nargs="+", metavar="FILE")
    c.add_argument("--format", choices=["text", "json", "github"], default="text")
    c.add_argument("--strict", action="store_true", help="treat warnings as errors")
    c.add_argument("--weights", metavar="FOLDER",
                   help="with one SPEC: the configuration a model folder's config.json gives "
                        "it, and whether the folder's tensors are the spec's exactly")
    c.add_argument("--tp", type=_positive_int, metavar="N",
                   help="also check that N ranks of tensor parallelism can split every "
                        "parameter the plan splits, at every preset")

    q = sub.add_parser("params", help="count parameters exactly, with the closed formula "
                       "(several files: each, and together with shared tensors once)")
    q.add_argument("files", nargs="+", metavar="FILE")
    _config_args(q)
    q.add_argument("--format", choices=["text", "json"], default="text")
    q.add_argument("--by-module", action="store_true", help="break the count down by module")
    q.add_argument("--tp", type=_positive_int, metavar="N",
                   help="per-rank memory and communication with N ranks of tensor parallelism "
                        "(parallelize()'s plan; docs/distributed.md)")
    q.add_argument("--fsdp", type=_positive_int, metavar="M", help="... and M ranks of FSDP")
    q.add_argument("--batch", type=_positive_int, metavar="B",
                   help="sequences per step for the activations and traffic (default 1)")
    q.add_argument("--seq", type=_positive_int, metavar="T",
                   help="positions per sequence (default: the context at the configuration)")
    q.add_argument("--no-sequence-parallel", dest="sequence", action="store_false",
                   help="... as parallelize(sequence=False): the values between the split "
                        "computations whole on every rank")

    k = sub.add_parser("compile", help="emit a PyTorch module (model.py) or an ONNX graph "
                       "(model.onnx)")
    k.add_argument("file", metavar="SPEC")
    k.add_argument("--target", choices=["torch", "onnx"], default="torch")
    _config_args(k)
    k.add_argument("--weights", metavar="W",
                   help="a checkpoint in the released model's own tensor names: a "
                        ".safetensors file, a sharded model.safetensors.index.json, a model "
                        "folder (save_pretrained's), or pytorch_model.bin (read with torch)")
    k.add_argument("-o", "--out", metavar="DIR", required=True, type=_out_dir,
                   help="output folder")
    k.add_argument("--opset", type=_opset, metavar="N",
                   help="onnx: the ONNX opset, 18 to 25 (default 23, the first with Attention, "
                        "RMSNormalization and RotaryEmbedding); docs/onnx.md gives the oldest "
                        "onnxruntime that reads each")
    k.add_argument("--optimize", choices=["none", "ort"],
                   help="onnx: `ort` emits onnxruntime's fused operators")
    k.add_argument("--external-data", action="store_true",
                   help="onnx: weights in model.onnx.data (automatic past 2 GiB)")
    k.add_argument("--kv-cache", action="store_true",
                   help="onnx: the incremental form of an autoregressive spec, with past "
                        "keys/values per layer in and present ones out")
    k.add_argument("--genai", action="store_true",
                   help="onnx, with --kv-cache: onnxruntime-genai's names (input_ids, "
                        "past_key_values.{l}.key, ...) and its genai_config.json, with the "
                        "model folder's tokenizer files (docs/generation.md)")
    k.add_argument("--last-position", action="store_true",
                   help="the outputs at the last position alone ([batch, 1, ...]), as "
                        "generation reads them: a prompt computes the head for one position "
                        "(autoregressive specs; docs/generation.md)")
    k.add_argument("--outputs", type=_names, metavar="NAMES",
                   help="onnx: the outputs the graph computes, by name, comma-separated: "
                        "some of the spec's, and `logits` (the final Softmax's input), the "
                        "one output generation reads, with no Softmax computed")
    k.add_argument("--strict", action="store_true",
                   help="checkpoint tensors holding NaN or Inf are an error, not a warning")
    k.add_argument("--seed", type=_seed, default=0,
                   help="onnx: seed of the random weights used without --weights")
    k.add_argument("--quantize", choices=["int4", "int8"],
                   help="onnx: weight matrices in blocks of 4- or 8-bit integers with a scale "
                        "each (onnxruntime's MatMulNBits); see docs/onnx.md")
    k.add_argument("--block-size", type=_block_size, metavar="B",
                   help="onnx, with --quantize: weights per block (a power of two >= 16; "
                        "default 32)")
    k.add_argument("--quantize-embeddings", action="store_true",
                   help="onnx, with --quantize: embedding tables too (GatherBlockQuantized)")
    k.add_argument("--dtype", choices=["float32", "float16", "bfloat16"],
                   help="the precision of the weights and the computations (default float32; "
                        "norms and softmax accumulate in float32); bfloat16 is for --target "
                        "torch")

    u = sub.add_parser("run", help="run a compiled ONNX model (or a spec) with onnxruntime")
    u.add_argument("target", metavar="DIR|SPEC")
    _config_args(u)
    u.add_argument("--provider", choices=["auto", "tensorrt", "cuda", "cpu"], default="auto")
    u.add_argument("--tokens", metavar="IDS",
                   help="0-based token ids for the first input, comma-separated "
                        "(several sequences: separate them with `;`)")
    u.add_argument("--input", metavar="NAME=VALUES", action="append", default=[],
                   help="values for another input, as --tokens (repeatable)")
    u.add_argument("--weights", metavar="W", help="with a SPEC: its checkpoint (a file, a "
                   "shard index or a model folder, as for compile)")
    u.add_argument("--optimize", choices=["none", "ort"], help="with a SPEC: as for compile")
    u.add_argument("--top", type=_count, default=5, metavar="K",
                   help="how many of the most likely ids to show (default 5)")

    d = sub.add_parser("diff", help="how two architectures differ (exit 0 equivalent, "
                       "1 different, 2 trouble)")
    d.add_argument("a", metavar="A.fgpt")
    d.add_argument("b", metavar="B.fgpt")
    d.add_argument("--preset", metavar="P", help="a preset for both sides")
    d.add_argument("--set", metavar="K=V", action="append", default=[], type=_set_arg,
                   help="override a hyperparameter on both sides (repeatable)")
    for s in ("a", "b"):
        d.add_argument(f"--preset-{s}", metavar="P", help=f"a preset for {s.upper()} only")
        d.add_argument(f"--set-{s}", metavar="K=V", action="append", default=[],
                       type=_set_arg,
                       help=f"override a hyperparameter of {s.upper()} only")
    d.add_argument("--format", choices=["text", "json"], default="text")

    w = sub.add_parser("render", help="typeset a spec: LaTeX boxes, a Markdown summary, or a "
                       "Graphviz diagram (DOT, or SVG with Graphviz installed)")
    w.add_argument("file", metavar="SPEC")
    w.add_argument("--to", choices=["latex", "markdown", "dot", "svg"], required=True)
    _config_args(w)
    w.add_argument("--stdlib", action="store_true",
                   help="latex: also box the standard-library modules the model uses")
    w.add_argument("-o", "--out", metavar="FILE", type=_out_file,
                   help="write here (default: standard output)")

    g = sub.add_parser("generate", help="generate token ids from a prompt, with the key/value "
                       "cache of an autoregressive spec (ONNX or PyTorch)")
    g.add_argument("target", metavar="SPEC|DIR")
    _config_args(g)
    g.add_argument("--weights", metavar="W", help="with a SPEC: its checkpoint (a file, a "
                   "shard index or a model folder, as for compile)")
    g.add_argument("--prompt-ids", metavar="IDS", required=True,
                   help="0-based token ids, comma-separated; several prompts separated by "
                        "`;` (of any lengths where the model takes a padding mask)")
    g.add_argument("--max-new-tokens", type=_count, metavar="N", required=True,
                   help="at most N new ids per prompt")
    g.add_argument("--max-length", type=_positive_int, metavar="N",
                   help="stop when a sequence has N positions, prompt included")
    g.add_argument("--stop-ids", metavar="IDS", default="",
                   help="ids that end a sequence (kept in the output), comma-separated; "
                        "one list per prompt separated by `;`")
    g.add_argument("--greedy", action="store_true", help="the most likely id (the default)")
    g.add_argument("--temperature", type=_positive_float, metavar="T",
                   help="sample, with the logits divided by T")
    g.add_argument("--top-k", type=_positive_int, metavar="K",
                   help="sample among the K likeliest ids")
    g.add_argument("--top-p", type=_top_p, metavar="P",
                   help="sample among the likeliest ids whose probability reaches P")
    g.add_argument("--seed", type=_seed, metavar="S", help="seed of the sampler")
    g.add_argument("--input", metavar="NAME=VALUES", action="append", default=[],
                   help="another input, the same at every step (an encoder's source)")
    g.add_argument("--backend", choices=["onnx", "torch"],
                   help="with a SPEC: what to compile to (default onnx)")
    g.add_argument("--provider", choices=["auto", "tensorrt", "cuda", "cpu"], default="auto",
                   help="onnx: the execution provider")
    g.add_argument("--no-cache", action="store_true",
                   help="recompute the whole prefix at every step")
    g.add_argument("--huge-pages", action="store_true",
                   help="onnx on CPU: the session's memory onto 2 MiB pages (Linux; loads "
                   "slower, decodes faster: for long runs)")
    g.add_argument("--prepack", action="store_true",
                   help="torch on CPU: keep each weight reordered for oneDNN (decodes "
                   "faster, twice the weights' memory)")

    h = sub.add_parser("cache", help="show or clear fgc's caches (parsed specs, parse tables, "
                       "onnxruntime's optimised graphs, CPU kernel choices)")
    h.add_argument("action", choices=["info", "clear"])

    r = sub.add_parser("ir", help="print the elaborated IR")
    r.add_argument("file", metavar="FILE", nargs="?", help="the spec (not with json-schema)")
    _config_args(r)
    r.add_argument("--symbolic", action="store_true",
                   help="keep hyperparameters symbolic (the default without --preset/--set)")
    r.add_argument("--lowered", action="store_true",
                   help="the program both backends print: after the lowering (lowered "
                   "operations such as lookups and masks by meaning; docs/architecture.md)")
    r.add_argument("--format", choices=["text", "json", "json-schema"], default="text",
                   help="json: the IR as a versioned JSON document; json-schema: that "
                   "document's JSON schema")
    return p


def _config_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--preset", metavar="P", help="a preset defined in the spec")
    p.add_argument("--set", metavar="K=V", action="append", default=[], type=_set_arg,
                   help="override one hyperparameter (repeatable)")


# ---------------------------------------------------------------- option values
# argparse calls these on the text of an option; ArgumentTypeError makes a usage error
# (exit 2) naming the option, before any spec is read.

INT64 = 2**63


def _int(text: str, lo: int, hi: int, what: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{_short(text)}` is not a whole number") from None
    if not lo <= value <= hi:
        raise argparse.ArgumentTypeError(f"{_short(text)}: {what}")
    return value


def _count(text: str) -> int:
    return _int(text, 0, INT64 - 1, "give a number >= 0")


def _positive_int(text: str) -> int:
    return _int(text, 1, INT64 - 1, "give a number >= 1")


def _seed(text: str) -> int:
    return _int(text, 0, 2**64 - 1, "a seed is a whole number from 0 to 2^64 - 1")


def _opset(text: str) -> int:
    from .backends.onnx.lower import MAX_OPSET, MIN_OPSET
    return _int(text, MIN_OPSET, MAX_OPSET, f"the ONNX backend writes opsets {MIN_OPSET} to "
                f"{MAX_OPSET}")


def _block_size(text: str) -> int:
    value = _int(text, 16, 2**16, "a block is a power of two from 16 to 65536 weights")
    if value & (value - 1):
        raise argparse.ArgumentTypeError(f"{value}: a block is a power of two (16, 32, 64, "
                                         "...) of weights")
    return value


def _real(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"`{_short(text)}` is not a number") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"{_short(text)}: give a finite number")
    return value


def _positive_float(text: str) -> float:
    value = _real(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{_short(text)}: give a number > 0")
    return value


def _top_p(text: str) -> float:
    value = _real(text)
    if not 0 < value <= 1:  # worded as runtime.generate words it
        raise argparse.ArgumentTypeError(f"top-p {value}: give a number in (0, 1]")
    return value


def _names(text: str) -> list[str]:
    """`--outputs A,B`: names, in the order given, each once."""
    names = [n.strip() for n in text.split(",")]
    if not all(names):
        raise argparse.ArgumentTypeError(f"`{_short(text)}`: give names separated by commas")
    return list(dict.fromkeys(names))


def _set_arg(text: str) -> str:
    """`--set NAME=VALUE`, kept as text (the commands parse it again) once it reads."""
    from .errors import FgcError
    from .pipeline import parse_set
    try:
        parse_set(text)
    except ValueError as e:
        reason = None
        name, _, value = text.partition("=")
        value = value.strip()
        if value:
            from lark import Token

            from .syntax.nodes import parse_number
            tok = Token("INT", value)
            tok.line = tok.column = tok.end_line = tok.end_column = 1
            try:
                parse_number(tok, "--set")
            except FgcError as number:
                reason = number.diagnostics[0].message
            except (ValueError, ArithmeticError, IndexError):
                pass
        plain = str(e).removeprefix("--set").lstrip(": ")
        raise argparse.ArgumentTypeError(f"{name.strip()}: {reason}" if reason else plain) \
            from None
    return text


def _path_text(text: str, what: str) -> str:
    if not text.strip():
        raise argparse.ArgumentTypeError(f"{what} is an empty name")
    if "\0" in text:
        raise argparse.ArgumentTypeError(f"{what} holds a NUL character")
    return text


def _out_dir(text: str) -> str:
    return _path_text(text, "the output folder")


def _out_file(text: str) -> str:
    """`render -o FILE`: a file's name, not a folder (`.`, `/`, `out/`)."""
    _path_text(text, "the output file")
    if text.endswith(("/", os.sep)) or os.path.basename(text) in ("", ".", "..") or \
            os.path.isdir(text):
        raise argparse.ArgumentTypeError(f"{_short(text)} is a folder; give a file name")
    return text


def _short(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def cmd_cache(args) -> int:
    """`fgc cache info|clear`: what fgc keeps in the user's cache folder."""
    import shutil

    from runtime.files import cache_home
    from runtime.kernels import FILE as KERNEL_FILE
    from runtime.progress import human_size
    root = cache_home()
    sizes: dict[str, list[int]] = {}
    if root.is_dir() and not root.is_symlink():
        for path in root.rglob("*"):
            if path.is_file() and not path.is_symlink():
                where = path.relative_to(root).parts
                kind = ("onnxruntime's optimised graphs" if where[0] == "onnxruntime"
                        else "CPU kernel choices" if where == (KERNEL_FILE,)
                        else "parse tables" if path.name.startswith("grammar-")
                        else "parsed specs")
                entry = sizes.setdefault(kind, [0, 0])
                entry[0] += 1
                entry[1] += path.stat().st_size
    if args.action == "info":
        print(f"cache folder {root}")
        for kind, (count, size) in sorted(sizes.items()):
            print(f"  {kind}: {count} file{'s' * (count != 1)}, {human_size(size)}")
        if not sizes:
            print("  empty")
        return EXIT_OK
    if root.is_symlink():
        print(f"fgc: error: {root} is a symbolic link; not removing it", file=sys.stderr)
        return EXIT_USAGE
    shutil.rmtree(root, ignore_errors=True)
    freed = sum(size for _, size in sizes.values())
    print(f"removed {root} ({human_size(freed)})")
    return EXIT_OK


def _version() -> str:
    try:
        from importlib.metadata import version
        return "fgc " + version("fgc")
    except Exception:  # noqa: BLE001 - not installed as a distribution
        return "fgc (development)"


def main(argv: list[str] | None = None) -> int:
    sys.setrecursionlimit(max(sys.getrecursionlimit(), 10_000))
    _names_as_bytes()
    args = build_parser().parse_args(argv)
    try:
        return {"check": cmd_check, "params": cmd_params, "ir": cmd_ir,
                "compile": cmd_compile, "run": cmd_run, "diff": cmd_diff,
                "generate": cmd_generate,
                "render": cmd_render, "cache": cmd_cache}[args.command](args)
    except BrokenPipeError:
        return EXIT_OK
    except KeyboardInterrupt:
        return 130
    except Terminated as e:  # SIGTERM/SIGHUP while writing: temporaries already removed
        return 128 + e.signum
    except Exception as e:  # noqa: BLE001 - the last line of defence against a traceback
        if os.environ.get("FGC_DEBUG"):
            raise
        print(f"fgc: internal error: {_bug_line(e)}", file=sys.stderr)
        print("fgc: this is a bug in fgc, not in your input; please report it with the "
              "command and the spec (FGC_DEBUG=1 shows the traceback)", file=sys.stderr)
        return EXIT_INTERNAL


def _names_as_bytes() -> None:
    """A file name that is not UTF-8 reaches Python as surrogate escapes; print it as the
    bytes it is (as ls does) rather than fail on it, on a terminal whose locale makes
    standard output strict (en_US.UTF-8; C.UTF-8 already escapes)."""
    for stream in (sys.stdout, sys.stderr):
        if getattr(stream, "errors", None) == "strict" and hasattr(stream, "reconfigure"):
            try:
                stream.reconfigure(errors="surrogateescape")
            except (ValueError, OSError, AttributeError):  # not a text stream we can change
                pass


def _bug_line(e: BaseException) -> str:
    """`Type: first line of the message`, at most 200 characters."""
    first = next((line for line in str(e).splitlines() if line.strip()), "")
    text = f"{type(e).__name__}: {first.strip()}" if first else type(e).__name__
    return _short(text, 200)


# ---------------------------------------------------------------- helpers


def _color() -> bool:
    return sys.stderr.isatty() and not os.environ.get("NO_COLOR")


def _print_diagnostics(diags, sources, stream=None) -> None:
    from .errors import render
    stream = stream or sys.stderr
    color = _color() and stream is sys.stderr
    for d in diags:
        text = render(d, sources)
        if color:
            tint = "\033[1;31m" if d.severity == "error" else "\033[1;33m"
            text = text.replace(f"{d.severity}:", f"{tint}{d.severity}:\033[0m", 1)
        print(text, file=stream)


def _not_a_file(path: str, folders: bool = False) -> bool:
    """Print a usage error when `path` names nothing (or a folder, unless `folders`)."""
    if not os.path.lexists(path):
        print(f"fgc: error: {path}: no such file{' or folder' if folders else ''}",
              file=sys.stderr)
        return True
    if not folders and os.path.isdir(path):
        print(f"fgc: error: {path} is a directory; give a .fgpt file", file=sys.stderr)
        return True
    return False


def _load(path: str):
    """(spec, None) or (None, exit code) with the diagnostics printed."""
    from .errors import FgcError, Sources
    from .pipeline import load
    if _not_a_file(path):
        return None, EXIT_USAGE
    try:
        return load(path), None
    except FgcError as e:
        _print_diagnostics(e.diagnostics, getattr(e, "sources", Sources()))
        return None, EXIT_SPEC


def _load_model(path: str, trouble: int = EXIT_SPEC):
    """Like _load, for commands that need a model: a file of modules only is refused."""
    spec, code = _load(path)
    if spec is None:
        return None, EXIT_USAGE if code == EXIT_USAGE else trouble
    if not spec.file.models:
        _no_model(spec)
        return None, trouble
    return spec, None


def _no_model(spec, why: str = "") -> None:
    """A file of modules only where a model is needed: an error at its first line."""
    from pathlib import Path

    from .errors import FgcError, Span
    err = FgcError(f"{Path(spec.path).name} defines modules but no model{why}",
                   Span(spec.path, 1, 1), "`fgc check` checks a file of modules; the other "
                   "commands need a `model Name { ... }`")
    _print_diagnostics(err.diagnostics, spec.sources)


def _sets(items: list[str]) -> dict[str, Fraction | float]:
    from .pipeline import parse_set
    out = {}
    for item in items:
        try:
            name, value = parse_set(item)
        except ValueError as e:
            raise _Usage(str(e)) from None
        out[name] = value
    return out


def _symbolic(spec):
    """The spec's symbolic configuration, or None with its diagnostics printed."""
    from .errors import FgcError
    try:
        return spec.symbolic()
    except FgcError as e:
        _print_diagnostics(e.diagnostics, spec.sources)
        return None


class _Usage(Exception):
    pass


def _choice(spec, preset: str | None, sets: dict) -> int | None:
    """None when the spec has a model with `preset` and every `--set` name; else the exit
    code, the problem printed (a usage error: the command line names what is not there)."""
    if not spec.file.models:
        _no_model(spec)
        return EXIT_SPEC
    names = {h.name for h in spec.model.hypers}
    unknown = [k for k in sets if k not in names]
    if unknown:
        print(f"fgc: error: --set {unknown[0]}: `{spec.model.name}` has no hyperparameter "
              f"`{unknown[0]}` (it has {', '.join(sorted(names)) or 'none'})", file=sys.stderr)
        return EXIT_USAGE
    if preset is not None and preset not in spec.presets():
        avail = ", ".join(spec.presets()) or "none"
        print(f"fgc: error: `{spec.model.name}` has no preset `{preset}` (presets: {avail})",
              file=sys.stderr)
        return EXIT_USAGE
    return None


def _configure(spec, args):
    """The configuration the command line asks for: (config, None) or (None, exit code)."""
    from .errors import FgcError
    try:
        sets = _sets(args.set)
    except _Usage as e:
        print(f"fgc: error: {e}", file=sys.stderr)
        return None, EXIT_USAGE
    code = _choice(spec, args.preset, sets)
    if code is not None:
        return None, code
    preset = args.preset
    if preset is None and not sets:
        try:
            preset = spec.default_preset()
        except FgcError as e:
            _print_diagnostics(e.diagnostics, spec.sources)
            return None, EXIT_SPEC
    try:
        return spec.configure(preset, sets), None
    except FgcError as e:
        _print_diagnostics(e.diagnostics, spec.sources)
        return None, EXIT_SPEC


# ---------------------------------------------------------------- fgc check


def cmd_check(args) -> int:
    from .errors import FgcError, Sources, printable
    from .pipeline import load
    if getattr(args, "weights", None) is not None:
        if getattr(args, "tp", None):
            print("fgc: error: --tp checks specs, not --weights FOLDER", file=sys.stderr)
            return EXIT_USAGE
        return _check_folder(args)
    results = []
    worst = EXIT_OK
    paths = _expand_paths(args.files)
    if paths is None:
        return EXIT_USAGE
    for path in paths:
        sources = Sources()
        internal = False
        try:
            spec = load(path)
            sources = spec.sources
            errors, warnings = spec.check()
            if not errors and getattr(args, "tp", None):
                found = spec.check_tp(args.tp)
                errors = [d for d in found if d.severity == "error"]
                warnings = warnings + [d for d in found if d.severity != "error"]
        except FgcError as e:
            errors, warnings = e.diagnostics, []
            sources = getattr(e, "sources", sources)
        except RecursionError:
            errors = [_diag(f"{path}: too deeply nested to check")]
            warnings = []
        except Exception as e:  # noqa: BLE001 - report this file, go on with the others
            if os.environ.get("FGC_DEBUG"):
                raise
            errors = [_diag(f"internal error while checking {path}: {_bug_line(e)} "
                            "(a bug in fgc, not in the spec; please report it)")]
            warnings = []
            internal = True
        failed = bool(errors) or (args.strict and bool(warnings))
        if failed:
            worst = max(worst, EXIT_INTERNAL if internal else EXIT_SPEC)
        results.append((path, errors, warnings, sources, failed))
    if args.format == "json":
        out = {"ok": worst == EXIT_OK, "files": [
            {"file": path, "ok": not failed,
             "diagnostics": [d.as_dict() for d in errors + warnings]}
            for path, errors, warnings, _, failed in results]}
        print(json.dumps(out, indent=2))
    elif args.format == "github":
        for _path, errors, warnings, _, _ in results:
            for d in errors + warnings:
                kind = "error" if d.severity == "error" or args.strict else "warning"
                loc = ""
                if d.span is not None:
                    loc = (f" file={_gh_property(printable(d.span.file))},line={d.span.line},"
                           f"col={d.span.column}")
                msg = d.message + (f" (help: {d.hint})" if d.hint else "")
                msg = msg.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
                print(f"::{kind}{loc}::{msg}")
    else:
        for path, errors, warnings, sources, failed in results:
            _print_diagnostics(errors + warnings, sources)
            if not failed:
                note = f", {len(warnings)} warning{'s' * (len(warnings) != 1)}" if warnings else ""
                print(f"{printable(path)}: ok{note}")
    return worst


def _gh_property(value: str) -> str:
    """Escape a workflow-command property value (`,` and `:` end it)."""
    return (value.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
            .replace(":", "%3A").replace(",", "%2C"))


def _diag(message: str):
    from .errors import Diagnostic
    return Diagnostic("error", message)


def _expand_paths(paths: list[str]) -> list[str] | None:
    """Directories stand for every .fgpt file below them, in sorted order."""
    from pathlib import Path
    out = []
    for p in paths:
        if _not_a_file(p, folders=True):
            return None
        if Path(p).is_dir():
            found = sorted(str(f) for f in Path(p).rglob("*.fgpt"))
            if not found:
                print(f"fgc: error: {p}: no .fgpt files found", file=sys.stderr)
                return None
            out.extend(found)
        else:
            out.append(p)
    return out


# ---------------------------------------------------------------- fgc params


def cmd_params(args) -> int:
    if (args.tp or args.fsdp) and (len(args.files) > 1 or os.path.isdir(args.files[0])):
        print("fgc: error: --tp and --fsdp take one spec file", file=sys.stderr)
        return EXIT_USAGE
    if (args.batch or args.seq or not args.sequence) and not (args.tp or args.fsdp):
        print("fgc: error: --batch, --seq and --no-sequence-parallel shape the figures of "
              "--tp and --fsdp; give one", file=sys.stderr)
        return EXIT_USAGE
    if len(args.files) == 1 and os.path.isdir(args.files[0]):
        return _params_folder(args)
    if len(args.files) > 1:
        return _params_together(args)
    spec, code = _load(args.files[0])
    if spec is None:
        return code
    counted, code = _counted(spec, args)
    if counted is None:
        return code
    report = params_report(*counted)
    spread = None
    if args.tp or args.fsdp:
        from .errors import FgcError
        from .passes.scaleout import format_text
        from .passes.scaleout import report as scaleout
        try:
            spread = scaleout(counted[1], counted[2], args.tp or 1, args.fsdp or 1,
                              args.batch or 1, args.seq, args.sequence)
        except FgcError as e:
            _print_diagnostics(e.diagnostics, spec.sources)
            return EXIT_SPEC
        report["distributed"] = spread
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        from .table import use_color
        print(format_params_text(report, args.by_module, use_color()))
        if spread is not None:
            print()
            print(format_text(spread))
    return EXIT_OK


def _counted(spec, args):
    """((spec, config, symbolic config), None) for counting, the configuration's warnings
    printed; or (None, exit code) with its diagnostics printed."""
    cfg, code = _configure(spec, args)
    if cfg is None:
        return None, code
    sym = _symbolic(spec)
    if sym is None:
        return None, EXIT_SPEC
    _print_diagnostics(cfg.warnings, spec.sources)
    return (spec, cfg, sym), None


def _params_together(args) -> int:
    """`fgc params A B ...`: each spec's count, then all of them together, with the tensors
    their `share ... with` declarations name counted once."""
    from argparse import Namespace

    from .errors import Sources
    from .passes.sharing import joint
    try:
        sets = _sets(args.set)
    except _Usage as e:
        print(f"fgc: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    items, reports = [], []
    if any(_not_a_file(path) for path in args.files):
        return EXIT_USAGE
    for path in args.files:
        spec, code = _load_model(path)
        if spec is None:
            return code
        names = {h.name for h in spec.model.hypers}
        mine = [f"{k}={v}" for k, v in sets.items() if k in names]
        counted, code = _counted(spec, Namespace(preset=args.preset, set=mine))
        if counted is None:
            return code
        items.append(counted)
        reports.append(params_report(*counted))
    unknown = [k for k in sets if not any(k in {h.name for h in spec.model.hypers}
                                          for spec, _, _ in items)]
    if unknown:
        print(f"fgc: error: --set {unknown[0]}: no spec given has a hyperparameter "
              f"`{unknown[0]}`", file=sys.stderr)
        return EXIT_USAGE
    together = joint(items)
    if together.errors:
        sources = Sources()
        for spec, _, _ in items:
            sources._lines.update(spec.sources._lines)
        _print_diagnostics(together.errors, sources)
        return EXIT_SPEC
    report = {"specs": reports, "total": together.total, "formula": together.formula,
              "shared": together.groups}
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return EXIT_OK
    from .elaborate.symbolic import human
    from .table import use_color
    for r in reports:
        print(format_params_text(r, args.by_module, use_color()))
        print()
    names = " + ".join(r["model"] for r in reports)
    print(f"together  {names}")
    if together.groups:
        saved = sum(g["elements"] * (len(g["in"]) - 1) for g in together.groups)
        print(f"shared    {', '.join(g['tensor'] + ' ' + g['shape'] for g in together.groups)}")
        print(f"          {saved:,} parameters held by {len(reports)} specs, counted once")
    else:
        print("shared    nothing (no `share ... with` between these specs)")
    sums = " + ".join(f"{r['total']:,}" for r in reports)
    if together.groups:
        sums += f" - {saved:,}"
    print(f"total     {together.total:,}  ({human(together.total)}) = {sums}")
    print(f"formula   {together.formula}")
    return EXIT_OK


def params_report(spec, cfg, sym) -> dict:
    """Everything `fgc params` says, as plain data (the JSON output)."""
    from .elaborate.symbolic import format_poly
    from .passes.params import as_int, formula, per_module
    hypers = sym.hypers
    sym_total = sym.count.total()
    expanded = hypers.expand(sym_total)
    sym_rows = {name: (per, copies) for name, per, copies in per_module(sym.count)}
    sym_entries = {(e.path, e.name): e for e in sym.count.entries}
    modules = []
    for name, per, copies in per_module(cfg.count):
        s = sym_rows.get(name)
        entry = next(e for e in cfg.count.entries if (e.path[0] if e.path else e.name) == name)
        modules.append({
            "name": name,
            "module": entry.path and _module_of(cfg, name) or "parameter",
            "per_copy": as_int(per), "copies": as_int(copies), "total": as_int(per * copies),
            "formula": format_poly(s[0]) if s else None,
            "copies_formula": format_poly(s[1]) if s else None,
        })
    params = []
    for e in cfg.count.entries:
        s = sym_entries.get((e.path, e.name))
        params.append({
            "path": ".".join(e.path + (e.name,)), "declared": e.declared,
            "shape": [as_int(d) for d in e.shape],
            "shape_symbolic": [format_poly(d) for d in s.shape] if s else None,
            "family": as_int(e.family) if e.family is not None else None,
            "per_copy": as_int(e.per_use), "copies": as_int(e.copies),
            "total": as_int(e.total), "shared": e.shared,
        })
    values = {}
    order = [h.name for h in spec.model.hypers]
    for k, v in sorted(cfg.values.items(), key=lambda kv: order.index(kv[0])
                       if kv[0] in order else len(order)):
        values[k] = (int(v.const_value()) if v.const_value().denominator == 1
                     else float(v.const_value())) if hasattr(v, "const_value") else v
    derived = {k: format_poly(v) for k, v in hypers.derived.items()}
    return {
        "file": spec.path, "model": cfg.model.name, "preset": cfg.name,
        "hyperparameters": values,
        "total": cfg.total,
        "formula": formula(sym.count),
        "formula_expanded": format_poly(expanded) if expanded != sym_total else None,
        "derived": derived,
        "tied": [{"param": k, "used_in": v} for k, v in sorted(cfg.count.tied.items())],
        "shared_with": _shared_with(cfg),
        "modules": modules,
        "params": params,
    }


def _shared_with(cfg) -> list[dict]:
    """The spec's `share ... with` declarations: what it has in common with another spec."""
    from .passes.params import as_int
    from .passes.sharing import tensors
    out = []
    for decl in cfg.model.shared_with:
        found = tensors(cfg, decl.names)
        out.append({"spec": decl.spec, "names": decl.names,
                    "tensors": [p for name in decl.names for p in found[name]],
                    "total": sum(as_int(t) for name in decl.names
                                 for _, t in found[name].values())})
    return out


def _module_of(cfg, instance: str) -> str:
    from .elaborate import ir
    for item in cfg.model.body:
        eqns = item.body if isinstance(item, ir.Loop) else [item]
        for e in eqns:
            if e.op == "call" and e.attrs.get("instance") == instance:
                return e.attrs["module"]
    return "?"


def format_params_text(r: dict, by_module: bool, color: bool = False) -> str:
    from .elaborate.symbolic import human
    from .table import table
    lines = []
    where = f"preset {r['preset']}" if r["preset"] not in ("defaults",) else "defaults"
    lines.append(f"{r['model']}  ({r['file']}, {where})")
    hv = "  ".join(f"{k}={_num(v)}" for k, v in r["hyperparameters"].items())
    lines.append(f"  {hv}")
    lines.append("")
    if by_module:
        header = ("name", "module", "per copy", "copies", "total", "formula")
        rows = [header]
        for m in r["modules"]:
            rows.append((m["name"], m["module"], f"{m['per_copy']:,}", f"{m['copies']:,}",
                         f"{m['total']:,}", m["formula"] or ""))
            for p in r["params"]:
                head = p["path"].split(".")[0]
                if head == m["name"] and "." in p["path"]:
                    shape = "×".join(str(d) for d in p["shape"])
                    if p["family"]:
                        shape = f"{p['family']}×[{shape}]"
                    rows.append(("  " + p["path"].split(".", 1)[1], shape, f"{p['per_copy']:,}",
                                 "", "", ""))
        rows.append(("total", "", "", "", f"{r['total']:,}", ""))
        lines += table(rows, {2, 3, 4}, color=color)
        lines.append("")
    lines.append(f"total    {r['total']:,}  ({human(r['total'])})")
    lines.append(f"formula  {r['formula']}")
    if r["formula_expanded"]:
        derived = ", ".join(f"{k} = {v}" for k, v in r["derived"].items())
        lines.append(f"         = {r['formula_expanded']}   (with {derived})")
    for t in r["tied"]:
        lines.append(f"tied     {t['param']} is used in {' and '.join(t['used_in'])}; "
                     "counted once")
    for d in r.get("shared_with", []):
        lines.append(f"shared   {', '.join(d['names'])} with {d['spec']}: {d['total']:,} "
                     "parameters, counted once when both are counted (fgc params A B)")
    return "\n".join(lines)


def _num(v) -> str:
    if isinstance(v, int):
        return f"{v:,}" if abs(v) >= 10_000 else str(v)
    return repr(v)


# ---------------------------------------------------------------- fgc diff


def cmd_diff(args) -> int:
    """Exit 0 when the two are equivalent, 1 when they differ, 2 on any trouble (as diff)."""
    from argparse import Namespace

    from .table import use_color
    from .tools.diff import Side, compare, format_text
    sides = []
    for key, path in (("a", args.a), ("b", args.b)):
        spec, code = _load_model(path, trouble=EXIT_USAGE)
        if spec is None:
            return code
        ns = Namespace(preset=getattr(args, f"preset_{key}") or args.preset,
                       set=args.set + getattr(args, f"set_{key}"))
        cfg, code = _configure(spec, ns)
        if cfg is None:
            return EXIT_USAGE
        sym = _symbolic(spec)
        if sym is None:
            return EXIT_USAGE
        sides.append(Side(path, spec, sym, cfg))
    report = compare(*sides)
    if args.format == "json":
        print(json.dumps(report, indent=2))
    else:
        print(format_text(report, use_color()))
    return EXIT_OK if report["equivalent"] else EXIT_SPEC


# ---------------------------------------------------------------- fgc render


def cmd_render(args) -> int:
    import shutil
    import subprocess
    from pathlib import Path

    from runtime.files import atomic_write

    from .tools import render
    spec, code = _load(args.file)
    if spec is None:
        return code
    chosen = args.preset is not None or bool(args.set)
    cfg = None
    if spec.file.models:
        cfg, code = _configure(spec, args)
        if cfg is None:
            return code
    elif args.to != "latex":
        _no_model(spec, f"; --to {args.to} draws a model")
        return EXIT_SPEC
    elif chosen:
        print(f"fgc: error: --preset and --set choose a model's sizes; {args.file} has no "
              "model", file=sys.stderr)
        return EXIT_USAGE
    sym = None
    if spec.file.models:
        sym = _symbolic(spec)
        if sym is None:
            return EXIT_SPEC
    if args.to == "latex":
        text = render.latex(spec, sym, stdlib=args.stdlib)
    elif args.to == "markdown":
        text = render.markdown(spec, cfg, params_report(spec, cfg, sym))
    else:
        text = render.dot(spec, cfg if chosen else sym)
        if args.to == "svg":
            exe = shutil.which("dot")
            if exe is None:
                print("fgc: error: --to svg needs Graphviz's `dot` (Debian: apt install "
                      "graphviz); --to dot writes the graph without it", file=sys.stderr)
                return EXIT_SPEC
            r = subprocess.run([exe, "-Tsvg"], input=text, capture_output=True, text=True,
                               timeout=120)
            if r.returncode != 0:
                print(f"fgc: error: Graphviz failed: {r.stderr.strip()[:300]}",
                      file=sys.stderr)
                return EXIT_INTERNAL
            text = r.stdout
    if args.out is None:
        sys.stdout.write(text)
        return EXIT_OK
    out = Path(args.out)
    try:
        # a fresh temporary renamed over `out`: no link there or at a fixed name followed
        atomic_write(out, text.encode("utf-8", "surrogateescape"))
    except OSError as e:
        print(f"fgc: error: cannot write {out}: {e.strerror or e}", file=sys.stderr)
        return EXIT_SPEC
    print(f"wrote {out}", file=sys.stderr)
    return EXIT_OK


# ---------------------------------------------------------------- fgc compile


def cmd_compile(args) -> int:
    from .emit import compile_spec
    from .errors import FgcError, printable
    try:
        sets = _sets(args.set)
    except _Usage as e:
        print(f"fgc: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    onnx_only = [flag for flag, given in (
        ("--opset", args.opset is not None), ("--optimize", args.optimize is not None),
        ("--external-data", args.external_data), ("--kv-cache", getattr(args, "kv_cache", 0)),
        ("--genai", getattr(args, "genai", False)),
        ("--quantize", getattr(args, "quantize", None) is not None),
        ("--block-size", getattr(args, "block_size", None) is not None),
        ("--quantize-embeddings", getattr(args, "quantize_embeddings", False)))
        if given]
    if args.target != "onnx" and onnx_only:
        step = " (the torch module has step() instead)" if "--kv-cache" in onnx_only else ""
        print(f"fgc: error: {', '.join(onnx_only)} {'is' if len(onnx_only) == 1 else 'are'} "
              f"for --target onnx{step}", file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "quantize", None) is None and {"--block-size", "--quantize-embeddings"} & \
            set(onnx_only):
        print("fgc: error: --block-size and --quantize-embeddings go with --quantize int4|int8",
              file=sys.stderr)
        return EXIT_USAGE
    if getattr(args, "genai", False) and not getattr(args, "kv_cache", False):
        print("fgc: error: --genai goes with --kv-cache: onnxruntime-genai runs the incremental "
              "form", file=sys.stderr)
        return EXIT_USAGE
    if args.target == "onnx" and not _utf8(args.file):
        print(f"fgc: error: {args.file!r}: the file name is not UTF-8, which ONNX needs (it "
              "is in every node's doc string); rename the file", file=sys.stderr)
        return EXIT_USAGE
    if os.path.isdir(args.file):  # a model folder: the spec its config.json claims
        code = _spec_for_folder(args)
        if code is not None:
            return code
    spec, code = _load_model(args.file)
    if spec is None:
        return code
    code = _choice(spec, args.preset, sets)
    if code is not None:
        return code
    reading, code = _reading(spec, args.weights, args.preset, sets)
    if code is not None:
        return code
    if reading is not None:
        print(reading.summary(), file=sys.stderr)
        for warning in reading.warnings:
            print(f"warning: {printable(warning)}", file=sys.stderr)
    try:
        result = compile_spec(args.file, args.out, args.target, args.preset, sets, args.weights,
                              opset=args.opset, optimize=args.optimize,
                              external_data=args.external_data,
                              seed=args.seed if args.target == "onnx" else 0,
                              kv_cache=getattr(args, "kv_cache", False),
                              strict=getattr(args, "strict", False),
                              genai=getattr(args, "genai", False),
                              last_position=getattr(args, "last_position", False),
                              outputs=getattr(args, "outputs", None),
                              dtype=getattr(args, "dtype", None),
                              quantize=getattr(args, "quantize", None),
                              block_size=getattr(args, "block_size", None),
                              quantize_embeddings=getattr(args, "quantize_embeddings", False),
                              reading=reading)
    except FgcError as e:
        _print_diagnostics(e.diagnostics, getattr(e, "sources", None) or spec.sources)
        return EXIT_SPEC
    for warning in result.warnings:
        print(f"warning: {printable(warning)}", file=sys.stderr)
    for f in result.files:
        print(f"wrote {f}")
    if result.ignored:
        print(f"ignored {len(result.ignored)} checkpoint tensors the spec marks as not "
              f"parameters (e.g. {printable(result.ignored[0])})")
    return EXIT_OK


# ---------------------------------------------------------------- model folders
# A transformers model folder (config.json and its checkpoint) in place of a spec: the spec
# its config.json claims (compiler/config_json.py), its hyperparameters from config.json.


def _folder_config(folder: str):
    """(the folder's config.json, None) or (None, exit code) with the problem printed: a
    folder without config.json is a usage error (2), a config.json that does not read an
    error in a file fgc reads (1)."""
    from .config_json import has_config, read_config
    from .errors import FgcError, Sources
    if not has_config(folder):
        print(f"fgc: error: {folder} is a directory; give a .fgpt file, or a model folder with "
              "a config.json (as save_pretrained writes one)", file=sys.stderr)
        return None, EXIT_USAGE
    try:
        return read_config(folder), None
    except FgcError as e:
        _print_diagnostics(e.diagnostics, getattr(e, "sources", None) or Sources())
        return None, EXIT_SPEC


def _picked(folder: str):
    """(the spec's path, None) for a model folder, said on stderr, or (None, exit code)."""
    from .config_json import pick_spec
    from .errors import FgcError, Sources, printable
    config, code = _folder_config(folder)
    if config is None:
        return None, code
    try:
        claim = pick_spec(config)
    except FgcError as e:
        _print_diagnostics(e.diagnostics, Sources())
        return None, EXIT_SPEC
    print(f"fgc: {printable(config.path)} names {config.describe()}; its spec is "
          f"{printable(claim.path)}", file=sys.stderr)
    return claim.path, None


def _spec_for_folder(args) -> int | None:
    """`fgc compile FOLDER`: args.file becomes the spec the folder's config.json claims and
    args.weights the folder; None, or the exit code with the problem printed."""
    if args.weights is not None and os.path.realpath(args.weights) != \
            os.path.realpath(args.file):
        print(f"fgc: error: {args.file} is a model folder, the checkpoint itself; --weights "
              "goes with a .fgpt spec", file=sys.stderr)
        return EXIT_USAGE
    path, code = _picked(args.file)
    if path is None:
        return code
    args.weights, args.file = args.file, path
    return None


def _reading(spec, weights, preset, sets):
    """(what config.json gives the spec, None), (None, None) where `weights` is no model
    folder with a config.json or the spec has no config block, or (None, exit code) with
    the problems printed."""
    from .config_json import configuration
    from .errors import FgcError
    try:
        return configuration(spec, weights, preset, sets), None
    except FgcError as e:
        _print_diagnostics(e.diagnostics, getattr(e, "sources", None) or spec.sources)
        return None, EXIT_SPEC


def _params_folder(args) -> int:
    """`fgc params FOLDER`: the count of the spec the folder's config.json claims, at the
    configuration config.json gives (each hyperparameter with the key it came from)."""
    from .errors import FgcError, printable
    path, code = _picked(args.files[0])
    if path is None:
        return code
    spec, code = _load_model(path)
    if spec is None:
        return code
    try:
        sets = _sets(args.set)
    except _Usage as e:
        print(f"fgc: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    code = _choice(spec, args.preset, sets)
    if code is not None:
        return code
    reading, code = _reading(spec, args.files[0], args.preset, sets)
    if reading is None:
        return code if code is not None else EXIT_SPEC
    for warning in reading.warnings:
        print(f"warning: {printable(warning)}", file=sys.stderr)
    try:
        cfg = spec.configure(args.preset, reading.sets, reading.label(reading.sets))
    except FgcError as e:
        _print_diagnostics(e.diagnostics, spec.sources)
        return EXIT_SPEC
    sym = _symbolic(spec)
    if sym is None:
        return EXIT_SPEC
    _print_diagnostics(cfg.warnings, spec.sources)
    report = params_report(spec, cfg, sym)
    report["config"] = reading.as_dict()
    if args.format == "json":
        print(json.dumps(report, indent=2))
        return EXIT_OK
    from .table import use_color
    print("\n".join(reading.lines()))
    print()
    print(format_params_text(report, args.by_module, use_color()))
    return EXIT_OK


def _check_folder(args) -> int:
    """`fgc check --weights FOLDER SPEC`: the spec's checks, the configuration the folder's
    config.json gives it (each hyperparameter, its value, its key), and whether the
    folder's tensors are the spec's exactly: none missing, mis-shaped or unused."""
    from .errors import FgcError, printable
    from .pipeline import load
    if len(args.files) != 1:
        print("fgc: error: --weights checks one SPEC against the folder", file=sys.stderr)
        return EXIT_USAGE
    path, folder = args.files[0], args.weights
    if _not_a_file(path) or _not_a_file(folder, folders=True):
        return EXIT_USAGE
    out: dict = {"file": path, "ok": False, "diagnostics": [], "config": None,
                 "tensors": None}
    text = args.format != "json"

    def done(diags, sources, code: int) -> int:
        out["diagnostics"] = [d.as_dict() for d in diags]
        out["ok"] = code == EXIT_OK
        if text:
            _print_diagnostics(diags, sources)
            if code == EXIT_OK:
                print(f"{printable(path)}: ok")
        else:
            print(json.dumps({"ok": out["ok"], "files": [out]}, indent=2))
        return code

    try:
        spec = load(path)
    except FgcError as e:
        return done(e.diagnostics, getattr(e, "sources", None), EXIT_SPEC)
    if not spec.file.models:
        _no_model(spec)
        return EXIT_SPEC
    errors, warnings = spec.check()
    if errors or (args.strict and warnings):
        return done(errors + warnings, spec.sources, EXIT_SPEC)
    try:
        from .config_json import configuration
        reading = configuration(spec, folder, None, None)
        if reading is not None:
            out["config"] = reading.as_dict()
            if text:
                print("\n".join(reading.lines()))
            cfg = spec.configure(None, reading.sets, reading.label())
        else:
            why = "the spec has no config block" if spec.model.config is None else \
                f"{folder} has no config.json"
            preset = spec.default_preset()
            warnings.append(_note(f"{why}: the tensors are checked against "
                                  + (f"preset `{preset}`" if preset else "the defaults")))
            cfg = spec.configure(preset)
        from .weights import import_checkpoint
        imported = import_checkpoint(cfg, spec.model.checkpoint, folder)
    except FgcError as e:
        return done(e.diagnostics + warnings, spec.sources, EXIT_SPEC)
    unused = list(getattr(imported, "extras", []))
    out["tensors"] = {"read": len(imported.tensors), "ignored": len(imported.ignored),
                      "unused": unused}
    if unused:
        errors = [_diag(f"{len(unused):,} tensor{'s' * (len(unused) != 1)} of {folder} "
                        f"{'are' if len(unused) != 1 else 'is'} read by no parameter and not "
                        f"ignored by the spec: {', '.join(unused[:5])}"
                        f"{' …' if len(unused) > 5 else ''}")]
        return done(errors + warnings, spec.sources, EXIT_SPEC)
    if text:
        ignored = f"; {len(imported.ignored)} ignored as the spec says" if imported.ignored \
            else ""
        print(f"tensors  {len(imported.tensors):,} parameters read from {printable(folder)}, "
              f"each as the spec expects{ignored}")
    return done(warnings, spec.sources, EXIT_SPEC if args.strict and warnings else EXIT_OK)


def _note(message: str):
    from .errors import Diagnostic
    return Diagnostic("note", message)


# ---------------------------------------------------------------- fgc run


def cmd_run(args) -> int:
    import contextlib
    import io
    import tempfile
    from pathlib import Path
    target = Path(args.target)
    try:
        _check_int64(args.tokens, "--tokens")
    except _Usage as e:
        print(f"fgc: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if _not_a_file(args.target, folders=True):
        return EXIT_USAGE
    if target.is_dir():
        if args.preset or args.set or args.weights or args.optimize:
            print("fgc: error: --preset, --set, --weights and --optimize apply to a SPEC, not "
                  "to a compiled folder", file=sys.stderr)
            return EXIT_USAGE
        return _run_dir(target, args)
    with tempfile.TemporaryDirectory(prefix="fgc-run-") as tmp:
        spec_args = argparse.Namespace(
            file=str(target), out=tmp, target="onnx", preset=args.preset, set=args.set,
            weights=args.weights, opset=None, optimize=args.optimize, external_data=False,
            seed=0, kv_cache=False)
        with contextlib.redirect_stdout(io.StringIO()):  # "wrote ..." of a temporary folder
            code = cmd_compile(spec_args)
        if code != EXIT_OK:
            return code
        return _run_dir(Path(tmp), args)


def _print_pages(model) -> None:
    """The line saying how much of the session's memory is on huge pages (runtime/pages.py),
    where any is."""
    if model.huge_pages:
        print(f"memory: {model.huge_pages / 2**20:.0f} MiB of onnxruntime's session on 2 MiB "
              "pages")


def _run_dir(folder, args) -> int:
    from runtime import RuntimeError_, load
    try:
        model = load(folder, provider=args.provider)
        print(f"provider: {model.provider} ({model.reason})")
        _print_pages(model)
        feeds = model.feeds(args.tokens, dict(_pairs(args.input)))
        for note in model.notes:
            print(f"note: {note}")
        result = model.run(feeds)
    except RuntimeError_ as e:
        print(f"fgc: {e}", file=sys.stderr)
        return EXIT_SPEC
    except _Usage as e:
        print(f"fgc: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    for name, value in feeds.items():
        print(f"input {name}: {value.dtype}{list(value.shape)}")
    for line in model.describe(result, top=args.top):
        print(line)
    return EXIT_OK


def _utf8(path: str) -> bool:
    try:
        path.encode("utf-8")
        return True
    except UnicodeEncodeError:  # undecodable bytes of the name, as surrogate escapes
        return False


def _pairs(items: list[str]):
    for item in items:
        if "=" not in item:
            raise _Usage(f"--input takes NAME=VALUES, got `{item}`")
        k, v = item.split("=", 1)
        yield k.strip(), v


# ---------------------------------------------------------------- fgc generate


def cmd_generate(args) -> int:
    import contextlib
    import io
    import tempfile
    from pathlib import Path
    target = Path(args.target)
    try:
        prompt = _id_rows(args.prompt_ids, "--prompt-ids", ragged=True)
        stops = _id_rows(args.stop_ids, "--stop-ids", ragged=True) if args.stop_ids.strip() \
            else [[]]
        stop = stops[0] if len(stops) == 1 else stops  # one list, or one per prompt
        inputs = {k: _id_rows(v, f"--input {k}") for k, v in _pairs(args.input)}
    except _Usage as e:
        print(f"fgc: error: {e}", file=sys.stderr)
        return EXIT_USAGE
    if args.greedy and (args.temperature is not None or args.top_k is not None
                        or args.top_p is not None):
        print("fgc: error: --greedy takes no --temperature, --top-k or --top-p",
              file=sys.stderr)
        return EXIT_USAGE
    if _not_a_file(args.target, folders=True):
        return EXIT_USAGE
    if target.is_dir():
        if args.preset or args.set or args.weights or args.backend:
            print("fgc: error: --preset, --set, --weights and --backend apply to a SPEC, not "
                  "to a compiled folder", file=sys.stderr)
            return EXIT_USAGE
        return _generate_dir(target, args, prompt, stop, inputs)
    spec, code = _load_model(str(target))
    if spec is None:
        return code
    from .errors import FgcError
    from .lowering.signature import logits_alone
    from .passes.incremental import derive
    sym = _symbolic(spec)
    if sym is None:
        return EXIT_SPEC
    from .elaborate.ir import state_pairs
    try:
        derive(sym.model, sym.functions)
        cached = True
    except FgcError as e:
        cached = False
        if not args.no_cache and not state_pairs(sym.model):
            print(f"note: {e.diagnostics[0].message}; every step recomputes the prefix")
    backend = args.backend or "onnx"
    if args.huge_pages and backend == "torch" or args.prepack and backend == "onnx":
        return _backend_flag(args)
    with tempfile.TemporaryDirectory(prefix="fgc-generate-") as tmp:
        spec_args = argparse.Namespace(
            file=str(target), out=tmp, target=backend, preset=args.preset, set=args.set,
            weights=args.weights, opset=None, optimize=None, external_data=False, seed=0,
            kv_cache=cached and backend == "onnx" and not args.no_cache,
            last_position=cached and _cuts_at_last(sym),
            outputs=logits_alone(sym.model, sym.functions) if backend == "onnx" else None)
        with contextlib.redirect_stdout(io.StringIO()):  # "wrote ..." of a temporary folder
            code = cmd_compile(spec_args)
        if code != EXIT_OK:
            return code
        return _generate_dir(Path(tmp), args, prompt, stop, inputs)


def _backend_flag(args) -> int:
    """The error for a flag of the other backend's: --huge-pages is onnxruntime's, --prepack
    the PyTorch module's."""
    if args.huge_pages:
        print("fgc: error: --huge-pages is for an ONNX model (onnxruntime's CPU session), not "
              "the PyTorch module", file=sys.stderr)
    else:
        print("fgc: error: --prepack is for the PyTorch module (--backend torch, a folder "
              "with model.py), not an ONNX model: onnxruntime prepacks its weights itself",
              file=sys.stderr)
    return EXIT_USAGE


def _cuts_at_last(sym) -> bool:
    """Whether the outputs have a last-position form (`--last-position`): a step reads the
    last position's logits alone."""
    from .errors import FgcError
    from .lowering.last import last_position
    try:
        last_position(sym.model, sym.functions)
    except FgcError:
        return False
    return True


def _id_rows(text: str, what: str, ragged: bool = False) -> list[list[int]]:
    """Rows of ids, `1,2,3;4,5,6`: of equal lengths unless `ragged` (prompts a padding
    mask lines up)."""
    rows = [r for r in text.replace(" ", "").split(";") if r]
    try:
        out = [[int(x) for x in r.split(",") if x] for r in rows]
    except ValueError:
        raise _Usage(f"{what}: `{_short(text)}` is not a comma-separated list of ids") \
            from None
    if not out or not all(out) or not ragged and any(len(r) != len(out[0]) for r in out):
        raise _Usage(f"{what}: give ids" + ("" if ragged else
                                            ", and sequences of equal lengths"))
    bad = next((x for r in out for x in r if not 0 <= x < INT64), None)
    if bad is not None:
        raise _Usage(f"{what}: {_short(str(bad))} is not an id (ids are 0-based, below 2^63)")
    return out


def _check_int64(text: str | None, what: str) -> None:
    """Token ids must fit the int64 tensor they go into (the runtime checks the rest
    against the model: ranges, lengths)."""
    for item in (text or "").replace(" ", "").replace(";", ",").split(","):
        try:
            value = int(item)
        except ValueError:
            continue  # a real number, or not a number: the runtime says which
        if not -INT64 <= value < INT64:
            raise _Usage(f"{what}: {_short(item)} does not fit a 64-bit integer")


def _generate_dir(folder, args, prompt, stop, inputs) -> int:
    import time

    from runtime import RuntimeError_, generate, load
    module = None  # a compiled model.py, whose CPU kernel choices are kept afterwards
    try:
        if (folder / "model.onnx").is_file():
            if args.prepack:
                return _backend_flag(args)
            model = load(folder, provider=args.provider, huge_pages=args.huge_pages or None)
            print(f"provider: {model.provider} ({model.reason})")
            _print_pages(model)
            cached, state = bool(model.incremental), bool(model.state)
        elif (folder / "model.py").is_file():
            if args.huge_pages:
                return _backend_flag(args)
            model, module = _torch_model(folder, prepack=args.prepack)
            cached = callable(getattr(model, "step", None))
            state = bool(model.signature().get("state")) if hasattr(model, "signature") \
                else False
            print("backend: PyTorch (CPU)")
        else:
            print(f"fgc: {folder} holds neither model.onnx nor model.py", file=sys.stderr)
            return EXIT_SPEC
        if args.no_cache or not (cached or state):
            print("cache: none: every step recomputes the prefix")
        elif state:
            print("cache: the model's own state, fed back at every step (Mem' as Mem)")
        else:
            print("cache: keys and values of earlier positions kept (incremental form)")
        begin = time.perf_counter()
        rows = generate(model, prompt, args.max_new_tokens, greedy=args.greedy or None,
                        temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                        seed=args.seed, stop=stop, max_length=args.max_length,
                        inputs=inputs, cache=not args.no_cache)
        took = time.perf_counter() - begin
    except RuntimeError_ as e:
        print(f"fgc: {e}", file=sys.stderr)
        return EXIT_SPEC
    finally:
        if module is not None:
            from runtime.kernels import remember
            remember(module)
    count = sum(len(r) for r in rows)
    print(f"generated {count} ids in {took:.2f} s ({count / max(took, 1e-9):.1f} ids/s)")
    for row in rows:
        print(",".join(str(t) for t in row))
    return EXIT_OK


def _torch_model(folder, prepack: bool = False):
    """(build() from a compiled model.py, with weights.safetensors when it is there, and
    the imported model.py), its CPU kernel choices prefilled from this machine's cache;
    `prepack` sets the module's PREPACK (its weights kept reordered for oneDNN)."""
    import importlib.util

    from runtime import RuntimeError_
    from runtime.kernels import prefill
    spec = importlib.util.spec_from_file_location("fgc_generated_model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    try:
        spec.loader.exec_module(module)
        module.PREPACK = prepack and hasattr(module, "PREPACK")
        model = module.build().eval()
    except Exception as e:  # noqa: BLE001 - a model.py that is not fgc's, or edited
        raise RuntimeError_(f"{folder / 'model.py'} does not build: {e}") from None
    if prepack and not module.PREPACK:
        raise RuntimeError_(f"{folder / 'model.py'} has no prepacked kernel (no products by "
                            "a weight, or compiled by an earlier fgc): compile it again, or "
                            "run without --prepack")
    weights = folder / "weights.safetensors"
    if weights.is_file():
        from safetensors.torch import load_file
        try:
            model.load_state_dict(load_file(str(weights)))
        except Exception as e:  # noqa: BLE001
            raise RuntimeError_(f"{weights} does not fit {folder / 'model.py'}: "
                                f"{str(e)[:300]}") from None
    else:
        print("note: no weights.safetensors: random weights")
    prefill(module)
    return model, module


# ---------------------------------------------------------------- fgc ir


def cmd_ir(args) -> int:
    from .errors import FgcError
    from .tools.printer import format_json, format_model, json_schema
    if args.format == "json-schema":
        print(json.dumps(json_schema(), indent=1))
        return EXIT_OK
    if args.file is None:
        print("fgc: error: the following arguments are required: FILE", file=sys.stderr)
        return EXIT_USAGE
    spec, code = _load_model(args.file)
    if spec is None:
        return code
    if args.symbolic or (args.preset is None and not args.set):
        try:
            cfg = spec.symbolic()
        except FgcError as e:
            _print_diagnostics(e.diagnostics, spec.sources)
            return EXIT_SPEC
    else:
        cfg, code = _configure(spec, args)
        if cfg is None:
            return code
    if cfg.name != "symbolic":
        from .elaborate.ir import Hyper
        order = [h.name for h in spec.model.hypers]
        cfg.model.hypers = [Hyper(name=k, default=cfg.values[k]) for k in order]
    model, functions = cfg.model, cfg.functions
    if args.lowered:
        from .lowering import prepare
        model, functions = prepare(model, functions)
    if args.format == "json":
        print(format_json(model, functions), end="")
    else:
        print(format_model(model, functions), end="")
    return EXIT_OK


if __name__ == "__main__":
    raise SystemExit(main())
