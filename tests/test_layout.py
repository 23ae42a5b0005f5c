"""The package layout's boundaries: no import cycles, runtime/ apart from compiler/, the ONNX
backend and weights.py apart from the torch backend, and light commands that stay light.

The graph is read from the source (every `import`, those inside functions too), so a cycle
hidden behind a function-level import fails here as one at module level would.
"""

from __future__ import annotations

import ast
import graphlib
import json
import subprocess
import sys
from functools import cache
from pathlib import Path

import pytest
from conftest import ROOT

PACKAGES = ("compiler", "runtime")
TINY = ["--set", "L=2", "--set", "H=16", "--set", "A=2", "--set", "V=50", "--set", "n=8"]
# what the front half must never pull in; transformers only ever comes with the slow tests
HEAVY = ("torch", "onnx", "onnxruntime", "jinja2", "transformers")


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


@cache
def import_graph() -> dict[str, frozenset[str]]:
    """{module: the modules of compiler/ and runtime/ it imports}, anywhere in its source.
    `from pkg import name` counts as importing pkg.name where that is a module."""
    files = {_module_name(p): p for top in PACKAGES for p in (ROOT / top).rglob("*.py")}

    def resolve(name: str) -> str | None:
        while name and name not in files:
            name = name.rpartition(".")[0]
        return name or None

    graph = {}
    for module, path in files.items():
        package = module if path.name == "__init__.py" else module.rpartition(".")[0]
        targets = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                targets.update(alias.name for alias in node.names)
            elif isinstance(node, ast.ImportFrom):
                base = package.rsplit(".", node.level - 1)[0] if node.level else ""
                base = ".".join(filter(None, (base, node.module)))
                targets.update(f"{base}.{alias.name}" for alias in node.names)
        graph[module] = frozenset(t for t in map(resolve, targets) if t and t != module)
    return graph


def reachable(start: str) -> set[str]:
    graph, seen, todo = import_graph(), set(), [start]
    while todo:
        for target in graph[todo.pop()] - seen:
            seen.add(target)
            todo.append(target)
    return seen


def test_the_graph_sees_every_kind_of_import():
    graph = import_graph()
    assert "compiler.elaborate.ir" in graph["compiler.pipeline"]  # from .elaborate import ir
    assert "compiler.syntax.nodes" in graph["compiler.syntax.parse"]  # from . import nodes
    assert "compiler.syntax.parse_tree" in graph["compiler.syntax.parse"]  # in a function
    assert "runtime.files" in graph["compiler.emit"]  # absolute


def test_no_import_cycle():
    try:
        graphlib.TopologicalSorter(import_graph()).prepare()
    except graphlib.CycleError as e:
        pytest.fail("import cycle: " + " -> ".join(e.args[1]))


def test_runtime_never_imports_compiler():
    for module in import_graph():
        if module.partition(".")[0] == "runtime":
            found = sorted(m for m in reachable(module) if m.partition(".")[0] == "compiler")
            assert not found, f"{module} imports {found}"


@pytest.mark.parametrize("module", ["compiler.backends.onnx", "compiler.backends.onnx.graph",
                                    "compiler.backends.onnx.lower", "compiler.weights"])
def test_onnx_backend_and_weights_never_import_the_torch_backend(module):
    found = sorted(m for m in reachable(module) if m.startswith("compiler.backends.torch"))
    assert not found, f"{module} imports {found} (shared names belong in compiler/names.py)"


def _modules_after(argv: list[str], status: int = 0) -> set[str]:
    """sys.modules after `fgc ARGV` in a fresh interpreter, which must exit with `status`."""
    code = ("import json, sys\nfrom compiler.cli import main\n"
            f"code = main({argv!r})\nprint(json.dumps([code, sorted(sys.modules)]))\n")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    code, modules = json.loads(r.stdout.splitlines()[-1])
    assert code == status, r.stderr
    return set(modules)


@pytest.mark.parametrize("argv, status", [
    (["check", "specs/gpt2.fgpt"], 0),
    (["params", "specs/formal/gpt.fgpt", "--by-module"], 0),
    (["diff", "specs/formal/gpt.fgpt", "specs/formal/gpt2.fgpt"], 1),  # 1: they differ
], ids=["check", "params", "diff"])
def test_front_half_commands_stay_light(argv, status):
    modules = _modules_after(argv, status)
    assert not [m for m in HEAVY if m in modules]


def test_onnx_compile_imports_neither_torch_nor_jinja2(tmp_path):
    argv = ["compile", "specs/gpt2.fgpt", "--target", "onnx", *TINY, "--optimize", "ort",
            "-o", str(tmp_path / "onnx")]
    modules = _modules_after(argv)
    assert "onnx" in modules  # the command did lower to ONNX
    assert not [m for m in ("torch", "jinja2") if m in modules]
    assert (tmp_path / "onnx" / "model.onnx").is_file()
