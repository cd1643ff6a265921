"""Per-call cost of the decorators and the overflow check, against hand-written torch.

Every case runs in this one process, interleaved over several repeats, and the
median is reported. Ratios compare each fp16utils call with the hand-written
PyTorch code that does the same work.

Run:
    python benchmarks/decorators.py            # full run
    python benchmarks/decorators.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import statistics
import timeit
from typing import Callable

import torch
from torch import nn

from fp16utils import LossScaler, auto_fp16, force_fp32, wrap_fp16_model


class Plain(nn.Module):
    def forward(self, x, y):
        return x


class Auto(nn.Module):
    def __init__(self, enabled: bool) -> None:
        super().__init__()
        self.fp16_enabled = enabled

    @auto_fp16()
    def forward(self, x, y):
        return x


class Force(nn.Module):
    fp16_enabled = False

    @force_fp32()
    def forward(self, x, y):
        return x


class HandAuto(nn.Module):
    """What auto_fp16 replaces: cast the float32 arguments, run under autocast."""

    def forward(self, x, y):
        x, y = x.half(), y.half()
        with torch.autocast(device_type=x.device.type, dtype=torch.float16):
            return x


class HandForce(nn.Module):
    """What force_fp32 replaces: cast the half arguments, run with autocast off."""

    def forward(self, x, y):
        x, y = x.float(), y.float()
        with torch.autocast(device_type=x.device.type, enabled=False):
            return x


def per_call_signature_auto_fp16(func):
    """The 0.x algorithm, for reference: the signature is read again on every call.

    Written here from its documented behaviour: check the owner, read the
    argument names with ``inspect.getfullargspec``, cast the named float32
    arguments (containers rebuilt), run under autocast.
    """
    import functools
    import inspect

    from fp16utils import cast_tensor_type

    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        if not isinstance(args[0], nn.Module):
            raise TypeError('only methods of nn.Module')
        if not getattr(args[0], 'fp16_enabled', False):
            return func(*args, **kwargs)
        names = inspect.getfullargspec(func).args
        new_args = [cast_tensor_type(a, torch.float32, torch.float16) if n in names else a
                    for n, a in zip(names, args)]
        new_kwargs = {k: cast_tensor_type(v, torch.float32, torch.float16) if k in names else v
                      for k, v in kwargs.items()}
        with torch.autocast(device_type=args[1].device.type, dtype=torch.float16):
            return func(*new_args, **new_kwargs)

    return wrapper


class PerCallAuto(nn.Module):
    fp16_enabled = True

    @per_call_signature_auto_fp16
    def forward(self, x, y):
        return x


def hand_overflow(params: list[nn.Parameter], device: torch.device) -> bool:
    """The fused kernel over the parameters' gradients, one sync."""
    grads = [p.grad for p in params if p.grad is not None]
    found = torch.zeros(1, device=device)
    inv = torch.ones(1, device=device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    return bool(found.item())


def mmcv_style_overflow(params: list[nn.Parameter]) -> bool:
    """mmcv 1.x's LossScaler.has_overflow: one sum and one sync per parameter."""
    for p in params:
        if p.grad is not None:
            s = float(p.grad.data.float().sum())
            if s in (float('inf'), -float('inf')) or s != s:
                return True
    return False


def measure(fn: Callable[[], object], number: int, repeats: int) -> list[float]:
    """Seconds per call for each repeat."""
    return [t / number for t in timeit.repeat(fn, number=number, repeat=repeats)]


def run(device: str, number: int, repeats: int, n_params: int) -> list[tuple[str, float, str]]:
    dev = torch.device(device)
    dt = dev.type
    x = torch.randn(8, 16, device=dev)
    y = torch.randn(8, 16, device=dev)
    xh, yh = x.half(), y.half()
    plain, off = Plain(), Auto(False)
    on = wrap_fp16_model(Auto(False))
    force = wrap_fp16_model(Force())
    hand_auto, hand_force = HandAuto(), HandForce()
    per_call = PerCallAuto()
    sizes = [(64, 64), (64,), (128, 64, 3, 3), (128,)]
    params = [nn.Parameter(torch.randn(*sizes[i % len(sizes)], device=dev))
              for i in range(n_params)]
    for p in params:
        p.grad = torch.randn_like(p)
    scaler = LossScaler()

    def sync() -> None:
        if dt == 'cuda':
            torch.cuda.synchronize()

    cases: dict[str, Callable[[], object]] = {
        'plain forward': lambda: plain(x, y),
        'auto_fp16 disabled': lambda: off(x, y),
        'auto_fp16 enabled': lambda: (on(x, y), sync()),
        'hand-written autocast + .half()': lambda: (hand_auto(x, y), sync()),
        '0.x-style auto_fp16 (signature per call)': lambda: (per_call(x, y), sync()),
        'force_fp32 enabled': lambda: (force(xh, yh), sync()),
        'hand-written autocast off + .float()': lambda: (hand_force(xh, yh), sync()),
        f'LossScaler.has_overflow ({n_params} params)': lambda: scaler.has_overflow(params),
        f'fused kernel over grads ({n_params} params)': lambda: hand_overflow(params, dev),
        f'mmcv-style per-parameter check ({n_params} params)':
            lambda: mmcv_style_overflow(params),
    }
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm up
        measure(fn, max(1, number // 10), 1)
    for _ in range(repeats):  # interleave the cases so drift hits all alike
        for name, fn in cases.items():
            heavy = 'param' in name
            samples[name] += measure(fn, max(1, number // 50) if heavy else number, 1)
    med = {k: statistics.median(v) for k, v in samples.items()}
    over = f'fused kernel over grads ({n_params} params)'
    refs = {
        'plain forward': None,
        'auto_fp16 disabled': 'plain forward',
        'auto_fp16 enabled': 'hand-written autocast + .half()',
        'hand-written autocast + .half()': None,
        '0.x-style auto_fp16 (signature per call)': 'hand-written autocast + .half()',
        'force_fp32 enabled': 'hand-written autocast off + .float()',
        'hand-written autocast off + .float()': None,
        f'LossScaler.has_overflow ({n_params} params)': over,
        over: None,
        f'mmcv-style per-parameter check ({n_params} params)': over,
    }
    rows = []
    for name, ref in refs.items():
        if ref is None:
            rows.append((name, med[name], '1.00 (reference)' if name != 'plain forward'
                         else 'reference'))
        elif name == 'auto_fp16 disabled':
            rows.append((name, med[name], f'+{(med[name] - med[ref]) * 1e6:.2f} us vs plain'))
        else:
            rows.append((name, med[name], f'{med[name] / med[ref]:.2f}x'))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--number', type=int, default=20000, help='calls per sample')
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--params', type=int, default=160)
    parser.add_argument('--quick', action='store_true', help='fewer calls, for a smoke run')
    args = parser.parse_args(argv)
    if args.quick:
        args.number, args.repeats = 2000, 3
    torch.set_num_threads(1)
    rows = run(args.device, args.number, args.repeats, args.params)
    print(f'device: {args.device} | torch {torch.__version__} | '
          f'median of {args.repeats} interleaved repeats')
    print()
    print('| case | per call (us) | vs hand-written |')
    print('|---|---:|---|')
    for name, sec, ratio in rows:
        print(f'| {name} | {sec * 1e6:.2f} | {ratio} |')


if __name__ == '__main__':
    main()
