"""Runtime: loads and runs what fgc emitted; never imports `compiler`.

`load(folder, provider="auto")` makes an onnxruntime session for `folder/model.onnx`,
preferring TensorRT/CUDA when a GPU is usable and saying which provider runs and why.
`run_segments(model, inputs)` runs a long sequence through a model with recurrent state
(Transformer-XL's memory), segment by segment, with an ONNX session or the PyTorch module.
`generate(model, prompt_ids, max_new_tokens, ...)` samples token ids from either, with
the key/value cache where the model has its incremental form.
"""

from .generate import Sampler, generate
from .segments import run_segments
from .session import Model, RuntimeError_, choose_providers, cuda_device, load

__all__ = ["Model", "RuntimeError_", "Sampler", "choose_providers", "cuda_device", "generate",
           "load", "run_segments"]
