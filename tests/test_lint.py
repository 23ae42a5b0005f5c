"""The project's own code is ruff-clean (the rules in pyproject.toml)."""

from __future__ import annotations

import shutil
import subprocess
import sys

import pytest
from conftest import ROOT


def test_ruff_clean():
    ruff = shutil.which("ruff") or shutil.which("ruff", path=str(ROOT / ".venv" / "bin"))
    if ruff is None:
        try:
            import ruff as _  # noqa: F401
        except ImportError:
            pytest.skip("ruff is not installed")
        cmd = [sys.executable, "-m", "ruff"]
    else:
        cmd = [ruff]
    r = subprocess.run(cmd + ["check", "--no-cache", "compiler", "runtime", "tests", "benchmarks",
                              "examples"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
