"""Well-typed `.fgpt` specs at toy sizes, drawn with hypothesis, for tests/test_differential.py.

`specs()` composes the language's constructs at random: the token embedding `OneHot(x) @ W_e`
(learned positions, a scale), a `layers` block of residual sublayers (attention, feed-forward,
pointwise), some chosen per layer (`... if l is odd else ...`), labelled (`attn: MH(...)`) or
shared across the layers, now and then a second block cross-attending to the first; the
standard library's masks (Mask^AR, Mask^BD, Mask^ST, Mask^AR_next, Mask^AR_curr, a per-layer
choice among them), an element-wise mask written here, and masks with an added bias
(`B_i + Mask^AR`); attention modules written here, with per-head or shared keys and values
(multi-query), families staged in `where` clauses, a softmax written out, a sliced input
(`X[:, 1..D]`), or a bias family passed as a family argument (`B_1, ..., B_A` into
`B_i: R[n, n] for i in 1..A`); families at model level, one member per head of a real input
(`Bt[i, :, :]`); LN, an RMSNorm written here, the GELU variants, Softmax, Concat; one to
four outputs. Sizes stay small (H, D <= 8, A <= 3, n <= 8, V <= 13), so that one spec
compiles and runs in a fraction of a second. A few constructs are drawn for `fgc check`'s
refusal: a module with parameters called once per member, a key slice that moves with the
member index (grouped-query attention).

Each draw says which constructs it used (`Generated.features`). A construct that a backend
gets wrong today is listed in KNOWN with its regression spec (tests/differential/) and the
stage of the comparison that goes wrong: the harness leaves that stage out for a spec that
uses it, or, for a stage it cannot leave out, the construct is not drawn. When a fix lands,
its regression test's strict xfail fails, and its entry here goes.
"""

from __future__ import annotations

from dataclasses import dataclass

from hypothesis import strategies as st

# feature -> (the stage of the comparison that goes wrong, its regression spec). Stages:
# "compile" (a backend cannot lower, or emits broken code for, what `fgc check` accepts),
# "agree" (the backends compute different things), "length" (at a shorter run one backend
# runs or crashes where the other refuses), "kv" (the incremental form). The harness leaves
# out the last two for a spec with the feature; the others are not drawn at all.
KNOWN: dict[str, tuple[str, str]] = {}
SKIPPABLE = {"length", "kv"}


def skipped_stages(features: frozenset[str]) -> set[str]:
    """The stages the harness leaves out for a spec with these features."""
    return {KNOWN[f][0] for f in features if f in KNOWN}


@dataclass(frozen=True)
class Generated:
    text: str
    features: frozenset[str]
    causal: bool  # some attention over the tokens has a causal mask


MASKS = ["Mask^AR", "Mask^BD", "Mask^ST", "Mask^AR_next", "layer-mask", "custom-mask"]
# an element-wise mask written here: causal, within a window of c positions
WINDOW = """module Mask^Win[n, c] -> R[n, n] {
  Mask^Win[i, j] = 0 if j <= i and j > i - c else -inf
}
"""
ACTIVATIONS = {  # name -> the nonlinearity applied to U
    "GELU": "GELU(U)", "GELU^tanh": "GELU^tanh(U)", "GELU^erf": "GELU^erf(U)",
    "relu": "max(0, U)", "tanh": "tanh(U)", "silu": "U * sigmoid(U)",
}


class _Draft:
    """What one draw has decided so far: modules, parameters, equations, features."""

    def __init__(self, draw, avoid: frozenset[str]):
        self.draw = draw
        self.avoid = avoid
        self.modules: dict[str, str] = {}
        self.hypers: list[str] = []
        self.inputs: list[str] = ["x: {1..V}^n"]
        self.params: list[str] = ["W_e: R[V, H]"]
        self.before: list[str] = []  # equations before the layers
        self.features: set[str] = set()
        self.causal = False
        self.causal_attentions = 0  # attentions over the tokens with a causal mask
        self.labels: list[str] = []
        self.last = "H^(L)"  # what the outputs read
        self.counter = 0

    def pick(self, options):
        return self.draw(st.sampled_from(list(options)))

    def chance(self, p: float = 0.5) -> bool:
        """True with probability about p; shrinks to False (the construct left out)."""
        return self.draw(st.integers(0, 99)) >= 100 * (1 - p)

    def allowed(self, feature: str) -> bool:
        return feature not in self.avoid

    def fresh(self, base: str) -> str:
        self.counter += 1
        return f"{base}{self.counter}"

    def use(self, *features: str) -> None:
        self.features.update(features)


# ---------------------------------------------------------------- modules written here


def _attention_module(d: _Draft) -> tuple[str, bool, bool]:
    """An attention module written here: (its name, whether it takes the caller's mask,
    whether it takes a bias family)."""
    name = d.fresh("Attn")
    d.use("attention-module")
    kv = "heads"
    if d.chance(0.3):
        kv = "shared"
        d.use("multi-query")
    elif d.chance(0.1):  # a key slice that moves with i: `fgc check` refuses it
        kv = "grouped"
        d.use("grouped-query")
    # a module with parameters per head: `fgc check` refuses it (no batched form)
    style = "per-head-module" if d.chance(0.1) else d.pick(["direct", "staged", "written"])
    sliced = style != "per-head-module" and d.chance(0.2)
    # what a head adds to its scores: the caller's mask, or a bias family plus a mask
    mask_kind = "arg"
    if d.chance(0.35):
        mask_kind = d.pick(["bias+arg", "bias+AR", "bias+BD", "bias"])
        d.use("family-argument", f"mask-{mask_kind}")
        if mask_kind in ("bias+AR", "bias+BD"):
            d.use("bias+stdlib-mask")
        d.causal |= mask_kind == "bias+AR"
    mask = {"arg": "Mask", "bias+arg": "B_i + Mask", "bias+AR": "B_i + Mask^AR",
            "bias+BD": "B_i + Mask^BD", "bias": "B_i"}[mask_kind]

    if sliced:
        d.use("slice")
    q = "X[:, 1..D] @ W_i^Q" if sliced else "X @ W_i^Q"
    params = [f"param W_i^Q: R[{'D' if sliced else 'H'}, D] for i in 1..A"]
    if kv == "heads":
        k, v = "X @ W_i^K", "X @ W_i^V"
        params += ["param W_i^K: R[H, D] for i in 1..A", "param W_i^V: R[H, D] for i in 1..A"]
    elif kv == "shared":
        k, v = "X @ W^K", "X @ W^V"
        params += ["param W^K: R[H, D]", "param W^V: R[H, D]"]
    else:  # G groups of keys; head i reads group (i - 1) * G / A
        k = "X @ W^K[:, ((i - 1) * G / A) * D + 1 .. ((i - 1) * G / A + 1) * D]"
        v = "X @ W^V[:, 1..D]"
        params += ["param W^K: R[H, G * D]", "param W^V: R[H, G * D]"]
    if style == "direct":
        heads = f"head_i = Attention({q}, {k}, {v}, {mask}) for i in 1..A"
    elif style == "staged":
        d.use("staged-where")
        if kv == "shared":  # every member of k_i is the one shared key
            d.use("shared-key-family")
        heads = (f"q_i = {q} for i in 1..A,\n          k_i = {k} for i in 1..A,\n"
                 f"          head_i = Attention(q_i, k_i, {v}, {mask}) for i in 1..A")
    elif style == "written":
        d.use("written-softmax")
        heads = (f"s_i = ({q}) @ ({k})^T / sqrt(D) for i in 1..A,\n"
                 f"          head_i = Softmax(s_i + {mask}) @ ({v}) for i in 1..A")
    else:  # one instance of a module per head, each with its own projections
        d.use("module-per-head")
        head = d.fresh("Head")
        d.modules[head] = (
            f"module {head}[D](X: R[n, H], Mask: R[n, n]) -> R[n, D] {{\n"
            f"  {head}(X, Mask) = Attention(X @ W^Q, X @ W^K, X @ W^V, Mask)\n"
            f"  param W^Q: R[H, D], W^K: R[H, D], W^V: R[H, D]\n}}\n")
        heads = f"head_i = {head}[D](X, {mask}) for i in 1..A"
        params = []
    params.append("param W^O: R[A * D, H]")
    concat = d.pick(["Concat(head_1, ..., head_A)", "concat(head_1, ..., head_A)"])
    d.use("Concat" if concat.startswith("C") else "concat")
    takes_mask = mask_kind in ("arg", "bias+arg")
    takes_bias = mask_kind != "arg"
    args = ["X: R[n, H]"] + ["Mask: R[n, n]"] * takes_mask + \
        ["B_i: R[n, n] for i in 1..A"] * takes_bias
    names = ["X"] + ["Mask"] * takes_mask + ["B"] * takes_bias
    body = "\n  ".join(params)
    d.modules[name] = (
        f"module {name}{'[A, G, D]' if kv == 'grouped' else '[A, D]'}({', '.join(args)})"
        f" -> R[n, H] {{\n  {name}({', '.join(names)}) = {concat} @ W^O\n"
        f"    where {heads}\n  {body}\n}}\n")
    return name, takes_mask, takes_bias


def _ff_module(d: _Draft) -> str:
    """A feed-forward module written here; returns its name."""
    name = d.fresh("FFN")
    act = d.pick(sorted(ACTIVATIONS))
    d.use("ff-module", f"act-{act}")
    if d.chance(0.3):
        d.use("gated")
        body = (f"{name}(X) = ({ACTIVATIONS[act]} * (X @ W_3)) @ W_2 + b_2\n"
                f"    where U = X @ W_1 + b_1\n"
                "  param W_1: R[H, F], b_1: R[F], W_3: R[H, F], W_2: R[F, H], b_2: R[H]")
    else:
        body = (f"{name}(X) = {ACTIVATIONS[act]} @ W_2 + b_2 where U = X @ W_1 + b_1\n"
                "  param W_1: R[H, F], b_1: R[F], W_2: R[F, H], b_2: R[H]")
    d.modules[name] = f"module {name}[F](X: R[..., H]) -> R[..., H] {{\n  {body}\n}}\n"
    return name


def _norm(d: _Draft, x: str) -> str:
    kind = d.pick(["LN", "LN", "LN-eps", "RMSNorm"])
    d.use(kind)
    if kind == "LN":
        return f"LN({x})"
    if kind == "LN-eps":
        return f"LN[eps = 1e-6]({x})"
    d.modules["RMSNorm"] = ("module RMSNorm[eps = 1e-6](X: R[..., H]) -> R[..., H] {\n"
                            "  RMSNorm(X) = g * X / sqrt(mean(X * X) + eps)\n"
                            "  param g: R[H]\n}\n")
    return f"RMSNorm({x})"


# ---------------------------------------------------------------- sublayers


def _bias_family(d: _Draft) -> str:
    """A family of A matrices R[n, n] made at model level and passed whole (`B_1, ...,
    B_A`); returns its base name."""
    kind = d.pick(["param", "scaled", "projected", "content"])
    d.use(f"bias-{kind}")
    if kind != "content":
        d.use("n-sized-param")  # a parameter whose last axis is n: the length is fixed
    if kind in ("param", "scaled") and not any(p.startswith("P_i") for p in d.params):
        d.params.append("P_i: R[n, n] for i in 1..A")
    if kind == "param":
        return "P"
    d.use("model-family")
    name = d.fresh("B")
    if kind == "scaled":
        d.before.append(f"{name}_i = P_i * 0.5 for i in 1..A")
    else:
        u = d.fresh("U")
        d.params.append(f"{u}_i: R[H, {'n' if kind == 'projected' else 'H'}] for i in 1..A")
        d.before.append(f"{name}_i = H^(0) @ {u}_i for i in 1..A" if kind == "projected" else
                        f"{name}_i = H^(0) @ {u}_i @ H^(0)^T / sqrt(H) for i in 1..A")
    return name


def _window(d: _Draft) -> None:
    if not any(h.startswith("w = ") for h in d.hypers):
        d.hypers.append(f"w = {d.draw(st.integers(1, 4))}")


def _mask(d: _Draft, layer_masks: list[str], builtin: bool = False) -> str:
    """A mask for self-attention: the standard library's, or one chosen per layer. With
    `builtin` (the standard library's MH and MHA), also Mask^AR_curr, whose first row
    hides every key: Attention gives that query 0, where a softmax written out is NaN."""
    kind = d.pick(MASKS + ["Mask^AR_curr"] * builtin)
    if kind not in ("Mask^BD", "custom-mask") and d.causal_attentions:
        if not d.allowed("two-causal-attentions"):
            kind = "Mask^BD"
        else:
            d.use("two-causal-attentions")
    d.use(kind)
    if kind == "custom-mask":  # causal, but not one the incremental form knows
        d.modules["Mask^Win"] = WINDOW
        d.causal = True
        _window(d)
        return "Mask^Win[n, w]"
    d.causal_attentions += kind != "Mask^BD"
    if kind != "layer-mask":
        d.causal |= kind != "Mask^BD"
        if kind == "Mask^ST":
            _window(d)
        return kind
    a, b = d.pick([("Mask^AR", "Mask^ST"), ("Mask^AR", "Mask^BD"), ("Mask^ST", "Mask^AR")])
    if "Mask^ST" in (a, b):
        _window(d)
    d.causal = True
    name = d.fresh("M")
    layer_masks.append(f"{name}^(l) = {a} if l is {d.pick(['odd', 'even'])} else {b}")
    return f"{name}^(l)"


def _attention(d: _Draft, x: str, layer_masks: list[str]) -> str:
    kind = d.pick(["MH", "MHA", "module", "module"])
    if kind == "MH":
        d.use("MH")
        return f"MH({x}, {_mask(d, layer_masks, builtin=True)})"
    if kind == "MHA":
        d.use("MHA")
        return f"MHA({x}, {x}, {x}, {_mask(d, layer_masks, builtin=True)})"
    name, takes_mask, takes_bias = _attention_module(d)
    args = [x]
    if takes_mask:
        args.append(_mask(d, layer_masks))
    if takes_bias:
        base = _bias_family(d)
        args.append(f"{base}_1, ..., {base}_A")
    return f"{name}({', '.join(args)})"


def _feed_forward(d: _Draft, x: str) -> str:
    kind = d.pick(["FF^GELU", "FF^ReLU", "module"])
    if kind == "module":
        return f"{_ff_module(d)}({x})"
    d.use(kind)
    return f"{kind}({x})"


def _labelled(d: _Draft, call: str, base: str) -> str:
    d.use("label")
    d.labels.append(d.fresh(base))
    return f"{d.labels[-1]}: {call}"


def _sublayer(d: _Draft, x: str, layer_masks: list[str]) -> tuple[str, str, str] | str:
    """One residual branch applied to `x`: an expression, or (a, condition, b) for a
    choice made per layer."""
    kind = d.pick(["attention", "attention", "ff", "ff", "pointwise", "condition"])
    if kind == "condition":
        d.use("layer-condition")
        before = d.causal_attentions
        a = _attention(d, _norm(d, x), layer_masks)
        if d.causal_attentions > before:
            d.use("causal-attention-in-some-layers")
        b = _feed_forward(d, _norm(d, x))
        if d.chance(0.5):
            a, b = _labelled(d, a, "attn"), _labelled(d, b, "ff")
        return a, d.pick(["l is odd", "l is even", "l <= L / 2", "l != 1"]), b
    if kind == "pointwise":
        act = d.pick(["GELU", "GELU^tanh", "GELU^erf", "tanh"])
        d.use(f"act-{act}")
        return f"{act}({x}) * 0.5"
    inner = x if d.chance(0.4) else _norm(d, x)
    call = _attention(d, inner, layer_masks) if kind == "attention" else \
        _feed_forward(d, inner)
    return _labelled(d, call, "attn" if kind == "attention" else "ff") \
        if d.chance(0.3) else call


def _residual(d: _Draft, branch, x: str) -> str:
    """branch + x; a choice per layer is bracketed whole, or each side gets its own
    residual."""
    if isinstance(branch, str):
        return f"{branch} + {x}"
    a, cond, b = branch
    if d.allowed("condition-plus-residual") and d.chance(0.7):
        d.use("condition-plus-residual")
        return f"({a} if {cond} else {b}) + {x}"
    return f"({a} + {x}) if {cond} else ({b} + {x})"


def _second_stack(d: _Draft) -> list[str]:
    """A second `layers` block after the first: queries from the embedding, keys and values
    from the first block's result Z (cross-attention). The outputs read its G^(L)."""
    d.use("second-stack", "MHA")
    d.last = "G^(L)"
    mask = d.pick(["Mask^AR", "Mask^BD"])
    d.use(mask)
    if mask == "Mask^AR":
        d.causal = True
    branch = _feed_forward(d, _norm(d, "G^(l-1)"))
    return ["  Z = H^(L)", "  G^(0) = H^(0)", "  layers l in 1..L {",
            f"    Gc^(l) = MHA({_norm(d, 'G^(l-1)')}, Z, Z, {mask}) + G^(l-1)",
            f"    G^(l) = {branch.replace('G^(l-1)', 'Gc^(l)')} + Gc^(l)", "  }"]


def _outputs(d: _Draft) -> tuple[list[str], list[str]]:
    """(equations after the layers, one to three outputs) over the last layer's value."""
    kinds = d.draw(st.lists(st.sampled_from(["tied", "head", "family", "slice", "concat"]),
                            min_size=1, max_size=3, unique=True))
    if d.chance(0.1):  # a module with parameters per member: `fgc check` refuses it
        kinds.append("instances")
    after, out = [], []
    last = d.last
    for kind in kinds:
        if kind == "tied":
            d.use("tied-output", "Softmax")
            out.append(f"output probs = Softmax({_norm(d, last)} @ W_e^T)")
        elif kind == "head":
            d.params.append("W_o: R[H, V]")
            out.append(f"output logits = {last} @ W_o")
        elif kind == "family":
            d.use("model-family", "output-family", "Concat")
            d.params.append("W_i^P: R[H, D] for i in 1..A")
            after.append(f"y_i = {last} @ W_i^P for i in 1..A")
            name = "heads"
            if d.allowed("value-named-like-family") and d.chance(0.3):
                d.use("value-named-like-family")
                name = "y"  # the family's own base name
            out.append(f"output {name} = Concat(y_1, ..., y_A)")
        elif kind == "instances":
            d.use("model-family", "instance-family", "Concat")
            d.params.append("W_g: R[A * H, V]")
            after.append(f"g_i = {_feed_forward(d, last)} for i in 1..A")
            out.append("output gs = Concat(g_1, ..., g_A) @ W_g")
        elif kind == "slice":
            d.use("slice")
            out.append(f"output first = GELU^tanh({last}[:, 1..D])")
        else:
            d.use("concat", "Softmax")
            d.params.append("W_c: R[2 * H, V]")
            out.append(f"output both = Softmax(concat({last}, H^(0)) @ W_c)")
    families = any(p.endswith("for i in 1..A") for p in d.params)
    if d.chance(0.15) and (not families or d.allowed("member-index-beside-family")):
        d.use("member-index")  # member i of the family reads slice i of one input
        if families:
            d.use("member-index-beside-family")
        d.inputs.append("Bt: R[A, H, D]")
        after.append(f"z_i = {last} @ Bt[i, :, :] for i in 1..A")
        out.append("output zs = Concat(z_1, ..., z_A)")
    if len(out) > 1:
        d.use("several-outputs")
    return after, out


# ---------------------------------------------------------------- the model


@st.composite
def specs(draw, avoid: frozenset[str] | None = None) -> Generated:
    """A model and the modules it uses. `avoid`: features never drawn (by default those of
    KNOWN whose stage the harness cannot leave out)."""
    if avoid is None:
        avoid = frozenset(f for f, (stage, _) in KNOWN.items() if stage not in SKIPPABLE)
    d = _Draft(draw, avoid)
    A = draw(st.integers(1, 3))
    # a LayerNorm over fewer than 4 features is ill-conditioned: float32 rounding is
    # amplified past the tolerance
    D = draw(st.integers(-(-4 // A), 8 // A))
    H = A * D
    F = draw(st.sampled_from(sorted({H, 2 * H, min(16, 4 * H)})))
    d.hypers = [f"L = {draw(st.integers(1, 3))}", f"V = {draw(st.integers(5, 13))}",
                f"n = {draw(st.integers(3, 8))}", f"H = {H}", f"A = {A}", "D = H / A",
                f"F = {F}"]

    embed = "OneHot(x) @ W_e"
    if d.chance(0.5):
        d.use("positions")
        d.params.append("W_p: R[n, H]")
        embed += " + W_p"
    if d.chance(0.2):
        d.use("scaled-embedding")
        embed = f"({embed}) * sqrt(H)"
    d.before.append(f"H^(0) = {embed}")

    layer_masks: list[str] = []
    steps = []
    count = draw(st.integers(1, 3))
    previous = "H^(l-1)"
    for k in range(count):
        out = "H^(l)" if k == count - 1 else f"{d.fresh('S')}^(l)"
        total = _residual(d, _sublayer(d, previous, layer_masks), previous)
        if d.chance(0.3):
            d.use("post-norm")
            total = _norm(d, total)
        steps.append(f"{out} = {total}")
        previous = out
    share = []
    if d.labels and d.chance(0.3):
        d.use("share")
        share = [f"share {', '.join(d.labels)}"]
    stack = _second_stack(d) if d.chance(0.15) else []
    after, outputs = _outputs(d)
    if "grouped-query" in d.features:
        groups = [g for g in (1, 2, 3) if A % g == 0]
        d.hypers.append(f"G = {draw(st.sampled_from(groups))}")

    lines = ["model Gen {", f"  hyper {', '.join(d.hypers)}",
             *(f"  input {i}" for i in d.inputs), *(f"  param {p}" for p in d.params),
             *(f"  {e}" for e in d.before), "  layers l in 1..L {",
             *(f"    {s}" for s in share + layer_masks + steps), "  }", *stack,
             *(f"  {e}" for e in after + outputs), "}"]
    text = "".join(m + "\n" for m in d.modules.values()) + "\n".join(lines) + "\n"
    return Generated(text, frozenset(d.features), d.causal)
