"""Elaboration: a syntax tree in, the checked IR out (values with symbolic shapes, flat
equations `out = op(inputs, params)` with spans, grouped into functions and a model).

`elaborator.py` resolves names, instantiates modules and checks every shape, symbolically
(for every size) and per preset, with the shape rule of each primitive from the table in
`primitives.py`; `ir.py` defines the IR and `symbolic.py` the polynomials its dimensions and
counts are written in. Everything later reads the IR, never the syntax tree's meaning.
"""
