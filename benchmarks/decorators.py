"""Per-call cost of the decorators and the overflow check, against hand-written torch.

Every case runs in this one process, interleaved over several repeats, and the
median is reported. Ratios compare each fp16utils call with the hand-written
PyTorch code that does the same work.

The headline ratios (printed last):

- ``LossScaler.has_overflow(params)`` against the bare fused kernel and its one
  ``.item()``: ``torch._amp_foreach_non_finite_check_and_unscale_(grads,
  found_inf, inv_scale); found_inf.item()`` on the same gradients, with the list
  and the two flag tensors built once, outside the timing;
- ``auto_fp16`` (enabled) called as a bound method with two tensor arguments
  against the same body written by hand with the device type as a constant:
  ``with torch.autocast('cpu', dtype=torch.float16): return body(self,
  x.half(), y.half())`` (``'cuda'`` with ``--device cuda``), once for a model
  that went through ``wrap_fp16_model`` and once for ``model.fp16_enabled =
  True`` set by hand (as mmcv's tests and many 0.x codebases do). The row that
  reads ``x.device.type`` on each call is kept beside them;
- ``auto_fp16`` disabled (no true ``fp16_enabled``: False on the instance, False
  on the class, no attribute) beside mmcv 1.x's own ``auto_fp16`` on the same
  method, when mmcv is importable (``from mmcv.runner import auto_fp16``); else
  that row is skipped, with the reason.

Run:
    python benchmarks/decorators.py            # full run
    python benchmarks/decorators.py --quick    # a few seconds
"""

from __future__ import annotations

import argparse
import statistics
import timeit
import warnings
from typing import Callable, Optional

import torch
from torch import nn

from fp16utils import LossScaler, auto_fp16, force_fp32, wrap_fp16_model

try:  # run as a script: benchmarks/ is on sys.path
    from _support import cannot_measure
except ImportError:  # imported as benchmarks.decorators
    from benchmarks._support import cannot_measure


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


def _body(self, x, y):
    return x


class AutoMethod(nn.Module):
    """A decorated method, called directly (no nn.Module.__call__)."""

    fp16_enabled = False

    @auto_fp16()
    def head(self, x, y):
        return _body(self, x, y)


class PlainMethod(nn.Module):
    """The undecorated method: what a disabled decorator should cost next to."""

    def head(self, x, y):
        return _body(self, x, y)


def off_methods(decorator: Callable) -> dict[str, nn.Module]:
    """A method under ``decorator()`` whose owner has no true ``fp16_enabled``, three ways."""

    class NoFlag(nn.Module):
        @decorator()
        def head(self, x, y):
            return _body(self, x, y)

    class ClassFlag(NoFlag):
        fp16_enabled = False

    instance = NoFlag()
    instance.fp16_enabled = False  # mmdet's style: set in __init__
    return {OFF_INSTANCE: instance, OFF_CLASS: ClassFlag(), OFF_MISSING: NoFlag()}


def mmcv_auto_fp16() -> tuple[Optional[Callable], str]:
    """mmcv's own ``auto_fp16`` and its version, or None and why it cannot be had here."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # mmcv 1.x warns about 2.0 when imported
            import mmcv
            from mmcv.runner import auto_fp16 as theirs
    except ModuleNotFoundError as err:
        if (err.name or '').split('.')[0] == 'mmcv':
            return None, 'mmcv not installed: row skipped'
        return None, f'mmcv cannot be imported here ({err}): row skipped'
    except Exception as err:  # noqa: BLE001 - e.g. a torchvision built for another torch
        reason = f'{type(err).__name__}: {str(err).splitlines()[0] if str(err) else ""}'
        return None, (f'mmcv cannot be imported here ({reason}; see '
                      'docs/troubleshooting/torchvision-nms.md): row skipped')
    return theirs, mmcv.__version__


class HandMethod(nn.Module):
    """What auto_fp16 replaces, in a bound method: the same body, by hand."""

    def head(self, x, y):
        with torch.autocast(device_type=x.device.type, dtype=torch.float16):
            return _body(self, x.half(), y.half())


def hand_method_const(device_type: str) -> nn.Module:
    """The hand-written bound method with the device type a constant (no lookup per call)."""

    class HandMethodConst(nn.Module):
        def head(self, x, y):
            with torch.autocast(device_type, dtype=torch.float16):
                return _body(self, x.half(), y.half())

    return HandMethodConst()


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


class ForceNoFlag(nn.Module):
    """A migrated module: no fp16_enabled at all, a @force_fp32 method."""

    @force_fp32()
    def forward(self, x, y):
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
    """By hand, from the parameters: collect the gradients, make the flags, one sync."""
    grads = [p.grad for p in params if p.grad is not None]
    found = torch.zeros(1, device=device)
    inv = torch.ones(1, device=device)
    torch._amp_foreach_non_finite_check_and_unscale_(grads, found, inv)
    return bool(found.item())


def collect_then_bare(params: list[nn.Parameter], bare: Callable[[], float]) -> float:
    """The floor for any check from parameters: read every ``.grad``, then the bare kernel."""
    grads = [g for p in params if (g := p.grad) is not None]  # noqa: F841 (the cost)
    return bare()


def bare_fused_kernel(grads: list[torch.Tensor], device: torch.device
                      ) -> Callable[[], float]:
    """The bare fused kernel and its one ``.item()``; list and flags made once, here."""
    found = torch.zeros(1, device=device)
    inv = torch.ones(1, device=device)
    kernel = torch._amp_foreach_non_finite_check_and_unscale_

    def check() -> float:
        kernel(grads, found, inv)
        return found.item()

    return check


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


OVERFLOW = 'LossScaler.has_overflow'
BARE = 'bare fused kernel + one .item()'
METHOD = 'auto_fp16 enabled, bound method, two tensor args (wrap_fp16_model)'
BY_HAND = 'auto_fp16 enabled, bound method, two tensor args (fp16_enabled = True by hand)'
PLAIN_METHOD = 'undecorated bound method'
OFF_INSTANCE = 'fp16_enabled = False on the instance'
OFF_CLASS = 'fp16_enabled = False on the class'
OFF_MISSING = 'no fp16_enabled attribute'
FLOOR = 'floor: read every p.grad, then the bare kernel + .item()'
HAND_METHOD = 'hand-written bound method: autocast(x.device.type) + .half()'
HAND_CONST = "hand-written bound method: autocast(constant device, e.g. 'cpu') + .half()"
NO_FLAG = 'force_fp32 without the flag, inside an outer autocast'
HAND_NO_FLAG = 'hand-written, inside an outer autocast: autocast off + .float()'


def run(device: str, number: int, repeats: int, n_params: int, numel: int,
        theirs: Optional[Callable] = None
        ) -> tuple[list[tuple[str, float, str]], dict[str, float], list[tuple]]:
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
    method, hand_method = wrap_fp16_model(AutoMethod()), HandMethod()
    by_hand = AutoMethod()
    by_hand.fp16_enabled = True  # no wrap_fp16_model: dtype and backend from the defaults
    plain_method = PlainMethod()
    ours_off = off_methods(auto_fp16)
    theirs_off = off_methods(theirs) if theirs is not None else {}
    hand_const = hand_method_const(dt)
    params = [nn.Parameter(torch.randn(numel, device=dev)) for _ in range(n_params)]
    for p in params:
        p.grad = torch.randn_like(p)
    scaler = LossScaler()
    bare = bare_fused_kernel([p.grad for p in params], dev)

    def sync() -> None:
        if dt == 'cuda':
            torch.cuda.synchronize()

    force_off = ForceNoFlag()
    outer = torch.autocast(device_type=dt, dtype=torch.float16)

    def force_under_autocast() -> None:  # the 1.x style: the flags gone, a whole autocast
        with outer:
            force_off(xh, yh)
        sync()

    def hand_under_autocast() -> None:
        with outer:
            hand_force(xh, yh)
        sync()

    cases: dict[str, Callable[[], object]] = {
        'plain forward': lambda: plain(x, y),
        'auto_fp16 disabled': lambda: off(x, y),
        'auto_fp16 enabled': lambda: (on(x, y), sync()),
        'hand-written autocast + .half()': lambda: (hand_auto(x, y), sync()),
        '0.x-style auto_fp16 (signature per call)': lambda: (per_call(x, y), sync()),
        METHOD: lambda: (method.head(x, y), sync()),
        BY_HAND: lambda: (by_hand.head(x, y), sync()),
        HAND_METHOD: lambda: (hand_method.head(x, y), sync()),
        HAND_CONST: lambda: (hand_const.head(x, y), sync()),
        'force_fp32 enabled': lambda: (force(xh, yh), sync()),
        'hand-written autocast off + .float()': lambda: (hand_force(xh, yh), sync()),
        'force_fp32 disabled (no flag, no autocast)': lambda: force_off(xh, yh),
        NO_FLAG: force_under_autocast,
        HAND_NO_FLAG: hand_under_autocast,
        OVERFLOW: lambda: scaler.has_overflow(params),
        BARE: bare,
        FLOOR: lambda: collect_then_bare(params, bare),
        'by hand: collect grads, make flags, kernel, .item()':
            lambda: hand_overflow(params, dev),
        'mmcv-style per-parameter check': lambda: mmcv_style_overflow(params),
        PLAIN_METHOD: lambda: plain_method.head(x, y),
    }
    for label, owners in (('fp16utils', ours_off), ('mmcv', theirs_off)):
        for style, owner in owners.items():
            cases[f'{label}: {style}'] = lambda owner=owner: owner.head(x, y)
    heavy = {OVERFLOW, BARE, FLOOR, 'by hand: collect grads, make flags, kernel, .item()',
             'mmcv-style per-parameter check'}
    samples: dict[str, list[float]] = {k: [] for k in cases}
    for fn in cases.values():  # warm up
        measure(fn, max(1, number // 10), 1)
    for _ in range(repeats):  # interleave the cases so drift hits all alike
        for name, fn in cases.items():
            samples[name] += measure(fn, max(1, number // 20) if name in heavy else number, 1)
    med = {k: statistics.median(v) for k, v in samples.items()}
    refs = {
        'plain forward': None,
        'auto_fp16 disabled': 'plain forward',
        'auto_fp16 enabled': 'hand-written autocast + .half()',
        'hand-written autocast + .half()': None,
        '0.x-style auto_fp16 (signature per call)': 'hand-written autocast + .half()',
        METHOD: HAND_CONST,
        BY_HAND: HAND_CONST,
        HAND_METHOD: HAND_CONST,
        HAND_CONST: None,
        'force_fp32 enabled': 'hand-written autocast off + .float()',
        'hand-written autocast off + .float()': None,
        'force_fp32 disabled (no flag, no autocast)': 'plain forward',
        NO_FLAG: HAND_NO_FLAG,
        HAND_NO_FLAG: None,
        OVERFLOW: BARE,
        BARE: None,
        FLOOR: BARE,
        'by hand: collect grads, make flags, kernel, .item()': BARE,
        'mmcv-style per-parameter check': BARE,
    }
    rows = []
    for name, ref in refs.items():
        if ref is None:
            rows.append((name, med[name], '1.00 (reference)' if name != 'plain forward'
                         else 'reference'))
        elif ref == 'plain forward':
            rows.append((name, med[name], f'+{(med[name] - med[ref]) * 1e6:.2f} us vs plain'))
        else:
            rows.append((name, med[name], f'{med[name] / med[ref]:.2f}x'))
    headline = {'has_overflow': med[OVERFLOW] / med[BARE],
                'has_overflow vs floor': med[OVERFLOW] / med[FLOOR],
                'auto_fp16 bound method': med[METHOD] / med[HAND_CONST],
                'auto_fp16 bound method, flag by hand': med[BY_HAND] / med[HAND_CONST]}
    plain = med[PLAIN_METHOD]
    disabled = []  # (style, fp16utils s, mmcv s or None), each a whole call
    for style in ours_off:
        mine, other = med[f'fp16utils: {style}'], med.get(f'mmcv: {style}')
        disabled.append((style, mine, other))
    return rows, headline, [(PLAIN_METHOD, plain, None)] + disabled


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('--device', default='cuda' if torch.cuda.is_available() else 'cpu')
    parser.add_argument('--number', type=int, default=20000, help='calls per sample')
    parser.add_argument('--repeats', type=int, default=7)
    parser.add_argument('--params', type=int, default=160, help='parameters checked')
    parser.add_argument('--numel', type=int, default=1000,
                        help='float32 elements in each parameter (and gradient)')
    parser.add_argument('--quick', action='store_true', help='fewer calls, for a smoke run')
    args = parser.parse_args(argv)
    if args.quick:
        args.number, args.repeats = 2000, 3
    why = cannot_measure(torch.device(args.device).type, torch.float16)
    if why:  # the decorators' default dtype, and the hand-written code's
        parser.exit(2, f'{parser.prog}: cannot measure float16 here: {why}\n')
    torch.set_num_threads(1)
    theirs, version = mmcv_auto_fp16()
    rows, headline, disabled = run(args.device, args.number, args.repeats, args.params,
                                   args.numel, theirs)
    print(f'device: {args.device} | torch {torch.__version__} | '
          f'median of {args.repeats} interleaved repeats | overflow check over '
          f'{args.params} parameters of {args.numel} elements')
    print()
    print('| case | per call (us) | vs hand-written |')
    print('|---|---:|---|')
    for name, sec, ratio in rows:
        print(f'| {name} | {sec * 1e6:.2f} | {ratio} |')
    print()
    (_, plain, _), disabled = disabled[0], disabled[1:]
    mmcv_head = f'mmcv {version}' if theirs is not None else 'mmcv'
    print(f'| auto_fp16 disabled, bound method (the undecorated method: {plain * 1e6:.2f} us) '
          f'| fp16utils (us) | {mmcv_head} (us) | fp16utils / mmcv |')
    print('|---|---:|---:|---:|')
    for style, mine, other in disabled:
        theirs_cell = f'{other * 1e6:.2f}' if other is not None else 'skipped'
        ratio = f'{mine / other:.2f}x' if other is not None else 'skipped'
        print(f'| {style} | {mine * 1e6:.2f} | {theirs_cell} | {ratio} |')
    print()
    print(f"has_overflow vs bare fused kernel + one .item(): "
          f"{headline['has_overflow']:.2f}x (vs the floor, reading p.grad included: "
          f"{headline['has_overflow vs floor']:.2f}x)")
    print(f"auto_fp16 bound method, two tensor args, vs hand-written (constant device): "
          f"{headline['auto_fp16 bound method']:.2f}x via wrap_fp16_model, "
          f"{headline['auto_fp16 bound method, flag by hand']:.2f}x with fp16_enabled = True "
          f"set by hand")
    if theirs is None:
        print(f'auto_fp16 disabled vs mmcv: {version}')
    else:
        print(f'auto_fp16 disabled vs mmcv {version} disabled: ' + ', '.join(
            f'{mine / other:.2f}x ({style})' for style, mine, other in disabled))


if __name__ == '__main__':
    main()
