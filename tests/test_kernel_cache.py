"""The per-machine cache of model.py's CPU kernel choices (runtime/kernels.py).

A fake compiled module (KERNELS, onednn, ONEDNN) stands in for model.py where only the
cache is tested; `fgc generate --backend torch` is run once end to end. Nothing here
depends on which kernel wins on the machine running the tests.
"""

from __future__ import annotations

import itertools
import json
import os
import pickle
import types

import pytest

from compiler.cli import main
from runtime import kernels

torch = pytest.importorskip("torch")


@pytest.fixture
def cache(tmp_path, monkeypatch):
    """An empty cache home of the test's own; the path the kernel file takes there."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    monkeypatch.delenv("FGC_NO_CACHE", raising=False)
    return tmp_path / "cache" / "fgc" / kernels.FILE


def fake_model():
    def onednn(x, w):
        return x @ w
    return types.SimpleNamespace(KERNELS={}, onednn=onednn, ONEDNN=True)


def chosen(module) -> dict:
    """KERNELS by kernel name, comparable across modules."""
    return {key: "onednn" if kernel is module.onednn else "matmul"
            for key, kernel in module.KERNELS.items()}


def filled(module):
    module.KERNELS[(5, torch.Size([16, 48]), (48, 1), 2)] = module.onednn
    module.KERNELS[(1, torch.Size([16, 37]), (1, 16), 2)] = torch.matmul
    module.KERNELS[(5, torch.Size([64, 16]), (16, 1), 4)] = torch.matmul
    return module


def test_choices_round_trip_through_the_file(cache):
    first = filled(fake_model())
    assert kernels.remember(first) == 3
    assert cache.is_file() and (cache.stat().st_mode & 0o777) == 0o600
    second = fake_model()
    assert kernels.prefill(second) == 3
    assert chosen(second) == chosen(first)
    # the keys are project()'s own: a torch.Size shape looks them up
    assert second.KERNELS[(5, torch.Size([16, 48]), (48, 1), 2)] is second.onednn
    assert kernels.remember(second) == 0  # nothing new: no write
    # a choice made in process is kept over the cache's
    third = fake_model()
    third.KERNELS[(5, torch.Size([16, 48]), (48, 1), 2)] = torch.matmul
    assert kernels.prefill(third) == 2
    assert third.KERNELS[(5, torch.Size([16, 48]), (48, 1), 2)] is torch.matmul


def test_the_rows_gemm_round_trips_where_the_module_has_it(cache):
    """`transposed` (the GEMM of a weight stored (out, in), row by row) is remembered by
    name and given back to a module that defines it; a model.py without it skips it."""
    def transposed(x, w):
        return (w.mT @ x.mT).mT
    first = fake_model()
    first.transposed = transposed
    first.KERNELS[(3, torch.Size([32, 64]), (1, 32), 2)] = transposed
    first.KERNELS[(3, torch.Size([64, 32]), (1, 64), 2)] = first.onednn
    assert kernels.remember(first) == 2
    second = fake_model()
    second.transposed = transposed
    assert kernels.prefill(second) == 2
    assert second.KERNELS[(3, torch.Size([32, 64]), (1, 32), 2)] is transposed
    older = fake_model()  # no transposed(): that choice is measured again, not guessed
    assert kernels.prefill(older) == 1
    assert (3, torch.Size([32, 64]), (1, 32), 2) not in older.KERNELS


def test_only_known_kernels_and_keys_are_remembered(cache):
    module = fake_model()
    module.KERNELS[(3, torch.Size([4, 4]), (4, 1), 1)] = lambda x, w: x @ w  # not a kernel
    module.KERNELS[("3", (4, 4), (4, 1), 1)] = torch.matmul  # not a key
    assert kernels.remember(module) == 0
    assert not cache.exists()
    assert kernels.prefill(types.SimpleNamespace(KERNELS={})) == 0  # not a compiled model.py


def test_a_linked_cache_file_is_neither_read_nor_written_through(cache, tmp_path):
    kernels.remember(filled(fake_model()))
    outside = tmp_path / "outside.json"
    outside.write_bytes(cache.read_bytes())  # a valid cache, but reached through a link
    cache.unlink()
    cache.symlink_to(outside)
    before = outside.read_bytes()
    assert kernels.prefill(fake_model()) == 0
    module = fake_model()
    module.KERNELS[(2, torch.Size([8, 8]), (8, 1), 1)] = torch.matmul
    assert kernels.remember(module) == 1
    assert outside.read_bytes() == before
    assert not cache.is_symlink() and cache.is_file()
    again = fake_model()
    assert kernels.prefill(again) == 1 and chosen(again) == chosen(module)


MACHINE_KEY = "[5,[16,48],[48,1],2]"


def document(entries: dict) -> str:
    return json.dumps({"format": kernels.FORMAT, "machines": {kernels.machine(): entries}})


@pytest.mark.parametrize("content", [
    b"not json", b"\x80\xff\xfe", b"", b"[" * 100_000 + b"]" * 100_000,
    pickle.dumps({"format": 1}), b'{"format": 2, "machines": {}}', b'{"format": 1}',
    b'{"format": 1, "machines": []}', b"null", b"NaN",
], ids=["text", "undecodable", "empty", "deep", "pickle", "format", "no-machines",
        "machines-list", "null", "nan"])
def test_a_damaged_cache_file_is_ignored(cache, content):
    cache.parent.mkdir(parents=True, mode=0o700)
    cache.write_bytes(content)
    module = fake_model()
    assert kernels.prefill(module) == 0 and module.KERNELS == {}
    assert kernels.remember(filled(fake_model())) == 3  # and rewritten
    assert kernels.prefill(fake_model()) == 3


def test_wrong_typed_entries_are_dropped(cache):
    cache.parent.mkdir(parents=True, mode=0o700)
    good = {MACHINE_KEY: "onednn"}
    bad = {"[true,[16,48],[48,1],2]": "onednn", "[5,[16,48],[48,1],0]": "matmul",
           "[5,[16,-48],[48,1],2]": "matmul", "[5,[16,48],[1],2]": "matmul",
           "[5,[16.0,48],[48,1],2]": "matmul", '[5,"16,48",[48,1],2]': "matmul",
           "[5,[],[],2]": "matmul", "[5,[16,48],[48,1]]": "matmul", "not json": "matmul",
           "[6,[16,48],[48,1],2]": "eval", "[7,[16,48],[48,1],2]": ["onednn"],
           "[8,[16,48],[48,1],2]": None, "[9," + "[1]," * 3 + "1]": "matmul"}
    cache.write_text(document({**bad, **good}))
    module = fake_model()
    assert kernels.prefill(module) == 1
    assert module.KERNELS == {(5, torch.Size([16, 48]), (48, 1), 2): module.onednn}
    cache.write_text(json.dumps({"format": 1, "machines": {kernels.machine(): "onednn"}}))
    assert kernels.prefill(fake_model()) == 0


def test_an_oversized_cache_file_is_ignored(cache):
    cache.parent.mkdir(parents=True, mode=0o700)
    cache.write_text(document({MACHINE_KEY: "onednn"}) + " " * kernels.LIMIT)
    assert kernels.prefill(fake_model()) == 0


def test_another_machines_choices_are_not_taken(cache, monkeypatch):
    kernels.remember(filled(fake_model()))
    with monkeypatch.context() as m:
        m.setattr(kernels, "machine", lambda module=None: "Some Other CPU | torch 0.0")
        assert kernels.prefill(fake_model()) == 0
        other = fake_model()
        other.KERNELS[(2, torch.Size([8, 8]), (8, 1), 1)] = torch.matmul
        assert kernels.remember(other) == 1
    assert kernels.prefill(fake_model()) == 3  # both machines are kept
    machines = json.loads(cache.read_text())["machines"]
    assert len(machines) == 2 and kernels.machine() in machines


def test_the_machine_names_the_cpu_and_torch():
    name = kernels.machine()
    assert name.endswith(f" | torch {torch.__version__}") and kernels.cpu_model()


def test_no_cache_and_an_unwritable_home(cache, monkeypatch):
    monkeypatch.setenv("FGC_NO_CACHE", "1")
    assert kernels.remember(filled(fake_model())) == 0
    assert not cache.exists()
    monkeypatch.delenv("FGC_NO_CACHE")

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Read-only file system")

    monkeypatch.setattr(kernels, "atomic_write", read_only)
    assert kernels.remember(filled(fake_model())) == 0  # skipped, no error

    def bug(*args, **kwargs):
        raise TypeError("a bug")

    monkeypatch.setattr(kernels, "atomic_write", bug)
    with pytest.raises(TypeError):  # only file-system errors are skipped
        kernels.remember(filled(fake_model()))


# ---------------------------------------------------------------- fgc generate, fgc cache


TINY = list(itertools.chain.from_iterable(
    ("--set", f"{k}={v}") for k, v in dict(L=1, H=16, A=2, V=29, n=12).items()))


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: no choice")
def test_fgc_generate_keeps_the_choices_per_machine(cache, monkeypatch, capsys):
    # enough steps for the one-id products to be decided (model.py times each candidate on
    # SAMPLES products of a shape class first); the prompt's, made once, stay undecided
    args = ["generate", "specs/gpt2.fgpt", *TINY, "--backend", "torch", "--prompt-ids",
            "1,2,3", "--max-new-tokens", "8"]
    assert main(args) == 0, capsys.readouterr().err
    entries = kernels.load(cache)[kernels.machine()]
    assert entries and set(entries.values()) <= set(kernels.NAMES)
    assert all(threads == torch.get_num_threads() for _, _, _, threads in entries)

    prefilled = []
    prefill = kernels.prefill
    monkeypatch.setattr(kernels, "prefill", lambda m: prefilled.append(prefill(m)) or
                        prefilled[-1])
    stamp = os.stat(cache).st_mtime_ns
    assert main(args) == 0
    assert prefilled == [len(entries)]
    assert os.stat(cache).st_mtime_ns == stamp  # nothing new was measured, nothing written

    assert main(["cache", "info"]) == 0
    assert "CPU kernel choices: 1 file" in capsys.readouterr().out
    assert main(["cache", "clear"]) == 0
    assert not cache.exists()


@pytest.mark.skipif(not torch.backends.mkldnn.is_available(), reason="no oneDNN: no choice")
def test_fgc_generate_prepack_gives_the_same_ids_and_its_own_choices(cache, capsys):
    """`--prepack` keeps the module's weights reordered for oneDNN: the same ids as without,
    and its choices (among which the kept copies) filed under a machine of their own, so a
    process without it never reads "prepacked" back."""
    args = ["generate", "specs/gpt2.fgpt", *TINY, "--backend", "torch", "--prompt-ids",
            "1,2,3", "--max-new-tokens", "8"]
    torch.manual_seed(0)  # the same random weights in both runs (no weights file)
    assert main(args) == 0
    plain = capsys.readouterr().out.splitlines()[-1]
    torch.manual_seed(0)
    assert main([*args, "--prepack"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.splitlines()[-1] == plain
    machines = kernels.load(cache)
    packed = kernels.machine(types.SimpleNamespace(PREPACK=True))
    assert set(machines) == {kernels.machine(), packed} and packed.endswith(" | prepack")
    assert "prepacked" not in machines[kernels.machine()].values()


def test_prepack_is_refused_for_an_onnx_model(capsys):
    """--prepack is the PyTorch module's: asked of an ONNX model, a usage error before
    anything is compiled, not a flag ignored."""
    assert main(["generate", "specs/gpt2.fgpt", *TINY, "--prompt-ids", "1,2",
                 "--max-new-tokens", "2", "--prepack"]) == 2
    assert "--prepack is for the PyTorch module" in capsys.readouterr().err


def test_prepacked_choices_are_read_back_only_with_prepack(cache):
    module = fake_model()
    module.prepacked, module.PREPACK = (lambda x, w: x @ w), True
    module.KERNELS[(1, torch.Size([16, 48]), (48, 1), 2)] = module.prepacked
    assert kernels.remember(module) == 1
    again = fake_model()
    again.prepacked, again.PREPACK = module.prepacked, True
    assert kernels.prefill(again) == 1 and list(again.KERNELS.values()) == [module.prepacked]
    plain = fake_model()
    plain.prepacked, plain.PREPACK = module.prepacked, False
    assert kernels.prefill(plain) == 0 and plain.KERNELS == {}
