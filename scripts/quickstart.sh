#!/usr/bin/env bash
# Set up fgc in .venv and run the main job on shipped specs: check, count, compile (PyTorch
# and ONNX), run, and generate a few tokens with the key/value cache.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup.sh
.venv/bin/fgc check specs/
.venv/bin/fgc params specs/formal/gpt.fgpt --by-module
.venv/bin/fgc params specs/formal/gpt3.fgpt --preset 175b
.venv/bin/fgc compile specs/gpt2.fgpt --target torch --preset small -o out/gpt2
.venv/bin/python -c "
import importlib.util, torch
spec = importlib.util.spec_from_file_location('gpt2', 'out/gpt2/model.py')
m = importlib.util.module_from_spec(spec); spec.loader.exec_module(m)
model = m.build()
probs = model(torch.randint(0, model.config.V, (1, 8)))
print('out/gpt2/model.py:', sum(p.numel() for p in model.parameters()), 'parameters;',
      'probabilities', tuple(probs.shape))
"
.venv/bin/fgc compile specs/gpt2.fgpt --target onnx --preset small --optimize ort -o out/gpt2-onnx
.venv/bin/fgc run out/gpt2-onnx --tokens 464,2068,7586,21831
.venv/bin/fgc generate specs/gpt2.fgpt --preset small --prompt-ids 464,2068,7586,21831 \
    --max-new-tokens 8
