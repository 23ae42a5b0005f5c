"""Train a compiled Llama-style spec spread over processes: FSDP2 over tensor parallelism.

    torchrun --nproc-per-node 4 examples/train_distributed.py [--tp 2] [--steps 50]
    torchrun --nproc-per-node 1 examples/train_distributed.py --tp 1 --backend nccl  # one GPU

specs/llama.fgpt is compiled at a small byte-level size (V = 256) with fgc's Python API,
rank 0 writing model.py and the others waiting for it. Every rank builds the model from
one seed. parallelize() then splits it as the plan derived from the spec's equations says
(docs/distributed.md), over a (dp, tp) mesh of world size / tp by tp ranks. The model
trains with AdamW on the bundled public-domain text (examples/data/), each data-parallel
rank drawing its own windows; the loss printed is the mean over the ranks. At the end the
sharded training state is saved (runtime.distributed.save_state: safetensors, each rank its
blocks) into --out when given.

gloo on the CPU by default; --backend nccl on GPUs (one per rank).
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh

from compiler.emit import compile_spec
from runtime.distributed import save_state

ROOT = Path(__file__).resolve().parent.parent
SPEC = ROOT / "specs" / "llama.fgpt"
DATA = Path(__file__).resolve().parent / "data"
SIZE = {"L": 2, "H": 64, "A": 4, "G": 2, "F": 128, "V": 256, "n": 64}  # one token per byte


def compiled(folder: Path, rank: int):
    """model.py compiled by rank 0 into `folder`, imported on every rank."""
    if rank == 0:
        compile_spec(str(SPEC), str(folder), target="torch", preset="tinyllama", sets=SIZE)
    dist.barrier()
    spec = importlib.util.spec_from_file_location("llama_small", folder / "model.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def text() -> torch.Tensor:
    data = b"\n\n".join((DATA / name).read_bytes() for name in ("founding.txt",
                                                                "arithmetic.txt"))
    return torch.tensor(list(data), dtype=torch.long)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--tp", type=int, default=2, help="tensor-parallel ranks (default 2)")
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=8, help="sequences per data-parallel rank")
    p.add_argument("--backend", default="gloo", choices=["gloo", "nccl"])
    p.add_argument("--work", type=Path, default=Path("out/train-distributed"),
                   help="folder for model.py (default out/train-distributed)")
    p.add_argument("--out", type=Path, help="folder for the sharded training state")
    args = p.parse_args(argv)

    dist.init_process_group(args.backend)
    rank, size = dist.get_rank(), dist.get_world_size()
    if size % args.tp:
        raise SystemExit(f"--tp {args.tp} does not divide the {size} processes")
    device = "cpu"
    if args.backend == "nccl":
        device = f"cuda:{int(os.environ.get('LOCAL_RANK', 0))}"
        torch.cuda.set_device(device)
    mesh = init_device_mesh(device.split(":")[0], (size // args.tp, args.tp),
                            mesh_dim_names=("dp", "tp"))
    module = compiled(args.work, rank)
    torch.manual_seed(0)  # every rank: the same whole parameters before they are split
    model = module.build(device=device)
    module.parallelize(model, tp_mesh=mesh["tp"] if args.tp > 1 else None,
                       dp_mesh=mesh["dp"] if size // args.tp > 1 else None)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.9, 0.99))
    data = text()
    # each data-parallel rank its own windows; the tensor-parallel ranks of one the same
    gen = torch.Generator().manual_seed(mesh["dp"].get_local_rank())
    n = SIZE["n"]
    if rank == 0:
        mine = sum(p.to_local().numel() if hasattr(p, "to_local") else p.numel()
                   for p in model.parameters())
        print(f"{size} ranks: dp {size // args.tp} x tp {args.tp}, {args.backend}; "
              f"{sum(p.numel() for p in model.parameters()):,} parameters, {mine:,} on "
              "rank 0", flush=True)
    start = time.perf_counter()
    for step in range(1, args.steps + 1):
        at = torch.randint(0, len(data) - n - 1, (args.batch,), generator=gen).tolist()
        x = torch.stack([data[s:s + n] for s in at]).to(device)
        y = torch.stack([data[s + 1:s + n + 1] for s in at]).to(device)
        loss = F.cross_entropy(model.logits(x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        mean = loss.detach().clone()
        dist.all_reduce(mean)
        if rank == 0 and (step == 1 or step % 10 == 0 or step == args.steps):
            print(f"step {step:4d}  loss {mean.item() / size:.3f}  "
                  f"({time.perf_counter() - start:.1f}s)", flush=True)
    if args.out is not None:
        save_state(model, opt, args.out)
        if rank == 0:
            print(f"wrote the training state into {args.out}", flush=True)
    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    os._exit(0)  # done: gloo's threads can abort an interpreter shutdown after this


if __name__ == "__main__":
    main()
