"""The command-line contract: exit codes and JSON shape (what commands import: test_layout)."""

from __future__ import annotations

import json

from conftest import fgc


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

