"""Planted files: caches that would run code, links that would redirect a write, and output
folders that must change as one unit (docs/security.md)."""

from __future__ import annotations

import json
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT

from compiler.emit import compile_spec
from compiler.errors import FgcError
from compiler.syntax import cache
from compiler.syntax.parse_tree import parse_uncached

TINY = {"L": 1, "H": 16, "A": 2, "V": 50, "n": 16}
TINY_ARGS = [a for k, v in TINY.items() for a in ("--set", f"{k}={v}")]
SPEC = ROOT / "specs" / "gpt2.fgpt"
FORMAL = ROOT / "specs" / "formal" / "gpt2.fgpt"  # no checkpoint block: the module's own names


def run(*args, env=None, timeout=60):
    return subprocess.run([sys.executable, "-m", "compiler.cli", *args], cwd=ROOT,
                          capture_output=True, text=True, timeout=timeout,
                          env={**os.environ, **(env or {})})


class Payload:
    """Unpickling this creates the file `marker`: proof that a pickle was loaded."""

    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


# ---------------------------------------------------------------- 1. nothing is unpickled


def test_no_module_reads_an_executable_format():
    """pickle and marshal appear nowhere in fgc's own code (torch's weights_only loader is
    torch's, called only for pytorch_model.bin when asked)."""
    for folder in ("compiler", "runtime"):
        for path in (ROOT / folder).rglob("*.py"):
            text = path.read_text()
            for word in ("import pickle", "import marshal", "pickle.load", "marshal.load",
                         "cache=True", "dill", "cloudpickle"):
                assert word not in text, f"{path}: {word}"


def test_planted_lark_cache_is_never_read(tmp_path):
    """Lark's own cache (`.lark_cache_*.tmp` in the shared temporary folder, unpickled by
    `cache=True`) is not used: a payload planted under every name Lark could use stays
    unexploded through a cold parse."""
    marker = tmp_path / "exploded"
    tmpdir = Path(tempfile.gettempdir())
    planted = []
    for name in [p.name for p in tmpdir.glob(".lark_cache_*.tmp")] or []:
        planted.append(tmpdir / name)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache"), "TMPDIR": str(tmp_path)}
    # whatever name lark would pick, inside the TMPDIR this run uses
    for i in range(3):
        planted.append(tmp_path / f".lark_cache_{os.getuid()}_{i}.tmp")
    for p in planted:
        if p.parent == tmp_path:
            p.write_bytes(pickle.dumps(Payload(str(marker))))
    r = run("check", str(SPEC), env=env)
    assert r.returncode == 0, r.stderr
    assert not marker.exists()
    assert not list(tmp_path.glob(".lark_cache_*")) or all(
        p.read_bytes() == pickle.dumps(Payload(str(marker))) for p in tmp_path.glob(
            ".lark_cache_*"))


def _entry(tmp_path, monkeypatch, text: str, name: str) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "fgc" / f"parse-{cache.key(text, name)}.json"


def test_parse_cache_round_trip_and_privacy(tmp_path, monkeypatch):
    text = SPEC.read_text()
    entry = _entry(tmp_path, monkeypatch, text, "gpt2.fgpt")
    tree = parse_uncached(text, "gpt2.fgpt")
    cache.store_tree(text, "gpt2.fgpt", tree)
    assert entry.is_file() and cache.load_tree(text, "gpt2.fgpt") == tree
    folder = tmp_path / "cache" / "fgc"
    assert folder.stat().st_mode & 0o777 == 0o700
    assert entry.stat().st_mode & 0o077 == 0
    json.loads(entry.read_bytes())  # JSON, nothing else


PLANTS = {
    "pickle": lambda marker: pickle.dumps(Payload(marker)),
    "truncated": lambda marker: b'["File","gpt2.fgpt",[["Module"',
    "wrong class": lambda marker: json.dumps(
        ["Popen", "touch " + marker]).encode(),
    "wrong field type": lambda marker: json.dumps(["File", 7, [], []]).encode(),
    "a name from another module": lambda marker: json.dumps(
        ["File", "gpt2.fgpt", [["system", "touch " + marker]], []]).encode(),
    "wrong count": lambda marker: json.dumps(["File", "gpt2.fgpt", []]).encode(),
    "huge integer": lambda marker: b"[" + b"9" * 100_000 + b"]",
    "deep": lambda marker: b"[" * 200_000 + b"]" * 200_000,
    "not utf-8": lambda marker: b"\xff\xfe\x00",
}


@pytest.mark.parametrize("kind", sorted(PLANTS))
def test_planted_parse_cache_entry_is_rebuilt(kind, tmp_path, monkeypatch):
    """An entry of the wrong shape is a miss: the spec is parsed again, correctly, the
    entry rewritten, and nothing in it ever runs."""
    text = SPEC.read_text()
    entry = _entry(tmp_path, monkeypatch, text, "gpt2.fgpt")
    entry.parent.mkdir(parents=True, mode=0o700)
    marker = tmp_path / "exploded"
    entry.write_bytes(PLANTS[kind](str(marker)))
    assert cache.load_tree(text, "gpt2.fgpt") is None
    from compiler.syntax.parse import parse_text
    assert parse_text(text, "gpt2.fgpt") == parse_uncached(text, "gpt2.fgpt")
    assert not marker.exists()
    assert cache.load_tree(text, "gpt2.fgpt") is not None  # rewritten


@pytest.mark.parametrize("kind", ["fifo", "folder", "link", "link to a fifo"])
def test_special_parse_cache_entries_are_ignored(kind, tmp_path):
    """A FIFO, a folder or a link at an entry's path: ignored (never waited on, never
    written through), the check still succeeds."""
    text = SPEC.read_text()
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    folder = tmp_path / "cache" / "fgc"
    folder.mkdir(parents=True, mode=0o700)
    name = f"parse-{cache.key(text, str(SPEC))}.json"
    entry = folder / name
    victim = tmp_path / "victim"
    victim.write_text("untouched")
    if kind == "fifo":
        os.mkfifo(entry)
    elif kind == "folder":
        entry.mkdir()
    elif kind == "link":
        entry.symlink_to(victim)
    else:
        os.mkfifo(tmp_path / "fifo")
        entry.symlink_to(tmp_path / "fifo")
    r = run("check", str(SPEC), env=env, timeout=60)
    assert r.returncode == 0, r.stderr
    assert victim.read_text() == "untouched"


def test_untrusted_cache_folder_is_not_used(tmp_path, monkeypatch):
    """A cache folder that is a link, or open to other users and not ours to fix, is not
    used; fgc works without a cache."""
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "cache").mkdir()
    (tmp_path / "cache" / "fgc").symlink_to(elsewhere)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert cache.folder() is None
    text = SPEC.read_text()
    cache.store_tree(text, "gpt2.fgpt", parse_uncached(text, "gpt2.fgpt"))
    assert list(elsewhere.iterdir()) == []
    loose = tmp_path / "loose"
    (loose / "fgc").mkdir(parents=True)
    os.chmod(loose / "fgc", 0o777)
    monkeypatch.setenv("XDG_CACHE_HOME", str(loose))
    assert cache.folder() == loose / "fgc"
    assert (loose / "fgc").stat().st_mode & 0o777 == 0o700  # ours: closed again


# ---------------------------------------------------------------- 2. no write follows a link


@pytest.mark.parametrize("target,names", [
    ("torch", ["model.py", "weights.safetensors"]),
    ("onnx", ["model.onnx", "model.onnx.data"]),
])
def test_links_planted_in_the_output_folder_are_replaced(target, names, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in names:
        victim = tmp_path / f"victim-{name}"
        victim.write_text("untouched")
        (out / name).symlink_to(victim)
        victims[name] = victim
    args = ["compile", str(FORMAL), "--target", target, *TINY_ARGS, "-o", str(out)]
    if target == "onnx":
        args.append("--external-data")
    else:
        weights = tmp_path / "w.safetensors"
        _write_random_checkpoint(weights)
        args += ["--weights", str(weights)]
    r = run(*args)
    assert r.returncode == 0, r.stderr
    for name, victim in victims.items():
        assert victim.read_text() == "untouched"
        assert (out / name).is_file() and not (out / name).is_symlink()


def _write_random_checkpoint(path: Path) -> None:
    """Random weights for SPEC in its module's own names (which --weights also takes)."""
    import importlib.util

    from safetensors.torch import save_file
    folder = path.parent / "ckpt-model"
    compile_spec(str(FORMAL), str(folder), "torch", None, TINY)
    spec = importlib.util.spec_from_file_location("ckpt_model", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    save_file(module.build().state_dict(), str(path))


def test_fgc_run_writes_nothing_beside_the_model(tmp_path, monkeypatch):
    """`fgc run DIR` used to write onnxruntime's optimised graph and a stamp beside the
    model, following links planted at those names; now nothing is written there."""
    out = tmp_path / "out"
    compile_spec(str(SPEC), str(out), "onnx", None, TINY)
    victims = []
    for name in ("model.cpu.opt.onnx", "model.cpu.opt.onnx.data",
                 ".fgc-session-cache.json.tmp", ".fgc-session-cache.json"):
        victim = tmp_path / f"victim-{name}"
        victim.write_text("untouched")
        (out / name).symlink_to(victim)
        victims.append(victim)
    before = sorted(p.name for p in out.iterdir())
    for _ in range(2):
        r = run("run", str(out), "--provider", "cpu", "--tokens", "1,2,3",
                env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
        assert r.returncode == 0, r.stderr
    assert all(v.read_text() == "untouched" for v in victims)
    assert sorted(p.name for p in out.iterdir()) == before


# ---------------------------------------------------------------- 3. the graph cache


def test_graph_cache_is_capped_and_cleared(tmp_path, monkeypatch):
    from runtime import load
    from runtime.session import cache_folder, cache_info
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    outs = []
    for seed in (1, 2, 3):  # three models of one size, different weights
        out = tmp_path / f"out{seed}"
        compile_spec(str(SPEC), str(out), "onnx", None, TINY, seed=seed)
        outs.append(out)
    load(outs[0], provider="cpu", quiet=True)
    _, count, one = cache_info()
    assert count == 1 and one > 0
    monkeypatch.setenv("FGC_ORT_CACHE_MAX", str(int(one * 2.5)))
    for out in outs[1:]:
        time.sleep(0.01)
        load(out, provider="cpu", quiet=True)
    _, count, total = cache_info()
    assert count == 2 and total <= one * 3  # the oldest entry went
    assert not load(outs[0], provider="cpu", quiet=True).cached
    monkeypatch.setenv("FGC_ORT_CACHE_MAX", "0")  # a cap of 0: nothing cached
    m = load(outs[1], provider="cpu", quiet=True)
    assert not m.cached
    r = run("cache", "clear", env={"XDG_CACHE_HOME": str(tmp_path / "cache")})
    assert r.returncode == 0 and "removed" in r.stdout
    assert not cache_folder().exists()


def test_graph_cache_says_what_it_wrote(tmp_path):
    out = tmp_path / "out"
    compile_spec(str(SPEC), str(out), "onnx", None, TINY)
    env = {"XDG_CACHE_HOME": str(tmp_path / "cache")}
    r = run("run", str(out), "--provider", "cpu", "--tokens", "1,2", env=env)
    assert r.returncode == 0, r.stderr
    assert "cached onnxruntime's optimised graph" in r.stderr and "KiB" in r.stderr
    r = run("run", str(out), "--provider", "cpu", "--tokens", "1,2", env=env)
    assert "cached onnxruntime" not in r.stderr  # the second load reads it
    info = run("cache", "info", env=env)
    assert "onnxruntime's optimised graphs:" in info.stdout


# ---------------------------------------------------------------- 4. whole outputs


def test_refused_compile_creates_no_folder(tmp_path):
    out = tmp_path / "new" / "out"
    r = run("compile", str(SPEC), "--target", "torch", *TINY_ARGS, "--weights",
            str(tmp_path / "missing.safetensors"), "-o", str(out))
    assert r.returncode == 1
    assert not (tmp_path / "new").exists() or list((tmp_path / "new").iterdir()) == []


def test_stale_outputs_never_survive(tmp_path):
    """A torch compile without --weights after one with: the old weights.safetensors
    goes (generate would use it); ONNX without external data: the old data file goes."""
    out = tmp_path / "out"
    weights = tmp_path / "w.safetensors"
    _write_random_checkpoint(weights)
    compile_spec(str(FORMAL), str(out), "torch", None, TINY, str(weights))
    assert (out / "weights.safetensors").is_file()
    (out / "notes.txt").write_text("mine")
    compile_spec(str(FORMAL), str(out), "torch", None, TINY)
    assert sorted(p.name for p in out.iterdir()) == ["model.py", "notes.txt"]
    compile_spec(str(SPEC), str(out), "onnx", None, TINY, external_data=True)
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "model.onnx.data",
                                                     "notes.txt"]
    compile_spec(str(SPEC), str(out), "onnx", None, TINY)
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "notes.txt"]


def _names(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir())


BIG = ["--set", "L=2", "--set", "H=512", "--set", "A=8", "--set", "V=60000", "--set", "n=64"]


def test_sigterm_during_a_write_leaves_the_previous_output(tmp_path):
    """SIGTERM while the weights are written: the folder holds the previous compile, whole,
    and no temporary or staging folder."""
    out = tmp_path / "out"
    compile_spec(str(SPEC), str(out), "onnx", None, TINY)
    before = (out / "model.onnx").read_bytes()
    proc = subprocess.Popen([sys.executable, "-m", "compiler.cli", "compile", str(SPEC),
                             "--target", "onnx", *BIG, "--external-data", "-o", str(out)],
                            cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.name.startswith(".fgc-stage-") for p in out.iterdir()):
            time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            break
        time.sleep(0.005)
    _, err = proc.communicate(timeout=120)
    assert b"Traceback" not in err
    names = _names(out)
    assert not [n for n in names if n.startswith(".")], names
    if proc.returncode == 0:  # finished before the signal: the new output, whole
        assert names == ["model.onnx", "model.onnx.data"]
    else:
        assert proc.returncode == 128 + signal.SIGTERM
        assert names == ["model.onnx"] and (out / "model.onnx").read_bytes() == before


def test_killed_compile_leaves_nothing_the_next_one_keeps(tmp_path):
    """SIGKILL cannot be caught: its staging folder stays until the next compile into the
    folder, which removes it (nobody holds its lock)."""
    out = tmp_path / "out"
    compile_spec(str(SPEC), str(out), "onnx", None, TINY)
    proc = subprocess.Popen([sys.executable, "-m", "compiler.cli", "compile", str(SPEC),
                             "--target", "onnx", *BIG, "-o", str(out)], cwd=ROOT,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if any(p.name.startswith(".fgc-stage-") for p in out.iterdir()):
            proc.kill()
            break
        time.sleep(0.005)
    proc.wait(timeout=60)
    compile_spec(str(SPEC), str(out), "onnx", None, TINY)
    assert _names(out) == ["model.onnx"]


def test_concurrent_compiles_leave_one_whole_output(tmp_path):
    """Two compiles into one folder at once: the folder ends holding one of them, whole
    (the graph loads and its data file is the one it was written with)."""
    out = tmp_path / "out"
    procs = [subprocess.Popen([sys.executable, "-m", "compiler.cli", "compile", str(SPEC),
                               "--target", "onnx", *TINY_ARGS, "--set", f"L={L}", *extra,
                               "-o", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE)
             for L, extra in ((1, ["--external-data"]), (2, []))]
    for p in procs:
        _, err = p.communicate(timeout=120)
        assert p.returncode == 0, err
    names = _names(out)
    assert names in (["model.onnx"], ["model.onnx", "model.onnx.data"])
    from runtime import load
    m = load(out, provider="cpu", cache=False)
    assert np.isfinite(m.run({"x": np.array([[1, 2, 3]])})["GPT"]).all()


def test_full_disk_leaves_the_folder_as_it_was(tmp_path):
    """A write that fails (here: RLIMIT_FSIZE, as a full disk would) is a clear error,
    exit 1, and the previous output stays."""
    out = tmp_path / "out"
    compile_spec(str(SPEC), str(out), "onnx", None, TINY)
    before = (out / "model.onnx").read_bytes()
    code = ("import resource, signal, sys\n"
            "signal.signal(signal.SIGXFSZ, signal.SIG_IGN)\n"
            "resource.setrlimit(resource.RLIMIT_FSIZE, (100_000, 100_000))\n"
            "from compiler.cli import main\n"
            f"sys.exit(main({['compile', str(SPEC), '--target', 'onnx', *BIG, '-o', str(out)]!r}))")
    r = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode == 1, r.stderr
    assert "cannot write" in r.stderr and "Traceback" not in r.stderr
    assert _names(out) == ["model.onnx"] and (out / "model.onnx").read_bytes() == before


def test_output_folder_checks_come_before_the_work(tmp_path):
    (tmp_path / "file").write_text("x")
    for bad, words in ((str(tmp_path / "file"), "not a folder"),
                       (str(tmp_path / "file" / "sub"), "not a folder"),
                       ("", "empty name")):
        with pytest.raises(FgcError, match=words):
            compile_spec(str(SPEC), bad, "onnx", None, TINY)


def test_long_loads_show_their_time(tmp_path):
    """A blocking call (onnxruntime building a session) past its threshold shows elapsed
    time, then the total; a quick one shows nothing."""
    import io

    from runtime.progress import Ticker
    stream = io.StringIO()
    with Ticker("optimising model.onnx (5.8 GiB) with onnxruntime", after=0.05, stream=stream,
                show=True):
        time.sleep(0.3)
    text = stream.getvalue()
    assert text.startswith("optimising model.onnx (5.8 GiB) with onnxruntime  0 s")
    assert text.endswith(" s\n") and text.count("\n") == 2
    quick = io.StringIO()
    with Ticker("loading", after=5, stream=quick, show=True):
        pass
    assert quick.getvalue() == ""


def test_every_test_named_in_the_security_model_exists():
    """docs/security.md cites the tests that pin each promise: they must exist."""
    import re
    doc = (ROOT / "docs" / "security.md").read_text()
    cited = set(re.findall(r"`(test_[a-z0-9_]+)`", doc))
    defined = set()
    for path in (ROOT / "tests").glob("test_*.py"):
        defined |= set(re.findall(r"^def (test_[a-z0-9_]+)", path.read_text(), re.M))
    assert cited and not cited - defined, sorted(cited - defined)


def test_nonfinite_weights_warn_and_strict_refuses(tmp_path):
    """NaN or Inf in a checkpoint: a warning naming the tensor (its name escaped), the
    compile goes on; with --strict, exit 1 and nothing written."""
    from safetensors.numpy import load_file, save_file
    weights = tmp_path / "w.safetensors"
    _write_random_checkpoint(weights)
    tensors = load_file(str(weights))
    name = sorted(tensors)[0]
    tensors[name][0, ...] = np.nan
    save_file(tensors, str(weights))
    args = ["compile", str(FORMAL), "--target", "torch", *TINY_ARGS, "--weights", str(weights)]
    r = run(*args, "-o", str(tmp_path / "a"))
    assert r.returncode == 0, r.stderr
    assert "warning:" in r.stderr and name in r.stderr and "NaN" in r.stderr
    r = run(*args, "--strict", "-o", str(tmp_path / "b"))
    assert r.returncode == 1 and name in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "b").exists()
