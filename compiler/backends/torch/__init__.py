"""The PyTorch backend: readable nn.Module source generated from the checked IR."""

from .codegen import Unsupported, generate

__all__ = ["generate", "Unsupported"]
