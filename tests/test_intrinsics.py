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
        from compiler.backends.torch.codegen import FUSED, FUSED_MASKS
    else:
        from compiler.backends.onnx import lower
        FUSED = lower.FUSED_ORT if table.endswith("ort") else lower.FUSED
        FUSED_MASKS = lower.FUSED_MASKS
    assert set(FUSED) == set(KINDS)
    assert set(FUSED_MASKS) == set(MASKS)
    # what every backend passes by meaning, and only that, has a fused form
    assert {kind for kind, lower in FUSED_MASKS.items() if lower is not None} == BY_MEANING


def test_every_primitive_and_lowered_op_has_an_entry_in_both_backends():
    from compiler.backends.onnx.lower import LOWER as ONNX
    from compiler.backends.torch.codegen import LOWER as TORCH
    from compiler.elaborate.primitives import PRIMITIVES
    from compiler.lowering import LOWERED_OPS
    ops = set(PRIMITIVES) | set(LOWERED_OPS)
    assert ops - set(TORCH) == set()
    assert ops - set(ONNX) == set()
