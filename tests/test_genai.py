"""onnxruntime-genai generates with fgc's graph: `fgc compile FOLDER --target onnx --kv-cache
--genai`.

Tiny GPT-2 and Llama models of transformers' classes, with peaked random weights, are saved
as save_pretrained writes a model folder, beside a byte-level BPE tokenizer saved the same
way. fgc compiles each folder with `--genai`: the graph's tensors take onnxruntime-genai's
names, and genai_config.json and the tokenizer's files are written beside it.
onnxruntime-genai (og.Model, og.Tokenizer, og.Generator; greedy, CPU), in a process of its
own as a user runs it, encodes a text and generates from it; the ids are those of
`runtime.generate` and of `fgc generate` on the same folder, stopping at the folder's
end-of-sequence id alike. The onnxruntime it loads is the environment's onnxruntime-gpu,
whose providers the --no-deps install (scripts/setup.sh) leaves as they were.

The tests that run onnxruntime-genai skip where it cannot be imported; the others (the
errors, the files written without a model folder, a tokenizer linked from outside the
folder) need only fgc.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import numpy as np
import pytest
from conftest import ROOT, fgc, peaked_weights

from compiler.cli import main
from runtime import generate
from runtime import load as load_onnx

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")
tokenizers = pytest.importorskip("tokenizers")

TEXT = "the cat sat on the mat"
NEW = 12  # ids to generate
EOS = "<|endoftext|>"  # the tokenizer's one special token: bos, eos and the folder's ids
MODELS = {  # transformers' class and configuration, tiny; the vocabulary is the tokenizer's
    "gpt2": ("GPT2LMHeadModel", "GPT2Config",
             dict(n_layer=2, n_embd=24, n_head=3, n_positions=32)),
    "llama": ("LlamaForCausalLM", "LlamaConfig",
              dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                   num_key_value_heads=2, intermediate_size=48, max_position_embeddings=32,
                   tie_word_embeddings=False)),
    # a sparse mixture of experts (onnxruntime's MoE under --optimize ort)
    "qwen3_moe": ("Qwen3MoeForCausalLM", "Qwen3MoeConfig",
                  dict(num_hidden_layers=2, hidden_size=32, num_attention_heads=4,
                       num_key_value_heads=2, head_dim=8, moe_intermediate_size=16,
                       num_experts=4, num_experts_per_tok=2, norm_topk_prob=True,
                       max_position_embeddings=32, tie_word_embeddings=False)),
    # five sliding layers (a window of 4, shorter than the run) to one full one
    "gemma3": ("Gemma3ForCausalLM", "Gemma3TextConfig",
               dict(num_hidden_layers=6, hidden_size=32, num_attention_heads=4,
                    num_key_value_heads=2, head_dim=8, intermediate_size=48,
                    query_pre_attn_scalar=8, sliding_window=4, max_position_embeddings=32)),
}
SEED = {"gpt2": 0, "llama": 1, "qwen3_moe": 3, "gemma3": 6}

# onnxruntime-genai in a process of its own: the ids of TEXT as its Tokenizer encodes them,
# NEW more ids, greedy on the CPU, as genai_config.json says and with each other
# end-of-sequence id given (an overlay of the file); which onnxruntime it found
GENAI = """
import json, os, sys
import numpy as np
import onnxruntime
import onnxruntime_genai as og
folder, text, new = sys.argv[1], sys.argv[2], int(sys.argv[3])
runs = {}
for eos in [None] + [int(i) for i in sys.argv[4:]]:
    config = og.Config(folder)
    config.clear_providers()
    if eos is not None:
        config.overlay(json.dumps({"model": {"eos_token_id": eos}}))
    model = og.Model(config)
    prompt = [int(i) for i in og.Tokenizer(model).encode(text)]
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(prompt) + new, do_sample=False)
    generator = og.Generator(model, params)
    generator.append_tokens(np.array([prompt], dtype=np.int32))
    while not generator.is_done():
        generator.generate_next_token()
    runs[str(eos)] = [int(i) for i in generator.get_sequence(0)][len(prompt):]
print(json.dumps({"version": og.__version__, "prompt": prompt, "runs": runs,
                  "library": os.environ.get("ORT_LIB_PATH", ""),
                  "onnxruntime": os.path.dirname(onnxruntime.__file__),
                  "providers": onnxruntime.get_available_providers()}))
"""


def _genai(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", GENAI, *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)


@pytest.fixture(scope="module")
def genai_imports():
    """Skip where onnxruntime-genai cannot be imported (scripts/setup.sh installs it with
    the test extras)."""
    r = subprocess.run([sys.executable, "-c", "import onnxruntime_genai"], cwd=ROOT,
                       capture_output=True, text=True, timeout=60)
    if r.returncode != 0:
        pytest.skip("onnxruntime-genai cannot be imported: "
                    + (r.stderr.strip().splitlines() or ["?"])[-1])


@pytest.fixture(scope="module")
def tokenizer():
    """A byte-level BPE tokenizer trained on a line of text, as transformers' GPT2TokenizerFast
    (its tokenizer_config.json names GPT2Tokenizer, which onnxruntime-genai reads)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    bpe.train_from_iterator([TEXT, "a formula is a model of the model"] * 10,
                            trainers.BpeTrainer(vocab_size=300, special_tokens=[EOS],
                                                initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    return transformers.GPT2TokenizerFast(tokenizer_object=bpe, bos_token=EOS, eos_token=EOS,
                                          unk_token=EOS)


@pytest.fixture(scope="module")
def folders(tokenizer, tmp_path_factory):
    """Per model: a folder as save_pretrained writes one (config.json naming the tokenizer's
    end-of-sequence id, generation_config.json, model.safetensors, the tokenizer's files)."""
    out = {}
    eos = tokenizer.convert_tokens_to_ids(EOS)
    for name, (cls, config_cls, sizes) in MODELS.items():
        config = getattr(transformers, config_cls)(vocab_size=len(tokenizer), bos_token_id=eos,
                                                   eos_token_id=eos, **sizes)
        torch.manual_seed(SEED[name])
        model = getattr(transformers, cls)(config).eval()
        peaked_weights(model)
        folder = tmp_path_factory.mktemp(name) / "hf"
        model.save_pretrained(folder)
        tokenizer.save_pretrained(folder)
        out[name] = folder
    return out


@pytest.mark.parametrize("name", list(MODELS))
def test_genai_generates_the_ids_of_fgc_generate(name, folders, tokenizer, genai_imports,
                                                 tmp_path):
    folder, out = folders[name], tmp_path / "genai"
    r = fgc("compile", str(folder), "--target", "onnx", "--kv-cache", "--genai", "-o", str(out))
    assert r.returncode == 0, r.stderr
    assert "warning" not in r.stderr, r.stderr  # the folder names its ids and tokenizer

    # the folder: graph, genai_config.json, the tokenizer's files as they were
    for file in ("tokenizer.json", "tokenizer_config.json"):
        assert (out / file).read_bytes() == (folder / file).read_bytes()
    assert {p.name for p in out.iterdir()} == {"model.onnx", "genai_config.json",
                                               "tokenizer.json", "tokenizer_config.json"}
    config = json.loads((out / "genai_config.json").read_text())
    model, decoder = config["model"], config["model"]["decoder"]
    hf = json.loads((folder / "config.json").read_text())
    eos = tokenizer.convert_tokens_to_ids(EOS)
    heads = {"gpt2": (3, 3, 8, 24)}.get(name, (4, 2, 8, 32))
    assert (decoder["num_attention_heads"], decoder["num_key_value_heads"],
            decoder["head_size"], decoder["hidden_size"]) == heads
    layers = MODELS[name][2].get("num_hidden_layers", 2)
    assert decoder["num_hidden_layers"] == layers
    assert (model["vocab_size"], model["context_length"], config["search"]["max_length"]) == \
        (len(tokenizer), 32, 32)
    assert (model["bos_token_id"], model["eos_token_id"], model["pad_token_id"]) == \
        (hf["bos_token_id"], hf["eos_token_id"], eos)
    assert model["type"] == "decoder" and config["search"]["past_present_share_buffer"] is False
    assert decoder["inputs"] == {"input_ids": "input_ids", "attention_mask": "attention_mask",
                                 "past_key_names": "past_key_values.%d.key",
                                 "past_value_names": "past_key_values.%d.value"}
    assert decoder["outputs"] == {"logits": "logits", "present_key_names": "present.%d.key",
                                  "present_value_names": "present.%d.value"}
    onnx_model = load_onnx(out, provider="cpu")
    assert [i.name for i in onnx_model.session.get_inputs()] == [
        "input_ids", "attention_mask", *(f"past_key_values.{layer}.{kind}"
                                         for layer in range(layers)
                                         for kind in ("key", "value"))]
    assert {"logits", "present.0.key", "present.1.value"} <= \
        {o.name for o in onnx_model.session.get_outputs()}

    # runtime.generate and fgc generate on the folder, stopping at its end-of-sequence id
    prompt = tokenizer(TEXT)["input_ids"]
    ours = generate(onnx_model, prompt, NEW, stop=[eos])[0]
    assert len(ours) == NEW and len(set(ours)) >= 4, ours  # not one id repeated
    r = fgc("generate", str(out), "--prompt-ids", ",".join(map(str, prompt)),
            "--max-new-tokens", str(NEW), "--stop-ids", str(eos), "--provider", "cpu")
    assert r.returncode == 0, r.stderr
    assert [int(i) for i in r.stdout.strip().splitlines()[-1].split(",")] == ours
    # and stopping at the fifth id generated, which fgc keeps
    stop = ours[4]
    stopped = generate(onnx_model, prompt, NEW, stop=[stop])[0]
    assert stopped == ours[:ours.index(stop) + 1]

    # onnxruntime-genai: its tokenizer reads the copied files as transformers does, and it
    # generates the same ids; its sequence ends before the end-of-sequence id
    g = _genai(str(out), TEXT, str(NEW), str(stop))
    assert g.returncode == 0, g.stderr
    found = json.loads(g.stdout.strip().splitlines()[-1])
    assert found["prompt"] == prompt
    assert found["runs"] == {"None": ours, str(stop): stopped[:-1]}

    # genai loaded this environment's onnxruntime (onnxruntime-gpu), with its providers
    assert found["library"].startswith(found["onnxruntime"] + os.sep), found
    assert {"CPUExecutionProvider", "CUDAExecutionProvider"} <= set(found["providers"])


def test_the_environments_onnxruntime_keeps_its_providers(genai_imports):
    """onnxruntime-genai is installed without its dependencies: the CPU `onnxruntime` wheel
    would overwrite onnxruntime-gpu's files and lose the CUDA provider."""
    import importlib.metadata

    import onnxruntime
    assert {"CPUExecutionProvider", "CUDAExecutionProvider"} <= \
        set(onnxruntime.get_available_providers())
    with pytest.raises(importlib.metadata.PackageNotFoundError):
        importlib.metadata.version("onnxruntime")  # only onnxruntime-gpu's files are there


# ---------------------------------------------------------------- without onnxruntime-genai


def _main(capsys, *args: str) -> tuple[int, str]:
    code = main(list(args))
    return code, capsys.readouterr().err


TINY_GPT2 = ["--set", "L=2", "--set", "H=24", "--set", "A=3", "--set", "V=37", "--set", "n=24"]


@pytest.mark.parametrize("args, code, message", [
    (["specs/gpt2.fgpt", "--target", "onnx", "--genai", *TINY_GPT2], 2,
     "--genai goes with --kv-cache"),
    (["specs/gpt2.fgpt", "--target", "torch", "--kv-cache", "--genai", *TINY_GPT2], 2,
     "--kv-cache, --genai are for --target onnx"),
    (["specs/bert.fgpt", "--target", "onnx", "--kv-cache", "--genai", "--set", "L=2",
      "--set", "H=16", "--set", "A=2", "--set", "V=50", "--set", "n=8"], 1,
     "has no incremental form"),
    (["specs/transformer.fgpt", "--target", "onnx", "--kv-cache", "--genai", "--set", "L=2",
      "--set", "H=8", "--set", "A=2", "--set", "V=13", "--set", "n=6", "--set", "m=16"], 1,
     "onnxruntime-genai's decoder feeds the token ids alone"),
])
def test_genai_refuses_what_it_cannot_run(args, code, message, capsys, tmp_path):
    out = tmp_path / "out"
    got, err = _main(capsys, "compile", *args, "-o", str(out))
    assert (got, message in err) == (code, True), err
    assert "Traceback" not in err and not out.exists()


def test_genai_without_a_model_folder(capsys, tmp_path):
    """Random weights: genai's names and config, no tokenizer, and a warning that no
    end-of-sequence id is known; fgc's runtime generates with the renamed graph."""
    out = tmp_path / "out"
    code, err = _main(capsys, "compile", "specs/gpt2.fgpt", "--target", "onnx", "--kv-cache",
                      "--genai", *TINY_GPT2, "-o", str(out))
    assert code == 0, err
    assert "no end-of-sequence id" in err and "stops at id 0" in err
    assert sorted(p.name for p in out.iterdir()) == ["genai_config.json", "model.onnx"]
    config = json.loads((out / "genai_config.json").read_text())["model"]
    assert "eos_token_id" not in config and config["vocab_size"] == 37
    model = load_onnx(out, provider="cpu")
    assert model.incremental["tokens"] == "input_ids"
    assert model.incremental["cache"][0]["past"] == "past_key_values.0.key"
    ids = np.array([[1, 2, 3]])
    assert generate(model, ids, 5) == generate(model, ids, 5, cache=False)
    # a later compile without --genai takes genai_config.json away with the old graph
    code, err = _main(capsys, "compile", "specs/gpt2.fgpt", "--target", "onnx", "--kv-cache",
                      *TINY_GPT2, "-o", str(out))
    assert code == 0, err
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx"]
    assert load_onnx(out, provider="cpu").incremental["tokens"] == "x"


def test_a_tokenizer_linked_from_outside_the_folder_is_refused(folders, capsys, tmp_path):
    folder = tmp_path / "hf"
    shutil.copytree(folders["gpt2"], folder)
    secret = tmp_path / "elsewhere.json"
    secret.write_text("{}")
    (folder / "tokenizer.json").unlink()
    (folder / "tokenizer.json").symlink_to(secret)
    out = tmp_path / "out"
    code, err = _main(capsys, "compile", str(folder), "--target", "onnx", "--kv-cache",
                      "--genai", "-o", str(out))
    assert code == 1 and "outside" in err and "tokenizer.json" in err, err
    assert not out.exists()


def test_links_planted_in_the_output_folder_are_replaced(folders, capsys, tmp_path):
    """genai_config.json and the tokenizer's files are written as model.onnx is: a link at
    their names in the output folder is replaced, never written through."""
    out = tmp_path / "out"
    out.mkdir()
    victims = {}
    for name in ("genai_config.json", "tokenizer.json", "tokenizer_config.json"):
        victims[name] = tmp_path / f"victim-{name}"
        victims[name].write_text("untouched")
        (out / name).symlink_to(victims[name])
    code, err = _main(capsys, "compile", str(folders["gpt2"]), "--target", "onnx",
                      "--kv-cache", "--genai", "-o", str(out))
    assert code == 0, err
    for name, victim in victims.items():
        assert victim.read_text() == "untouched"
        assert (out / name).is_file() and not (out / name).is_symlink()
    assert (out / "tokenizer.json").read_bytes() == \
        (folders["gpt2"] / "tokenizer.json").read_bytes()


# onnxruntime-genai greedy from a prompt of ids, as genai_config.json says
GENAI_IDS = """
import json, sys
import numpy as np
import onnxruntime_genai as og
folder, new, prompt = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
config = og.Config(folder)
config.clear_providers()
model = og.Model(config)
params = og.GeneratorParams(model)
params.set_search_options(max_length=len(prompt) + new, do_sample=False)
generator = og.Generator(model, params)
generator.append_tokens(np.array([prompt], np.int32))
while not generator.is_done():
    generator.generate_next_token()
print(json.dumps([int(i) for i in generator.get_sequence(0)][len(prompt):]))
"""


@pytest.mark.parametrize("name", ["llama", "qwen3_moe", "gemma3"])
def test_genai_shares_the_buffer_of_an_ort_graph(name, folders, genai_imports, tmp_path):
    """`--optimize ort`: GroupQueryAttention counts its keys by the padding mask, so the
    past and present share one buffer (genai_config.json's past_present_share_buffer, and
    runtime.generate's IO binding), and genai's ids are fgc's: with onnxruntime's MoE too,
    and with Gemma 3's sliding layers."""
    out = tmp_path / "genai"
    r = fgc("compile", str(folders[name]), "--target", "onnx", "--kv-cache", "--genai",
            "--optimize", "ort", "-o", str(out))
    assert r.returncode == 0, r.stderr
    config = json.loads((out / "genai_config.json").read_text())
    if name == "qwen3_moe":
        assert '"MoE"' in str([n.op_type for n in __import__("onnx").load(
            str(out / "model.onnx")).graph.node]).replace("'", '"')
    if name == "gemma3":  # a window's layers keep their own mask: no shared buffer
        assert config["search"]["past_present_share_buffer"] is (
            load_onnx(out, provider="cpu").incremental.get("share_buffer") is True)
    else:
        assert config["search"]["past_present_share_buffer"] is True
    model = load_onnx(out, provider="cpu")
    assert bool(model.incremental.get("share_buffer")) == \
        config["search"]["past_present_share_buffer"]
    prompt = [5, 17, 3, 9, 44]
    ours = generate(model, [prompt], NEW)[0]
    g = subprocess.run([sys.executable, "-c", GENAI_IDS, str(out), str(NEW),
                        json.dumps(prompt)], cwd=ROOT, capture_output=True, text=True,
                       timeout=120)
    assert g.returncode == 0, g.stderr
    assert json.loads(g.stdout.strip().splitlines()[-1]) == ours
