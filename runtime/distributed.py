"""Weights and training state of a module spread over processes (model.py's
parallelize()): each rank reads and writes only its own blocks.

    from runtime.distributed import load_weights
    compiled.parallelize(model, tp_mesh=mesh["tp"], dp_mesh=mesh["dp"])
    load_weights(model, "out/weights.safetensors")

A parameter split by tensor parallelism or sharded by FSDP2 is a DTensor: the block this
rank holds is one box of the whole tensor (its offsets and sizes), and that box is all
that is read, through safetensors' slices (the file mapped, only the box's pages read).
A parameter whole on every rank is read whole. The file must name exactly the module's
tensors, with the module's shapes (a mismatch is an error naming the tensor); nothing is
unpickled.
"""

from __future__ import annotations

import os


class WeightsError(ValueError):
    """A weights file that does not fit the module; the message names what differs."""


def load_weights(model, path: str | os.PathLike) -> dict[str, int]:
    """Copy the tensors of a safetensors file (the module's state_dict names, as `fgc
    compile --target torch --weights` writes them) into `model`, each rank its blocks.
    Returns, per tensor, how many of its entries this rank read."""
    import torch
    from safetensors import safe_open

    state = model.state_dict()
    read: dict[str, int] = {}
    with safe_open(os.fspath(path), framework="pt") as f:
        names = set(f.keys())
        missing = sorted(set(state) - names)
        extra = sorted(names - set(state))
        if missing or extra:
            raise WeightsError(
                f"{os.fspath(path)} does not hold this module's tensors: "
                + "; ".join(x for x in (
                    f"missing {', '.join(missing[:5])}" + (" ..." if len(missing) > 5 else "")
                    if missing else "",
                    f"not the module's {', '.join(extra[:5])}" + (" ..." if len(extra) > 5
                                                                  else "")
                    if extra else "") if x))
        with torch.no_grad():
            for name, target in state.items():
                part = f.get_slice(name)
                shape = tuple(part.get_shape())
                if shape != tuple(target.shape):
                    raise WeightsError(f"`{name}` in {os.fspath(path)} is {list(shape)}; the "
                                       f"module's is {list(target.shape)}")
                if hasattr(target, "to_local"):  # a DTensor: this rank's box of it
                    local = target.to_local()
                    box = _box(target)
                    if local.numel():
                        block = part[tuple(slice(o, o + s) for o, s in box)]
                        local.copy_(block.reshape(local.shape))
                    read[name] = local.numel()
                else:
                    target.copy_(part[:])
                    read[name] = target.numel()
    return read


def _box(t) -> list[tuple[int, int]]:
    """(offset, size) along each axis of the block of DTensor `t` this rank holds."""
    chunks = t.__create_chunk_list__()  # what torch.distributed.checkpoint saves per rank
    if len(chunks) != 1:
        raise WeightsError("a parameter held as several blocks on one rank")
    return list(zip(chunks[0].offsets, chunks[0].sizes))


# ---------------------------------------------------------------- training state
# A sharded training state: the module's parameters and the optimizer's tensors, saved and
# restored with torch.distributed.checkpoint, each rank writing and reading only its own
# blocks. The files are safetensors (HuggingFaceStorageWriter): the layout of every tensor
# (its blocks' offsets) is JSON in their headers, so that restoring unpickles nothing.
# The optimizer's settings (learning rate, betas) are not tensors and stay the restoring
# optimizer's own.


def save_state(model, optimizer, folder: str | os.PathLike) -> None:
    """Write the training state of a module spread by parallelize() (or not) into
    `folder`, every rank its blocks; every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageWriter

    dcp.save(_tensors(model, optimizer),
             storage_writer=HuggingFaceStorageWriter(os.fspath(folder), save_distributed=True))


def load_state(model, optimizer, folder: str | os.PathLike) -> None:
    """Restore what save_state wrote into a module spread the same way or another (the
    blocks are re-cut to this run's meshes); every rank calls it."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import HuggingFaceStorageReader
    from torch.distributed.checkpoint.state_dict import set_state_dict

    state = _tensors(model, optimizer)  # the optimizer's state made if it has none yet
    dcp.load(state, storage_reader=HuggingFaceStorageReader(os.fspath(folder)))
    _, settings = _state_dicts(model, optimizer)
    set_state_dict(model, optimizer,
                   model_state_dict={k[6:]: v for k, v in state.items()
                                     if k.startswith("model.")},
                   optim_state_dict={**settings, **{k[6:]: v for k, v in state.items()
                                                    if k.startswith("optim.")}},
                   options=_options())


def _options():
    from torch.distributed.checkpoint.state_dict import StateDictOptions

    return StateDictOptions(flatten_optimizer_state_dict=True)


def _state_dicts(model, optimizer):
    from torch.distributed.checkpoint.state_dict import get_state_dict

    return get_state_dict(model, optimizer, options=_options())


def _tensors(model, optimizer) -> dict:
    """The training state's tensors by name: `model.` and `optim.` before the flattened
    state dicts' keys."""
    import torch

    params, optim = _state_dicts(model, optimizer)
    return {**{"model." + k: v for k, v in params.items()},
            **{"optim." + k: v for k, v in optim.items() if isinstance(v, torch.Tensor)}}
