"""Half-precision evaluation: ``eval_precision`` against the hand-written autocast forward.

Both evaluate the same float32 model on the same batches under ``torch.no_grad()``:

- hand-written: ``with torch.autocast(device, dtype=dtype): model(x)``;
- ``eval_precision(model, dtype)`` entered around the same forward (native backend),
  and with ``fp32_modules`` kept (one module in float32, as a detector keeps its
  RoI head);
- the legacy backend: a half model from ``wrap_fp16_model(backend='legacy')`` whose
  inputs ``eval_precision`` casts, against ``model.half()(x.half())`` by hand.

Every case runs in this one process, interleaved over several repeats; the table
gives the median time per forward and its ratio to the hand-written code it does the
same work as. On the CPU times are the process's CPU time (robust to other processes
on a shared machine), elsewhere wall time between device synchronisations.

Run:
    python benchmarks/evaluation.py             # full run
    python benchmarks/evaluation.py --quick     # a few seconds
"""

from __future__ import annotations

import argparse
import copy
import itertools
import platform
import statistics
import time
from typing import Callable, Dict, List, Tuple

import torch
from _support import cannot_measure
from torch import nn

import fp16utils
from fp16utils import eval_precision, wrap_fp16_model

Forward = Callable[[torch.Tensor], torch.Tensor]


class ConvNet(nn.Module):
    """A small detector-like stack: convolutions, norms, and a head of its own."""

    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(
            nn.Conv2d(3, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(),
            nn.Conv2d(32, 64, 3, stride=2, padding=1), nn.BatchNorm2d(64), nn.ReLU(),
            nn.Conv2d(64, 64, 3, padding=1), nn.BatchNorm2d(64), nn.ReLU())
        self.head = nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(64, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


class MLP(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.body = nn.Sequential(nn.Linear(512, 1024), nn.GELU(), nn.Linear(1024, 1024),
                                  nn.GELU())
        self.head = nn.Linear(1024, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(self.body(x))


MODELS: Dict[str, Tuple[type, Tuple[int, ...]]] = {
    'conv net, 8x3x32x32': (ConvNet, (8, 3, 32, 32)),
    'MLP, 64x512': (MLP, (64, 512)),
}


def variants(model_cls: type, device: str, dtype: torch.dtype) -> Dict[str, Forward]:
    torch.manual_seed(0)
    model = model_cls().to(device).eval()

    def by_hand(x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(device, dtype=dtype):
            return model(x)

    native = eval_precision(model, dtype)

    def ours(x: torch.Tensor) -> torch.Tensor:
        with native:
            return model(x)

    kept_model = copy.deepcopy(model)
    kept = eval_precision(kept_model, dtype, fp32_modules=['head'])

    def ours_kept(x: torch.Tensor) -> torch.Tensor:
        with kept:
            return kept_model(x)

    half_by_hand = copy.deepcopy(model).to(dtype)

    def legacy_by_hand(x: torch.Tensor) -> torch.Tensor:
        return half_by_hand(x.to(dtype))

    legacy_model = wrap_fp16_model(copy.deepcopy(model), dtype=dtype, backend='legacy')
    legacy = eval_precision(legacy_model, dtype, backend='legacy')

    def ours_legacy(x: torch.Tensor) -> torch.Tensor:
        with legacy:
            return legacy_model(x)

    return {
        'autocast (hand-written)': by_hand,
        'eval_precision': ours,
        "eval_precision, fp32_modules=['head']": ours_kept,
        'half model (hand-written)': legacy_by_hand,
        "eval_precision, backend='legacy'": ours_legacy,
    }


#: Each row's hand-written reference.
REFERENCE = {
    'eval_precision': 'autocast (hand-written)',
    "eval_precision, fp32_modules=['head']": 'autocast (hand-written)',
    "eval_precision, backend='legacy'": 'half model (hand-written)',
}


def time_forwards(forward: Forward, data: List[torch.Tensor], count: int, device: str) -> float:
    clock = time.process_time if device == 'cpu' else time.perf_counter
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    start = clock()
    with torch.no_grad():
        for x in itertools.islice(itertools.cycle(data), count):
            forward(x)
    if device.startswith('cuda'):
        torch.cuda.synchronize()
    return (clock() - start) / count


def main(argv: List[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split('\n\n')[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--dtype', default='bfloat16', choices=['float16', 'bfloat16'])
    parser.add_argument('--forwards', type=int, default=60, help='forwards per timed block')
    parser.add_argument('--repeats', type=int, default=9, help='interleaved repeats')
    parser.add_argument('--quick', action='store_true', help='few forwards, for a smoke run')
    args = parser.parse_args(argv)
    if args.quick:
        args.forwards, args.repeats = 5, 3
    dtype = fp16utils._torch.dtypes.resolve_dtype(args.dtype)
    why = cannot_measure(torch.device(args.device).type, dtype)
    if why:
        parser.exit(2, f'{parser.prog}: cannot measure {args.dtype} here: {why}\n')
    if args.device == 'cpu':
        torch.set_num_threads(1)
    print(f'torch {torch.__version__}, fp16utils {fp16utils.__version__}, '
          f'device {args.device}, dtype {args.dtype}, threads {torch.get_num_threads()}, '
          f'{platform.processor() or platform.machine()}; {args.repeats} interleaved '
          f'repeats of {args.forwards} forwards, medians')
    for name, (model_cls, shape) in MODELS.items():
        forwards = variants(model_cls, args.device, dtype)
        gen = torch.Generator().manual_seed(0)
        data = [torch.randn(shape, generator=gen).to(args.device) for _ in range(4)]
        for forward in forwards.values():  # warm up
            time_forwards(forward, data, 3, args.device)
        times: Dict[str, List[float]] = {label: [] for label in forwards}
        for repeat in range(args.repeats):
            order = list(forwards) if repeat % 2 == 0 else list(forwards)[::-1]
            for label in order:
                times[label].append(time_forwards(forwards[label], data, args.forwards,
                                                  args.device))
        medians = {label: statistics.median(t) for label, t in times.items()}
        print(f'\n### {name}\n')
        print('| variant | time per forward | vs hand-written |')
        print('| --- | ---: | ---: |')
        for label, median in medians.items():
            ref = REFERENCE.get(label)
            ratio = f'{median / medians[ref]:.3f}x' if ref else '(reference)'
            print(f'| {label} | {median * 1e6:,.0f} us | {ratio} |')


if __name__ == '__main__':
    main()
