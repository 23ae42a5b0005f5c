"""Spec names that model.py already owns (issue 16, item 8).

A spec may give a thing a name that Python, torch or the generated file itself already uses:
`class`, `len`, `torch`, `causal_mask`, `forward`, `state_dict`, `set_submodule`... `fgc check`
accepts them, so the backends must too: the torch backend renames them (one rule, in
compiler/names.py) while the checkpoint names stay the spec's own, and the
ONNX graph keeps every value's name distinct.

(a) the reserved set is derived and complete: it covers dir(torch.nn.Module), Python's
    keywords and builtins, the template's module-level names, and every name the generated
    methods bind that no spec name gave them;
(b) one spec that uses such names in every role (module, module hyperparameter, family index
    and size, module input, local and parameter, comprehension indices, model, hyperparameter
    in a shape and a guard, inputs, parameters, values, labels, shared module, two layer
    loops, outputs, checkpoint names) compiles to a ruff-clean model.py that loads its
    checkpoint and runs, and to an ONNX graph that gives the same outputs;
(c) every reserved name the grammar accepts, all at once in each of the roles, one spec a role.
"""

from __future__ import annotations

import ast
import builtins
import json
import keyword
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import ROOT
from test_torch_backend import assert_safe_module, hostile_spec, import_model, ruff_cmd

from compiler.cli import main as fgc_main
from compiler.elaborate import ir
from compiler.emit import compile_spec
from compiler.names import (
    FUNCTIONAL,
    NN_MODULE,
    RESERVED,
    TEMPLATE,
    class_name,
    ident,
    layers_attr,
    reserved,
    template_names,
    value_name,
)
from compiler.pipeline import load
from compiler.weights import parameter_keys

torch = pytest.importorskip("torch")
ort = pytest.importorskip("onnxruntime")
from safetensors.numpy import load_file, save_file  # noqa: E402

# a spec name as the grammar reads one (its NAME terminal, read from the grammar itself)
_GRAMMAR = (ROOT / "compiler" / "syntax" / "grammar.lark").read_text("utf-8")
_TERMINAL = re.search(r"^NAME: /(.*)/$", _GRAMMAR, re.MULTILINE)[1]
SPEC_NAME = re.compile(_TERMINAL)
# every reserved name a spec can write (`_x`, `in`, `layers`... cannot be written)
POOL = sorted(n for n in RESERVED if SPEC_NAME.fullmatch(n))
TOL = 1e-5


def check_ok(path: Path, capsys) -> None:
    capsys.readouterr()
    code = fgc_main(["check", str(path)])
    assert code == 0, capsys.readouterr().err


def ruff_clean(paths: list[Path]) -> None:
    ruff = ruff_cmd()
    if ruff is None:
        return
    r = subprocess.run(ruff + ["check", "--no-cache", "--config", str(ROOT / "pyproject.toml"),
                               *map(str, paths)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr


def session(path: Path):
    opts = ort.SessionOptions()
    opts.intra_op_num_threads = 1
    return ort.InferenceSession(str(path), opts, providers=["CPUExecutionProvider"])


# ---------------------------------------------------------------- (a) the reserved set


def test_reserved_covers_nn_module():
    """NN_MODULE is written out (compiling does not import torch): it must hold every public
    attribute of this torch's nn.Module, the class's and an instance's."""
    # a fresh interpreter: other libraries add methods to nn.Module when imported (the
    # test session has imported transformers, which adds `smart_apply`)
    code = ("import json, torch; m = torch.nn.Module; print(json.dumps(sorted("
            "n for n in set(dir(m)) | set(vars(m())) if not n.startswith('_'))))")
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       timeout=120, check=True)
    public = set(json.loads(r.stdout))
    assert public <= NN_MODULE, sorted(public - NN_MODULE)
    assert NN_MODULE <= RESERVED


def test_reserved_covers_python_and_the_template():
    template = template_names(TEMPLATE.read_text(encoding="utf-8"))
    assert {"torch", "nn", "math", "project", "ONEDNN", "take", "build",
            "causal_mask"} <= template
    assert {"Config", "dataclass", "replace"} <= template  # build(Config(...))
    assert set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins)) | template \
        | set(FUNCTIONAL) <= RESERVED
    assert all(ident(n) != n for n in RESERVED)
    assert ident("layers2") == "layers2_" and ident("T_destination") == "T_destination_"
    assert class_name("none") == "None_" and class_name("print") == "Print"


def _spec_names(cfg) -> set[str]:
    """Every name a spec (its modules and the stdlib's among them) gives a thing."""
    names: set[str] = set()

    def eqns(items):
        for e in items:
            if isinstance(e, ir.Loop):
                names.add(e.var)
                names.update(n for c in e.carried for n in (c.name, c.init, c.inner, c.result))
                names.update(e.shared)
                names.update(n for pair in e.results + e.stacks for n in pair)
                eqns(e.body)
                continue
            names.update(v.name for v in e.outs)
            if "instance" in e.attrs:  # a use's unnamed result is named after it
                names.update((e.attrs["instance"], value_name(e.attrs["instance"])))
            if e.family is not None:
                names.add(e.family[0])
    m = cfg.model
    for owner in [m, *cfg.functions.values()]:
        names.update((owner.name, value_name(owner.name)))  # a module's unnamed result
        names.update(h.name for h in owner.hypers)
        names.update(v.name for v in owner.inputs + owner.outputs)
        names.update(p.name for p in owner.params)
        eqns(owner.body if owner is m else owner.eqns)
    return names


def _bound(tree: ast.Module) -> set[str]:
    """The names model.py's classes bind: arguments, locals, methods, `self.x` attributes,
    and its module-level assignments (not the template helpers' own locals)."""
    out: set[str] = set()
    for node in tree.body:
        if isinstance(node, ast.Assign):
            out.update(t.id for t in node.targets if isinstance(t, ast.Name))
        if not isinstance(node, ast.ClassDef):
            continue
        out.add(node.name)
        for sub in ast.walk(node):
            if isinstance(sub, ast.FunctionDef):
                out.add(sub.name)
            elif isinstance(sub, ast.arg):
                out.add(sub.arg)
            elif isinstance(sub, ast.Name) and isinstance(sub.ctx, ast.Store):
                out.add(sub.id)
            elif isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store):
                out.add(sub.attr)
    return out


@pytest.mark.parametrize("which", ["rich", "decoder"])
def test_generated_names_are_reserved(which, tmp_path):
    """Whatever model.py binds that no spec name gave it is in RESERVED: a new local or
    method in the generated code cannot go unreserved (and so shadow or be shadowed)."""
    path = tmp_path / "spec.fgpt"
    path.write_text(rich_spec() if which == "rich" else hostile_spec(), encoding="utf-8")
    compile_spec(str(path), str(tmp_path / "out"))
    tree = ast.parse((tmp_path / "out" / "model.py").read_text(encoding="utf-8"))
    spec = load(str(path))
    given = set()
    for n in _spec_names(spec.configure(None, {})) | _spec_names(spec.symbolic()):
        given |= {ident(n), class_name(n)}
    owned = {n for n in _bound(tree) - given
             if not re.fullmatch(r"t\d+|\w+_\d+|table|__\w+__", n)}  # temporaries, dunders
    classes = {n.name for n in tree.body if isinstance(n, ast.ClassDef)}
    layers = {n for n in classes if re.fullmatch(r"\w+Layer\d*_*", n)}
    assert not {n for n in owned - layers if not reserved(n)}, sorted(owned)


# ---------------------------------------------------------------- (b) every role, one spec

RICH = """\
module {MOD}[{MH}, {FK}]({MX}: R[n, H]) -> R[n, H] {{
  {MOD}({MX}) = Concat({FV}_1, ..., {FV}_{FK}) @ {MP} + {MLOC}
    where {FV}_{FI} = {MX} @ {MF}_{FI} for {FI} in 1..{FK},
          {MLOC} = {MX} * {MH}
  param {MF}_{FI}: R[H, H] for {FI} in 1..{FK}
  param {MP}: R[{FK} * H, H]
}}

module {CMOD}[{CN}] -> R[{CN}, {CN}] {{
  {CMOD}[{CI}, {CJ}] = -inf if {CJ} > {CI} else 0
}}

model {MODEL} {{
  hyper L = 2, H = 8, {HY} = 3, V = 11, n = 6, {K} = 2, A = 2, D = H / A
  input {IN}: {{1..V}}^n, {IN2}: R[n, H]
  param W_e: R[V, H], {P}: R[n, H], W_x: R[{HY}, H]
  {VAL} = OneHot({IN}) @ W_e + {P} + {IN2}
  G^(0) = {VAL} + W_x[1, :]
  H^(0) = {GLAB}: {MOD}[{MH}={K}, {FK}=2](G^(0)) if {HY} != H else G^(0)
  layers {LV} in 1..L {{
    share {SHR}
    {LVAL}^({LV}) = {LAB}: {MOD}[{MH}={K}, {FK}=2]({SHR}: LN(H^({LV}-1))) + H^({LV}-1)
    H^({LV}) = {ALAB}: MH({LVAL}^({LV}), {CMOD}[n]) + {LVAL}^({LV}) if {LV} is odd
      else {LVAL}^({LV})
  }}
  F^(0) = H^(L)
  layers {LV2} in 1..L {{
    F^({LV2}) = {FLAB}: FF^GELU[F=H](F^({LV2}-1)) + F^({LV2}-1)
  }}
  output {OUT} = Softmax({FLN}: LN(H^(L)) @ W_e^T)
  output {OUT2} = F^(L) * 2
  checkpoint {{
    prefix "net."
{CKPT}
  }}
}}
"""
RICH_DEFAULTS = {
    "MOD": "Mix", "MH": "k", "FK": "f", "MX": "X", "FV": "h", "FI": "i", "MP": "W_m",
    "MLOC": "Y", "MF": "W", "CMOD": "Band", "CN": "c", "CI": "i", "CJ": "j", "MODEL": "Toy",
    "HY": "Z", "K": "K", "IN": "x", "IN2": "u", "P": "W_p", "VAL": "E", "GLAB": "g",
    "LV": "l", "SHR": "s", "LVAL": "Hhat", "LAB": "lab", "ALAB": "attn", "LV2": "q",
    "FLAB": "ff", "FLN": "ln_f", "OUT": "Y", "OUT2": "Q",
}
RICH_ROLES = list(RICH_DEFAULTS)
# a family's index and size are written into member names (`h_1`, `W_i`): letters and digits
ALNUM_ROLES = {"FK", "FI"}
# checkpoint name -> (the spec's path, with {ROLE}s; its `layers` block or None; shape)
CKPT = {
    "wte": ("W_e", None, (11, 8)), "wpe": ("{P}", None, (6, 8)), "wx": ("W_x", None, (3, 8)),
    "g.f": ("{GLAB}.{MF}", None, (8, 2, 8)), "g.p": ("{GLAB}.{MP}", None, (16, 8)),
    "s.w": ("{SHR}.gamma", None, (8,)), "s.b": ("{SHR}.beta", None, (8,)),
    "f.w": ("{FLN}.gamma", None, (8,)), "f.b": ("{FLN}.beta", None, (8,)),
    "h.{l}.f": ("{LAB}.{MF}", 0, (8, 2, 8)), "h.{l}.p": ("{LAB}.{MP}", 0, (16, 8)),
    "h.{l}.q": ("{ALAB}.W^Q", 0, (8, 2, 4)), "h.{l}.k": ("{ALAB}.W^K", 0, (8, 2, 4)),
    "h.{l}.v": ("{ALAB}.W^V", 0, (8, 2, 4)), "h.{l}.o": ("{ALAB}.W^O", 0, (8, 8)),
    "d.{l}.w1": ("{FLAB}.W_1", 1, (8, 8)), "d.{l}.b1": ("{FLAB}.b_1", 1, (8,)),
    "d.{l}.w2": ("{FLAB}.W_2", 1, (8, 8)), "d.{l}.b2": ("{FLAB}.b_2", 1, (8,)),
}
ODD_ONLY = {"{ALAB}"}  # the attention exists in odd layers only: layer 1 of 2


def rich_spec(**names: str) -> str:
    n = {**RICH_DEFAULTS, **names}
    top = [f'    {p.format(**n)} = "{c}"' for c, (p, loop, _) in CKPT.items() if loop is None]
    per = [f'      {p.format(**n)} = "{c}"' for c, (p, loop, _) in CKPT.items()
           if loop is not None]
    return RICH.format(**n, CKPT="\n".join(top + ["    layers {"] + per + ["    }"]))


def rich_names(shift: int) -> dict[str, str]:
    """Names for the roles, from POOL, each distinct, none the spec's own fixed names."""
    fixed = {"L", "H", "V", "n", "A", "D", "W_e", "W_x", "G", "F", "gamma", "beta"}
    plain = [n for n in POOL if n not in fixed]
    alnum = [n for n in plain if n.isalnum()]
    out: dict[str, str] = {}
    k = shift
    for role in RICH_ROLES:
        source = alnum if role in ALNUM_ROLES else plain
        while source[k % len(source)] in out.values():
            k += 1
        out[role] = source[k % len(source)]
        k += 7  # spread each rotation over the pool
    return out


# the issue's own examples, placed by hand in one spec
NAMED = {
    "MOD": "causal_mask", "MH": "set_submodule", "FK": "lambda", "MX": "torch", "FV": "class",
    "FI": "None", "MP": "state_dict", "MLOC": "forward", "MF": "training", "CMOD": "project",
    "CN": "build", "CI": "len", "CJ": "range", "MODEL": "nn", "HY": "ONEDNN", "K": "cuda",
    "IN": "print", "IN2": "math", "P": "T_destination", "VAL": "register_state_dict_pre_hook",
    "GLAB": "register_load_state_dict_post_hook", "LV": "self", "SHR": "to",
    "LVAL": "parameters", "LAB": "layers2", "ALAB": "logits", "LV2": "device", "FLAB": "step",
    "FLN": "cache", "OUT": "past", "OUT2": "signature",
}
RICH_CASES = {"defaults": {}, "named": NAMED, **{f"pool{s}": rich_names(s) for s in (0, 3, 5)}}


def _state_key(path: str, loop: int | None, layer: int | None) -> str:
    """The torch module's name for a checkpoint entry: its path in ident() spelling."""
    parts = [ident(p) for p in path.split(".")]
    return ".".join(([layers_attr(loop), str(layer)] if loop is not None else []) + parts)


@pytest.mark.parametrize("case", sorted(RICH_CASES))
def test_every_role_compiles_loads_and_runs(case, tmp_path, capsys):
    names = RICH_CASES[case]
    path = tmp_path / "spec.fgpt"
    path.write_text(rich_spec(**names), encoding="utf-8")
    check_ok(path, capsys)

    # a checkpoint in the spec's own names, distinct values everywhere
    rng = np.random.default_rng(0)
    ckpt, where = {}, {}
    for source, (spec_path, loop, shape) in CKPT.items():
        odd_only = spec_path.split(".")[0] in ODD_ONLY
        layers = [None] if loop is None else ([0] if odd_only else [0, 1])
        for layer in layers:
            name = "net." + source.replace("{l}", str(layer))
            ckpt[name] = rng.normal(0.0, 0.3, shape).astype(np.float32)
            where[name] = _state_key(spec_path.format(**{**RICH_DEFAULTS, **names}), loop,
                                     layer)
    save_file(ckpt, str(tmp_path / "ckpt.safetensors"))

    out = tmp_path / "torch"
    result = compile_spec(str(path), str(out), "torch", weights=str(tmp_path / "ckpt.safetensors"))
    text = (out / "model.py").read_text(encoding="utf-8")
    assert_safe_module(text)
    ruff_clean([out / "model.py"])
    model = import_model(out / "model.py").build().eval()
    cfg = load(str(path)).configure(None, {})
    state = model.state_dict()
    assert sorted(state) == sorted(t for t, _ in parameter_keys(cfg))
    assert sum(p.numel() for p in model.parameters()) == result.total
    written = load_file(str(out / "weights.safetensors"))
    model.load_state_dict({k: torch.from_numpy(v) for k, v in written.items()}, strict=True)
    for name, key in where.items():  # each checkpoint tensor where its spec path says
        np.testing.assert_array_equal(model.state_dict()[key].numpy(), ckpt[name])

    g = torch.Generator().manual_seed(1)
    inputs = {names.get("IN", "x"): torch.randint(0, 11, (2, 5), generator=g),
              names.get("IN2", "u"): torch.randn(2, 5, 8, generator=g)}
    with torch.no_grad():
        probs, stream = model(*inputs.values())
    assert probs.shape == (2, 5, 11) and stream.shape == (2, 5, 8)
    torch.testing.assert_close(probs.sum(-1), torch.ones(2, 5))

    onnx_out = tmp_path / "onnx"
    compile_spec(str(path), str(onnx_out), "onnx", weights=str(tmp_path / "ckpt.safetensors"))
    got = session(onnx_out / "model.onnx").run(None, {k: v.numpy() for k, v in inputs.items()})
    # float32 rounding grows with the values: the difference relative to the largest
    diffs = [float(np.abs(o - r.numpy()).max() / max(1.0, np.abs(r.numpy()).max()))
             for o, r in zip(got, (probs, stream))]
    assert max(diffs) <= TOL, diffs


def test_step_with_generated_names(tmp_path, capsys):
    """The decoder spec, whose model has step(), with the names step() and its cache use."""
    names = {"IN": "past", "P": "sites", "VAL": "site", "LAB": "kv", "HY": "start",
             "MP": "cache", "MH": "layer", "MX": "device", "OUT": "logits", "MOD": "step",
             "MODEL": "cache_sites", "LV": "signature"}
    path = tmp_path / "spec.fgpt"
    path.write_text(hostile_spec(**names), encoding="utf-8")
    check_ok(path, capsys)
    compile_spec(str(path), str(tmp_path / "out"))
    ruff_clean([tmp_path / "out" / "model.py"])
    model = import_model(tmp_path / "out" / "model.py").build().eval()
    ids = torch.randint(0, 11, (2, 6), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        whole = model.logits(ids)  # step() gives logits, forward() their softmax
        torch.testing.assert_close(torch.softmax(whole, -1), model(ids))
        first, past = model.step(ids[:, :4])
        rest, _ = model.step(ids[:, 4:], past=past)
    torch.testing.assert_close(torch.cat([first, rest], 1), whole)


CLASS_AS_SIZE = """\
module h(X: R[..., H]) -> R[..., H] {
  h(X) = X @ W
  param W: R[H, H]
}

module Outer(X: R[..., H]) -> R[..., H] {
  Outer(X) = inner: h(X @ U)
  param U: R[H, H]
}

model Toy {
  hyper H = 4, V = 5, n = 3
  input x: {1..V}^n
  param W_e: R[V, H]
  output Y = Outer(OneHot(x) @ W_e)
}
"""


def test_class_named_like_a_size(tmp_path):
    """Module `h` is class H_, not H: Outer's __init__ takes a size H and builds it there."""
    path = tmp_path / "spec.fgpt"
    path.write_text(CLASS_AS_SIZE, encoding="utf-8")
    compile_spec(str(path), str(tmp_path / "out"))
    model = import_model(tmp_path / "out" / "model.py").build()
    assert type(model.Outer.inner).__name__ == "H_"
    assert model(torch.randint(0, 5, (2, 3))).shape == (2, 3, 4)


# ---------------------------------------------------------------- (c) the whole set, each role

# The spec's own names end in `z`, which no reserved name does. Long sums are written as a
# chain of equations, one term each.
def _sum(terms: list[str]) -> str:
    return " + ".join(terms)


def _chain(first: str, terms: list[str], prefix: str = "S", indent: str = "  ") -> tuple:
    """Lines `S1z = first + t1`, `S2z = S1z + t2`, ...; and the last name."""
    rows, prev = [], first
    for k, t in enumerate(terms):
        rows.append(f"{indent}{prefix}{k + 1}z = {prev} + {t}")
        prev = f"{prefix}{k + 1}z"
    return "\n".join(rows), prev


def role_hyper(names: list[str]) -> str:
    hypers = ", ".join(f"{n} = 1" for n in names)
    return f"""model Mz {{
  hyper Hz = 4, nz = 3, Vz = 5, {hypers}
  input xz: {{1..Vz}}^nz
  param Wz: R[Vz, Hz], Bz: R[{_sum(names)}, Hz]
  Ez = OneHot(xz) @ Wz + Bz[1, :] * {names[0]}
  output Yz = Ez
}}
"""


def role_param(names: list[str]) -> str:
    params = ", ".join(f"{n}: R[Hz]" for n in names)
    return f"""model Mz {{
  hyper Hz = 4, nz = 3, Vz = 5
  input xz: {{1..Vz}}^nz
  param Wz: R[Vz, Hz], {params}
  Ez = OneHot(xz) @ Wz
{_chain("Ez", names)[0]}
  output Yz = {_chain("Ez", names)[1]}
}}
"""


# the sizes, token input and embedding every role's model starts from
HEADER = """  hyper Hz = 4, nz = 3, Vz = 5
  input xz: {1..Vz}^nz
  param Wz: R[Vz, Hz]
"""


def role_module_param(names: list[str]) -> str:
    params = ", ".join(f"{n}: R[Hz]" for n in names)
    rows, last = _chain("Xz", names)
    return f"""module Modz(Xz: R[..., Hz]) -> R[..., Hz] {{
{rows}
  Modz(Xz) = {last}
  param {params}
}}

model Mz {{
{HEADER}  output Yz = Modz(OneHot(xz) @ Wz)
}}
"""


def role_module_hyper(names: list[str]) -> str:
    return f"""module Modz[{", ".join(names)}](Xz: R[..., Hz]) -> R[..., Hz] {{
  Modz(Xz) = Xz * ({_sum(names)})
}}

model Mz {{
{HEADER}  output Yz = Modz[{", ".join(f"{n}=1" for n in names)}](OneHot(xz) @ Wz)
}}
"""


def role_module_input(names: list[str]) -> str:
    args = ", ".join(f"{n}: R[..., Hz]" for n in names)
    rows, last = _chain(names[0], names[1:])
    return f"""module Modz({args}) -> R[..., Hz] {{
{rows}
  Modz({", ".join(names)}) = {last}
}}

model Mz {{
{HEADER}  Ez = OneHot(xz) @ Wz
  output Yz = Modz({", ".join("Ez" for _ in names)})
}}
"""


def role_label(names: list[str]) -> str:
    rows = "\n".join(f"  E{k + 1}z = {n}: LN(E{k}z)" for k, n in enumerate(names))
    return f"""model Mz {{
{HEADER}  E0z = OneHot(xz) @ Wz
{rows}
  output Yz = E{len(names)}z
}}
"""


def role_input(names: list[str]) -> str:
    inputs = ", ".join(f"{n}: R[nz, Hz]" for n in names)
    return f"""model Mz {{
  hyper Hz = 4, nz = 3, Vz = 5
  input xz: {{1..Vz}}^nz, {inputs}
  param Wz: R[Vz, Hz]
  Ez = OneHot(xz) @ Wz
{_chain("Ez", names)[0]}
  output Yz = {_chain("Ez", names)[1]}
}}
"""


def role_value(names: list[str]) -> str:
    rows = "\n".join(f"  {n} = {prev} + Bz" for prev, n in zip(["E0z", *names], names))
    return f"""model Mz {{
  hyper Hz = 4, nz = 3, Vz = 5
  input xz: {{1..Vz}}^nz
  param Wz: R[Vz, Hz], Bz: R[Hz]
  E0z = OneHot(xz) @ Wz
{rows}
  output Yz = {names[-1]} * {names[0]}
}}
"""


def role_output(names: list[str]) -> str:
    rows = "\n".join(f"  output {n} = Ez * {k + 1}" for k, n in enumerate(names))
    return f"""model Mz {{
{HEADER}  Ez = OneHot(xz) @ Wz
{rows}
}}
"""


def role_module(names: list[str]) -> str:
    mods = "\n".join(f"module {n}(Xz: R[..., Hz]) -> R[..., Hz] {{\n  {n}(Xz) = Xz @ Wz\n"
                     f"  param Wz: R[Hz, Hz]\n}}\n" for n in names)
    rows = "\n".join(f"  E{k + 1}z = {n}(E{k}z)" for k, n in enumerate(names))
    return f"""{mods}
model Mz {{
{HEADER}  E0z = OneHot(xz) @ Wz
{rows}
  output Yz = E{len(names)}z
}}
"""


def role_layer_var(names: list[str]) -> str:
    loops = "\n".join(f"  X{k + 1}z^(0) = X{k}z{'^(Lz)' if k else ''}\n"
                      f"  layers {n} in 1..Lz {{\n"
                      f"    X{k + 1}z^({n}) = X{k + 1}z^({n}-1) + 1 if {n} is odd "
                      f"else X{k + 1}z^({n}-1)\n  }}" for k, n in enumerate(names))
    return f"""model Mz {{
  hyper Hz = 4, nz = 3, Vz = 5, Lz = 2
  input xz: {{1..Vz}}^nz
  param Wz: R[Vz, Hz]
  X0z = OneHot(xz) @ Wz
{loops}
  output Yz = X{len(names)}z^(Lz)
}}
"""


def role_family_index(names: list[str]) -> str:
    names = [n for n in names if n.isalnum()]
    members = "\n".join(f"  h{k}z_{n} = Xz @ W{k}z_{n} for {n} in 1..Kz"
                        for k, n in enumerate(names))
    rows, last = _chain("Concat(h0z_1, ..., h0z_Kz)",
                        [f"Concat(h{k}z_1, ..., h{k}z_Kz)" for k in range(1, len(names))])
    params = "\n".join(f"  param W{k}z_{n}: R[Hz, Hz] for {n} in 1..Kz"
                       for k, n in enumerate(names))
    return f"""module Famz[Kz](Xz: R[nz, Hz]) -> R[nz, Kz * Hz] {{
{members}
{rows}
  Famz(Xz) = {last}
{params}
}}

model Mz {{
{HEADER}  output Yz = Famz[Kz=2](OneHot(xz) @ Wz)
}}
"""


def role_comprehension_index(names: list[str]) -> str:
    pairs = list(zip(names[::2], names[1::2]))
    mods = "\n".join(f"module Band{k}z[cz] -> R[cz, cz] {{\n  Band{k}z[{i}, {j}] = "
                     f"1 if {j} > {i} else 0\n}}\n" for k, (i, j) in enumerate(pairs))
    return f"""{mods}
model Mz {{
{HEADER}  Ez = OneHot(xz) @ Wz
{_chain("Band0z[nz]", [f"Band{k}z[nz]" for k in range(1, len(pairs))], "M")[0]}
  output Yz = Softmax(M{len(pairs) - 1}z) @ Ez
}}
"""


ROLE_SPECS = {
    "hyperparameter": role_hyper, "parameter": role_param,
    "module_parameter": role_module_param, "module_hyperparameter": role_module_hyper,
    "module_input": role_module_input, "instance_label": role_label, "input": role_input,
    "value": role_value, "output": role_output, "module": role_module,
    "layer_variable": role_layer_var, "family_index": role_family_index,
    "comprehension_index": role_comprehension_index,
}


def role_inputs(cfg, batch: int = 2) -> list:
    g = torch.Generator().manual_seed(0)
    out = []
    for v in cfg.model.inputs:
        shape = [int(d.const_value()) for d in v.type.shape]
        out.append(torch.randn(batch, *shape, generator=g) if v.type.dtype == "real"
                   else torch.randint(0, 5, (batch, *shape), generator=g))
    return out


@pytest.mark.parametrize("role", sorted(ROLE_SPECS))
def test_every_reserved_name_in_one_role(role, tmp_path, capsys):
    names = POOL
    assert not {n for n in names if n.endswith("z")}  # the spec's own names stay apart
    path = tmp_path / "spec.fgpt"
    path.write_text(ROLE_SPECS[role](names), encoding="utf-8")
    check_ok(path, capsys)
    compile_spec(str(path), str(tmp_path / "torch"))
    model_py = tmp_path / "torch" / "model.py"
    assert_safe_module(model_py.read_text(encoding="utf-8"))
    ruff_clean([model_py])
    model = import_model(model_py).build().eval()
    cfg = load(str(path)).configure(None, {})
    assert sorted(model.state_dict()) == sorted(t for t, _ in parameter_keys(cfg))
    args = role_inputs(cfg)
    with torch.no_grad():
        ref = model(*args)
    refs = ref if isinstance(ref, tuple) else (ref,)
    assert len(refs) == len(cfg.model.outputs)
    state = model.state_dict()
    weights = {o: state[t].numpy() for t, o in parameter_keys(cfg)}
    # the ONNX graph, the same weights (by its own names): every output the same
    from compiler.backends.onnx.lower import Lowerer
    spec = load(str(path))
    onnx_model, _ = Lowerer(spec, spec.symbolic(), cfg.values, weights=weights).lower()
    sess = ort.InferenceSession(onnx_model.SerializeToString(),
                                providers=["CPUExecutionProvider"])
    feeds = {v.name: a.numpy() for v, a in zip(cfg.model.inputs, args)}
    got = sess.run(None, feeds)
    assert len({o.name for o in sess.get_outputs()}) == len(got) == len(refs)
    for o, r in zip(got, refs):
        assert float(np.abs(o - r.numpy()).max()) <= TOL
