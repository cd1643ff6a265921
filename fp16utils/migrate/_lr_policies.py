"""mmcv 1.7.2's lr/momentum policies as MMEngine 0.10 schedulers (one builder per policy).

Each builder takes the policy's arguments (``policy``/warmup keys removed) and returns the
1.x scheduler dicts; one that has no 1.x form raises :class:`NoForm`. Why each form is
exact (or how far it is not) is worked out in docs/migration/schedule.md.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Optional

from ._lr_context import Horizon, NoForm

__all__ = ['LR_POLICIES', 'MOMENTUM_POLICIES', 'RESTARTING']

#: Schedulers that set absolute values (not a factor of the current one): they go first.
RESTARTING = frozenset({'CosineRestartLR', 'CosineRestartMomentum', 'OneCycleLR'})

Builder = Callable[[dict[str, Any], 'Ctx'], list[dict[str, Any]]]


class Ctx:
    """What a builder needs: the horizon, the 1.x names, the base value, where it is."""

    def __init__(self, horizon: Horizon, suffix: str, where: str, base: float,
                 base_found: bool, notes: list[str]) -> None:
        """Keep what the builders read."""
        self.horizon = horizon
        self.suffix = suffix  # 'LR' or 'Momentum'
        self.where = where  # 'lr_config' or 'momentum_config'
        self.base = base
        self.base_found = base_found
        self.notes = notes

    def name(self, stem: str) -> str:
        """The 1.x scheduler type for ``stem`` ('MultiStep' -> 'MultiStepLR')."""
        return stem + self.suffix

    def whose(self, what: str = 'value') -> str:
        """Which base value a rewritten factor was computed for, in a note's words."""
        if self.base_found:
            return f'the optimizer {what} {self.base!r}'
        return f'a base {what} of 1.0 (the config has none)'

    def span(self, args: dict[str, Any], needs_length: bool,
             default_by_epoch: bool = True) -> tuple[Optional[int], dict[str, Any]]:
        """``(length, unit keys)`` for the policy's ``by_epoch``; unit keys go in each dict."""
        by_epoch = bool(args.pop('by_epoch', default_by_epoch))
        length, sched_epoch, convert = self.horizon.unit(by_epoch, needs_length, self.where)
        keys: dict[str, Any] = {'by_epoch': sched_epoch}
        if convert:
            keys['convert_to_iter_based'] = True
        return length, keys


def _reject_rest(args: dict[str, Any], ctx: Ctx) -> None:
    """Arguments the policy does not take: mmcv raised TypeError on them."""
    if args:
        names = ', '.join(sorted(args))
        raise NoForm(f'{ctx.where}: {names} is not an argument of this policy (mmcv raised '
                     'TypeError); remove it and convert again', 'policies')


def _floor(args: dict[str, Any], ctx: Ctx, abs_key: str, ratio_key: str) -> dict[str, Any]:
    """``min_lr``/``min_lr_ratio`` (exactly one, as mmcv asserts) as ``eta_min(_ratio)``."""
    low, ratio = args.pop(abs_key, None), args.pop(ratio_key, None)
    if (low is None) == (ratio is None):
        raise NoForm(f'{ctx.where}: give exactly one of {abs_key} and {ratio_key} (mmcv '
                     'asserted this); fix it and convert again', 'policies')
    return {'eta_min': low} if ratio is None else {'eta_min_ratio': ratio}


def _end(length: Optional[int], extra: int = 0) -> dict[str, Any]:
    """``begin``/``end`` keys (``end`` only when the length is known)."""
    return {'begin': 0} if length is None else {'begin': 0, 'end': length + extra}


def _fixed(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """Fixed: no scheduler (a warmup only)."""
    args.pop('by_epoch', None)
    _reject_rest(args, ctx)
    return []


def _step(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """Step: StepLR (int step) or MultiStepLR (list); a floor binds as a last decay."""
    step = args.pop('step')
    gamma = args.pop('gamma', 0.1 if ctx.suffix == 'LR' else 0.5)
    low = args.pop('min_lr' if ctx.suffix == 'LR' else 'min_momentum', None)
    length, unit = ctx.span(args, needs_length=False)
    _reject_rest(args, ctx)
    if unit.pop('convert_to_iter_based', False):  # iterations are known: no conversion
        unit['by_epoch'] = False
    if isinstance(step, bool) or not (
            (isinstance(step, int) and step > 0)
            or (isinstance(step, list) and step
                and all(isinstance(s, int) and not isinstance(s, bool) and s > 0 for s in step))):
        raise NoForm(f'{ctx.where}.step: {step!r} is not a positive int or a list of them '
                     '(mmcv refused it); fix it and convert again', 'policies')
    if low is not None:
        clipped = _clipped_steps(step, gamma, low, length, ctx)
        if clipped is not None:
            return [{**s, **_end(length), **unit} for s in clipped]
    if isinstance(step, int):
        head: dict[str, Any] = {'type': ctx.name('Step'), 'step_size': step}
    else:
        head = {'type': ctx.name('MultiStep'), 'milestones': list(step)}
    return [{**head, 'gamma': gamma, **_end(length), **unit}]


def _clipped_steps(step: Any, gamma: float, low: float, length: Optional[int],
                   ctx: Ctx) -> Optional[list[dict[str, Any]]]:
    """Step decay floored at ``low`` for the optimizer's base value; None: never floored."""
    if isinstance(step, int):
        if not 0 < gamma < 1 or low <= 0:
            return None  # never floored
        count = 1  # decays until the floor binds (where it does, horizon or not)
        while ctx.base * gamma ** count >= low and count < 10000:
            count += 1
        milestones = [step * k for k in range(1, count + 1)]
        if length is not None:
            milestones = [m for m in milestones if m < length] or milestones[:1]
    else:
        milestones = sorted(step)
    value, kept = ctx.base, []
    for mile in milestones:
        if value * gamma >= low:
            value *= gamma
            kept.append(mile)
            continue
        out = [{'type': ctx.name('MultiStep'), 'milestones': kept, 'gamma': gamma}] if kept else []
        if value - low > 1e-12 * low:  # the last decay stops at the floor (not rounding)
            out.append({'type': ctx.name('MultiStep'), 'milestones': [mile],
                        'gamma': low / value})
        key = 'min_lr' if ctx.suffix == 'LR' else 'min_momentum'
        whose = ctx.whose()
        ctx.notes.append(
            f'{ctx.where}.{key}: {low!r} (a floor; no 1.x argument) became the last decay '
            f'factor for {whose}: param groups with another base value (lr_mult) are floored '
            'elsewhere; see docs/migration/schedule.md#approximations')
        return out
    return None


def _exp(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """Exp: ExponentialLR."""
    gamma = args.pop('gamma')
    length, unit = ctx.span(args, needs_length=False)
    _reject_rest(args, ctx)
    if unit.pop('convert_to_iter_based', False):
        unit['by_epoch'] = False
    return [{'type': ctx.name('Exponential'), 'gamma': gamma, **_end(length), **unit}]


def _poly(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """Poly: PolyLR ending one step after the horizon (MMEngine reaches eta_min at end - 1)."""
    power = args.pop('power', 1.)
    low = args.pop('min_lr', 0.)
    length, unit = ctx.span(args, needs_length=True)
    _reject_rest(args, ctx)
    # PolyLR reaches eta_min at step end-1; mmcv's poly at max_iters: end = length + 1
    extra = 0 if unit.get('convert_to_iter_based') else 1
    return [{'type': 'PolyLR', 'eta_min': low, 'power': power, **_end(length, extra), **unit}]


def _inv(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """Inv: no MMEngine scheduler."""
    raise NoForm(f'{ctx.where}: the Inv policy (lr * (1 + gamma * t) ** -power) has no MMEngine '
                 'scheduler; write a custom one', 'no-1x-form')


def _cosine(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """CosineAnnealing: CosineAnnealingLR/-Momentum over the whole horizon."""
    if ctx.suffix == 'LR':
        floor = _floor(args, ctx, 'min_lr', 'min_lr_ratio')
    else:
        floor = _floor(args, ctx, 'min_momentum', 'min_momentum_ratio')
    length, unit = ctx.span(args, needs_length=True)
    _reject_rest(args, ctx)
    return [{'type': ctx.name('CosineAnnealing'), 'T_max': length, **floor,
             **_end(length), **unit}]


def _flat_cosine(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """FlatCosineAnnealing: CosineAnnealingLR from round(T * start_percent) to T."""
    pct = args.pop('start_percent', 0.75)
    floor = _floor(args, ctx, 'min_lr', 'min_lr_ratio')
    length, unit = ctx.span(args, needs_length=True)
    _reject_rest(args, ctx)
    assert length is not None
    if not isinstance(pct, float) or not 0 <= pct <= 1:
        raise NoForm(f'{ctx.where}.start_percent: {pct!r} is not a float in [0, 1] (mmcv '
                     'refused it); fix it and convert again', 'policies')
    if unit.get('convert_to_iter_based') and not float(length * pct).is_integer():
        raise NoForm(f'{ctx.where}: by_epoch=False under an epoch-based runner starts the '
                     f'cosine at round(max_iters * {pct}), which is not a whole epoch here; '
                     'the start depends on the iterations per epoch: write the schedule by hand',
                     'horizons')
    start = round(length * pct)
    if start >= length:
        return []
    return [{'type': 'CosineAnnealingLR', 'T_max': length - start, **floor,
             'begin': start, 'end': length, **unit}]


def _restart(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """CosineRestart: CosineRestartLR, restart weights rewritten for mmcv's restart value."""
    periods = args.pop('periods')
    weights = list(args.pop('restart_weights', [1]))
    floor = _floor(args, ctx, 'min_lr', 'min_lr_ratio')
    length, unit = ctx.span(args, needs_length=False)
    _reject_rest(args, ctx)
    if unit.pop('convert_to_iter_based', False):
        unit['by_epoch'] = False
    if not isinstance(periods, (list, tuple)) or len(periods) != len(weights):
        raise NoForm(f'{ctx.where}: periods {periods!r} and restart_weights {weights!r} must '
                     'have the same length (mmcv asserted this); fix them', 'policies')
    # mmcv restarts at w * base + (1 - w) * floor, MMEngine at w' * base: w' = w + (1 - w) r
    ratio = floor.get('eta_min_ratio')
    if ratio is None and floor['eta_min'] and any(w != 1 for w in weights):
        ratio = floor['eta_min'] / ctx.base
        whose = ctx.whose('lr')
        ctx.notes.append(
            f'{ctx.where}.restart_weights: mmcv restarts at w * base_lr + (1 - w) * min_lr, '
            f'MMEngine at w * base_lr; the weights were rewritten for {whose}: param groups '
            'with another base lr (lr_mult) restart elsewhere; see '
            'docs/migration/schedule.md#approximations')
    if ratio:
        weights = [w + (1 - w) * ratio for w in weights]
    if len(periods) == 1 and weights == [1]:  # one cosine: upstream's own form
        return [{'type': ctx.name('CosineAnnealing'), 'T_max': periods[0], **floor,
                 'begin': 0, 'end': periods[0], **unit}]
    return [{'type': ctx.name('CosineRestart'), 'periods': list(periods),
             'restart_weights': weights, **floor, **_end(length), **unit}]


def _cyclic(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """Cyclic (cosine): two CosineRestart schedulers per cycle, up then down."""
    default = (10, 1e-4) if ctx.suffix == 'LR' else (0.85 / 0.95, 1.)
    target = args.pop('target_ratio', default)
    times = args.pop('cyclic_times', 1)
    up_ratio = args.pop('step_ratio_up', 0.4)
    strategy = args.pop('anneal_strategy', 'cos')
    gamma = args.pop('gamma', 1)
    length, unit = ctx.span(args, needs_length=True, default_by_epoch=False)
    _reject_rest(args, ctx)
    if unit['by_epoch']:
        raise NoForm(f'{ctx.where}: the Cyclic policy needs by_epoch=False (mmcv asserted '
                     'this) and runner.max_iters', 'horizons')
    if isinstance(target, float):
        target = (target, target / 1e5)
    elif isinstance(target, (tuple, list)) and len(target) == 1:
        target = (target[0], target[0] / 1e5)
    if strategy != 'cos':
        raise NoForm(f"{ctx.where}.anneal_strategy: {strategy!r}: MMEngine anneals only with "
                     "cosines from a restart; use anneal_strategy='cos' or write the schedule "
                     'by hand', 'no-1x-form')
    assert length is not None
    if isinstance(times, bool) or not isinstance(times, int) or not 0 < times <= length:
        raise NoForm(f'{ctx.where}.cyclic_times: {times!r} is not an int in [1, max_iters] '
                     '(mmcv divided by zero)', 'policies')
    period = length // times
    up = int(up_ratio * period)
    out: list[dict[str, Any]] = []
    for cycle in range(math.ceil(length / period)):
        scale = gamma ** cycle
        peak = 1 - scale + target[0] * scale
        begin = cycle * period
        if up:
            out.append({'type': ctx.name('CosineRestart'), 'periods': [up],
                        'restart_weights': [1], 'eta_min_ratio': peak,
                        'begin': begin, 'end': begin + up, **unit})
        end = min(begin + period, length)
        if end > begin + up:
            out.append({'type': ctx.name('CosineRestart'), 'periods': [period - up],
                        'restart_weights': [peak], 'eta_min_ratio': target[1],
                        'begin': begin + up, 'end': end, **unit})
    return out


def _one_cycle(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """OneCycle: OneCycleLR (the lr only)."""
    if ctx.suffix != 'LR':
        raise NoForm(f'{ctx.where}: the OneCycle momentum policy has no MMEngine scheduler '
                     '(OneCycleLR schedules the lr only); write the momentum schedule by hand',
                     'no-1x-form')
    max_lr = args.pop('max_lr')
    total = args.pop('total_steps', None)
    rest = {k: args.pop(k) for k in ('pct_start', 'anneal_strategy', 'div_factor',
                                     'final_div_factor', 'three_phase') if k in args}
    if isinstance(max_lr, dict):
        raise NoForm(f'{ctx.where}.max_lr: {max_lr!r} (one per optimizer) has no 1.x form in one '
                     'param_scheduler list; write param_scheduler as a dict per optimizer',
                     'no-1x-form')
    length, unit = ctx.span(args, needs_length=total is None, default_by_epoch=False)
    _reject_rest(args, ctx)
    if unit['by_epoch'] and not unit.get('convert_to_iter_based'):
        raise NoForm(f'{ctx.where}: the OneCycle policy needs by_epoch=False (mmcv asserted '
                     'this)', 'horizons')
    if unit.get('convert_to_iter_based'):
        if total is None:
            raise NoForm(f'{ctx.where}: OneCycle without total_steps reads runner.max_iters, '
                         'which an epoch-based runner knows only at run time; set total_steps '
                         'and convert again', 'horizons')
        unit = {'by_epoch': False}
    steps = total if total is not None else length
    if length is not None and total is not None and total < length:
        raise NoForm(f'{ctx.where}.total_steps: {total!r} is below max_iters={length} (mmcv '
                     'raised ValueError)', 'policies')
    return [{'type': 'OneCycleLR', 'eta_max': max_lr, 'total_steps': steps, **rest,
             'begin': 0, 'end': steps, **unit}]


def _linear(args: dict[str, Any], ctx: Ctx) -> list[dict[str, Any]]:
    """LinearAnnealing: LinearLR/-Momentum from 1 to the floor ratio, ending at T + 1."""
    if ctx.suffix == 'LR':
        abs_key, ratio_key = 'min_lr', 'min_lr_ratio'
    else:
        abs_key, ratio_key = 'min_momentum', 'min_momentum_ratio'
    floor = _floor(args, ctx, abs_key, ratio_key)
    length, unit = ctx.span(args, needs_length=True)
    _reject_rest(args, ctx)
    ratio = floor.get('eta_min_ratio')
    if ratio is None:
        ratio = floor['eta_min'] / ctx.base
        if floor['eta_min']:
            whose = ctx.whose()
            ctx.notes.append(
                f'{ctx.where}.{abs_key}: {floor["eta_min"]!r} became end_factor={ratio!r} '
                f'of {whose}; param groups with another base value end elsewhere; see '
                'docs/migration/schedule.md#approximations')
    if not 0 <= ratio <= 1:
        raise NoForm(f'{ctx.where}: a linear anneal to {ratio!r} x the base value rises; '
                     "MMEngine's Linear schedulers only fall (end_factor <= 1)", 'no-1x-form')
    extra = 0 if unit.get('convert_to_iter_based') else 1
    return [{'type': ctx.name('Linear'), 'start_factor': 1.0, 'end_factor': ratio,
             **_end(length, extra), **unit}]


LR_POLICIES: dict[str, Builder] = {
    'Fixed': _fixed, 'Step': _step, 'Exp': _exp, 'Poly': _poly, 'Inv': _inv,
    'CosineAnnealing': _cosine, 'FlatCosineAnnealing': _flat_cosine,
    'CosineRestart': _restart, 'Cyclic': _cyclic, 'OneCycle': _one_cycle,
    'LinearAnnealing': _linear,
}
MOMENTUM_POLICIES: dict[str, Builder] = {
    'Step': _step, 'CosineAnnealing': _cosine, 'LinearAnnealing': _linear,
    'Cyclic': _cyclic, 'OneCycle': _one_cycle,
}
