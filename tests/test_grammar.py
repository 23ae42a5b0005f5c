"""The grammar: conflict-free LALR(1), every shipped spec parses, and printing is deterministic."""

from __future__ import annotations

import contextlib
import functools
import io
import os
import subprocess
import sys
from pathlib import Path

import interegular  # noqa: F401 - strict mode needs it to find terminal collisions
import lark
import pytest
from conftest import GOLDEN, ROOT, all_specs

from compiler.syntax.parse import parse_text
from compiler.syntax.parse_tree import GRAMMAR, parser

STDLIB = ROOT / "compiler" / "stdlib" / "stdlib.fgpt"


def shipped() -> list[Path]:
    """Every .fgpt the project ships or tests with: specs/, the stdlib, golden inputs."""
    return all_specs() + [STDLIB] + sorted((GOLDEN / "specs").glob("*.fgpt"))


def _rel(p: Path) -> str:
    return str(p.relative_to(ROOT))


@functools.lru_cache(maxsize=1)
def _strict() -> lark.Lark:
    return lark.Lark(GRAMMAR.read_text(), parser="lalr", strict=True,
                     propagate_positions=True, maybe_placeholders=True)


def test_grammar_builds_in_strict_mode():
    """strict=True turns shift/reduce conflicts and colliding terminals into build errors."""
    _strict()


def test_grammar_builds_in_strict_mode_without_options():
    lark.Lark(GRAMMAR.read_text(), parser="lalr", strict=True)


def test_there_are_specs_to_test():
    names = {p.name for p in shipped()}
    assert {"gpt.fgpt", "stdlib.fgpt"} <= names


@pytest.mark.parametrize("path", shipped(), ids=_rel)
def test_shipped_spec_parses(path):
    text = path.read_text(encoding="utf-8")
    f = parse_text(text, path.name)
    assert f.models or f.modules


@pytest.mark.parametrize("path", shipped(), ids=_rel)
def test_strict_and_shipped_parsers_agree(path):
    """The strict grammar and the cached parser fgc uses build the same tree."""
    text = path.read_text(encoding="utf-8")
    assert _strict().parse(text) == parser().parse(text)


def _ir_in_process(path: str, *opts: str) -> str:
    from compiler.cli import main
    out = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(io.StringIO()):
        code = main(["ir", path, *opts])
    assert code == 0, f"fgc ir {path} exited {code}"
    return out.getvalue()


def _models() -> list[Path]:
    return [p for p in shipped() if p != STDLIB]


@pytest.mark.parametrize("path", _models(), ids=_rel)
def test_ir_printing_is_deterministic_in_process(path):
    rel = _rel(path)
    first = _ir_in_process(rel)
    assert first.strip()
    assert _ir_in_process(rel) == first


def _first_preset(path: Path) -> str | None:
    from compiler.pipeline import load
    presets = load(str(path)).presets()
    return presets[0] if presets else None


def _ir_subprocess(seed: str, *args: str) -> str:
    env = dict(os.environ, PYTHONHASHSEED=seed)
    r = subprocess.run([sys.executable, "-m", "compiler.cli", "ir", *args], cwd=ROOT, env=env,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    return r.stdout


@pytest.mark.parametrize("path", _models(), ids=_rel)
def test_ir_printing_does_not_depend_on_the_hash_seed(path):
    """Set and dict order must not leak into the IR: PYTHONHASHSEED=0 and =123 agree."""
    args = [_rel(path)]
    preset = _first_preset(path)
    runs = [args] + ([args + ["--preset", preset]] if preset else [])
    for a in runs:
        assert _ir_subprocess("0", *a) == _ir_subprocess("123", *a), a
