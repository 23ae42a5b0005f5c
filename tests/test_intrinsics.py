"""The intrinsics table (compiler/elaborate/intrinsics.py) against the standard library and
every backend's table of fused forms."""

from __future__ import annotations

import pytest

from compiler.elaborate.intrinsics import BY_MEANING, INTRINSICS, KINDS, MASKS, intrinsic
from compiler.pipeline import _stdlib, load


def test_every_intrinsic_is_a_standard_library_module():
    _, stdlib = _stdlib()
    assert set(INTRINSICS) <= {m.name for m in stdlib.modules}


def test_a_module_a_spec_defines_is_never_an_intrinsic(tmp_path):
    path = tmp_path / "own.fgpt"
    path.write_text("module Softmax(X: R[..., k]) -> R[..., k] {\n  Softmax(X) = X\n}\n"
                    "model M {\n  hyper n = 4, H = 2\n  input x: R[n, H]\n"
                    "  output y = Softmax(x) + LN(x)\n}\n")
    functions = load(str(path)).symbolic().functions
    assert intrinsic(functions["Softmax"]) is None
    assert intrinsic(functions["LN"]) is INTRINSICS["LN"]


@pytest.mark.parametrize("table", ["torch", "onnx", "onnx --optimize ort"])
def test_every_backend_table_has_every_kind(table):
    if table == "torch":
        from compiler.backends.torch.codegen import FUSED
    else:
        from compiler.backends.onnx import lower
        FUSED = lower.FUSED_ORT if table.endswith("ort") else lower.FUSED
    assert set(FUSED) == set(KINDS)


def test_the_masks_passed_by_meaning_are_the_ones_the_lowering_reads():
    from compiler.elaborate import ir
    from compiler.lowering.masks import MaskKind, mask_of_call
    functions = {name: ir.Function(name=name, hypers=[], inputs=[], params=[], eqns=[],
                                   outputs=[], builtin=True) for name in INTRINSICS}
    read = set()
    for name, i in INTRINSICS.items():
        if i.kind != "mask":
            continue
        call = ir.Eqn(outs=[], op="call", ins=[], attrs={"module": name, "bindings": {}})
        kind = mask_of_call(call, functions)
        if kind is not None:
            read.add(i.mask)
            assert kind == MaskKind(i.mask in ("causal", "window"), False, i.mask == "window")
            assert (i.width is not None) == kind.window  # a window says which size is its width
    assert read == BY_MEANING
    assert BY_MEANING <= MASKS


def test_every_primitive_and_lowered_op_has_an_entry_in_both_backends():
    from compiler.backends.onnx.lower import LOWER as ONNX
    from compiler.backends.torch.codegen import LOWER as TORCH
    from compiler.elaborate.primitives import PRIMITIVES
    from compiler.lowering import LOWERED_OPS
    ops = set(PRIMITIVES) | set(LOWERED_OPS)
    assert ops - set(TORCH) == set()
    assert ops - set(ONNX) == set()
