"""A 0.x ``loss_scale`` (mmcv's hook, ``fp16`` key or runner) as ``AmpOptimWrapper`` takes it.

mmcv spells a scale as a number, ``'dynamic'`` or a ``LossScaler`` dict (``mode``,
``init_scale``, ``scale_factor``, ``scale_window``); the 1.x wrappers take a number,
``'dynamic'`` or a dict of ``torch.amp.GradScaler`` arguments. Where the two read a value
differently (``'dynamic'``: mmcv's LossScaler starts at 2**32 and grows every 1000 steps,
GradScaler at 2**16 every 2000), a note says so and ``faithful`` writes mmcv's numbers.
The loss-scale policy's keys (``hysteresis``, ``min_scale``, ...) pass through, checked;
DeepSpeed's names become them (:mod:`._deepspeed_keys`).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from .._args.numbers import as_whole
from .._args.spec import (
    GRAD_SCALER_ARGS,
    MMCV_DYNAMIC,
    MMCV_INIT_SCALE,
    TORCH_DYNAMIC,
    is_number,
    parse_loss_scale,
    positive_finite,
)
from ._deepspeed_keys import POLICY_ARGS, deepspeed_defaults, policy_args, rename_deepspeed

__all__ = ['FAITHFUL_DYNAMIC', 'convert_loss_scale']

#: mmcv LossScaler's ``'dynamic'`` in GradScaler's names (growth 2 and backoff 1/2 are
#: the defaults of both, so only these two differ).
FAITHFUL_DYNAMIC = {'init_scale': MMCV_DYNAMIC.init_scale,
                    'growth_interval': MMCV_DYNAMIC.growth_interval}
_SEE = 'see docs/migration/convert-config.md#dynamic-loss-scale'
_MMCV_PATH = ("what mmcv 1.x's Fp16OptimizerHook ran on torch < 1.6 and the legacy backend "
              "runs; on torch >= 1.6 mmcv's hook already used GradScaler's")


def _dynamic(where: str, notes: Optional[list[str]], faithful: bool) -> Any:
    """``'dynamic'``: kept (upstream's form) or mmcv's numbers, with the note saying which."""
    mmcv = (f"mmcv LossScaler's numbers (init_scale 2**32, scale factor 2, scale_window "
            f'{MMCV_DYNAMIC.growth_interval})')
    torch = (f"GradScaler's defaults (init_scale 2**16, growth_interval "
             f'{TORCH_DYNAMIC.growth_interval})')
    if faithful:
        if notes is not None:
            notes.append(
                f"{where}: 'dynamic' written as loss_scale=dict(init_scale=2.**32, "
                f"growth_interval={MMCV_DYNAMIC.growth_interval}), {mmcv} (--faithful); "
                f"MMEngine's 'dynamic' would mean {torch}; {_SEE}"
            )
        return dict(FAITHFUL_DYNAMIC)
    if notes is not None:
        notes.append(
            f"{where}: 'dynamic' kept as optim_wrapper loss_scale='dynamic', as upstream's 1.x "
            f'configs write it; AmpOptimWrapper reads it as {torch}, not {mmcv}, '
            f"{_MMCV_PATH}; for mmcv's numbers write loss_scale=dict(init_scale=2.**32, "
            f'growth_interval={MMCV_DYNAMIC.growth_interval}) or pass --faithful; {_SEE}'
        )
    return 'dynamic'


def convert_loss_scale(value: Any, where: str, problems: list[str],
                       notes: Optional[list[str]] = None, faithful: bool = False,
                       deepspeed: bool = False) -> Any:
    """The 1.x value of a 0.x ``loss_scale``; what is unsafe is kept and told in ``problems``.

    A value whose meaning changes is told in ``notes``; with ``faithful`` it is written
    with mmcv's meaning instead (DeepSpeed's, for a dict in DeepSpeed's names, or any
    dict when ``deepspeed``: one read from DeepSpeed's ``fp16`` block).
    """
    expected = "expected a positive number (static scale), 'dynamic', or a dict of scaler arguments"
    if isinstance(value, str):
        if value == 'dynamic':
            return _dynamic(where, notes, faithful)
        problems.append(f'{where}: {value!r} is not understood; {expected}; kept as is, fix it')
        return value
    if is_number(value):
        if not positive_finite(value):
            problems.append(f'{where}: {value!r} is not a usable scale; {expected}; kept as is')
            return value
        return float(value)
    if not isinstance(value, Mapping):
        problems.append(
            f'{where}: got {type(value).__name__} {value!r}; {expected}; kept as is, fix it'
        )
        return value

    problems_before = len(problems)
    args = dict(value)
    named, kept = rename_deepspeed(args, where, problems)
    deepspeed = deepspeed or named
    mode = args.pop('mode', 'dynamic')
    if mode == 'static':
        ignored = sorted(k for k in args if k != 'init_scale')
        if ignored:
            problems.append(
                f"{where}: {', '.join(ignored)}: ignored with mode='static', so dropped; "
                'remove them from the 0.x config'
            )
        if 'init_scale' not in args:
            problems.append(
                f"{where}: mode='static' without init_scale means mmcv's default static "
                'scale 2**32, which overflows on almost every step; it was kept, but set '
                "a smaller loss_scale (e.g. 512.) or use 'dynamic'"
            )
        init = args.get('init_scale', float(MMCV_INIT_SCALE))
        if not positive_finite(init):
            problems.append(f'{where}.init_scale: {init!r} is not a positive number; kept as is')
            return init
        return float(init)
    if mode != 'dynamic':
        problems.append(
            f"{where}.mode: {mode!r} is not 'static' or 'dynamic'; the scaler arguments "
            'were kept as is; fix the mode'
        )
        return dict(value)

    policy = policy_args(args, where, problems)
    out: dict[str, Any] = {}
    for key, val in args.items():
        if key == 'scale_factor':
            if 'growth_factor' in args or 'backoff_factor' in args:
                problems.append(
                    f'{where}: both scale_factor (mmcv) and growth_factor/backoff_factor '
                    '(GradScaler) are given; the GradScaler values were kept and '
                    'scale_factor dropped; keep only one spelling'
                )
                continue
            if not (is_number(val) and val > 1):
                problems.append(
                    f'{where}.scale_factor: {val!r} is not a number > 1; kept as is, fix it'
                )
                out[key] = val
                continue
            out['growth_factor'] = val
            out['backoff_factor'] = 1 / val
        elif key == 'scale_window':
            if 'growth_interval' in args:
                problems.append(
                    f'{where}: both scale_window (mmcv) and growth_interval (GradScaler) '
                    'are given; growth_interval was kept and scale_window dropped'
                )
                continue
            out['growth_interval'] = val if (whole := as_whole(val)) is None else whole
        elif key in GRAD_SCALER_ARGS:  # 2.0 -> 2: GradScaler's update needs an int interval
            out[key] = whole if key == 'growth_interval' and (whole := as_whole(val)) else val
        else:
            problems.append(
                f'{where}.{key}: not an argument of mmcv LossScaler, torch GradScaler or the '
                f'loss-scale policy ({", ".join(POLICY_ARGS)}); kept as is, remove or rename it'
            )
            out[key] = val
    if len(problems) == problems_before:  # what the wrappers would say when built, said here
        try:
            parse_loss_scale({**out, **policy}, where)  # the policy checked with the scale
        except ValueError as err:
            problems.append(f'{err} Kept as is, fix it'.rstrip('.'))
        else:
            if deepspeed:
                deepspeed_defaults(out, policy, where, notes, faithful)
            elif any(k in value for k in ('mode', 'scale_factor', 'scale_window')):
                _mmcv_defaults(args, out, where, notes, faithful)  # a LossScaler dict
    out.update(policy)
    out.update(kept)
    # Keep the documented order: init_scale, growth_factor, backoff_factor, ..., the policy.
    order = list(GRAD_SCALER_ARGS) + list(POLICY_ARGS)
    return {k: out[k] for k in sorted(out, key=lambda k: order.index(k) if k in order else 99)}


def _mmcv_defaults(args: dict[str, Any], out: dict[str, Any], where: str,
                   notes: Optional[list[str]], faithful: bool) -> None:
    """An mmcv dynamic dict missing init_scale/scale_window: its defaults differ from torch's."""
    missing = {}
    if 'init_scale' not in args:
        missing['init_scale'] = ('2**32', '2**16', MMCV_DYNAMIC.init_scale)
    if 'scale_window' not in args and 'growth_interval' not in args:
        missing['growth_interval'] = (str(MMCV_DYNAMIC.growth_interval),
                                      str(TORCH_DYNAMIC.growth_interval),
                                      MMCV_DYNAMIC.growth_interval)
    if not missing:
        return
    said = '; '.join(f'{k}: mmcv LossScaler {a}, GradScaler {b}' for k, (a, b, _) in
                     missing.items())
    if faithful:
        for key, (_, _, val) in missing.items():
            out[key] = val
        if notes is not None:
            notes.append(f"{where}: mmcv's defaults written out ({said}) (--faithful); {_SEE}")
        return
    if notes is not None:
        wanted = ', '.join(f'{k}={"2.**32" if k == "init_scale" else v}' for k, (_, _, v) in
                           missing.items())
        notes.append(
            f'{where}: the dict leaves out {", ".join(missing)}, whose default changes '
            f'({said}); GradScaler\'s default was kept; add {wanted} for mmcv\'s, or pass '
            f'--faithful; {_SEE}'
        )
