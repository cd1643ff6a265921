"""Loss scaler states: mmcv's ``LossScaler`` keys and ``GradScaler``'s, checked and converted.

A state written with a scale policy that is not the default also carries the policy
keys (:data:`~fp16utils._args.policy.POLICY_STATE_KEYS`); mmcv and torch ignore them
when they load it, and the conversions carry them over.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, Mapping, Optional, Tuple

from .limits import SCALE_RANGE, positive_finite, real_number, usable_scale
from .numbers import as_whole, window_note
from .policy import POLICY_STATE_KEYS, check_policy_state

__all__ = ['GRAD_SCALER_STATE_KEYS', 'MMCV_STATE_KEYS', 'check_scaler_state',
           'grad_scaler_to_mmcv_state', 'mmcv_to_grad_scaler_state']

logger = logging.getLogger('fp16utils')

MMCV_STATE_KEYS = ('cur_scale', 'cur_iter', 'mode', 'last_overflow_iter', 'scale_factor',
                   'scale_window')
GRAD_SCALER_STATE_KEYS = ('scale', 'growth_factor', 'backoff_factor', 'growth_interval',
                          '_growth_tracker')
#: GradScaler's default growth factor, given to a static mmcv state (which never grows).
_TORCH_GROWTH_FACTOR = 2.0


def mmcv_to_grad_scaler_state(state: Mapping[str, Any]) -> Tuple[Dict[str, Any], bool]:
    """An mmcv ``LossScaler`` state as GradScaler's, and whether it is static."""
    # Both grow on the same step when tracker = (cur_iter - last_overflow_iter - 1) % window.
    window = int(state['scale_window'])
    factor = float(state['scale_factor'])
    tracker = (int(state['cur_iter']) - int(state['last_overflow_iter']) - 1) % window
    static = state['mode'] == 'static'
    if factor <= 1:  # a static scale never grows: keep values GradScaler takes
        factor = _TORCH_GROWTH_FACTOR
    return {
        'scale': float(state['cur_scale']),
        'growth_factor': factor,
        'backoff_factor': 1.0 / factor,
        'growth_interval': window,
        '_growth_tracker': tracker,
        **_policy_keys(state),
    }, static


def grad_scaler_to_mmcv_state(state: Mapping[str, Any], static: bool) -> Dict[str, Any]:
    """A GradScaler state as mmcv's ``LossScaler`` keys (the inverse mapping)."""
    growth = float(state['growth_factor'])
    backoff = float(state['backoff_factor'])
    if not math.isclose(growth * backoff, 1.0, rel_tol=1e-6):
        logger.warning(
            'Loading a GradScaler state (growth_factor=%s, backoff_factor=%s) into the legacy '
            "backend's LossScaler, which backs off by 1/growth_factor; backoff_factor is "
            'ignored.', growth, backoff)
    return {
        'cur_scale': float(state['scale']),
        'cur_iter': int(state['_growth_tracker']),
        'mode': 'static' if static else 'dynamic',
        'last_overflow_iter': -1,
        'scale_factor': growth,
        'scale_window': int(state['growth_interval']),
        **_policy_keys(state),
    }


def _policy_keys(state: Mapping[str, Any]) -> Dict[str, Any]:
    """The scale-policy keys of a scaler state, carried over to the other format."""
    return {key: state[key] for key in POLICY_STATE_KEYS if key in state}


def _state_error(owner: str, key: str, value: Any, expected: str) -> ValueError:
    return ValueError(f'{owner}: the loss scaler state has {key}={value!r}; expected '
                      f'{expected}. Load a state written by GradScaler.state_dict() or '
                      'LossScaler.state_dict().')


def _check_int(state: Mapping[str, Any], key: str, owner: str, low: Optional[int]) -> int:
    value = as_whole(state[key])  # an int, or a float without a fraction (mmcv keeps 2.0)
    if value is None or (low is not None and value < low):
        raise _state_error(owner, key, state[key], ('a whole number' if low is None else
                           f'a whole number >= {low}') + window_note(state[key]))
    return value


def _check_factor(state: Mapping[str, Any], key: str, owner: str, above_one: bool) -> float:
    value = state[key]
    ok = positive_finite(value) and (value > 1 if above_one else value < 1)
    if not ok:
        raise _state_error(owner, key, value, 'a finite number > 1' if above_one
                           else 'a number in (0, 1)')
    return float(value)


def check_scaler_state(state: Any, owner: str, *, unit_factor: bool = False) -> str:
    """Check a scaler state's keys, types and ranges; say its format, ``'mmcv'`` or ``'torch'``."""
    if not isinstance(state, Mapping):
        raise TypeError(f'{owner}: a loss scaler state must be a dict, got '
                        f'{type(state).__name__}.')
    if 'cur_scale' in state:
        keys, kind = MMCV_STATE_KEYS, 'mmcv'
    else:
        keys, kind = GRAD_SCALER_STATE_KEYS, 'torch'
    missing = [k for k in keys if k not in state]
    if missing:
        raise KeyError(
            f'{owner}: the loss scaler state {sorted(state, key=str)} is missing {missing}; '
            f'expected GradScaler.state_dict() keys {list(GRAD_SCALER_STATE_KEYS)} or mmcv '
            f'LossScaler keys {list(MMCV_STATE_KEYS)}.')
    unknown = sorted(set(state) - set(keys) - set(POLICY_STATE_KEYS), key=str)
    if unknown:
        raise ValueError(f'{owner}: the loss scaler state has the unknown key(s) {unknown}; '
                         f'a {kind} state has exactly the keys {list(keys)} (and, written '
                         f'with a scale policy, {list(POLICY_STATE_KEYS)}).')
    check_policy_state(state, owner)
    scale_key = 'cur_scale' if kind == 'mmcv' else 'scale'
    scale = state[scale_key]
    if not usable_scale(scale):
        raise _state_error(owner, scale_key, scale, SCALE_RANGE)
    if kind == 'torch':
        _check_factor(state, 'growth_factor', owner, True)
        _check_factor(state, 'backoff_factor', owner, False)
        interval = _check_int(state, 'growth_interval', owner, 1)
        tracker = _check_int(state, '_growth_tracker', owner, 0)
        if tracker >= interval:
            raise _state_error(owner, '_growth_tracker', tracker,
                               f'a whole number in [0, growth_interval={interval})')
        return kind
    mode = state['mode']
    if mode not in ('dynamic', 'static'):
        raise _state_error(owner, 'mode', mode, "'dynamic' or 'static'")
    factor = state['scale_factor']
    # unit_factor: LossScaler itself also holds a dynamic scale_factor of 1 (a fixed scale).
    if mode == 'dynamic' and not (unit_factor and real_number(factor) == 1):
        _check_factor(state, 'scale_factor', owner, True)
    elif not positive_finite(factor):
        raise _state_error(owner, 'scale_factor', factor, 'a finite number > 0')
    _check_int(state, 'scale_window', owner, 1)
    cur_iter = _check_int(state, 'cur_iter', owner, 0)
    last = _check_int(state, 'last_overflow_iter', owner, None)
    if last > cur_iter:
        raise _state_error(owner, 'last_overflow_iter', last,
                           f'an int <= cur_iter={cur_iter} (-1: no overflow yet)')
    return kind
