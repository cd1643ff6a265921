"""DDP and FSDP2 with AmpOptimWrapper: two CPU processes (gloo) skip the same steps.

Two processes on this machine form a gloo process group (``torch.multiprocessing``;
no GPU, no cluster). Each part puts a nan into one batch of rank 1 only:

- DDP: ``optim_context(model)`` skips DDP's gradient all-reduce while a window
  accumulates (``no_sync``); the all-reduce then carries the nan to both ranks,
  both skip that step, and the replicas stay bit-identical.
- FSDP2 (``fully_shard``): each rank holds a shard of the gradients;
  ``use_fsdp=True`` (and, with a world size > 1, the default
  ``agree_across_ranks=None``) makes the ranks agree on the skip: one all-reduce
  of one flag per step. Left out, with the reason, where this torch has no
  ``fully_shard``.

Run: python examples/distributed.py                  # bfloat16, DDP then FSDP2
     python examples/distributed.py --dtype float16  # with dynamic loss scaling
     python examples/distributed.py --parts ddp
"""

import argparse
import os
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from fp16utils import AmpOptimWrapper

ITERS, BAD = 8, 4  # rank 1's batch of iteration BAD holds a nan


def make_model() -> nn.Module:
    torch.manual_seed(0)  # the same initial weights on every rank
    return nn.Sequential(nn.Linear(8, 32), nn.ReLU(), nn.Linear(32, 1))


def batches(rank: int):
    g = torch.Generator().manual_seed(100 + rank)  # each rank its own data
    for i in range(ITERS):
        x = torch.randn(16, 8, generator=g)
        y = x.sum(1, keepdim=True) / 4
        yield (torch.full_like(x, float('nan')) if rank == 1 and i == BAD else x), y


def train(model: nn.Module, optim_wrapper: AmpOptimWrapper, rank: int) -> list:
    skipped = []
    for i, (x, y) in enumerate(batches(rank)):
        with optim_wrapper.optim_context(model):
            pred = model(x)
        result = optim_wrapper.update_params(nn.functional.mse_loss(pred.float(), y))
        if result.skipped:
            skipped.append(i)
    return skipped


def run_ddp(rank: int, dtype: str) -> dict:
    model = DDP(make_model())
    optim_wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.05),
                                    dtype=dtype, loss_scale=dict(init_scale=2.0**10),
                                    accumulative_counts=2)
    skipped = train(model, optim_wrapper, rank)
    flat = torch.cat([p.detach().reshape(-1) for p in model.parameters()])
    replicas = [torch.empty_like(flat) for _ in range(dist.get_world_size())]
    dist.all_gather(replicas, flat)
    same = all(torch.equal(replicas[0], r) for r in replicas)
    return dict(part='ddp', skipped=skipped, scale=optim_wrapper.loss_scale,
                note=f'replicas bit-identical: {same}')


def run_fsdp2(rank: int, dtype: str) -> dict:
    try:
        from torch.distributed.fsdp import fully_shard
    except (ImportError, ValueError) as err:  # absent, or an old one that fails to import
        return dict(part='fsdp2', left_out=f'torch.distributed.fsdp.fully_shard cannot be '
                                          f'imported from this torch ({err})')
    model = make_model()
    fully_shard(model)  # parameters become DTensors, each rank holds a shard
    optim_wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.05),
                                    dtype=dtype, loss_scale=dict(init_scale=2.0**10),
                                    use_fsdp=True)
    skipped = train(model, optim_wrapper, rank)
    shards = sum(p.to_local().numel() for p in model.parameters())
    total = sum(p.numel() for p in model.parameters())
    return dict(part='fsdp2', skipped=skipped, scale=optim_wrapper.loss_scale,
                note=f'rank {rank} holds {shards} of {total} parameters')


def worker(rank: int, world_size: int, init_file: str, dtype: str, parts: list) -> None:
    torch.set_num_threads(1)
    dist.init_process_group('gloo', init_method=Path(init_file).as_uri(), rank=rank,
                            world_size=world_size)
    try:
        results = [run_ddp(rank, dtype) if part == 'ddp' else run_fsdp2(rank, dtype)
                   for part in parts]
        gathered = [None] * world_size
        dist.all_gather_object(gathered, results)
        if rank == 0:
            outcomes = [report(per_rank) for per_rank in zip(*gathered)]
            print(f"summary: {dtype}, {world_size} processes; {'; '.join(outcomes)}")
    finally:
        dist.destroy_process_group()


def report(per_rank: tuple) -> str:
    """Print what each rank skipped, its loss scale, the notes; return the outcome."""
    first = per_rank[0]
    if 'left_out' in first:
        print(f"{first['part']}: left out: {first['left_out']}")
        return f"{first['part']} left out"
    print(f"{first['part']}: skipped iterations per rank "
          f"{[r['skipped'] for r in per_rank]}, loss scales {[r['scale'] for r in per_rank]}; "
          + '; '.join(dict.fromkeys(r['note'] for r in per_rank)))  # each distinct note once
    agreed = all(r['skipped'] == first['skipped'] for r in per_rank)
    return f"{first['part']} skipped {first['skipped']} on every rank: {agreed}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--dtype', choices=['bfloat16', 'float16'], default='bfloat16')
    parser.add_argument('--parts', nargs='+', choices=['ddp', 'fsdp2'],
                        default=['ddp', 'fsdp2'])
    parser.add_argument('--start-method', choices=mp.get_all_start_methods(), default='spawn',
                        help="how the workers start; 'fork' (Linux) skips importing torch again")
    args = parser.parse_args()
    if not dist.is_available() or not dist.is_gloo_available():
        raise SystemExit('this torch build has no torch.distributed with gloo')
    os.environ.setdefault('OMP_NUM_THREADS', '1')
    world_size = 2
    # The ranks meet in a file of a fresh folder: no TCP port to pick (a port found free
    # here may be taken by another program before rank 0 listens on it).
    with tempfile.TemporaryDirectory() as folder:
        mp.start_processes(worker, args=(world_size, os.path.join(folder, 'rendezvous'),
                                         args.dtype, args.parts),
                           nprocs=world_size, start_method=args.start_method)


if __name__ == '__main__':
    main()
