"""Training steps per second: fp16utils' wrappers and hooks against hand-written torch AMP.

For a small conv net and a small MLP, each variant trains on the same data:

- ``fp32``: a hand-written float32 loop (for scale);
- ``amp (hand-written)``: ``torch.autocast`` + ``torch.amp.GradScaler`` written
  out by hand, the limit the others are measured against;
- ``AmpOptimWrapper``: the 1.x style (``optim_context`` + ``update_params``);
- ``Fp16OptimizerHook``: the 0.x style (``@auto_fp16`` forward, the hook's
  ``after_train_iter`` driven by a minimal runner);
- ``legacy (half + fp32 masters)``: ``AmpOptimWrapper(backend='legacy')``, a
  half model with float32 master weights;
- ``AmpOptimWrapper + overflow_guard, StepResult read``: the 1.x style with the
  overflow guard on and the returned :class:`~fp16utils.StepResult` read each step
  (what step outcomes and the guard cost on clean steps);
- ``AmpOptimWrapper, nonfinite='ignore'``: without the non-finite check that the
  default runs where nothing is scaled (bfloat16), to show what that check costs.

All variants run in one process, interleaved over several repeats; the table
shows the median steps/s and the time per step relative to the hand-written
AMP loop (1.00 = as fast; above 1 = slower). Absolute numbers only mean
something next to the device they were measured on.

Run:
    python benchmarks/train_step.py                  # cuda if available, else cpu
    python benchmarks/train_step.py --quick          # a few seconds
    python benchmarks/train_step.py --device cpu --dtype bfloat16 --steps 50 --repeats 7

On CPU, time is the process's CPU time with one torch thread (``--threads``
changes it), so that other work on a shared machine does not leak in; the
tiny model is overhead-bound and shows the per-step Python cost.

``--world-size 2`` measures instead what the ranks' agreement on a skip costs:
that many gloo processes (CPU) train the same models under DDP, and rank 0
prints the wall time per step of ``AmpOptimWrapper`` (agreeing, the default,
and with ``agree_across_ranks=False``) against the hand-written DDP +
autocast + GradScaler loop in the same processes:

    python benchmarks/train_step.py --world-size 2 --repeats 5
"""

from __future__ import annotations

import argparse
import itertools
import logging
import math
import platform
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch
import torch.nn.functional as F
from torch import nn

import fp16utils
from fp16utils import AmpOptimWrapper, Fp16OptimizerHook, auto_fp16

try:  # run as a script: benchmarks/ is on sys.path
    from _support import cannot_measure
except ImportError:  # imported as benchmarks.train_step
    from benchmarks._support import cannot_measure

Batch = Tuple[torch.Tensor, torch.Tensor]
Step = Callable[[Batch], None]


class ConvNet(nn.Module):
    """A small conv net for 3x16x16 images, 10 classes."""

    def __init__(self) -> None:
        super().__init__()
        self.fp16_enabled = False
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(),
            nn.Conv2d(16, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.Conv2d(32, 32, 3, stride=2, padding=1), nn.ReLU(),
            nn.AdaptiveAvgPool2d(1), nn.Flatten())
        self.head = nn.Linear(32, 10)

    @auto_fp16()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.features(x))


class MLP(nn.Module):
    """A small MLP, 128 -> 256 -> 256 -> 10."""

    def __init__(self) -> None:
        super().__init__()
        self.fp16_enabled = False
        self.net = nn.Sequential(nn.Linear(128, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(),
                                 nn.Linear(256, 10))

    @auto_fp16()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)


class Tiny(nn.Module):
    """One small linear layer: almost no compute, so per-step Python overhead shows."""

    def __init__(self) -> None:
        super().__init__()
        self.fp16_enabled = False
        self.fc = nn.Linear(16, 10)

    @auto_fp16()
    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc(x)


MODELS = {
    'conv net (bs 16, 3x16x16, 3 convs)': (
        ConvNet, lambda g, n: torch.randn(n, 3, 16, 16, generator=g), 16),
    'MLP (bs 64, 128-256-256-10)': (MLP, lambda g, n: torch.randn(n, 128, generator=g), 64),
    'tiny linear (bs 8, 16-10; overhead-bound)': (
        Tiny, lambda g, n: torch.randn(n, 16, generator=g), 8),
}


def make_data(make_x: Callable, batch_size: int, device: str, count: int = 8) -> List[Batch]:
    gen = torch.Generator().manual_seed(0)
    return [(make_x(gen, batch_size).to(device),
             torch.randint(0, 10, (batch_size,), generator=gen).to(device))
            for _ in range(count)]


def fresh(model_cls: type, device: str) -> nn.Module:
    torch.manual_seed(0)
    return model_cls().to(device)


def sgd(model: nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)


# ------------------------------------------------------------------------ the variants


def fp32_loop(model_cls: type, device: str, dtype: torch.dtype) -> Step:
    model = fresh(model_cls, device)
    optimizer = sgd(model)

    def step(batch: Batch) -> None:
        x, y = batch
        optimizer.zero_grad()
        F.cross_entropy(model(x), y).backward()
        optimizer.step()

    return step


def amp_loop(model_cls: type, device: str, dtype: torch.dtype) -> Step:
    model = fresh(model_cls, device)
    optimizer = sgd(model)
    scaler = torch.amp.GradScaler(device, enabled=dtype == torch.float16)

    def step(batch: Batch) -> None:
        x, y = batch
        with torch.autocast(device, dtype=dtype):
            out = model(x)
        loss = F.cross_entropy(out.float(), y)
        scaler.scale(loss).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()

    return step


def wrapper_step(wrapper: AmpOptimWrapper, model: nn.Module) -> Step:
    """One 1.x training step of ``model`` (which may be DDP) with ``wrapper``."""
    def step(batch: Batch) -> None:
        x, y = batch
        with wrapper.optim_context(model):
            out = model(x)
        wrapper.update_params(F.cross_entropy(out.float(), y))

    return step


def wrapper_loop(model_cls: type, device: str, dtype: torch.dtype,
                 backend: str = 'native') -> Step:
    model = fresh(model_cls, device)
    return wrapper_step(AmpOptimWrapper(sgd(model), dtype=dtype, backend=backend,
                                        model=model), model)


def legacy_loop(model_cls: type, device: str, dtype: torch.dtype) -> Step:
    return wrapper_loop(model_cls, device, dtype, backend='legacy')


class _LogBuffer:
    def update(self, values: Dict[str, float], count: int = 1) -> None:
        pass


class _Runner:
    """The attributes an mmcv optimizer hook reads."""

    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        self.model, self.optimizer = model, optimizer
        self.meta: dict = {}
        self.logger = None
        self.log_buffer = _LogBuffer()
        self.iter, self.max_iters = 0, 1 << 30
        self.outputs: dict = {}


def hook_loop(model_cls: type, device: str, dtype: torch.dtype) -> Step:
    model = fresh(model_cls, device)
    runner = _Runner(model, sgd(model))
    hook = Fp16OptimizerHook(loss_scale='dynamic', dtype=dtype, backend='native')
    hook.before_run(runner)  # wrap_fp16_model: the @auto_fp16 forward now autocasts

    def step(batch: Batch) -> None:
        x, y = batch
        out = runner.model(x)
        runner.outputs = {'loss': F.cross_entropy(out.float(), y), 'num_samples': len(y)}
        hook.after_train_iter(runner)
        runner.iter += 1

    return step


VARIANTS: Dict[str, Callable[..., Step]] = {
    'fp32 (hand-written)': fp32_loop,
    'amp (hand-written)': amp_loop,
    'AmpOptimWrapper': wrapper_loop,
    'Fp16OptimizerHook': hook_loop,
    'legacy (half + fp32 masters)': legacy_loop,
}
BASELINE = 'amp (hand-written)'


# ------------------------------------------------------------------------ outcomes and guard


def outcome_loop(model_cls: type, device: str, dtype: torch.dtype) -> Step:
    """``AmpOptimWrapper`` with ``overflow_guard`` set, its StepResult read each step.

    Reads ``stepped``, ``skipped`` and ``scale`` (host values), not ``grad_norm``
    (which would cost a sync): what a loop that reacts to skipped steps does.
    """
    model = fresh(model_cls, device)
    wrapper = AmpOptimWrapper(sgd(model), dtype=dtype,
                              overflow_guard=dict(max_consecutive=3, action='diagnose'))
    seen: List[object] = [0, None]

    def step(batch: Batch) -> None:
        x, y = batch
        with wrapper.optim_context(model):
            out = model(x)
        result = wrapper.update_params(F.cross_entropy(out.float(), y))
        seen[0] = int(seen[0]) + result.stepped + result.skipped  # host values: no sync
        seen[1] = result.scale

    return step


VARIANTS['AmpOptimWrapper + overflow_guard, StepResult read'] = outcome_loop


def unchecked_loop(model_cls: type, device: str, dtype: torch.dtype) -> Step:
    """``AmpOptimWrapper(nonfinite='ignore')``: without the non-finite check (and its sync)
    that the default runs where nothing is scaled (bfloat16)."""
    model = fresh(model_cls, device)
    return wrapper_step(AmpOptimWrapper(sgd(model), dtype=dtype, model=model,
                                        nonfinite='ignore'), model)


VARIANTS["AmpOptimWrapper, nonfinite='ignore'"] = unchecked_loop


def policy_loop(model_cls: type, device: str, dtype: torch.dtype) -> Step:
    """``AmpOptimWrapper`` with a scale policy: hysteresis, a floor and a ceiling, a warning
    at the floor (host-side arithmetic after the one sync the step makes anyway)."""
    model = fresh(model_cls, device)
    policy = dict(hysteresis=2, min_scale=1.0, max_scale=2.0**24, at_min_scale='warn')
    return wrapper_step(AmpOptimWrapper(sgd(model), dtype=dtype, model=model,
                                        loss_scale=policy), model)


VARIANTS['AmpOptimWrapper + scale policy (hysteresis, floor, ceiling)'] = policy_loop


# ------------------------------------------------------------------------ timing


def _sync(device: str) -> None:
    if device.startswith('cuda'):
        torch.cuda.synchronize()


def time_steps(step: Step, data: List[Batch], steps: int, device: str) -> float:
    """Seconds per step over ``steps`` steps.

    On CPU this is the process's CPU time (robust to other processes on a
    shared machine); elsewhere wall time between device synchronisations.
    """
    clock = time.process_time if device == 'cpu' else time.perf_counter
    batches = itertools.islice(itertools.cycle(data), steps)
    _sync(device)
    start = clock()
    for batch in batches:
        step(batch)
    _sync(device)
    return (clock() - start) / steps


def bench_model(name: str, model_cls: type, make_x: Callable, batch_size: int,
                args: argparse.Namespace) -> Tuple[int, List[Tuple[str, float, float]]]:
    device = args.device
    dtype = fp16utils._torch.dtypes.resolve_dtype(args.dtype)
    data = make_data(make_x, batch_size, device)
    steps = {label: make(model_cls, device, dtype) for label, make in VARIANTS.items()}
    for step in steps.values():  # warm up: first-call costs, the scaler settling
        time_steps(step, data, args.warmup, device)
    # Enough steps per timed block that the clock's resolution and noise do not matter.
    per_step = time_steps(steps[BASELINE], data, args.warmup, device)
    count = max(args.steps, math.ceil(args.min_block / max(per_step, 1e-9)))
    times: Dict[str, List[float]] = {label: [] for label in steps}
    for repeat in range(args.repeats):
        order = list(steps)
        if repeat % 2:
            order.reverse()
        for label in order:
            times[label].append(time_steps(steps[label], data, count, device))
    base = statistics.median(times[BASELINE])
    return count, [(label, 1.0 / statistics.median(t), statistics.median(t) / base)
                   for label, t in times.items()]


# ------------------------------------------------------------------------ distributed


def ddp_variants(model_cls: type, dtype: torch.dtype) -> Dict[str, Step]:
    """The DDP steps compared by ``--world-size``: hand-written, agreeing, opted out."""
    def wrapped(agree: object) -> Step:
        model = fresh(model_cls, 'cpu')
        wrapper = AmpOptimWrapper(sgd(model), dtype=dtype, model=model,
                                  agree_across_ranks=agree)
        return wrapper_step(wrapper, nn.parallel.DistributedDataParallel(model))

    model = fresh(model_cls, 'cpu')
    ddp = nn.parallel.DistributedDataParallel(model)
    optimizer = sgd(model)
    scaler = torch.amp.GradScaler('cpu', enabled=dtype == torch.float16)

    def hand_written(batch: Batch) -> None:
        x, y = batch
        with torch.autocast('cpu', dtype=dtype):
            out = ddp(x)
        scaler.scale(F.cross_entropy(out.float(), y)).backward()
        scaler.step(optimizer)
        scaler.update()
        optimizer.zero_grad()

    return {'DDP + amp (hand-written)': hand_written,
            'AmpOptimWrapper, ranks agree (default)': wrapped(None),
            'AmpOptimWrapper, agree_across_ranks=False': wrapped(False)}


def _ddp_worker(rank: int, world_size: int, init_file: str, args: argparse.Namespace) -> None:
    import torch.distributed as dist
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=world_size)
    torch.set_num_threads(1)
    logging.getLogger('fp16utils').setLevel(logging.ERROR)
    dtype = fp16utils._torch.dtypes.resolve_dtype(args.dtype)
    for name, (model_cls, make_x, batch_size) in MODELS.items():
        data = make_data(make_x, batch_size, 'cpu')
        steps = ddp_variants(model_cls, dtype)
        times: Dict[str, List[float]] = {label: [] for label in steps}
        for repeat in range(args.repeats + 1):  # the first round warms up
            for label in (list(steps) if repeat % 2 else list(steps)[::-1]):
                dist.barrier()
                start = time.perf_counter()
                for batch in itertools.islice(itertools.cycle(data), args.steps):
                    steps[label](batch)
                dist.barrier()
                if repeat:
                    times[label].append((time.perf_counter() - start) / args.steps)
        if rank == 0:
            base = statistics.median(times['DDP + amp (hand-written)'])
            agree = statistics.median(times['AmpOptimWrapper, ranks agree (default)'])
            print(f'\n### {name}: DDP, {world_size} gloo processes, {args.steps} steps per '
                  'block, wall time\n')
            print('| variant | steps/s | time vs hand-written DDP amp |')
            print('| --- | ---: | ---: |')
            for label, t in times.items():
                print(f'| {label} | {1.0 / statistics.median(t):,.1f} | '
                      f'{statistics.median(t) / base:.3f}x |')
            off = statistics.median(times['AmpOptimWrapper, agree_across_ranks=False'])
            print(f'| agreement on / off | | {agree / off:.3f}x |')
    dist.barrier()
    dist.destroy_process_group()


def bench_world(args: argparse.Namespace) -> None:
    """``--world-size N``: the cost of the ranks' agreement, N gloo processes on the CPU."""
    import tempfile

    import torch.multiprocessing as mp
    print(f'torch {torch.__version__}, fp16utils {fp16utils.__version__}, device cpu (gloo), '
          f'dtype {args.dtype}, {args.world_size} processes x 1 thread, '
          f'{platform.processor() or platform.machine()}; {args.repeats} interleaved '
          'repeats, medians of wall time')
    with tempfile.TemporaryDirectory() as tmp:
        mp.spawn(_ddp_worker, args=(args.world_size, f'{tmp}/pg', args), nprocs=args.world_size)


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', default='float16', choices=['float16', 'bfloat16'])
    parser.add_argument('--steps', type=int, default=40,
                        help='steps per timed block (at least; see --min-block)')
    parser.add_argument('--min-block', type=float, default=0.25,
                        help='seconds a timed block lasts at least (more steps for fast models)')
    parser.add_argument('--repeats', type=int, default=9, help='interleaved repeats')
    parser.add_argument('--warmup', type=int, default=10, help='untimed steps per variant')
    parser.add_argument('--threads', type=int, default=None,
                        help='torch threads (default: 1 on cpu, so that CPU time is clean)')
    parser.add_argument('--quick', action='store_true', help='few steps, for a smoke run')
    parser.add_argument('--world-size', type=int, default=1,
                        help='> 1: the cost of the ranks agreeing on a skip, under DDP (gloo)')
    args = parser.parse_args(argv)
    if args.quick:
        args.steps, args.repeats, args.warmup, args.min_block = 5, 3, 3, 0.02
    dtype = fp16utils._torch.dtypes.resolve_dtype(args.dtype)
    why = cannot_measure(torch.device(args.device).type, dtype, grad_scaler=True)
    if why:
        parser.exit(2, f'{parser.prog}: cannot measure {args.dtype} here: {why}\n')
    if args.world_size > 1:
        bench_world(args)
        return
    # Skipped steps (the dynamic scale probing upwards) are normal here: don't log them.
    logging.getLogger('fp16utils').setLevel(logging.ERROR)
    threads = args.threads or (1 if args.device == 'cpu' else None)
    if threads:
        torch.set_num_threads(threads)
    print(f'torch {torch.__version__}, fp16utils {fp16utils.__version__}, '
          f'device {args.device}, dtype {args.dtype}, threads {torch.get_num_threads()}, '
          f'{platform.processor() or platform.machine()}; '
          f'{args.repeats} interleaved repeats, medians of '
          f"{'process CPU time' if args.device == 'cpu' else 'wall time'}")
    for name, (model_cls, make_x, batch_size) in MODELS.items():
        count, rows = bench_model(name, model_cls, make_x, batch_size, args)
        print(f'\n### {name}: {count} steps per block\n')
        print('| variant | steps/s | time vs hand-written amp |')
        print('| --- | ---: | ---: |')
        for label, rate, ratio in rows:
            print(f'| {label} | {rate:,.1f} | {ratio:.3f}x |')


if __name__ == '__main__':
    main()
