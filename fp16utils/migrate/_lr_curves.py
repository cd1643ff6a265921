"""How far a converted schedule is from mmcv's: both curves, iteration by iteration.

:func:`largest_difference` steps mmcv 1.7.2's updater rule (regular value times the
warmup factor) and MMEngine 0.10's chained schedulers (each from the current value, in
list order, iteration-based ones after every iteration, epoch-based ones after every
epoch) for one param group, and returns the largest relative difference. The schedule
pass writes it into a note; tests/migration/test_lr_curves.py checks the figure against
the real mmcv and MMEngine.
"""

from __future__ import annotations

import math
from collections import Counter
from typing import Any, Optional

__all__ = ['EPOCH_LENGTH', 'largest_difference']

#: Iterations per epoch assumed where an epoch-based schedule's figure depends on it.
EPOCH_LENGTH = 100
_INF = 10 ** 12


def _cos(start: float, end: float, factor: float, weight: float = 1.) -> float:
    """mmcv's annealing_cos."""
    return end + 0.5 * weight * (start - end) * (math.cos(math.pi * factor) + 1)


def _lin(start: float, end: float, factor: float) -> float:
    """mmcv's annealing_linear."""
    return start + (end - start) * factor


class _Mmcv:
    """mmcv's regular value of one policy (progress in the policy's unit)."""

    def __init__(self, policy: str, args: dict[str, Any], base: float, momentum: bool,
                 max_iters: int) -> None:
        """Keep the policy; OneCycle's base is ``max_lr / div_factor``."""
        self.p, self.a, self.base, self.momentum = policy, args, base, momentum
        self.max_iters = max_iters
        if policy == 'OneCycle':
            self.base = args['max_lr'] / args.get('div_factor', 25)

    def _target(self, base: float) -> float:
        """``min_*_ratio * base`` or ``min_*``."""
        suffix = 'momentum' if self.momentum else 'lr'
        ratio = self.a.get(f'min_{suffix}_ratio')
        return base * ratio if ratio is not None else self.a[f'min_{suffix}']

    def value(self, progress: int, max_progress: int) -> Optional[float]:
        """The regular value (None where mmcv raised: past CosineRestart's periods)."""
        a, base, p = self.a, self.base, self.p
        if p == 'Fixed':
            return base
        if p == 'Step':
            step = a['step']
            exp = progress // step if isinstance(step, int) else next(
                (i for i, s in enumerate(step) if progress < s), len(step))
            value = base * a.get('gamma', 0.5 if self.momentum else 0.1) ** exp
            low = a.get('min_momentum' if self.momentum else 'min_lr')
            return value if low is None else max(value, low)
        if p == 'Exp':
            return base * a['gamma'] ** progress
        if p == 'Poly':
            low = a.get('min_lr', 0.)
            return (base - low) * (1 - progress / max_progress) ** a.get('power', 1.) + low
        if p == 'CosineAnnealing':
            return _cos(base, self._target(base), progress / max_progress)
        if p == 'LinearAnnealing':
            return _lin(base, self._target(base), progress / max_progress)
        if p == 'FlatCosineAnnealing':
            start = round(max_progress * a.get('start_percent', 0.75))
            if progress < start:
                return base
            return _cos(base, self._target(base), (progress - start) / (max_progress - start))
        if p == 'CosineRestart':
            return self._restart(progress)
        if p == 'Cyclic':
            return self._cyclic(progress)
        return self._one_cycle(progress)

    def _restart(self, progress: int) -> Optional[float]:
        """CosineRestart's value."""
        periods = self.a['periods']
        weights = self.a.get('restart_weights', [1])
        total = 0
        for period, weight in zip(periods, weights):
            if progress < total + period:
                alpha = min((progress - total) / period, 1)
                return _cos(self.base, self._target(self.base), alpha, weight)
            total += period
        return None

    def _cyclic(self, it: int) -> float:
        """Cyclic's value (cosine anneal only: the linear one has no 1.x form)."""
        a = self.a
        target = a.get('target_ratio', (0.85 / 0.95, 1.) if self.momentum else (10, 1e-4))
        if isinstance(target, float):
            target = (target, target / 1e5)
        elif len(target) == 1:
            target = (target[0], target[0] / 1e5)
        per_phase = self.max_iters // a.get('cyclic_times', 1)
        up = int(a.get('step_ratio_up', 0.4) * per_phase)
        cur, cycle = it % per_phase, it // per_phase
        scale = a.get('gamma', 1) ** cycle
        for start, end, s_ratio, e_ratio in ((0, up, 1, target[0]),
                                             (up, per_phase, target[0], target[1])):
            if start <= cur < end:
                if start == 0:
                    e_ratio = 1 - scale + e_ratio * scale
                else:
                    s_ratio = 1 - scale + s_ratio * scale
                return _cos(self.base * s_ratio, self.base * e_ratio,
                            (cur - start) / (end - start))
        raise AssertionError('unreachable')

    def _one_cycle(self, it: int) -> float:
        """OneCycle's value."""
        a = self.a
        total = a.get('total_steps') or self.max_iters
        pct, div = a.get('pct_start', 0.3), a.get('div_factor', 25)
        final = 1 / a.get('final_div_factor', 1e4)
        if a.get('three_phase', False):
            phases = [(float(pct * total) - 1, 1, div), (float(2 * pct * total) - 2, div, 1),
                      (total - 1, 1, final)]
        else:
            phases = [(float(pct * total) - 1, 1, div), (total - 1, div, final)]
        anneal = _lin if a.get('anneal_strategy', 'cos') == 'linear' else _cos
        start = 0.
        value = self.base
        for end, s_lr, e_lr in phases:
            if it <= end:
                value = anneal(self.base * s_lr, self.base * e_lr, (it - start) / (end - start))
                break
            start = end
        return value


def _warmup(kind: Optional[str], iters: int, ratio: float, it: int) -> float:
    """mmcv's warmup factor at iteration ``it`` (1 after warmup)."""
    if kind is None or it >= iters:
        return 1.
    if kind == 'constant':
        return ratio
    if kind == 'linear':
        return 1 - (1 - it / iters) * (1 - ratio)
    return ratio ** (1 - it / iters)


class _Sched:
    """One MMEngine scheduler (iteration- or epoch-stepped), for one param group."""

    def __init__(self, cfg: dict[str, Any], group: dict[str, float], max_epochs: int,
                 max_iters: int, length: int) -> None:
        """Build as MMEngine's Runner does (default end, convert_to_iter_based); step once."""
        c = dict(cfg)
        self.kind = c.pop('type').replace('Momentum', 'LR')
        self.by_epoch = c.pop('by_epoch', True)
        c.setdefault('end', max_epochs if self.by_epoch else max_iters)
        if c.pop('convert_to_iter_based', False):
            self.by_epoch = False
            for key in ('T_max', 'step_size', 'total_steps'):
                if c.get(key) is not None:
                    c[key] *= length
            if 'milestones' in c:
                c['milestones'] = [m * length for m in c['milestones']]
            if 'periods' in c:
                c['periods'] = [p * length for p in c['periods']]
            c['begin'] = int(c.get('begin', 0) * length)
            c['end'] = int(c['end'] * length)
        self.c, self.group = c, group
        self.begin, self.end = c.get('begin', 0), c['end']
        self.total = self.end - self.begin - 1
        if self.kind == 'OneCycleLR':
            steps = c.get('total_steps') or self.end - self.begin
            self.c['total_steps'] = steps
            group['initial'] = c['eta_max'] / c.get('div_factor', 25.)
            group['max'] = c['eta_max']
            group['min'] = group['initial'] / c.get('final_div_factor', 1e4)
        self.base = group['initial']
        self.last, self.glob = -1, -1
        self.step()

    def step(self) -> None:
        """MMEngine's ``_ParamScheduler.step``."""
        self.glob += 1
        if self.begin <= self.glob < self.end:
            self.last += 1
            self.group['v'] = self._get(self.group['v'], self.last)

    def _eta(self) -> float:
        """``eta_min`` or ``eta_min_ratio * base``."""
        ratio = self.c.get('eta_min_ratio')
        return self.base * ratio if ratio is not None else (self.c.get('eta_min') or 0.)

    def _get(self, v: float, ls: int) -> float:
        """The scheduler's chained ``_get_value`` for the current value ``v``."""
        c, k = self.c, self.kind
        if k == 'ConstantLR':
            if ls == 0:
                return v * c['factor']
            return v * (1.0 / c['factor']) if ls == self.total else v
        if k == 'LinearLR':
            s, e = c.get('start_factor', 1. / 3), c.get('end_factor', 1.)
            if ls == 0:
                return v * s
            return v * (1. + (e - s) / (self.total * s + (ls - 1) * (e - s)))
        if k == 'ExponentialLR':
            return v if ls == 0 else v * c['gamma']
        if k == 'StepLR':
            return v if ls == 0 or ls % c['step_size'] else v * c.get('gamma', .1)
        if k == 'MultiStepLR':
            counts = Counter(c['milestones'])
            return v * c.get('gamma', .1) ** counts[ls] if ls in counts else v
        if k == 'PolyLR':
            if ls == 0:
                return v
            eta = c.get('eta_min', 0)
            return (v - eta) * (1 - 1 / (self.total - ls + 1)) ** c.get('power', 1.) + eta
        if k == 'CosineAnnealingLR':
            t_max, eta = c.get('T_max') or self.end - self.begin, self._eta()
            if ls == 0:
                return v
            if (ls - 1 - t_max) % (2 * t_max) == 0:
                return v + (self.base - eta) * (1 - math.cos(math.pi / t_max)) / 2
            return ((1 + math.cos(math.pi * ls / t_max))
                    / (1 + math.cos(math.pi * (ls - 1) / t_max)) * (v - eta) + eta)
        if k == 'CosineRestartLR':
            return self._restart(v, ls)
        return self._one_cycle(ls)

    def _restart(self, v: float, ls: int) -> float:
        """CosineRestartLR's chained value."""
        total = 0
        for period, weight in zip(self.c['periods'], self.c.get('restart_weights', (1,))):
            if ls < total + period:
                step = ls - total
                if step == 0:
                    return self.base * weight
                eta = self._eta()
                return ((1 + math.cos(math.pi * step / period))
                        / (1 + math.cos(math.pi * (step - 1) / period)) * (v - eta) + eta)
            total += period
        return v

    def _one_cycle(self, ls: int) -> float:
        """OneCycleLR's value."""
        c, g = self.c, self.group
        total, pct = c['total_steps'], c.get('pct_start', 0.3)
        if c.get('three_phase', False):
            phases = [(float(pct * total) - 1, 'initial', 'max'),
                      (float(2 * pct * total) - 2, 'max', 'initial'),
                      (total - 1, 'initial', 'min')]
        else:
            phases = [(float(pct * total) - 1, 'initial', 'max'), (total - 1, 'max', 'min')]
        start = 0.
        for i, (end, s_key, e_key) in enumerate(phases):
            if ls <= end or i == len(phases) - 1:
                pct_now = (ls - start) / (end - start)
                if c.get('anneal_strategy', 'cos') == 'linear':
                    return (g[e_key] - g[s_key]) * pct_now + g[s_key]
                return g[e_key] + (g[s_key] - g[e_key]) / 2.0 * (math.cos(math.pi * pct_now) + 1)
            start = end
        raise AssertionError('unreachable')


def largest_difference(policy: str, args: dict[str, Any], warmup: dict[str, Any],
                       schedulers: list[dict[str, Any]], base: float, *, momentum: bool,
                       kind: str, length: int, max_epochs: Optional[int],
                       max_iters: Optional[int]) -> tuple[float, int, float, float]:
    """The largest relative difference between mmcv's curve and the schedulers' curve.

    Args:
        policy: mmcv's policy name (title case); ``args``: its arguments, ``by_epoch``
            included; ``warmup``: ``warmup``/``warmup_iters``/``warmup_ratio``/
            ``warmup_by_epoch`` as given.
        schedulers: the 1.x scheduler dicts, in list order.
        base: the optimizer's value (lr or momentum) of the param group checked.
        momentum: the schedule is a momentum one.
        kind: the runner, ``'epoch'`` or ``'iter'``; ``length``: iterations per epoch.
        max_epochs / max_iters: the runner's length (the one of ``kind``).

    Returns:
        ``(relative difference, iteration, mmcv value, MMEngine value)`` at the iteration
        where the relative difference is largest (the first such one).
    """
    if kind == 'epoch':
        assert max_epochs is not None
        max_iters = max_epochs * length
    else:
        length = max_iters = int(max_iters or 0)
        max_epochs = 1
    by_epoch = args.get('by_epoch', policy not in ('Cyclic', 'OneCycle'))
    rule = _Mmcv(policy, args, base, momentum, max_iters)
    w_iters = warmup.get('warmup_iters', 0)
    if warmup.get('warmup_by_epoch'):
        w_iters *= length
    w_kind, w_ratio = warmup.get('warmup'), warmup.get('warmup_ratio', 0.1)
    group: dict[str, float] = {'v': base, 'initial': base}
    scheds = [_Sched(s, group, max_epochs, max_iters, length) for s in schedulers]
    worst = (0., 0, base, base)
    for it in range(max_iters):
        epoch = it // length
        progress, top = (epoch, max_epochs) if by_epoch else (it, max_iters)
        regular = rule.value(progress, top)
        if regular is None:
            break
        want = regular * _warmup(w_kind, w_iters, w_ratio, it)
        got = group['v']
        rel = abs(got - want) / abs(want) if want else abs(got)
        if rel > worst[0]:
            worst = (rel, it, want, got)
        for s in scheds:
            if not s.by_epoch:
                s.step()
        if (it + 1) % length == 0:
            for s in scheds:
                if s.by_epoch:
                    s.step()
    return worst
