"""fgc: a compiler for transformer architectures written as boxed definitions.

Notes for developers. The packages are the stages, in pipeline order:

    syntax/      .fgpt text -> syntax tree (grammar.lark, parse.py; parse_tree.py holds
                 Lark, cache.py the on-disk parse cache, nodes.py the tree)
    elaborate/   syntax tree -> checked IR: names resolved, shapes checked symbolically
                 and per preset (elaborator.py; the IR in ir.py, shape rules in
                 primitives.py, dimensions in symbolic.py)
    passes/      facts about the IR: parameter counts (params.py), tensors two specs share
                 (sharing.py), the key/value-cache form (incremental.py), the size of a
                 compile (budget.py)
    backends/    IR -> PyTorch source (torch/) or an ONNX graph (onnx/)
    pipeline.py  syntax, elaboration and counting as one call (`load` gives a `Spec`)
    emit.py      `fgc compile`: a checked spec -> files, through a backend and weights.py
    config_json.py  a model folder's config.json through the spec's config block: its
                 hyperparameters, its assumptions, which spec the folder is for
    tools/       the IR shown to people: printer.py (`fgc ir`), diff.py, render.py
    cli.py       drives it all

Beside the stages: `names.py`, the naming policies every backend and weights.py share
(identifiers, tensor layouts); `errors.py`, the diagnostics; `table.py`, terminal tables. A
stage imports only these and the stages above it, and no module imports one that imports it
back (tests/test_layout.py checks the graph). The ONNX backend and weights.py never import
the torch backend, and `fgc check`, `params` and `diff` import nothing heavier than lark and
pydantic: keep torch, onnx and jinja2 out of the front half. The standard library of modules
is `stdlib/stdlib.fgpt`, written in the language. `runtime/` runs what was emitted and must
never import this package.
"""

__version__ = "0.1.0"
