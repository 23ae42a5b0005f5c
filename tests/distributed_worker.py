"""One rank of tests/test_distributed.py, started by torchrun (gloo, CPU).

    torchrun --standalone --nproc-per-node N tests/distributed_worker.py MODEL_PY CHECK...

MODEL_PY is a compiled model.py. Each check builds the model at its Config on every rank
from one seed, so that every rank holds the same parameters, and compares what the
parallelised module computes with what the same module computes alone in this process:
  - `forward`: parallelize(tp_mesh) then the forward pass on one batch;
  - `step`: parallelize(tp_mesh) then a prefill and three steps of step() with the cache;
  - `tp-train`: 5 AdamW steps under tensor parallelism, every rank the whole batch;
  - `fsdp-train`: 5 AdamW steps under FSDP2, each rank its share of the batch, the loss
    averaged over the ranks;
  - `2d-train`: the same over a (dp, tp) mesh of 2 x N/2 ranks;
  - `load` (tensor parallelism) and `2d-load` (the 2-D mesh): the whole model's weights
    saved as safetensors, loaded into a parallelised model built from another seed by
    runtime.distributed.load_weights, then the forward pass; `load-read` and
    `2d-load-read` give the share of the entries rank 0 read;
  - `idle-experts`: 3 AdamW steps under tensor parallelism with every position routed to
    the experts of rank 0 (rank 1's computing none), and `idle-experts-calls` how many more
    all-reduces one rank made than another (0: the ranks in step);
  - `blind`: the forward check with tp_reduce the identity (a plan without its sums);
  - `refused`: parallelize() of 3 heads over 2 ranks, its error's message;
  - `budget`: what one training step under tensor parallelism holds and sends (see
    measured()), for `fgc params --tp` to be checked against;
  - `sequence`: sequence parallelism off (7 positions over 2 ranks, and
    parallelize(sequence=False)) and on, each forward pass against the same alone, with
    the reduce-scatters it made; on, a padded batch; and what the first layer keeps
    without it;
  - `restore`: 2 AdamW steps under tensor parallelism, the training state saved
    (runtime.distributed.save_state), restored into a model and optimizer built from
    another seed, and 3 more steps: the 5 losses of the uninterrupted run.
Rank 0 prints one JSON line: check -> the largest difference found (or what it says).
FGC_WORK names a folder all ranks share.
"""

from __future__ import annotations

import importlib.util
import inspect
import json
import os
import sys

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh

BATCH, LENGTH, STEPS = 4, 8, 5  # 8 positions: 4 on each of 2 ranks (sequence parallel)


def load(path: str):
    spec = importlib.util.spec_from_file_location("compiled", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def make(m):
    """The model, its parameters drawn from one seed (std 0.3: outputs far from uniform)."""
    torch.manual_seed(0)
    model = m.build()
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.3)
    return model


def batch(model) -> list[torch.Tensor]:
    """Token ids for each input forward takes (a segment input `t`: zeros)."""
    g = torch.Generator().manual_seed(1)
    out = []
    for name, p in inspect.signature(model.forward).parameters.items():
        if p.default is not inspect.Parameter.empty:
            continue
        if name == "t":
            out.append(torch.zeros(BATCH, LENGTH, dtype=torch.long))
        else:
            out.append(torch.randint(0, model.config.V, (BATCH, LENGTH), generator=g))
    return out


def loss_of(model, inputs, targets):
    probs = model(*inputs)
    return -torch.log(probs.gather(-1, targets.unsqueeze(-1))).mean()


def train(model, inputs, targets, steps: int = STEPS, opt=None) -> list[torch.Tensor]:
    opt = opt or torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(steps):
        loss = loss_of(model, inputs, targets)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.detach().clone())
    return losses


def mean_over(losses, group, size) -> list[float]:
    for x in losses:
        dist.all_reduce(x, group=group)
    return [x.item() / size for x in losses]


def generate(model, x, steps: int = 3) -> torch.Tensor:
    """Logits of a prefill and `steps` greedy steps through step()'s cache."""
    with torch.no_grad():
        logits, past = model.step(x)
        out = [logits[:, -1]]
        for _ in range(steps):
            nxt = out[-1].argmax(-1, keepdim=True)
            logits, past = model.step(nxt, past=past)
            out.append(logits[:, -1])
    return torch.stack(out, 1)


def measured(m, mesh, inputs, targets, sequence: bool = True) -> dict[str, float]:
    """What one training step under tensor parallelism holds and sends: the parameters'
    entries on the rank holding most, the entries every collective of the step is handed on
    rank 0 (all-reduce, reduce-scatter: the tensor; all-gather: the gathered whole), and the
    entries of the
    tensors the first layer's forward pass keeps for the backward pass (parameters aside)."""
    model = m.parallelize(make(m), tp_mesh=mesh, sequence=sequence)
    own = torch.tensor(float(sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                                 for p in model.parameters())))
    dist.all_reduce(own, op=dist.ReduceOp.MAX)
    sent = [0]
    reduce, gather, scatter = dist.all_reduce, dist.all_gather, dist.reduce_scatter

    def counting_reduce(x, *a, **k):
        sent[0] += x.numel()
        return reduce(x, *a, **k)

    def counting_gather(parts, x, *a, **k):
        sent[0] += x.numel() * len(parts)
        return gather(parts, x, *a, **k)

    def counting_scatter(out, parts, *a, **k):
        sent[0] += sum(x.numel() for x in parts)
        return scatter(out, parts, *a, **k)

    kept, storages = [0], {p.to_local().untyped_storage().data_ptr() if hasattr(p, "to_local")
                           else p.untyped_storage().data_ptr() for p in model.parameters()}
    first = next(c for c in model.children() if isinstance(c, torch.nn.ModuleList))[0]
    on = [False]

    def pack(t):
        if on[0] and t.untyped_storage().data_ptr() not in storages:
            kept[0] += t.numel()
        return t

    first.register_forward_pre_hook(lambda *_: on.__setitem__(0, True))
    first.register_forward_hook(lambda *_: on.__setitem__(0, False))
    dist.all_reduce, dist.all_gather = counting_reduce, counting_gather
    dist.reduce_scatter = counting_scatter
    try:
        with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
            loss_of(model, inputs, targets).backward()
    finally:
        dist.all_reduce, dist.all_gather, dist.reduce_scatter = reduce, gather, scatter
    return {"budget-params": own.item(), "budget-sent": float(sent[0]),
            "budget-kept": float(kept[0])}


def sequence_parallel(m, mesh, inputs, targets) -> dict[str, float]:
    """Sequence parallelism off where the ranks cannot split the positions (7 of them) and
    with parallelize(sequence=False): the forward pass as alone either way, and how many
    reduce-scatters it makes (none); with it on, how many, and a padded batch (its tokens'
    probabilities); what the first layer keeps for the backward pass without it."""
    found = {}
    odd = [x[:, :LENGTH - 1] for x in inputs]
    scatter = dist.reduce_scatter
    for name, xs, on in (("sequence-odd", odd, True), ("sequence-off", inputs, False),
                         ("sequence-on", inputs, True)):
        model = make(m).eval()
        calls = [0]

        def counting(*a, calls=calls, **k):
            calls[0] += 1
            return scatter(*a, **k)

        with torch.no_grad():
            alone = model(*xs)
            m.parallelize(model, tp_mesh=mesh, sequence=on)
            dist.reduce_scatter = counting
            try:
                found[name] = (model(*xs) - alone).abs().max().item()
            finally:
                dist.reduce_scatter = scatter
        found[name + "-calls"] = calls[0]
    mask = torch.ones(BATCH, LENGTH, dtype=torch.long)
    mask[1, :3] = 0  # a padded batch: row 1's first 3 positions are padding
    model = make(m).eval()
    with torch.no_grad():
        alone = model(*inputs, attention_mask=mask)
        m.parallelize(model, tp_mesh=mesh)
        found["sequence-padded"] = (model(*inputs, attention_mask=mask) - alone)[
            mask.bool()].abs().max().item()
    found["sequence-off-kept"] = measured(m, mesh, inputs, targets, False)["budget-kept"]
    return found


def idle_experts(m, mesh, inputs, targets) -> dict[str, float]:
    """3 AdamW steps under tensor parallelism with the routers frozen at 0 (every position
    goes to the same K experts, rank 0's), against the same alone; and how many more
    all-reduces one rank made than another."""
    def idle(model):
        with torch.no_grad():
            for mod in model.modules():
                if hasattr(mod, "W_router"):  # all logits 0, whatever the input
                    mod.W_router.zero_()
                    mod.W_router.requires_grad_(False)
        return model

    alone = [x.item() for x in train(idle(make(m)), inputs, targets, 3)]
    model = m.parallelize(idle(make(m)), tp_mesh=mesh)
    calls, reduce = [0], dist.all_reduce

    def counting(*a, **k):
        calls[0] += 1
        return reduce(*a, **k)

    dist.all_reduce = counting
    try:
        got = [x.item() for x in train(model, inputs, targets, 3)]
    finally:
        dist.all_reduce = reduce
    most, least = torch.tensor(float(calls[0])), torch.tensor(float(-calls[0]))
    dist.all_reduce(most, op=dist.ReduceOp.MAX)
    dist.all_reduce(least, op=dist.ReduceOp.MAX)
    return {"idle-experts": max(abs(a - b) for a, b in zip(alone, got)),
            "idle-experts-calls": most.item() + least.item()}


def main() -> None:
    path, checks = sys.argv[1], sys.argv[2:]
    m = load(path)
    dist.init_process_group("gloo")
    rank, size = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (size,))
    found: dict[str, float] = {}
    model = make(m)
    inputs = batch(model)
    g = torch.Generator().manual_seed(2)
    targets = torch.randint(0, model.config.V, inputs[-1].shape, generator=g)
    for check in checks:
        if check == "forward":
            model = make(m).eval()
            with torch.no_grad():
                alone = model(*inputs)
                m.parallelize(model, tp_mesh=mesh)
                split = model(*inputs)
            found[check] = (split - alone).abs().max().item()
        elif check == "step":
            model = make(m).eval()
            alone = generate(model, inputs[0])
            m.parallelize(model, tp_mesh=mesh)
            found[check] = (generate(model, inputs[0]) - alone).abs().max().item()
        elif check == "tp-train":
            alone = [x.item() for x in train(make(m), inputs, targets)]
            model = m.parallelize(make(m), tp_mesh=mesh)
            got = [x.item() for x in train(model, inputs, targets)]
            found[check] = max(abs(a - b) for a, b in zip(alone, got))
        elif check == "fsdp-train":
            alone = [x.item() for x in train(make(m), inputs, targets)]
            model = m.parallelize(make(m), dp_mesh=mesh)
            share = BATCH // size
            mine = slice(rank * share, (rank + 1) * share)
            got = mean_over(train(model, [x[mine] for x in inputs], targets[mine]), None, size)
            found[check] = max(abs(a - b) for a, b in zip(alone, got))
        elif check == "2d-train":
            alone = [x.item() for x in train(make(m), inputs, targets)]
            mesh2 = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("dp", "tp"))
            model = m.parallelize(make(m), tp_mesh=mesh2["tp"], dp_mesh=mesh2["dp"])
            share = BATCH // 2
            at = mesh2["dp"].get_local_rank()
            mine = slice(at * share, (at + 1) * share)
            losses = train(model, [x[mine] for x in inputs], targets[mine])
            got = mean_over(losses, mesh2["dp"].get_group(), 2)
            found[check] = max(abs(a - b) for a, b in zip(alone, got))
        elif check in ("load", "2d-load"):
            from safetensors.torch import save_file

            from runtime.distributed import load_weights

            whole = make(m).eval()
            path = os.path.join(os.environ["FGC_WORK"], f"{check}.safetensors")
            if rank == 0:
                save_file({k: v.contiguous() for k, v in whole.state_dict().items()}, path)
            dist.barrier()
            torch.manual_seed(5)  # other parameters, all replaced by the file's
            model = m.build().eval()
            if check == "load":
                m.parallelize(model, tp_mesh=mesh)
            else:
                mesh2 = init_device_mesh("cpu", (2, size // 2), mesh_dim_names=("dp", "tp"))
                m.parallelize(model, tp_mesh=mesh2["tp"], dp_mesh=mesh2["dp"])
            read = load_weights(model, path)
            own = torch.tensor(float(sum(p.to_local().numel() if hasattr(p, "to_local")
                                         else p.numel() for p in model.parameters())))
            dist.all_reduce(own, op=dist.ReduceOp.MAX)
            found[check + "-params"] = own.item()  # on the fullest rank
            with torch.no_grad():
                found[check] = (model(*inputs) - whole(*inputs)).abs().max().item()
            found[check + "-read"] = sum(read.values()) / sum(
                p.numel() for p in whole.parameters())
        elif check == "restore":
            from runtime.distributed import load_state, save_state

            alone = [x.item() for x in train(make(m), inputs, targets)]
            model = m.parallelize(make(m), tp_mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            first = [x.item() for x in train(model, inputs, targets, 2, opt)]
            folder = os.path.join(os.environ["FGC_WORK"], "state")
            save_state(model, opt, folder)
            torch.manual_seed(9)  # another start, all replaced by the saved state
            model = m.parallelize(m.build(), tp_mesh=mesh)
            opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
            load_state(model, opt, folder)
            rest = [x.item() for x in train(model, inputs, targets, STEPS - 2, opt)]
            found[check] = max(abs(a - b) for a, b in zip(alone, first + rest))
        elif check == "idle-experts":
            found.update(idle_experts(m, mesh, inputs, targets))
        elif check == "blind":  # the forward check with the reductions left out
            model = make(m).eval()
            reduce = m.tp_reduce
            m.tp_reduce = lambda x, tp, sp=None, axis=-2, sum_=reduce: sum_(x, None, sp, axis)
            try:
                with torch.no_grad():
                    alone = model(*inputs)
                    m.parallelize(model, tp_mesh=mesh)
                    found[check] = (model(*inputs) - alone).abs().max().item()
            finally:
                m.tp_reduce = reduce
        elif check == "refused":  # three heads over two ranks
            try:
                m.parallelize(m.build(A=3, H=24), tp_mesh=mesh)
                found[check] = "split"
            except ValueError as e:
                found[check] = str(e)
        elif check == "budget":
            found.update(measured(m, mesh, inputs, targets))
        elif check == "sequence":
            found.update(sequence_parallel(m, mesh, inputs, targets))
        else:
            raise SystemExit(f"unknown check {check!r}")
    if rank == 0:
        print("RESULT " + json.dumps(found), flush=True)
    dist.barrier()  # every rank done with its collectives before any leaves
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # not through interpreter shutdown, where gloo's threads can abort


if __name__ == "__main__":
    main()
