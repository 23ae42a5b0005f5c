"""Backends: code generation from the checked IR (torch, onnx)."""
