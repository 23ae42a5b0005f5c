"""The per-machine cache of a compiled model.py's CPU kernel choices (`project`'s `KERNELS`).

model.py's `project(x, w)` times oneDNN's inner product, `torch.matmul` and, for a weight
stored (out, in), its `transposed` product on the first products of each shape class (in
turn, SAMPLES products each, as the forward passes make them) and keeps the fastest in its
module-level dict `KERNELS`, for that process only: model.py touches no files. The
runtime keeps the choices across processes instead: `prefill(module)` fills `KERNELS`
with what this machine chose before, right after model.py is imported, and
`remember(module)` merges what the module chose since into the cache once it has run. A
shape class met for the first time is still measured, by model.py itself; one still being
timed when the run ends (a product made once a run, as a prompt's) is not kept.

The cache is one JSON file, `runtime.files.cache_home() / "kernels.json"`
(`$XDG_CACHE_HOME/fgc/kernels.json`, `~/.cache/fgc/kernels.json`, in the 0700 folder the
other caches use):

    {"format": 1, "machines": {"<CPU model name> | torch <version>[ | prepack]":
                               {"[bits, [shape], [stride], threads]":
                                "onednn" | "matmul" | "transposed" | "prepacked"}}}

The machine is the processor's model name (/proc/cpuinfo, else `platform.processor()`)
and torch's version, and "prepack" for a module run with PREPACK (whose candidates
include the kept copies: its choices are another machine's); the inner key is model.py's
KERNELS key as JSON. It is read back
strictly and never unpickled: a file that is a link, another user's, over `LIMIT` bytes
or not this JSON is ignored, and an entry of another type or kernel name is dropped.
Writes go through `atomic_write` (a link at the path is replaced, never written through);
a cache that cannot be written is skipped. `FGC_NO_CACHE=1` turns it off, as it does the
parse cache; `fgc cache clear` (or deleting the file) clears it.

torch is imported inside the functions that need it, so `fgc cache` stays light.
"""

from __future__ import annotations

import functools
import json
import os
import platform
from pathlib import Path

from runtime.files import atomic_write, cache_home, open_regular, private_dir, read_entry

FORMAT = 1
FILE = "kernels.json"
LIMIT = 4 * 2**20  # bytes read back at most; a model's shape classes take a few KiB
MACHINES = 16  # machines kept; past this the least recently written go
ENTRIES = 512  # shape classes kept per machine; past this the oldest go
MAX_RANK = 8
CPUINFO_LIMIT = 256 * 2**10  # bytes of /proc/cpuinfo read: the first processor's lines suffice
NAMES = ("onednn", "matmul", "transposed", "prepacked")

Key = tuple[int, tuple[int, ...], tuple[int, ...], int]


def cache_file() -> Path | None:
    """The cache's path, or None when it is turned off or there is no private folder."""
    if os.environ.get("FGC_NO_CACHE"):
        return None
    where = private_dir(cache_home())
    return None if where is None else where / FILE


@functools.lru_cache(maxsize=1)
def cpu_model() -> str:
    """The processor's model name from /proc/cpuinfo, else what `platform` knows."""
    try:
        with os.fdopen(open_regular("/proc/cpuinfo"), "rb") as f:
            text = f.read(CPUINFO_LIMIT).decode("utf-8", "replace")
        for line in text.splitlines():
            field, sep, value = line.partition(":")
            if sep and field.strip() == "model name" and value.strip():
                return value.strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


def machine(module=None) -> str:
    """This machine's name in the cache: the CPU model and torch's version, and whether
    `module` (a compiled model.py) keeps its weights prepacked."""
    import torch
    return f"{cpu_model()} | torch {torch.__version__}" + (" | prepack" if _prepack(module)
                                                          else "")


def _prepack(module) -> bool:
    """Whether `module` (a compiled model.py) runs with PREPACK set."""
    return getattr(module, "PREPACK", False) is True


# ---------------------------------------------------------------- keys


def _count(x) -> bool:
    return type(x) is int and 0 <= x < 2**63  # bool is an int: refused


def _dims(x) -> bool:
    return isinstance(x, (list, tuple)) and 1 <= len(x) <= MAX_RANK and all(map(_count, x))


def as_key(key) -> Key | None:
    """A KERNELS key (bit length of the rows, weight shape, weight stride, threads) as plain
    ints and tuples, or None when it is not one."""
    if not isinstance(key, (list, tuple)) or len(key) != 4:
        return None
    bits, shape, stride, threads = key
    if not (_count(bits) and _dims(shape) and _dims(stride) and len(shape) == len(stride)
            and _count(threads) and threads >= 1):
        return None
    return bits, tuple(shape), tuple(stride), threads


def encode(key: Key) -> str:
    bits, shape, stride, threads = key
    return json.dumps([bits, list(shape), list(stride), threads], separators=(",", ":"))


def decode(text: str) -> Key | None:
    try:
        return as_key(json.loads(text))
    except (ValueError, RecursionError):
        return None


# ---------------------------------------------------------------- the file


def load(path: Path) -> dict[str, dict[Key, str]]:
    """{machine: {key: kernel name}} from the cache file; what does not check is left out,
    and a file that is missing, not a regular file of this user's or not JSON gives {}."""
    data = read_entry(path, LIMIT)
    if data is None:
        return {}
    try:
        document = json.loads(data)
    except (ValueError, RecursionError):
        return {}
    if not isinstance(document, dict) or document.get("format") != FORMAT or \
            not isinstance(document.get("machines"), dict):
        return {}
    machines = {}
    for name, entries in document["machines"].items():
        if not isinstance(entries, dict) or len(name) > 1000:
            continue
        kept = {}
        for text, kernel in entries.items():
            key = decode(text)
            if key is not None and type(kernel) is str and kernel in NAMES:
                kept[key] = kernel
        if kept:
            machines[name] = kept
    return machines


def dump(machines: dict[str, dict[Key, str]]) -> str:
    return json.dumps({"format": FORMAT, "machines": {
        name: {encode(k): v for k, v in entries.items()} for name, entries in machines.items()}},
        indent=1)


# ---------------------------------------------------------------- a compiled model.py


def _compiled(module) -> bool:
    return all(hasattr(module, name) for name in ("KERNELS", "onednn", "ONEDNN"))


def _kernels(module) -> dict:
    """The kernels by name that `module` (a compiled model.py) chooses among; a model.py
    compiled by an earlier fgc lacks `transposed` or `prepacked`, and `prepacked` is one
    only where the module's PREPACK is set."""
    import torch
    kernels = {"onednn": module.onednn, "matmul": torch.matmul}
    if hasattr(module, "transposed"):
        kernels["transposed"] = module.transposed
    if hasattr(module, "prepacked") and _prepack(module):
        kernels["prepacked"] = module.prepacked
    return kernels


def prefill(module) -> int:
    """Fill `module.KERNELS` (a compiled model.py that has `project`) with this machine's
    cached choices, keeping any it already holds; how many were added."""
    if not _compiled(module):
        return 0
    path = cache_file()
    if path is None:
        return 0
    import torch
    kernels = _kernels(module)
    added = 0
    for (bits, shape, stride, threads), name in load(path).get(machine(module), {}).items():
        key = bits, torch.Size(shape), stride, threads  # as project() makes it
        if key not in module.KERNELS and name in kernels:
            module.KERNELS[key] = kernels[name]
            added += 1
    return added


def remember(module) -> int:
    """Merge `module.KERNELS` (the entries that are one of its kernels) into this machine's
    cached choices; how many it wrote, 0 when nothing was new. A cache that cannot be
    written (a read-only home) is skipped."""
    if not _compiled(module):
        return 0
    names = {id(kernel): name for name, kernel in _kernels(module).items()}
    chosen = {}
    for key, kernel in list(module.KERNELS.items()):
        name = names.get(id(kernel))
        key = as_key(key)
        if name is not None and key is not None:
            chosen[key] = name
    path = cache_file() if chosen else None
    if path is None:
        return 0
    here = machine(module)
    try:
        machines = load(path)
        entries = machines.pop(here, {})
        if all(entries.get(k) == v for k, v in chosen.items()):
            return 0  # nothing new: no write
        for key, name in chosen.items():  # the newest last, so the oldest go first
            entries.pop(key, None)
            entries[key] = name
        machines[here] = dict(list(entries.items())[-ENTRIES:])
        kept = dict(list(machines.items())[-MACHINES:])
        text = dump(kept)
        if len(text) > LIMIT:  # other machines' entries go before this one's
            text = dump({here: machines[here]})
        atomic_write(path, text, fsync=False, file_mode=0o600)
    except OSError:
        return 0
    return len(chosen)
