"""The ONNX backend: the IR lowered straight to an ONNX graph (see lower.py)."""
