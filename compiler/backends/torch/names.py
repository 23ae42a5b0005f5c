"""Python identifiers for spec names: safe by construction, stable, collision-free."""

from __future__ import annotations

import builtins
import keyword
import re
import unicodedata

# names the generated file itself uses; a spec name equal to one is suffixed
RESERVED = {
    "torch", "nn", "math", "self", "B", "T", "build", "sdpa", "layer_norm", "gelu",
    "embedding", "CAUSAL", "causal_mask", "mask_tensor", "take", "device", "dtype", "layer",
    "l", "logits", "start", "past", "sites", "site", "kv", "project", "ONEDNN",
} | set(keyword.kwlist) | set(keyword.softkwlist) | set(dir(builtins))

# attributes every nn.Module has: a parameter or submodule of that name would shadow them
MODULE_ATTRIBUTES = {
    "training", "forward", "logits", "half", "float", "double", "bfloat16", "to", "cuda", "cpu",
    "xpu", "ipu", "mtia", "eval", "train", "parameters", "named_parameters", "buffers",
    "named_buffers", "children", "named_children", "modules", "named_modules", "state_dict",
    "load_state_dict", "apply", "register_buffer", "register_parameter", "register_module",
    "add_module", "get_submodule", "get_parameter", "get_buffer", "zero_grad",
    "requires_grad_", "share_memory", "type", "extra_repr", "reset_parameters",
    "call_super_init", "dump_patches", "compile", "to_empty", "set_extra_state",
    "get_extra_state", "register_forward_hook", "register_forward_pre_hook",
    "register_backward_hook", "register_full_backward_hook", "l", "step", "cache_sites",
    "cache", "signature",
}
RESERVED |= MODULE_ATTRIBUTES


def ident(name: str) -> str:
    """`W^Q` -> `W_Q`, `H^(l-1)` -> `H_prev`, `X'^(0)` -> `Xp_0`, `%12` -> `t12`."""
    name = unicodedata.normalize("NFKC", name)
    if name.startswith("%"):
        return "t" + name[1:]
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
    if text in RESERVED:
        text += "_"
    return text


def class_name(module: str) -> str:
    """`FF^GELU` -> `FF_GELU`, `Mask^AR_next` -> `Mask_AR_next`."""
    text = ident(module)
    return text[0].upper() + text[1:] if text[0].islower() else text


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
        while out in self.taken:
            out = f"{base}_{k}"
            k += 1
        self.taken.add(out)
        self.names[name] = out
        return out
