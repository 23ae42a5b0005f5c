"""Tools: the checked IR (and the syntax tree it came from) in, text for people out.

`printer.py` prints the IR (`fgc ir`, and what the golden tests pin), `diff.py` compares two
architectures as math (`fgc diff`), `render.py` draws a spec as LaTeX boxes, Markdown or
Graphviz (`fgc render`). They sit beside the pipeline, not in it: only the CLI imports
them.
"""
