"""Runtime: loads and runs what fgc emitted; never imports `compiler`.

`load(folder, provider="auto")` makes an onnxruntime session for `folder/model.onnx`,
preferring TensorRT/CUDA when a GPU is usable and saying which provider runs and why.
`run_segments(model, inputs)` runs a long sequence through a model with recurrent state
(Transformer-XL's memory), segment by segment, with an ONNX session or the PyTorch module.
`generate(model, prompt_ids, max_new_tokens, ...)` samples token ids from either, with
the key/value cache where the model has its incremental form.

`runtime.files` holds the rules for every file fgc reads back or writes (no write follows a
link, no read waits on a FIFO); it imports only the standard library, so `compiler/` uses
it too without paying for numpy. The names below are therefore imported on first use.
"""

import importlib

_EXPORTS = {"Sampler": "generate", "generate": "generate", "run_segments": "segments",
            "Model": "session", "RuntimeError_": "session", "choose_providers": "session",
            "cuda_device": "session", "load": "session"}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module 'runtime' has no attribute {name!r}")
    module = importlib.import_module(f".{_EXPORTS[name]}", __name__)
    # bind every name the submodule exports, `generate` above all: importing the submodule
    # runtime.generate has just set the package attribute `generate` to the module itself
    for export, home in _EXPORTS.items():
        if home == _EXPORTS[name]:
            globals()[export] = getattr(module, export)
    return globals()[name]
