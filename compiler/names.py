"""Naming policies the backends and weights.py share: identifiers for spec names, tensor layouts.

Python identifiers for spec names are safe by construction, stable and collision-free. The
rule, applied here and nowhere else: `ident` spells a spec name as an identifier (`W^Q` ->
`W_Q`), and one that model.py already owns takes a `_` suffix (`forward` -> `forward_`,
`causal_mask` -> `causal_mask_`, `class` -> `class_`; `class_`, written in a spec, takes one
more, so two names never meet: see `unreserved`). Class names follow the same rule after
their first letter is capitalised. What model.py owns, RESERVED, is derived rather than
listed wherever a source exists:

- Python's keywords, soft keywords and builtins (`keyword`, `builtins`);
- the module-level names of the torch backend's template, read from
  backends/torch/templates/model.py.j2 (its imports, helpers and constants), and what its
  codegen imports from torch.nn.functional (FUNCTIONAL);
- every public attribute of nn.Module (NN_MODULE: written out so that compiling need not
  import torch; tests/test_reserved_names.py checks it against dir(torch.nn.Module));
- the locals and attributes the generated methods bind themselves (GENERATED; the same test
  compiles specs and finds every name model.py binds that no spec name gave it here);
- the few names ruff would rewrite as a method call (LINT).

A model's state-dict keys are these identifiers (compiler/weights.py's state_key calls
ident), so a checkpoint block's names land on the renamed attributes and a weights file
is written in the module's own names; the ONNX graph's names (onnx_key) use them too. The
layouts below (a family of parameters as one tensor, the attribute of each `layers` block,
how a parameter starts) are shared the same way: the torch and ONNX backends and the
checkpoint import agree on them by importing them from here. This module reads the torch
template as a file and imports nothing of the backends.
"""

from __future__ import annotations

import builtins
import keyword
import re
import unicodedata
from pathlib import Path

TEMPLATE = Path(__file__).parent / "backends" / "torch" / "templates" / "model.py.j2"

# a spec name as the grammar reads it (syntax/grammar.lark's NAME), not inside a longer word
NAME = r"(?<![\w'^.])[A-Za-z][A-Za-z0-9_]*'*(?:\^[A-Za-z][A-Za-z0-9_]*)?"

# torch.nn.functional's functions that model.py imports, by the name it calls them
FUNCTIONAL = {"embedding": "embedding", "gelu": "gelu", "layer_norm": "layer_norm",
              "rms_norm": "rms_norm", "silu": "silu", "sdpa": "scaled_dot_product_attention"}

# nn.Module's public attributes (torch 2.13: dir(nn.Module), and `training`, which each
# instance sets): a parameter or submodule of that name would shadow them
NN_MODULE = {
    "T_destination", "add_module", "apply", "bfloat16", "buffers", "call_super_init",
    "children", "compile", "cpu", "cuda", "double", "dump_patches", "eval", "extra_repr",
    "float", "forward", "get_buffer", "get_extra_state", "get_parameter", "get_submodule",
    "half", "ipu", "load_state_dict", "modules", "mtia", "named_buffers", "named_children",
    "named_modules", "named_parameters", "parameters", "register_backward_hook",
    "register_buffer", "register_forward_hook", "register_forward_pre_hook",
    "register_full_backward_hook", "register_full_backward_pre_hook",
    "register_load_state_dict_post_hook", "register_load_state_dict_pre_hook",
    "register_module", "register_parameter", "register_state_dict_post_hook",
    "register_state_dict_pre_hook", "requires_grad_", "set_extra_state", "set_submodule",
    "share_memory", "state_dict", "to", "to_empty", "train", "training", "type", "xpu",
    "zero_grad",
}

# what the generated methods bind: locals (the batch and run length, the device, the layer
# loop's `layer`, step()'s `past` and its sites, the `config` the model and its layers are
# built from) and attributes and methods of the classes
GENERATED = {
    "self", "B", "T", "device", "dtype", "l", "layer", "start", "past", "sites", "site", "kv",
    "logits", "step", "cache_sites", "cache", "signature", "reset_parameters", "layers",
    "config",
    # tensor parallelism: the plan, a module's ranks and what the helpers' classes bind
    "TP_PLAN", "tp", "mesh", "group", "rank", "size", "ctx", "tensor", "axis", "grad",
    "parts", "backward",
    # sequence parallelism: its plan, a module's ranks, the call's switch
    "SP_PLAN", "sp", "sequence", "uses", "children", "ranks",
}
# unittest's deprecated aliases: ruff (UP005) rewrites a call `self.assert_(...)`, so a
# submodule may not be called so
LINT = {"assert_", "assertEquals", "assertNotEquals", "assertAlmostEquals",
        "assertNotAlmostEquals", "assertRegexpMatches", "assertRaisesRegexp", "failUnless",
        "failIf", "failUnlessEqual", "failIfEqual", "failUnlessAlmostEqual",
        "failIfAlmostEqual", "failUnlessRaises", "assertDictContainsSubset"}
# the model's attributes holding its second, third, ... `layers` block (layers_attr),
# and a value as split computations read it (codegen's Body._entered)
GENERATED_PATTERN = re.compile(r"layers\d+|\w+_entered_*")


def template_names(text: str) -> set[str]:
    """The names a model.py template binds at module level: `import x`, `from m import a as
    b`, `def f`, `class C`, `X = ...`, each at the start of a line (jinja's `{{ ... }}` are
    not names)."""
    names: set[str] = set()
    for line in text.splitlines():
        if m := re.match(r"(?:def|class)\s+([A-Za-z_]\w*)", line):
            names.add(m[1])
        elif m := re.match(r"([A-Za-z_]\w*)\s*(?::[^=]*)?=(?!=)", line):
            names.add(m[1])
        elif m := re.match(r"(?:from\s+\S+\s+)?import\s+(.+)", line):
            for part in m[1].strip("()").split(","):
                words = part.split()
                if words and re.fullmatch(r"[\w.]+", words[-1]):
                    names.add(words[-1].split(".")[0])
    return names


RESERVED = frozenset(set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins))
                     | template_names(TEMPLATE.read_text(encoding="utf-8")) | set(FUNCTIONAL)
                     | NN_MODULE | GENERATED | LINT)


def reserved(text: str) -> bool:
    """Whether model.py already owns the identifier `text`."""
    return text in RESERVED or GENERATED_PATTERN.fullmatch(text) is not None


def ident(name: str) -> str:
    """`W^Q` -> `W_Q`, `H^(l-1)` -> `H_prev`, `X'^(0)` -> `Xp_0`, `%12` -> `t12`, `class` ->
    `class_`."""
    name = unicodedata.normalize("NFKC", name)
    if name.startswith("%"):
        return "t" + name[1:]
    return unreserved(spell(name))


def spell(name: str) -> str:
    """A spec name in the letters an identifier may hold, before RESERVED is looked at."""
    name = unicodedata.normalize("NFKC", name)
    m = re.fullmatch(r"(.*)\^\((.*)\)", name)
    layer = None
    if m:
        name, layer = m.group(1), m.group(2).replace(" ", "")
    text = name.replace("'", "p").replace("^", "_")
    if layer is not None:
        if layer.endswith("-1"):
            text += "_prev"
        else:
            text += "_" + layer
    text = re.sub(r"[^0-9A-Za-z_]", "_", text)
    if not text or text[0].isdigit():
        text = "v_" + text
    if text.startswith("__"):
        text = "v" + text
    return text


def unreserved(text: str) -> str:
    """`text`, or where it is a reserved name followed by any number of `_`, `text` with as
    many more `_` as take every name of that kind past the reserved ones: `class` ->
    `class_`, `assert` -> `assert__` (`assert_` is reserved too), `assert_` -> `assert___`.
    Distinct names stay distinct, and none comes out reserved."""
    bases = [text[:len(text) - k] for k in range(len(text) - len(text.rstrip("_")), -1, -1)]
    base = next((b for b in bases if b and reserved(b)), None)
    if base is None:
        return text
    # one past the most underscores a reserved name of this base has
    shift = 1 + max(k for k in range(8) if reserved(base + "_" * k))
    return text + "_" * shift


def value_name(module: str) -> str:
    """A local named after a module's result, before `ident`: `RoundFactor` -> `round_factor`,
    `Mask^AR` -> `mask_ar`, `LSHKey` -> `lsh_key`, `diag` -> `diag`."""
    text = spell(module)
    text = re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", text)
    return text.lower()


def class_name(module: str) -> str:
    """`FF^GELU` -> `FF_GELU`, `Mask^AR_next` -> `Mask_AR_next`, `none` -> `None_`."""
    text = spell(module)
    return unreserved(text[0].upper() + text[1:])


class Namer:
    """Hands out distinct identifiers within one scope."""

    def __init__(self, taken: set[str] | None = None):
        self.taken = set(taken or ())
        self.names: dict[str, str] = {}

    def alias(self, name: str, preferred: str) -> str:
        """Name `name` after `preferred` (a temporary named for the call that made it)."""
        if name in self.names:
            return self.names[name]
        return self._take(name, ident(preferred))

    def __call__(self, name: str) -> str:
        if name in self.names:
            return self.names[name]
        return self._take(name, ident(name))

    def _take(self, name: str, base: str) -> str:
        out, k = base, 2
        while out in self.taken or reserved(out):
            out = f"{base}_{k}"
            k += 1
        self.taken.add(out)
        self.names[name] = out
        return out


def safe_name(path: str) -> str:
    """A file name as it may appear in generated code: letters, digits and `._-` only."""
    return re.sub(r"[^A-Za-z0-9._-]", "_", Path(path).name) or "spec"


def family_layout(dims: list, family, first: bool = False):
    """How an indexed family of parameters is stored: one tensor, the family axis just
    before the member's last axis. W_i^Q ∈ R^{H×D} for i in 1..A is (H, A, D), so
    X @ W^Q for every head at once is one matrix product with the (H, A·D) view. A family
    read one member at a time (`first`, ir.Param.members_first: MoE's experts) has the
    family axis first and each member as a linear layer holds its weight, (out, in)
    (member_layout): W_e^gate ∈ R^{H×F} for e in 1..E is (E, F, H), each member one
    contiguous matrix, laid out as the products of a few rows read it fastest."""
    if first:
        return [family] + member_layout(dims)
    at = family_axis(len(dims))
    return dims[:at] + [family] + dims[at:]


def member_layout(dims: list) -> list:
    """A member of a family stored members first (family_layout), its last two axes
    swapped: (in, out) as the equations write it, (out, in) as stored."""
    return dims[:-2] + [dims[-1], dims[-2]] if len(dims) >= 2 else list(dims)


def family_axis(rank: int, first: bool = False) -> int:
    """Where family_layout puts the family axis among a member's `rank` axes."""
    return rank - 1 if rank >= 2 and not first else 0


def layers_attr(index: int) -> str:
    """The model's attribute holding the layers of its `index`-th `layers` block (0-based):
    `layers`, then `layers2`, `layers3`, ... (an encoder, then a decoder)."""
    return "layers" if index == 0 else f"layers{index + 1}"
