"""onnxruntime-genai's files beside a graph compiled with `--kv-cache --genai`.

onnxruntime-genai (the `onnxruntime-genai` package) generates with a folder that holds the
graph, `genai_config.json` and the tokenizer's files. The graph's names are the signature's,
which `--genai` gives onnxruntime-genai's defaults (compiler/lowering/signature.py,
GENAI_NAMES); everything here is read off what the compiler decided, never guessed from a
hyperparameter's name:

- `prepare(lowerer, folder)`: all of it for a lowered graph, with its warnings.
- `genai_config(lowerer, ids)`: the file's contents. The names and the cache (layers, key/value
  heads, head width) come from the lowered graph's signature, the vocabulary and context from
  its token input (its range, its most positions), the query heads from the cached
  attention's family (passes/incremental.py), the hidden size from the token embedding's
  rows; `ids` are the special token ids of `special_ids`.
- `special_ids(folder, vocabulary)`: bos/eos/pad from a model folder's config.json, with
  generation_config.json over it (as transformers and genai's model builder read them).
- `tokenizer_files(folder)`: the files onnxruntime-genai's tokenizer (onnxruntime-extensions)
  reads that the folder has, each a regular file of the folder's own.
- `write(stage, config, files)`: writes them into the output's staging folder (emit.py's
  OutputFolder), through runtime/files.py, as model.onnx is written.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

from ...elaborate import ir
from ...errors import FgcError
from ...lowering.signature import Number

FILE = "genai_config.json"
# genai's generic decoder-only model: it feeds input_ids and the cache and reads the logits
# (its other types, "gpt2" and "llama" among them, add handling of their own)
TYPE = "decoder"
# what onnxruntime-extensions' tokenizer, which genai loads, reads from the model's folder
# (tokenizer.json and tokenizer_config.json are what it needs; a `tiktoken_file` that
# tokenizer_config.json names is read too)
TOKENIZER = ("tokenizer.json", "tokenizer_config.json", "tokenizer_module.json",
             "chat_template.jinja", "chat_template.json")
GENERATION = "generation_config.json"
MAX_JSON = 64 * 2**20  # tokenizer_config.json and generation_config.json: KiB, a chat
# template at most a few MiB


def prepare(lw, folder: str | None) -> tuple[dict, list[tuple[str, str]], list[str]]:
    """(genai_config.json's contents, the tokenizer files to copy, warnings) for the graph
    `lw` (a Lowerer, after `lower()` with genai), its weights from the model folder `folder`
    or from none."""
    ids, warnings = special_ids(folder, vocabulary(lw.signature))
    files, more = tokenizer_files(folder)
    return genai_config(lw, ids), files, warnings + more


def vocabulary(sig: dict) -> int:
    """How many ids the token input takes: its range, from the signature."""
    tokens = next(i for i in sig["inputs"] if i["name"] == sig["incremental"]["tokens"])
    return tokens["hi"] - tokens["lo"] + 1


def genai_config(lw, ids: dict) -> dict:
    """genai_config.json for the graph `lw` (a Lowerer, after `lower()` with genai) lowered,
    with the special token ids `ids` (`special_ids`)."""
    sig = lw.signature
    inc = sig["incremental"]
    key, value = inc["cache"]
    _, kv_heads, _, head_size = key["dims"]
    context = sig["max_length"][inc["length"]]
    site = lw.inc.sites[0]
    queries = kv_heads if site.queries is None else \
        Number(site.queries, "the query heads").at(lw.values)
    hidden = _embedding_width(lw.model, lw.inc.tokens, lw.values)
    # the padding mask (past + new positions), where the spec takes one
    padding = next((i["name"] for i in sig["inputs"] if i.get("pad")), None)
    decoder = {
        "session_options": {"log_id": "fgc", "provider_options": []},  # the CPU provider
        "filename": "model.onnx",
        "head_size": head_size,
        # genai reads it for models fed embeddings, not for this one
        **({"hidden_size": hidden} if hidden is not None else {}),
        "num_attention_heads": queries,
        "num_hidden_layers": key["layers"],
        "num_key_value_heads": kv_heads,
        "inputs": {"input_ids": inc["tokens"], "past_key_names": _pattern(key["past"]),
                   "past_value_names": _pattern(value["past"]),
                   **({"attention_mask": padding} if padding is not None else {})},
        "outputs": {"logits": sig["logits"]["name"],
                    "present_key_names": _pattern(key["present"]),
                    "present_value_names": _pattern(value["present"])},
    }
    return {
        "model": {**ids, "context_length": context,
                  "vocab_size": vocabulary(sig), "type": TYPE,
                  "decoder": decoder},
        # greedy by default, as `fgc generate`; past and present share one buffer where
        # every cached attention writes its keys into it (the signature's share_buffer:
        # GroupQueryAttention counting keys by the padding mask), else the graph
        # concatenates past and new keys and genai must not share it
        "search": {"do_sample": False, "max_length": context, "min_length": 0,
                   "num_beams": 1,
                   "past_present_share_buffer": bool(inc.get("share_buffer"))},
    }


def _pattern(name: str) -> str:
    """A signature's cache name (`{l}` for the layer) as genai_config.json writes it (`%d`)."""
    return name.replace("{l}", "%d")


def _embedding_width(model: ir.Model, tokens: str, values: dict) -> int | None:
    """The width of the rows the token ids look up (`OneHot(x) @ W_e`, lowering/lookups.py):
    the model's hidden size; None where no lookup reads the ids before the layers."""
    for item in model.body:
        if isinstance(item, ir.Eqn) and item.op == "lookup" and item.ins[0].name == tokens:
            shape = item.outs[0].type.shape
            if shape:
                return Number(shape[-1], "the token embedding's width").at(values)
    return None


# ---------------------------------------------------------------- the model folder


def special_ids(folder: str | None, vocabulary: int) -> tuple[dict, list[str]]:
    """({"bos_token_id", "eos_token_id", "pad_token_id"} as far as the folder names them,
    warnings). An id outside the vocabulary, which genai refuses to load, is left out with a
    warning; the pad id is the first end-of-sequence id where none is named (as genai's
    model builder does). Without an end-of-sequence id genai stops at id 0, its default:
    a warning says so."""
    warnings: list[str] = []
    found: dict = {}
    if folder is not None:
        from ...config_json import has_config, read_config
        sources = [read_config(folder).data] if has_config(folder) else []
        generation = _read_json(folder, GENERATION)
        if isinstance(generation, dict):
            sources.append(generation)  # over config.json
        for source in sources:
            for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
                if source.get(name) is not None:
                    found[name] = source[name]
    out: dict = {}
    for name, value in found.items():
        many = isinstance(value, list)
        kept = [v for v in (value if many else [value])
                if isinstance(v, int) and not isinstance(v, bool) and 0 <= v < vocabulary]
        if len(kept) != (len(value) if many else 1):
            warnings.append(f"{folder}: {name} {json.dumps(value)} is not an id of the "
                            f"model's {vocabulary:,} (0..{vocabulary - 1}), which "
                            "onnxruntime-genai needs; "
                            + ("the others are kept" if kept else "genai_config.json leaves "
                               "it out"))
        if kept:
            out[name] = kept if many else kept[0]
    if "eos_token_id" not in out:
        where = f"{folder} names no end-of-sequence id" if folder is not None else \
            "no end-of-sequence id is known (no model folder gives the weights)"
        warnings.append(f"{where}: genai_config.json leaves model.eos_token_id out, and "
                        "onnxruntime-genai then stops at id 0, its default; set it there")
    elif "pad_token_id" not in out:
        eos = out["eos_token_id"]
        out["pad_token_id"] = eos[0] if isinstance(eos, list) else eos
    return dict(sorted(out.items())), warnings


def tokenizer_files(folder: str | None) -> tuple[list[tuple[str, str]], list[str]]:
    """([(name, path)] of the tokenizer files genai reads that `folder` has, warnings). Each is
    a regular file of the folder's own: a link out of it is an FgcError (weights.py's rule
    for a model folder's files)."""
    if folder is None:
        return [], []
    from ...weights import _in_folder, _plain_name
    names = list(TOKENIZER)
    config = _read_json(folder, "tokenizer_config.json")
    tiktoken = config.get("tiktoken_file") if isinstance(config, dict) else None
    if isinstance(tiktoken, str) and _plain_name(tiktoken) and tiktoken not in names:
        names.append(tiktoken)
    found = []
    for name in names:
        path = os.path.join(folder, name)
        if os.path.lexists(path):
            _in_folder(Path(path), Path(folder))
            found.append((name, os.path.realpath(path)))
    warnings = []
    if not any(name == "tokenizer.json" for name, _ in found):
        warnings.append(f"{folder} has no tokenizer.json: onnxruntime-genai's Tokenizer reads "
                        "it (with tokenizer_config.json), so the compiled folder generates "
                        "from ids only")
    return found, warnings


def _read_json(folder: str, name: str):
    """A JSON file of the model folder, or None where there is none; an FgcError naming it
    when it is not a regular file of the folder's own or not JSON."""
    from ...config_json import read_small
    from ...weights import _in_folder
    path = os.path.join(folder, name)
    if not os.path.lexists(path):
        return None
    _in_folder(Path(path), Path(folder))
    data = read_small(path, MAX_JSON)
    try:
        return json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as e:
        raise FgcError(f"{path} is not JSON ({str(e)[:120]})", None) from None


# ---------------------------------------------------------------- writing


def write(stage: Path, config: dict, files: list[tuple[str, str]]) -> list[str]:
    """genai_config.json and copies of the tokenizer `files` in `stage`, each through a fresh
    temporary (runtime/files.py: no write follows a link); their names."""
    from runtime.files import FileError, atomic_write, open_atomic, open_regular
    atomic_write(stage / FILE, json.dumps(config, indent=2) + "\n")
    for name, source in files:
        try:
            fd = open_regular(source, follow=False)
        except FileError as e:
            raise FgcError(f"{source} {e.strerror}", None) from None
        except OSError as e:
            raise FgcError(f"cannot read {source}: {e.strerror or e}", None) from None
        with os.fdopen(fd, "rb") as src, open_atomic(stage / name) as out:
            shutil.copyfileobj(src, out, 2**20)
    return [FILE] + [name for name, _ in files]
