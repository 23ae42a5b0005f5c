"""fgc in other repositories' CI: the pre-commit hooks and the GitHub Actions example.

The hook entries of `.pre-commit-hooks.yaml` are run as pre-commit runs them (entry, then
the matching staged files), on a passing and a failing spec; the workflow's helper script
runs in a scratch git repository, where it must check the specs a change touched and only
those, and print annotations GitHub puts on the changed lines.
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml
from conftest import ROOT

HOOKS = yaml.safe_load((ROOT / ".pre-commit-hooks.yaml").read_text())
GOOD = (ROOT / "specs/formal/gpt2.fgpt").read_text()
BAD = GOOD.replace("H^(0) = OneHot(x) @ W_e + W_p", "H^(0) = OneHot(x) @ W_p")
LINE = next(k for k, line in enumerate(BAD.splitlines(), 1) if "OneHot(x) @ W_p" in line)
BIN = str(Path(sys.executable).parent)  # the environment's console scripts (fgc)
ENV = {**os.environ, "PATH": BIN + os.pathsep + os.environ.get("PATH", ""), "NO_COLOR": "1"}


def run_hook(hook: dict, files: list[Path], cwd: Path) -> subprocess.CompletedProcess:
    """As pre-commit does: the entry, the hook's args, then the files its pattern picks."""
    pattern = re.compile(hook["files"])
    picked = [str(f.relative_to(cwd)) for f in files if pattern.search(str(f))]
    argv = shlex.split(hook["entry"]) + hook.get("args", []) + picked
    return subprocess.run(argv, cwd=cwd, env=ENV, capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("hook", HOOKS, ids=lambda h: h["id"])
def test_hook_passes_a_good_spec_and_fails_a_bad_one(hook, tmp_path):
    assert shutil.which("fgc", path=ENV["PATH"]), "fgc is not installed in this environment"
    good, bad, other = tmp_path / "good.fgpt", tmp_path / "bad.fgpt", tmp_path / "notes.txt"
    good.write_text(GOOD)
    bad.write_text(BAD)
    other.write_text("not a spec")
    ok = run_hook(hook, [good, other], tmp_path)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    assert "good.fgpt: ok" in ok.stdout and "notes.txt" not in ok.stdout + ok.stderr
    failed = run_hook(hook, [good, bad, other], tmp_path)
    assert failed.returncode == 1
    assert f"bad.fgpt:{LINE}:" in failed.stderr and "error:" in failed.stderr
    assert "Traceback" not in failed.stderr


def git(cwd: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=cwd, check=True, capture_output=True, text=True,
                          env={**ENV, "GIT_AUTHOR_NAME": "t", "GIT_AUTHOR_EMAIL": "t@t",
                               "GIT_COMMITTER_NAME": "t", "GIT_COMMITTER_EMAIL": "t@t"}).stdout


@pytest.mark.skipif(shutil.which("git") is None, reason="git is not installed")
def test_workflow_checks_only_changed_specs(tmp_path):
    script = ROOT / "examples/ci/check-changed-specs.sh"
    workflow = yaml.safe_load((ROOT / "examples/ci/fgc-check.yml").read_text())
    steps = workflow["jobs"]["check"]["steps"]
    assert any("check-changed-specs.sh" in s.get("run", "") for s in steps)
    repo = tmp_path / "repo"
    (repo / "models").mkdir(parents=True)
    git(repo, "init", "-q")
    (repo / "models/old_broken.fgpt").write_text(BAD)  # broken, but not part of the change
    (repo / "models/kept.fgpt").write_text(GOOD)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "base")
    base = git(repo, "rev-parse", "HEAD").strip()
    (repo / "models/new.fgpt").write_text(GOOD)
    git(repo, "add", ".")
    git(repo, "commit", "-qm", "a good spec")
    r = subprocess.run(["bash", str(script), base], cwd=repo, env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "checking 1 spec(s) changed since" in r.stdout
    (repo / "models/new.fgpt").write_text(BAD)
    git(repo, "commit", "-qam", "break it")
    r = subprocess.run(["bash", str(script), base, "--", "--strict"], cwd=repo, env=ENV,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1
    assert f"::error file=models/new.fgpt,line={LINE},col=" in r.stdout
    assert "old_broken" not in r.stdout
    # no usable base (a new branch's first push): every tracked spec
    r = subprocess.run(["bash", str(script), "0" * 40], cwd=repo, env=ENV, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 1 and "checking 3 spec(s) tracked" in r.stdout
    assert "old_broken.fgpt" in r.stdout
