"""A bounded fuzz campaign over the front half: whatever a spec file holds, `fgc check`,
`fgc params`, `fgc ir` and `fgc compile --target torch` answer with exit 0, 1 or 2, never an
internal error (3) or a traceback, within a time limit and a memory limit, and every error in
a spec is located (`file:line:col`).

The cases, from a fixed seed (FGC_FUZZ_SEED) and as many as FGC_FUZZ_CASES (default
DEFAULT_CASES; e.g. FGC_FUZZ_CASES=50000 for a long run):
  - mutations of every shipped spec and the standard library: tokens deleted, duplicated,
    swapped or renamed; numbers replaced by huge, zero, negative or odd ones (`1e300`, `0`,
    `-1`, `1_`, `3K`); identifiers inserted (Python keywords, nn.Module attributes, the
    names model.py binds); lines deleted, duplicated or swapped; bytes deleted, duplicated
    or inserted (NUL, invalid UTF-8); the file truncated;
  - specs derived at random from compiler/syntax/grammar.lark's own rules (so they follow the
    grammar as it changes), with the terminals drawn from pools of plausible tokens;
  - test_properties.py's hypothesis strategies (near-valid models, generated programs,
    models with their own modules), drawn from a fixed seed.

The cases run in-process (`compiler.cli.main`) in worker subprocesses (this file, run as
a script), one per batch, under RLIMIT_AS and a per-command alarm, reporting one JSON line
per case; a worker that dies or hangs is replaced, past the case that killed it. Each
distinct failure is reduced (lines, then tokens) to a small reproducer, and the test fails
listing them; what it found once is pinned in FOUND. The parse cache is off in the workers.

Every error is located, `fgc check`'s JSON included. The only errors that legitimately have
no location are about the file as a whole, which the campaign's regular, readable files
never meet: one that cannot be read (no permission, a FIFO, a folder) or is too large.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent

DEFAULT_CASES = 1200
CASES = int(os.environ.get("FGC_FUZZ_CASES", DEFAULT_CASES))
SEED = int(os.environ.get("FGC_FUZZ_SEED", 16))
WORKERS = int(os.environ.get("FGC_FUZZ_WORKERS", min(2, os.cpu_count() or 1)))
COMMAND_SECONDS = 10.0  # one command on one spec takes 0.01-0.3 s; a loaded CI gets slack
MEMORY = 3 * 2**30  # RLIMIT_AS of a worker: an interpreter with lark and jinja2 and room
HANG_SECONDS = 6 * COMMAND_SECONDS  # a worker silent this long (a case runs up to 4
# commands) is stuck where its alarm cannot reach (inside one long C call)
MINIMIZE_SECONDS = 30.0
SHOW = 8  # distinct failures reduced and listed

SOURCES = sorted((ROOT / "specs").rglob("*.fgpt")) + [ROOT / "compiler/stdlib/stdlib.fgpt"]

# ---------------------------------------------------------------- what goes into a spec

TOKEN = re.compile(r"[A-Za-z][A-Za-z0-9_]*'*(?:\^[A-Za-z][A-Za-z0-9_]*)?"
                   r"|[0-9][0-9_]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?[KMBT]?"
                   r"|\"[^\"\n]*\"|\.\.\.|\.\.|->|==|!=|<=|>=|\S")
NUMBER = re.compile(r"(?<![A-Za-z0-9_.])[0-9][0-9_]*(?:\.[0-9]+)?(?:[eE][-+]?[0-9]+)?[KMBT]?")
NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*'*(?:\^[A-Za-z][A-Za-z0-9_]*)?")

NUMBERS = ["0", "-1", "1", "2", "3", "7", "1_", "1__0", "3K", "2T", "1e300", "1e-300",
           "1e300T", "1e301", "9" * 41, "9" * 37 + "e300", "0.5", "1.3B", "inf", "-inf",
           "10_000", "4_611_686_018_427_387_905", "99999999999999999999", "0e0", "00",
           "1_000_000_000", "2 * 1e300", "1e300 * 1e300", "1 / 0", "0.0", "1e-5"]
_KEYWORDS = ["False", "None", "True", "and", "as", "assert", "async", "await", "break",
             "class", "continue", "def", "del", "elif", "else", "except", "finally", "for",
             "from", "global", "if", "import", "in", "is", "lambda", "nonlocal", "not", "or",
             "pass", "raise", "return", "try", "while", "with", "yield", "match", "case",
             "type", "_"]
SPEC_WORDS = ["model", "module", "hyper", "preset", "input", "param", "output", "expect",
              "params", "share", "with", "layers", "for", "in", "where", "if", "else", "is",
              "even", "odd", "and", "or", "not", "inf", "checkpoint", "prefix", "ignore",
              "split", "heads", "transpose", "R", "Perm"]
PIECES = ["(", ")", "{", "}", "[", "]", '"', "'", "^", "@", ",", "=", "..", "...", ":", "->",
          "#", "\n", "\t", "|", "H^(l+1)", "H^(0)", "for i in 1..A", "_1", "^T", "% 0",
          "/ 0", "* 0", "\x00", "é", "×", "∈", "\u200b", "\ufeff", "\r", "X'", "W_i^Q"]
COMMON = ["H", "L", "A", "D", "F", "V", "n", "w", "x", "z", "X", "Y", "E", "W", "W_e", "W_p",
          "b", "Hhat", "G", "Mask", "head", "l", "i", "j", "k", "W_i^Q", "X'", "Mask^AR",
          "eps", "LN", "MH", "FF", "Softmax", "GELU", "OneHot", "Attention", "Concat"]


HYPERS = ["L", "H", "A", "D", "F", "V", "n", "m", "eps", "theta", "R", "w", "E", "K", "G", "Q"]
SET_VALUES = ["0", "-1", "1", "2", "3", "7", "1_", "3K", "2T", "1e300", "1e300T", "1e-300",
              "9" * 37 + "e300", "0.5", "1.3B", "10_000", "4611686018427387905", "abc", ""]
GPT2 = ROOT / "specs" / "formal" / "gpt2.fgpt"


def identifiers() -> list[str]:
    """Python's keywords, nn.Module's attributes and the names model.py binds: what a spec
    name must never clash with in the emitted code."""
    from compiler.names import GENERATED, NN_MODULE
    return sorted(set(_KEYWORDS) | NN_MODULE | GENERATED | {"__init__", "__class__", "super",
                                                            "self", "torch", "nn", "math"})


# ---------------------------------------------------------------- mutations


# numbers reach every later pass (sizes, counts, checkpoint steps), so they are replaced
# most often; the other edits mostly end in the parser
OPS = ["number"] * 6 + ["delete", "duplicate", "swap", "insert-name", "insert-piece",
                        "rename", "line-delete", "line-duplicate", "line-swap", "byte-delete",
                        "byte-duplicate", "byte-insert", "truncate"]


def mutate(rng: random.Random, data: bytes, names: list[str]) -> bytes:
    """1 to 4 random edits of a spec, by tokens, lines or bytes."""
    for _ in range(rng.randint(1, 4)):
        op = rng.choice(OPS)
        if op.startswith("byte") or op == "truncate":
            data = _mutate_bytes(rng, op, data)
        else:
            text = data.decode("utf-8", "surrogateescape")
            data = _mutate_text(rng, op, text, names).encode("utf-8", "surrogateescape")
    return data


def _mutate_bytes(rng: random.Random, op: str, data: bytes) -> bytes:
    if not data:
        return data
    a = rng.randrange(len(data) + 1)
    b = min(len(data), a + rng.choice([1, 1, 2, 5, 40]))
    if op == "byte-delete":
        return data[:a] + data[b:]
    if op == "byte-duplicate":
        return data[:b] + data[a:b] * rng.choice([1, 2, 50]) + data[b:]
    if op == "byte-insert":
        junk = rng.choice([b"\x00", b"\xff", b"\xc3", b"\xe2\x82", b"\r", b"\x1b", b"\x0c",
                           bytes([rng.randrange(256)])])
        return data[:a] + junk + data[a:]
    return data[:a]  # truncate


def _mutate_text(rng: random.Random, op: str, text: str, names: list[str]) -> str:
    toks = [m.span() for m in TOKEN.finditer(text)]
    lines = text.split("\n")
    if op == "delete" and toks:
        a, b = rng.choice(toks)
        return text[:a] + text[b:]
    if op == "duplicate" and toks:
        a, b = rng.choice(toks)
        return text[:b] + " " + text[a:b] + text[b:]
    if op == "swap" and len(toks) > 1:
        i = rng.randrange(len(toks) - 1)
        j = rng.randint(i + 1, min(len(toks) - 1, i + 40))
        (a, b), (c, d) = toks[i], toks[j]
        return text[:a] + text[c:d] + text[b:c] + text[a:b] + text[d:]
    if op == "number":
        nums = [m.span() for m in NUMBER.finditer(text)]
        if nums:
            a, b = rng.choice(nums)
            return text[:a] + rng.choice(NUMBERS) + text[b:]
        return text
    if op == "insert-name":
        at = _token_edge(rng, text, toks)
        return text[:at] + " " + rng.choice(names + SPEC_WORDS) + " " + text[at:]
    if op == "insert-piece":
        at = _token_edge(rng, text, toks)
        return text[:at] + rng.choice(PIECES + NUMBERS) + text[at:]
    if op == "rename":
        spans = [m.span() for m in NAME.finditer(text)]
        if spans:
            a, b = rng.choice(spans)
            new = rng.choice(names + COMMON + [text[c:d] for c, d in rng.sample(
                spans, min(3, len(spans)))])
            return text[:a] + new + text[b:]
        return text
    if op == "line-delete" and len(lines) > 1:
        del lines[rng.randrange(len(lines))]
    elif op == "line-duplicate" and lines:
        lines.insert(rng.randrange(len(lines) + 1), rng.choice(lines))
    elif op == "line-swap" and len(lines) > 1:
        i, j = rng.randrange(len(lines)), rng.randrange(len(lines))
        lines[i], lines[j] = lines[j], lines[i]
    return "\n".join(lines)


def _token_edge(rng: random.Random, text: str, toks: list[tuple[int, int]]) -> int:
    return rng.choice(toks)[rng.randrange(2)] if toks else rng.randrange(len(text) + 1)


# ---------------------------------------------------------------- specs from the grammar


class GrammarSpecs:
    """Random derivations of compiler/syntax/grammar.lark's rules: plausible specs that follow the
    grammar as it changes. Deep or long derivations finish along the shortest expansions."""

    TERMINALS = {
        "NAME": lambda rng, names: rng.choice(COMMON * 3 + names),
        "INT": lambda rng, names: rng.choice(["1", "2", "3", "4", "8", "12", "64", "768",
                                              "0", "10_000", "3K", "1_", "2T", "125M",
                                              "9" * 41]),
        "FLOAT": lambda rng, names: rng.choice(["0.5", "1e-5", "1.702", "1e300", "2.5e3",
                                                "1.3B", "1e-300", "9.9e300"]),
        "STRING": lambda rng, names: rng.choice(['"h.{l}.attn.c_attn.weight"', '"wte.weight"',
                                                 '"transformer."', '""', '"{l}"', '"x"']),
        "CMP": lambda rng, names: rng.choice(["!=", "<=", ">=", "<", ">"]),
        "PARITY": lambda rng, names: rng.choice(["even", "odd"]),
        "EQEQ": lambda rng, names: "==",
        "TILDE": lambda rng, names: "~",
        "ELLIPSIS": lambda rng, names: "...",
        "MEMBER_AT": lambda rng, names: rng.choice(["k_{", "head_{", "W_{", "x_{"]),
    }

    def __init__(self, max_depth: int = 14, max_tokens: int = 300):
        import lark
        from lark.lexer import PatternStr
        grammar = (ROOT / "compiler" / "syntax" / "grammar.lark").read_text(encoding="utf-8")
        # Earley builds no tables: this only reads the grammar's rules and terminals
        parsed = lark.Lark(grammar, parser="earley", lexer="dynamic")
        self.rules: dict[str, list[list]] = {}
        for rule in parsed.rules:
            self.rules.setdefault(rule.origin.name, []).append(list(rule.expansion))
        self.literal = {t.name: t.pattern.value for t in parsed.terminals
                        if isinstance(t.pattern, PatternStr)}
        known = set(self.literal) | set(self.TERMINALS) | set(parsed.ignore_tokens)
        self.unknown = sorted(t.name for t in parsed.terminals if t.name not in known)
        # the names the grammar's NAME reads (keywords such as `in` or `for` are not)
        name = re.compile(parsed.get_terminal("NAME").pattern.to_regexp())
        self.is_name = lambda text: name.fullmatch(text) is not None
        self.max_depth, self.max_tokens = max_depth, max_tokens
        self.height = self._heights()

    def _heights(self) -> dict[str, int]:
        """How deep the shallowest derivation of each rule is (a fixpoint)."""
        inf = 10**9
        h = {name: inf for name in self.rules}
        changed = True
        while changed:
            changed = False
            for name, expansions in self.rules.items():
                best = min(1 + max([h.get(s.name, 0) if not s.is_term else 0 for s in exp],
                                   default=0) for exp in expansions)
                if best < h[name]:
                    h[name], changed = best, True
        return h

    def _cost(self, exp) -> int:
        return max([self.height.get(s.name, 0) if not s.is_term else 0 for s in exp], default=0)

    def spec(self, rng: random.Random, names: list[str]) -> str:
        names = [n for n in names if self.is_name(n)]
        out: list[str] = []
        self._derive("start", rng, names, 0, out)
        return " ".join(out) + "\n"

    def _derive(self, name: str, rng, names, depth: int, out: list[str]) -> None:
        expansions = self.rules[name]
        if depth > self.max_depth or len(out) > self.max_tokens:
            least = min(self._cost(e) for e in expansions)
            expansions = [e for e in expansions if self._cost(e) == least]
        for sym in rng.choice(expansions):
            if not sym.is_term:
                self._derive(sym.name, rng, names, depth + 1, out)
            elif sym.name in self.literal:
                out.append(self.literal[sym.name])
            elif sym.name in self.TERMINALS:
                out.append(self.TERMINALS[sym.name](rng, names))


# ---------------------------------------------------------------- the cases


def hypothesis_specs(count: int, seed: int) -> list[tuple[str, str]]:
    """test_properties.py's strategies, drawn with a fixed seed through hypothesis's public
    API (a @given test that collects what it is given)."""
    if count <= 0:
        return []
    from hypothesis import HealthCheck, Phase, given, settings
    from hypothesis import seed as fixed_seed
    sys.path.insert(0, str(HERE))
    import test_properties as props
    out: list[tuple[str, str]] = []
    kinds = [("near_valid.fgpt", props.near_valid(props.HUGE)),
             ("generated.fgpt", props.programs),
             ("custom_module.fgpt", props.custom_module_model())]
    per = max(1, count // len(kinds))
    for name, strategy in kinds:
        drawn: list[str] = []

        @settings(max_examples=per, database=None, phases=[Phase.generate], deadline=None,
                  suppress_health_check=list(HealthCheck))
        @fixed_seed(seed)
        @given(strategy)
        def collect(text):
            drawn.append(text)  # noqa: B023 - called at once, within this iteration

        collect()
        out.extend((name, t) for t in drawn[:per])
    return out


def build_cases(count: int, seed: int) -> list[dict]:
    """`count` cases: (name, the spec's bytes, the commands to run on it)."""
    rng = random.Random(seed)
    names = identifiers()
    texts = {p: p.read_bytes() for p in SOURCES}
    grammar = GrammarSpecs()
    n_hypothesis = count // 5
    n_grammar = count * 15 // 100
    drawn = hypothesis_specs(n_hypothesis, seed)
    cases = []
    for name, text in drawn:
        cases.append((name, text.encode("utf-8", "surrogatepass"), "hypothesis", GPT2))
    for _ in range(n_grammar):
        cases.append(("grammar.fgpt", grammar.spec(rng, names).encode(), "grammar", GPT2))
    while len(cases) < count:
        path = rng.choice(SOURCES)
        cases.append((path.name, mutate(rng, texts[path], names), f"mutated {path.name}",
                      path))
    rng.shuffle(cases)
    out = []
    for i, (name, data, origin, original) in enumerate(cases[:count]):
        out.append({"i": i, "name": name, "origin": origin, "data": data.decode("latin-1"),
                    "argvs": commands(rng, original)})
    return out


def commands(rng: random.Random, original: Path) -> list[list[str]]:
    """`check` and `params` always; a sample of the other front-half commands."""
    argvs = [["check", "--format", "json", "{spec}"], ["params", "{spec}", "--format", "json"]]
    sample = [
        (0.08, ["ir", "{spec}"]),
        (0.06, ["compile", "{spec}", "--target", "torch", "-o", "{out}"]),
        (0.06, ["params", "{spec}", "--by-module"]),
        (0.08, ["params", "{spec}", "--set", f"{rng.choice(HYPERS)}={rng.choice(SET_VALUES)}"]),
        (0.05, ["diff", "{spec}", str(original)]),
    ]
    for chance, argv in sample:
        if rng.random() < chance:
            argvs.append(argv)
    return argvs


# ---------------------------------------------------------------- the worker (a subprocess)


class CommandTimeout(BaseException):
    """Raised by SIGALRM inside fgc; a BaseException so that no `except Exception` in fgc
    turns it into an internal error."""


def _innermost(tb) -> str:
    """`compiler/elaborate/elaborator.py:123 in _eval`: the deepest frame of fgc's own code."""
    import traceback
    where = "?"
    for frame in traceback.extract_tb(tb):
        rel = os.path.relpath(frame.filename, ROOT)
        if rel.startswith(("compiler", "runtime")):
            where = f"{rel}:{frame.lineno} in {frame.name}"
    return where


_LOCATED = re.compile(r"^.+:\d+:\d+: error: ", re.M)
_UNLOCATED = re.compile(r"^(?:fgc: )?error: .*$", re.M)


def run_command(main, argv: list[str], spec: Path) -> dict:
    """Run one fgc command in-process; the problem it shows, if any."""
    import contextlib
    import io
    import signal
    out, err = io.StringIO(), io.StringIO()
    t0 = time.perf_counter()
    problem = signature = None
    code = None
    signal.setitimer(signal.ITIMER_REAL, COMMAND_SECONDS)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as e:
                code = e.code
    except CommandTimeout as e:
        problem, signature = "timeout", f"timeout at {_innermost(e.__traceback__)}"
    except MemoryError as e:
        problem, signature = "memory", f"MemoryError at {_innermost(e.__traceback__)}"
    except RecursionError as e:
        problem, signature = "exception", f"RecursionError at {_innermost(e.__traceback__)}"
    except Exception as e:  # noqa: BLE001 - FGC_DEBUG=1: an internal error comes out here
        problem = "exception"
        signature = f"{type(e).__name__} at {_innermost(e.__traceback__)}"
        err.write(f"{type(e).__name__}: {str(e)[:300]}\n")
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    secs = time.perf_counter() - t0
    text = out.getvalue() + err.getvalue()
    if problem is None:
        problem, signature = _judge(argv, code, out.getvalue(), err.getvalue(), spec)
    return {"argv": argv[:1], "code": code, "secs": round(secs, 3), "problem": problem,
            "signature": signature, "output": text[-1500:] if problem else ""}


def _judge(argv, code, out: str, err: str, spec: Path) -> tuple[str | None, str | None]:
    """The contract, for a command that returned: exit 0/1/2, no traceback, located errors."""
    command = argv[0]
    if "Traceback" in out + err or "internal error" in out + err:
        return "traceback", f"{command}: traceback or internal error"
    if code not in (0, 1, 2):
        return "exit", f"{command}: exit {code}"
    if command == "check":
        try:
            report = json.loads(out)
        except ValueError:
            return "output", "check: --format json printed no JSON"
        for f in report["files"]:
            for d in f["diagnostics"]:
                if d["severity"] == "error" and not {"file", "line", "column"} <= set(d):
                    return "unlocated", f"check: unlocated error: {_shape(d['message'])}"
        if (code == 1) != any(d["severity"] == "error" for f in report["files"]
                              for d in f["diagnostics"]):
            return "exit", f"check: exit {code} disagrees with its diagnostics"
        return None, None
    # a usage error is the answer to a bad --set (an unknown name, a value that is no number)
    usage = "--set" in argv and code == 2
    stray = [line for line in _UNLOCATED.findall(err)
             if not (usage and line.startswith("fgc: error: "))]
    if stray:
        return "unlocated", f"{command}: unlocated error: {_shape(stray[0])}"
    # diff answers 1 for "different", and 2 for trouble, which a located error explains
    failed = 2 if command == "diff" else 1
    if code == failed and not _LOCATED.search(err):
        return "unlocated", f"{command}: exit {code} with no located error"
    if code == 2 and not usage and command != "diff":
        return "exit", f"{command}: a usage error for a spec's content"
    return None, None


def _shape(message: str) -> str:
    """A message with its particulars (names, numbers, quotes) blanked: one per kind."""
    message = re.sub(r"`[^`]*`|'[^']*'|\"[^\"]*\"", "_", message)
    return re.sub(r"[0-9][0-9,._]*", "N", message)[:120]


def _setup_worker(folder: Path):
    import resource
    import signal

    def alarm(signum, frame):
        raise CommandTimeout()

    signal.signal(signal.SIGALRM, alarm)
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    limit = MEMORY if hard == resource.RLIM_INFINITY else min(MEMORY, hard)
    resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    os.environ["FGC_DEBUG"] = "1"  # an internal error raises, with its traceback, to here
    sys.path.insert(0, str(ROOT))
    os.chdir(folder)
    from compiler.cli import main
    return main


def run_case(main, case: dict, folder: Path) -> list[dict]:
    spec = folder / case["name"]
    spec.write_bytes(case["data"].encode("latin-1"))
    out = folder / "out"
    results = []
    for argv in case["argvs"]:
        argv = [a.format(spec=str(spec), out=str(out)) for a in argv]
        results.append(run_command(main, argv, spec))
        shutil.rmtree(out, ignore_errors=True)
    return results


def worker(manifest: Path, results: Path, folder: Path) -> None:
    main = _setup_worker(folder)
    with open(results, "a", encoding="utf-8") as sink:
        for line in manifest.read_text(encoding="utf-8").splitlines():
            case = json.loads(line)
            sink.write(json.dumps({"start": case["i"]}) + "\n")
            sink.flush()
            sink.write(json.dumps({"i": case["i"], "results": run_case(main, case, folder)})
                       + "\n")
            sink.flush()


def minimize_worker(case_file: Path, result_file: Path, folder: Path) -> None:
    """Reduce one failing case while it fails the same way: drop lines, then tokens."""
    main = _setup_worker(folder)
    job = json.loads(case_file.read_text(encoding="utf-8"))
    data = job["data"].encode("latin-1")
    argv, signature = job["argv"], job["signature"]
    deadline = time.monotonic() + MINIMIZE_SECONDS

    def fails(candidate: bytes) -> bool:
        case = {"name": job["name"], "data": candidate.decode("latin-1"), "argvs": [argv]}
        return run_case(main, case, folder)[0]["signature"] == signature

    bare = re.sub(rb"[ \t]*#[^\n]*", b"", data)
    bare = re.sub(rb"\n\s*\n", b"\n", bare)
    if bare != data and fails(bare):
        data = bare
    for split in (_byte_lines, _byte_tokens):
        parts = split(data)
        chunk = max(1, len(parts) // 2)
        while chunk >= 1 and time.monotonic() < deadline:
            i, removed = 0, False
            while i < len(parts) and time.monotonic() < deadline:
                candidate = parts[:i] + parts[i + chunk:]
                if candidate and fails(b"".join(candidate)):
                    parts, removed = candidate, True
                else:
                    i += chunk
            if not removed:
                chunk //= 2
        data = b"".join(parts)
    result_file.write_text(json.dumps({"data": data.decode("latin-1")}), encoding="utf-8")


def _byte_lines(data: bytes) -> list[bytes]:
    return data.splitlines(keepends=True)


def _byte_tokens(data: bytes) -> list[bytes]:
    """Tokens with the space after each, so that dropping one keeps the rest apart."""
    return [m.group(0) for m in re.finditer(rb"\S+\s*|\s+", data)]


# ---------------------------------------------------------------- the campaign (the parent)


def _env(folder: Path) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "FGC_DEBUG"}
    env.update(FGC_NO_CACHE="1", XDG_CACHE_HOME=str(folder / "cache"), PYTHONHASHSEED="0",
               PYTHONPATH=str(ROOT))
    return env


def run_batch(cases: list[dict], folder: Path) -> tuple[dict[int, list[dict]], list[dict]]:
    """Run `cases` in worker subprocesses, replacing one that dies or hangs past the case
    it was on. Returns the results by case and the cases that killed a worker."""
    folder.mkdir(parents=True, exist_ok=True)
    done: dict[int, list[dict]] = {}
    killers: list[dict] = []
    todo = list(cases)
    by_index = {c["i"]: c for c in cases}
    while todo:
        manifest, results = folder / "manifest.jsonl", folder / "results.jsonl"
        manifest.write_text("".join(json.dumps(c) + "\n" for c in todo), encoding="utf-8")
        results.write_text("")
        work = folder / "work"
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        proc = subprocess.Popen([sys.executable, __file__, "--worker", str(manifest),
                                 str(results), str(work)], env=_env(folder), cwd=ROOT,
                                stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
        size, quiet_since = -1, time.monotonic()
        while proc.poll() is None:
            time.sleep(0.2)
            now_size = results.stat().st_size
            if now_size != size:
                size, quiet_since = now_size, time.monotonic()
            elif time.monotonic() - quiet_since > HANG_SECONDS:
                proc.kill()
        stderr = proc.communicate()[1].decode("utf-8", "replace")
        started, progressed = None, False
        for line in results.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            if "start" in row:
                started = row["start"]
            else:
                done[row["i"]] = row["results"]
                started, progressed = None, True
        if started is not None:  # the case that killed the worker, or hung it
            how = "hang" if proc.returncode == -9 else f"worker died ({proc.returncode})"
            killers.append({**by_index[started], "problem": how, "signature": how,
                            "output": stderr[-1500:]})
        elif not progressed and proc.returncode != 0:
            raise AssertionError(f"a fuzz worker failed: {stderr[-3000:]}")
        todo = [c for c in todo if c["i"] not in done and c["i"] != started]
    return done, killers


def minimize(case: dict, argv: list[str], signature: str, folder: Path) -> bytes:
    folder.mkdir(parents=True, exist_ok=True)
    job, result = folder / "job.json", folder / "result.json"
    job.write_text(json.dumps({"name": case["name"], "data": case["data"], "argv": argv,
                               "signature": signature}), encoding="utf-8")
    result.unlink(missing_ok=True)
    work = folder / "work"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir()
    try:
        subprocess.run([sys.executable, __file__, "--minimize", str(job), str(result),
                        str(work)], env=_env(folder), cwd=ROOT, capture_output=True,
                       timeout=MINIMIZE_SECONDS + 4 * COMMAND_SECONDS)
    except subprocess.TimeoutExpired:
        pass
    if result.is_file():
        return json.loads(result.read_text(encoding="utf-8"))["data"].encode("latin-1")
    return case["data"].encode("latin-1")


def campaign(count: int, seed: int, folder: Path) -> tuple[dict, list[str], float]:
    """Run the campaign; (statistics, failure reports, seconds)."""
    t0 = time.monotonic()
    cases = build_cases(count, seed)
    batches = [cases[k::WORKERS] for k in range(WORKERS)]
    from concurrent.futures import ThreadPoolExecutor
    with ThreadPoolExecutor(WORKERS) as pool:
        outcomes = list(pool.map(lambda kb: run_batch(kb[1], folder / f"batch{kb[0]}"),
                                 enumerate(batches)))
    by_index = {c["i"]: c for c in cases}
    failures: dict[str, list[tuple[dict, dict]]] = {}
    stats = {"cases": len(cases), "commands": 0, "exit": {}, "slowest": 0.0}
    for done, killers in outcomes:
        for i, results in done.items():
            for r in results:
                stats["commands"] += 1
                stats["exit"][str(r["code"])] = stats["exit"].get(str(r["code"]), 0) + 1
                stats["slowest"] = max(stats["slowest"], r["secs"])
                if r["problem"]:  # one entry per signature, whichever commands show it
                    failures.setdefault(r["signature"], []).append((by_index[i], r))
        for case in killers:
            failures.setdefault(case["signature"], []).append((case, case))
    reports = []
    for n, (key, found) in enumerate(sorted(failures.items(), key=lambda kv: -len(kv[1]))):
        cost = {"params": 0, "check": 1, "ir": 2, "compile": 3, "diff": 4}
        case, r = min(found, key=lambda cr: (cost.get(cr[1].get("argv", ["?"])[0], 5),
                                             len(cr[0]["data"])))
        commands = sorted({r["argv"][0] for _, r in found if "argv" in r})
        head = (f"[{len(found)} case(s), fgc {'/'.join(commands) or '?'}] {key}\n"
                f"  from: {case['origin']} (case {case['i']})")
        if n < SHOW and r is not case:
            argv = next(a for a in case["argvs"] if a[0] == r["argv"][0])
            small = minimize(case, argv, r["signature"], folder / "minimize")
            spec = small.decode("utf-8", "backslashreplace")
            head += (f"\n  fgc {' '.join(argv).format(spec=case['name'], out='OUT')}\n"
                     f"  output: {r['output'][-600:]!r}\n  reproducer ({len(small)} bytes):\n"
                     + "\n".join("    | " + line for line in spec.splitlines()[:40]))
        reports.append(head)
    return stats, reports, time.monotonic() - t0


# What the campaign found, reduced: each once answered with an internal error.
SPECS = ROOT / "specs"
FOUND = [
    # a checkpoint step's integer read with int(): `1_`, `1__0` and `2T` are INT tokens
    ("gpt2.fgpt", '| split(2, 3, 1) | heads(2)', '| split(1_, 3, 1) | heads(2)', "check"),
    ("gpt2.fgpt", '| split(2, 3, 1) | heads(2)', '| split(2, 1__0, 1) | heads(2)', "params"),
    ("gpt2.fgpt", '| split(2, 3, 1) | heads(2)', '| split(2, 3, 1) | heads(2T)', "ir"),
    # 1e600 in a preset, compared as a float with the derived value (OverflowError)
    ("gpt2.fgpt", "L = 12, H = 768, A = 12\n", "L = 12, H = 768, A = 12, D = 1e300 * 1e300\n",
     "check"),
    # Reformer with one layer: its LSH layers (even l) are none, divided by in the formula
    ("reformer.fgpt", "hyper L = 6,", "hyper L = 1,", "params --by-module"),
    ("reformer.fgpt", "hyper L = 6,", "hyper L = 1,", "diff"),
    # a real number in max() with a size symbol (ShapeError from the float path)
    ("reformer.fgpt", "c = 64, ", "c = inf, ", "ir"),
    # a real hyperparameter that is infinite, substituted into a module's sizes
    ("bert.fgpt", "eps = 1e-12", "eps = -inf", "compile"),
    # the same in the ONNX lowering, which computed exactly with it (OverflowError)
    ("bert.fgpt", "eps = 1e-12", "eps = -inf", "compile-onnx"),
    # a size given a real default: counted as a symbol, never checked as a size
    ("reformer.fgpt", "F = 512,", "F = 1e-5,", "params --format json"),
]


@pytest.mark.parametrize("spec, old, new, command", FOUND,
                         ids=[f"{c[0]}:{c[2].strip()[:30]}:{c[3]}" for c in FOUND])
def test_what_fuzzing_found(spec, old, new, command, tmp_path):
    from test_bad_input import run_main
    text = (SPECS / spec).read_text(encoding="utf-8")
    assert old in text
    path = tmp_path / spec
    path.write_text(text.replace(old, new, 1), encoding="utf-8")
    argv = {"check": ["check", "--format", "json", str(path)],
            "diff": ["diff", str(path), str(SPECS / spec)],
            "compile": ["compile", str(path), "--target", "torch", "-o", str(tmp_path / "o")],
            "compile-onnx": ["compile", str(path), "--target", "onnx", "-o", str(tmp_path / "o"),
                             *(a for kv in ("L=1", "H=8", "A=2", "V=10", "n=4", "F=8")
                               for a in ("--set", kv))],
            }.get(command, [*command.split()[:1], str(path), *command.split()[1:]])
    code, out, err = run_main(argv)
    problem, signature = _judge(argv, code, out, err, path)
    assert problem is None, (signature, out[-2000:], err[-2000:])


def test_fuzz_the_front_half(tmp_path):
    stats, reports, seconds = campaign(CASES, SEED, tmp_path)
    print(f"fuzz: {stats['cases']} cases, {stats['commands']} commands in {seconds:.1f} s "
          f"(seed {SEED}, {WORKERS} workers); exits {stats['exit']}; slowest command "
          f"{stats['slowest']:.2f} s")
    assert not reports, (f"{len(reports)} distinct failures in {stats['cases']} cases (seed "
                         f"{SEED}):\n\n" + "\n\n".join(reports))


def test_the_grammar_generator_knows_every_terminal():
    """A terminal added to the grammar needs a pool here, or generated specs miss it."""
    assert GrammarSpecs().unknown == []


def test_grammar_derived_specs_are_grammatical():
    """The derivations follow the grammar: Lark accepts them all (what fails is a check the
    syntax tree's builder adds: a call of something not callable, a preset name in two
    words, a malformed number)."""
    sys.path.insert(0, str(ROOT))
    from compiler.errors import FgcError
    from compiler.syntax.parse_tree import parse_uncached
    rng, names, grammar = random.Random(SEED), identifiers(), GrammarSpecs()
    for k in range(60):
        text = grammar.spec(rng, names)
        try:
            parse_uncached(text, f"g{k}.fgpt")
        except FgcError as e:
            assert not e.diagnostics[0].message.startswith("unexpected"), (e.diagnostics, text)


if __name__ == "__main__":
    mode, *paths = sys.argv[1:]
    if mode == "--worker":
        worker(*map(Path, paths))
    elif mode == "--minimize":
        minimize_worker(*map(Path, paths))
    else:
        raise SystemExit(f"usage: {sys.argv[0]} --worker|--minimize FILES...")
