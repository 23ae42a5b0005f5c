"""The command-line contract: exit codes, JSON shape, and no torch on the check path."""

from __future__ import annotations

import json
import subprocess
import sys

from conftest import ROOT, fgc


def test_check_shipped_specs_ok():
    r = fgc("check", "specs/")
    assert r.returncode == 0, r.stderr
    assert "error" not in r.stderr


def test_params_formal_gpt_paper_is_the_seed_figure():
    r = fgc("params", "specs/formal/gpt.fgpt", "--preset", "paper", "--format", "json")
    assert r.returncode == 0, r.stderr
    data = json.loads(r.stdout)
    assert data["total"] == 116_497_920
    assert isinstance(data["total"], int)
    assert "formula" in data and isinstance(data["formula"], str)


def test_usage_errors_exit_2():
    assert fgc("params", "specs/formal/gpt.fgpt", "--preset", "nope").returncode == 2
    assert fgc("params", "specs/formal/gpt.fgpt", "--set", "Q=3").returncode == 2
    assert fgc("params", "specs/formal/gpt.fgpt", "--set", "H=abc").returncode == 2
    assert fgc("frobnicate").returncode == 2


def test_check_and_params_do_not_import_torch_or_onnx():
    code = (
        "import sys\n"
        "from compiler.cli import main\n"
        "main(['check', 'specs/formal/gpt.fgpt'])\n"
        "main(['params', 'specs/formal/gpt.fgpt', '--by-module'])\n"
        "names = ('torch', 'onnx', 'onnxruntime', 'transformers')\n"
        "heavy = [m for m in names if m in sys.modules]\n"
        "print('HEAVY', heavy)\n"
    )
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert "HEAVY []" in r.stdout
