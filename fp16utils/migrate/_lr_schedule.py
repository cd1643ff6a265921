"""0.x ``lr_config``/``momentum_config`` -> 1.x ``param_scheduler``.

mmcv 1.7.2 computed ``regular(t) * warmup_factor(i)`` (t: the epoch or iteration of the
policy, i: the iteration); MMEngine chains schedulers, each working from the current
value. Warmups become ``ConstantLR``/``LinearLR`` (exp: ``LinearLR`` + ``ExponentialLR``)
ending one step after mmcv's ``warmup_iters`` (MMEngine reaches the end factor at
``end - 1``); each policy becomes the scheduler(s) of ``_lr_policies``. Every converted
schedule is stepped against mmcv's rule (``_lr_curves``): where the two differ, a note
gives the largest relative difference and where it is.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping
from typing import Any, Optional

from ._lr_context import SEE, Horizon, NoForm, base_value, read_horizon
from ._lr_curves import EPOCH_LENGTH, largest_difference
from ._lr_policies import LR_POLICIES, MOMENTUM_POLICIES, RESTARTING, Ctx

__all__ = ['convert_lr_schedule']

_KEYS = ('lr_config', 'momentum_config')
_WARMUP_KEYS = ('warmup', 'warmup_iters', 'warmup_ratio', 'warmup_by_epoch')
#: Relative differences up to this are rounding (chained products over long schedules).
_ROUNDING = 1e-9
#: Schedulers whose every step multiplies the current value by a factor.
_FACTORS = frozenset({'MultiStepLR', 'StepLR', 'ExponentialLR', 'LinearLR', 'ConstantLR'})
#: Above this relative difference the closest form is no sensible form: a problem.
_FAR = 0.1


def convert_lr_schedule(out: dict[str, Any], problems: list[str], notes: list[str]) -> None:
    """Replace ``lr_config``/``momentum_config`` in ``out`` by ``param_scheduler`` (in place).

    ``param_scheduler`` takes the place of ``lr_config`` (of ``momentum_config`` when
    there is no ``lr_config``) in the key order: the lr schedulers, then the momentum
    ones. ``None`` means no schedule: the key goes. A schedule with no 1.x form is left
    out, with one line in ``problems``; an approximate one gets a line in ``notes``.
    ``runner``/``total_epochs``/``total_iters`` are read, never changed.

    Args:
        out: the config being converted (the optimizer pass has run).
        problems: receives one line per schedule (or value) not converted.
        notes: receives one line per schedule converted approximately.

    Example:
        >>> cfg = dict(runner=dict(type='EpochBasedRunner', max_epochs=12),
        ...            lr_config=dict(policy='step', step=[8, 11]))
        >>> convert_lr_schedule(cfg, [], [])
        >>> cfg['param_scheduler']
        [{'type': 'MultiStepLR', 'milestones': [8, 11], 'gamma': 0.1, 'begin': 0, 'end': 12, \
'by_epoch': True}]
    """
    present = [k for k in _KEYS if k in out]
    if not present:
        return
    horizon = read_horizon(out)
    parts: list[dict[str, Any]] = []
    converted = False
    for key in present:
        value = out[key]
        if value is None:
            continue
        if 'param_scheduler' in out:
            problems.append(
                f'{key}: {value!r} was left out: the config already has a param_scheduler '
                f'(kept as it is); merge the two by hand; see {SEE}#the-conversion')
            continue
        got = _convert(out, key, value, horizon, problems, notes)
        if got is not None:
            parts.extend(got)
            converted = True
    result: dict[str, Any] = {}
    for key, value in out.items():
        if key in _KEYS:
            if converted and key == present[0]:
                result['param_scheduler'] = parts
            continue
        result[key] = value
    out.clear()
    out.update(result)


def _convert(out: Mapping[str, Any], key: str, value: Any, horizon: Horizon,
             problems: list[str], notes: list[str]) -> Optional[list[dict[str, Any]]]:
    """One 0.x key's schedulers, or None (with a problem line) when it has no 1.x form."""
    momentum = key == 'momentum_config'
    try:
        if not isinstance(value, Mapping) or 'policy' not in value:
            raise NoForm(f'{key}: not a dict with a policy (mmcv asserted one)', 'policies')
        args = copy.deepcopy(dict(value))
        policy = args.pop('policy')
        if isinstance(policy, str) and policy == policy.lower():
            policy = policy.title()  # mmcv's own spelling rule: 'step' -> 'Step'
        table = MOMENTUM_POLICIES if momentum else LR_POLICIES
        hook = 'MomentumUpdaterHook' if momentum else 'LrUpdaterHook'
        if not isinstance(policy, str) or policy not in table:
            raise NoForm(f'{key}.policy: {policy!r} is not an mmcv 1.7.2 policy (a codebase\'s '
                         f'own {policy}{hook}?); MMEngine has no scheduler for it',
                         'unknown-policies')
        if not momentum and horizon.kind == 'iter':
            args.setdefault('by_epoch', False)  # IterBasedRunner.register_training_hooks
        warm = {k: args.pop(k) for k in _WARMUP_KEYS if k in args}
        if (args.get('by_epoch', policy not in ('Cyclic', 'OneCycle'))
                and (policy != 'Fixed' or warm.get('warmup') is not None)):
            horizon.unit(True, False, key)  # under an iteration-based runner: nothing ran
        check_args = {**args}
        base, found = base_value(out, 'momentum' if momentum else 'lr')
        local_notes: list[str] = []
        ctx = Ctx(horizon, 'Momentum' if momentum else 'LR', key, base, found, local_notes)
        warm_scheds = _warmup(key, warm, horizon, momentum)
        try:
            main = table[policy](args, ctx)
        except KeyError as err:
            raise NoForm(f'{key}: the {policy} policy needs {err.args[0]} (mmcv raised '
                         'TypeError without it)', 'policies') from None
    except NoForm as err:
        problems.append(f'{err.text}; {key}={value!r} was left out (MMEngine ignores it); '
                        f'write its param_scheduler entries by hand; see {SEE}#{err.section}')
        return None
    if any(s['type'] in RESTARTING for s in main):
        scheds = main + warm_scheds  # they set absolute values: the warmup factor comes after
    else:
        scheds = warm_scheds + main
    far = None if _surely_exact(main, warm_scheds) else _check(
        key, policy, check_args, warm, scheds, base, found, momentum, horizon)
    if far is not None and far[0] > _FAR:
        problems.append(
            f'{key}: MMEngine has no form of this schedule; the closest, param_scheduler='
            f'{scheds!r}, is off by up to {far[1]}; {key}={value!r} was left out (MMEngine '
            f'ignores it); write its param_scheduler entries by hand; see {SEE}#no-1x-form')
        return None
    notes.extend(local_notes)
    if far is not None:
        notes.append(f'{key}: the param_scheduler is approximate: largest relative difference '
                     f'{far[1]}; see {SEE}#approximations')
    return scheds


def _warmup(key: str, warm: dict[str, Any], horizon: Horizon,
            momentum: bool) -> list[dict[str, Any]]:
    """The warmup schedulers (raises NoForm on a value mmcv refused, or no 1.x form)."""
    kind = warm.get('warmup')
    if kind is None:
        return []
    if kind not in ('constant', 'linear', 'exp'):
        raise NoForm(f"{key}.warmup: {kind!r} is not 'constant', 'linear' or 'exp' (mmcv "
                     'raised ValueError)', 'warmup')
    iters = warm.get('warmup_iters', 0)
    if isinstance(iters, bool) or not isinstance(iters, int) or iters <= 0:
        raise NoForm(f'{key}.warmup_iters: {iters!r} is not a positive int (mmcv refused it)',
                     'warmup')
    ratio = warm.get('warmup_ratio', 0.9 if momentum else 0.1)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not 0 < ratio <= 1:
        raise NoForm(f'{key}.warmup_ratio: {ratio!r} is not in (0, 1] (mmcv asserted this)',
                     'warmup')
    if momentum:
        raise NoForm(f'{key}.warmup: mmcv divided the momentum by the warmup factor; MMEngine '
                     'has no scheduler for that', 'warmup')
    if warm.get('warmup_by_epoch'):
        if horizon.kind == 'iter':
            raise NoForm(f'{key}.warmup_by_epoch: True under an iteration-based runner: mmcv '
                         'never set the warmup length there (it failed an assert)', 'warmup')
        if kind == 'constant':
            return [{'type': 'ConstantLR', 'factor': ratio, 'begin': 0, 'end': iters + 1,
                     'by_epoch': True}]
        if kind == 'linear':
            return [{'type': 'LinearLR', 'start_factor': ratio, 'begin': 0, 'end': iters,
                     'by_epoch': True, 'convert_to_iter_based': True}]
        raise NoForm(f"{key}.warmup: 'exp' with warmup_by_epoch=True grows by a factor per "
                     'iteration that depends on the iterations per epoch; set warmup_iters in '
                     'iterations (warmup_by_epoch=False) and convert again', 'warmup')
    if kind == 'constant':
        return [{'type': 'ConstantLR', 'factor': ratio, 'begin': 0, 'end': iters + 1,
                 'by_epoch': False}]
    if kind == 'linear':
        return [{'type': 'LinearLR', 'start_factor': ratio, 'begin': 0, 'end': iters + 1,
                 'by_epoch': False}]
    return [{'type': 'LinearLR', 'start_factor': ratio, 'end_factor': ratio, 'begin': 0,
             'end': 1, 'by_epoch': False},
            {'type': 'ExponentialLR', 'gamma': ratio ** (-1 / iters), 'begin': 0,
             'end': iters + 1, 'by_epoch': False}]


def _surely_exact(main: list[dict[str, Any]], warm: list[dict[str, Any]]) -> bool:
    """Whether the chain is mmcv's curve by construction (no need to step the two).

    Each policy's scheduler alone gives mmcv's regular curve, except PolyLR/LinearLR
    converted to iterations (one iteration short); a warmup rides on it exactly when
    every step of the policy's schedulers is a pure factor of the current value.
    """
    kinds = [s['type'].replace('Momentum', 'LR') for s in main]
    if any(k in ('PolyLR', 'LinearLR') and s.get('convert_to_iter_based')
           for k, s in zip(kinds, main)):
        return False
    if not warm:
        return True
    if any(s.get('convert_to_iter_based') for s in warm):
        return False
    for kind, sched in zip(kinds, main):
        floored = kind in ('PolyLR', 'CosineAnnealingLR')
        if kind not in _FACTORS and not (
                floored and not sched.get('eta_min') and not sched.get('eta_min_ratio')):
            return False
    return True


def _check(key: str, policy: str, args: dict[str, Any], warm: dict[str, Any],
           scheds: list[dict[str, Any]], base: float, found: bool, momentum: bool,
           horizon: Horizon) -> Optional[tuple[float, str]]:
    """Step both curves over the whole run: None when equal, else (difference, where)."""
    if horizon.kind == 'epoch' and horizon.epochs is not None:
        length, count = EPOCH_LENGTH, horizon.epochs * EPOCH_LENGTH
    elif horizon.kind == 'iter' and horizon.iters is not None:
        length, count = horizon.iters, horizon.iters
    else:
        return None  # no horizon: only policies that need none got here, all exact
    rel, it, want, got = largest_difference(
        policy, args, warm, scheds, base, momentum=momentum, kind=horizon.kind,
        length=length, max_epochs=horizon.epochs, max_iters=horizon.iters)
    if rel <= _ROUNDING:
        return None
    what = 'momentum' if momentum else 'lr'
    per_epoch = (f' with {EPOCH_LENGTH} iterations per epoch (the figure depends on it)'
                 if horizon.kind == 'epoch' else '')
    of_base = '' if found else f' (for a base {what} of {base!r}: the config has none)'
    return rel, (f'{rel:.12g} at iteration {it} of {count}{per_epoch}: {what} {want:.12g} in '
                 f'mmcv, {got:.12g} in MMEngine{of_base}')
