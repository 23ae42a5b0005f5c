"""Text in, text out: a byte-level BPE tokenizer (the `tokenizers` package) around fgc's
token-id generation.

With the public GPT-2 files (`tokenizer.json` and `model.safetensors` of the `gpt2`
checkpoint on the Hugging Face Hub, downloaded by you):

    python examples/generate_text.py --tokenizer tokenizer.json --weights model.safetensors \
        --prompt "The formulated transformer" --max-new-tokens 40 --temperature 0.8 --top-k 40

Without downloads, `--train-tokenizer FILE` trains a small byte-level BPE on a text file and
the model runs with random weights at the size you `--set` (the vocabulary is set to the
tokenizer's): the text is noise, but every step is the real one.

    python examples/generate_text.py --train-tokenizer examples/data/founding.txt \
        --set L=2 --set H=32 --set A=4 --set n=64 --prompt "We the People" --max-new-tokens 20

The spec (`--spec`, default specs/gpt2.fgpt, preset small) is compiled into a temporary
folder, to ONNX with `--kv-cache` (default) or to PyTorch (`--backend torch`); fgc and the
runtime see token ids only.
"""

from __future__ import annotations

import argparse
import importlib.util
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    which = ap.add_mutually_exclusive_group(required=True)
    which.add_argument("--tokenizer", metavar="tokenizer.json")
    which.add_argument("--train-tokenizer", metavar="TEXT", help="train a byte-level BPE here")
    ap.add_argument("--vocab", type=int, default=300, help="with --train-tokenizer: its size")
    ap.add_argument("--spec", default=str(ROOT / "specs" / "gpt2.fgpt"))
    ap.add_argument("--preset")
    ap.add_argument("--set", action="append", default=[], metavar="K=V")
    ap.add_argument("--weights", metavar="W.safetensors")
    ap.add_argument("--backend", choices=["onnx", "torch"], default="onnx")
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--max-new-tokens", type=int, default=40)
    ap.add_argument("--temperature", type=float)
    ap.add_argument("--top-k", type=int)
    ap.add_argument("--top-p", type=float)
    ap.add_argument("--seed", type=int)
    args = ap.parse_args(argv)
    try:
        import tokenizers
    except ImportError:
        print("this example needs the `tokenizers` package: pip install tokenizers",
              file=sys.stderr)
        return 1

    from compiler.emit import compile_spec
    from compiler.errors import FgcError
    from compiler.pipeline import parse_set
    from runtime import RuntimeError_, generate, load

    if args.tokenizer:
        tok = tokenizers.Tokenizer.from_file(args.tokenizer)
        stop = [i for i in (tok.token_to_id("<|endoftext|>"),) if i is not None]
    else:
        bpe = tokenizers.ByteLevelBPETokenizer()
        bpe.train([args.train_tokenizer], vocab_size=args.vocab, show_progress=False)
        tok, stop = bpe, []
    sets = dict(parse_set(s) for s in args.set)
    if args.train_tokenizer:
        sets.setdefault("V", tok.get_vocab_size())
    preset = args.preset or (None if sets else "small")
    with tempfile.TemporaryDirectory(prefix="fgc-text-") as tmp:
        try:
            compile_spec(args.spec, tmp, args.backend, preset, sets, args.weights,
                         kv_cache=args.backend == "onnx")
        except FgcError as e:
            print(f"fgc: {e}", file=sys.stderr)
            return 1
        if args.backend == "onnx":
            model = load(tmp, provider="auto")
            print(f"provider: {model.provider} ({model.reason})", file=sys.stderr)
        else:
            spec = importlib.util.spec_from_file_location("fgc_text_model", f"{tmp}/model.py")
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            model = module.build().eval()
            if args.weights:
                from safetensors.torch import load_file
                model.load_state_dict(load_file(f"{tmp}/weights.safetensors"))
        ids = tok.encode(args.prompt).ids
        try:
            (new,) = generate(model, [ids], args.max_new_tokens, temperature=args.temperature,
                              top_k=args.top_k, top_p=args.top_p, seed=args.seed, stop=stop)
        except RuntimeError_ as e:
            print(f"fgc: {e}", file=sys.stderr)
            return 1
    print(f"prompt ids: {ids}", file=sys.stderr)
    print(f"new ids:    {new}", file=sys.stderr)
    print(args.prompt + tok.decode(new))
    return 0


if __name__ == "__main__":
    sys.exit(main())
