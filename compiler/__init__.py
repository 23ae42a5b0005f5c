"""fgc: a compiler for transformer architectures written as boxed definitions.

Notes for developers. The stages are the files, in pipeline order:

    grammar.lark  -> parse.py (Lark LALR -> syntax.py)
                  -> shapes.py (names resolved, IR of ir.py built, shapes checked,
                                symbolically and per preset; rules in primitives.py)
                  -> params.py (exact counts and the closed formula)
                  -> backends/ (code generation) ; cli.py drives it all

`pipeline.py` strings the front half together. `fgc check` and `fgc params` import
nothing heavier than lark and pydantic: keep torch and onnx out of these modules.
The standard library of modules is `stdlib/stdlib.fgpt`, written in the language.
`runtime/` runs what was emitted and must never import this package.
"""

__version__ = "0.1.0"
