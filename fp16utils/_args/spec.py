"""What the training arguments mean: ``loss_scale``, ``clip_grad``, scaler states, policies.

One reading shared by the 1.x wrappers, the 0.x hooks and the config migration, so
they agree on what a value means and what is an error; mmcv's defaults are stated here.
"""

from __future__ import annotations

import logging
import math
from typing import Any, Dict, Mapping, NamedTuple, Optional, Tuple

from .limits import (  # the scale's floor, ceiling and steps live there; named here too
    MAX_LOSS_SCALE,
    MIN_LOSS_SCALE,
    SCALE_RANGE,
    grow_scale,
    positive_finite,
    shrink_scale,
    usable_scale,
)
from .numbers import as_whole, window_note
from .policy import (
    DEEPSPEED_NAMES,
    DEFAULT_POLICY,
    POLICY_KEYS,
    ScalePolicy,
    pop_policy,
    read_deepspeed_names,
)
from .states import (  # scaler states live there; named here too
    GRAD_SCALER_STATE_KEYS,
    MMCV_STATE_KEYS,
    check_scaler_state,
    grad_scaler_to_mmcv_state,
    mmcv_to_grad_scaler_state,
)

__all__ = [
    'GRAD_SCALER_ARGS', 'GRAD_SCALER_STATE_KEYS', 'LOSS_SCALER_ARGS', 'MAX_LOSS_SCALE',
    'MIN_LOSS_SCALE', 'MMCV_DYNAMIC', 'MMCV_INIT_SCALE', 'MMCV_LOSS_SCALE', 'MMCV_STATE_KEYS',
    'NONFINITE_POLICIES', 'NotADictError', 'SCALE_HISTORY_LEN', 'ScaleSpec', 'TORCH_DYNAMIC',
    'check_nonfinite_policy', 'check_positive_int', 'check_scale', 'check_scaler_state',
    'check_stats', 'grad_scaler_to_mmcv_state', 'grow_scale', 'is_number', 'is_positive_int',
    'mmcv_to_grad_scaler_state', 'nonfinite_error', 'parse_clip_grad', 'parse_loss_scale',
    'positive_finite', 'shrink_scale', 'ScalePolicy', 'DEFAULT_POLICY']

logger = logging.getLogger('fp16utils')

#: How many ``(step, scale)`` entries ``scale_history`` keeps (the latest ones).
SCALE_HISTORY_LEN = 64


class NotADictError(ValueError, AssertionError):
    """A setting that must be a dict is not one (an AssertionError too, as MMEngine raises)."""


def is_number(value: Any) -> bool:
    """Whether ``value`` is an int or a float (a bool is not a number here)."""
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def is_positive_int(value: Any) -> bool:
    """Whether ``value`` is an int >= 1 (a bool is not)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def check_scale(value: Any, owner: str, name: str) -> float:
    """``value`` as a float when it is a usable loss scale, else a ValueError naming it."""
    if not usable_scale(value):
        raise ValueError(f'{owner}: {name} must be {SCALE_RANGE}, got {value!r}.')
    return float(value)


def check_positive_int(value: Any, owner: str, name: str) -> int:
    """``value`` when it is an int >= 1, else a ValueError naming it."""
    if not is_positive_int(value):
        raise ValueError(f'{owner}: {name} must be an int >= 1, got {value!r}.')
    return value


# --------------------------------------------------------------------------- loss scale


class ScaleSpec(NamedTuple):
    """A parsed ``loss_scale`` argument, independent of the backend."""

    static: bool
    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    enabled: bool = True
    policy: ScalePolicy = DEFAULT_POLICY


#: mmcv's default ``loss_scale`` of ``Fp16OptimizerHook`` (a static scale).
MMCV_LOSS_SCALE = 512.0
#: mmcv ``LossScaler``'s default ``init_scale`` (an int, as mmcv writes it in checkpoints).
MMCV_INIT_SCALE = 2**32
#: ``'dynamic'`` with torch's GradScaler defaults (the 1.x wrappers, the native hook).
TORCH_DYNAMIC = ScaleSpec(False, 2.0**16, 2.0, 0.5, 2000)
#: ``'dynamic'`` with mmcv's LossScaler defaults (the legacy 0.x hook).
MMCV_DYNAMIC = ScaleSpec(False, float(MMCV_INIT_SCALE), 2.0, 0.5, 1000)

GRAD_SCALER_ARGS = ('init_scale', 'growth_factor', 'backoff_factor', 'growth_interval',
                    'enabled')
LOSS_SCALER_ARGS = ('init_scale', 'mode', 'scale_factor', 'scale_window')


def parse_loss_scale(loss_scale: Any, owner: str,
                     dynamic: ScaleSpec = TORCH_DYNAMIC) -> ScaleSpec:
    """``'dynamic'``, a number or a dict of either backend's scaler arguments, as a ScaleSpec."""
    usage = (f"{owner}: loss_scale must be 'dynamic', a positive number (a static scale) "
             'or a dict of scaler arguments (init_scale, growth_factor, backoff_factor, '
             'growth_interval, enabled; or mmcv\'s init_scale, mode, scale_factor, '
             'scale_window; and the policy keys min_scale, max_scale, hysteresis, '
             'consecutive_hysteresis, at_min_scale, or DeepSpeed\'s names)')
    if isinstance(loss_scale, str):
        if loss_scale == 'dynamic':
            return dynamic
        raise ValueError(f"{usage}; got the string {loss_scale!r}.")
    if is_number(loss_scale):
        if not usable_scale(loss_scale):
            raise ValueError(f'{usage}; got {loss_scale!r}, which is not {SCALE_RANGE}.')
        return dynamic._replace(static=True, init_scale=float(loss_scale))
    if not isinstance(loss_scale, Mapping):
        raise ValueError(f'{usage}; got {type(loss_scale).__name__} {loss_scale!r}.')
    args = dict(loss_scale)
    known = set(GRAD_SCALER_ARGS) | set(LOSS_SCALER_ARGS) | set(POLICY_KEYS) | set(
        DEEPSPEED_NAMES)
    unknown = sorted(set(args) - known, key=str)
    if unknown:
        raise ValueError(f'{usage}; got the unknown key(s) {unknown}.')
    for ours, theirs in (('growth_factor', 'scale_factor'), ('growth_interval', 'scale_window')):
        if ours in args and theirs in args:
            raise ValueError(f'{usage}; {ours!r} and {theirs!r} are the same setting in two '
                             'vocabularies: give only one of them.')
    read_deepspeed_names(args, usage)
    mode = args.get('mode', 'dynamic')
    if mode not in ('dynamic', 'static'):
        raise ValueError(f"{usage}; mode must be 'dynamic' or 'static', got {mode!r}.")
    static = mode == 'static'
    init_scale = args.get('init_scale', dynamic.init_scale)
    if not usable_scale(init_scale):
        raise ValueError(f'{usage}; init_scale must be {SCALE_RANGE}, got '
                         f'{init_scale!r}.')
    growth = args.get('growth_factor', args.get('scale_factor', dynamic.growth_factor))
    if 'backoff_factor' in args:
        backoff = args['backoff_factor']
    elif 'scale_factor' in args and positive_finite(growth):
        backoff = 1.0 / growth
    else:
        backoff = dynamic.backoff_factor
    interval = args.get('growth_interval', args.get('scale_window', dynamic.growth_interval))
    enabled = args.get('enabled', True)
    if not isinstance(enabled, bool):
        raise ValueError(f'{usage}; enabled must be True or False, got {enabled!r}.')
    factors_ok = (positive_finite(growth) and growth > 1 and positive_finite(backoff)
                  and backoff < 1)
    policy = pop_policy(args, usage, static=static, init_scale=float(init_scale))
    whole = as_whole(interval)  # 2.0 as mmcv takes it; 2.5 refused (see fp16utils._args.numbers)
    interval_ok = whole is not None and whole >= 1
    if static:
        # Growth and backoff never happen; keep valid values for GradScaler.
        if not factors_ok:
            growth, backoff = dynamic.growth_factor, dynamic.backoff_factor
        if not interval_ok:
            whole = dynamic.growth_interval
    else:
        if not factors_ok:
            raise ValueError(
                f'{usage}; a dynamic scale needs growth_factor (scale_factor) > 1 and '
                f'0 < backoff_factor < 1, got growth_factor={growth!r}, '
                f'backoff_factor={backoff!r}.')
        if not interval_ok:
            raise ValueError(f'{usage}; growth_interval (scale_window) must be a whole number '
                             f'>= 1, got {interval!r}{window_note(interval)}.')
    return ScaleSpec(static, float(init_scale), float(growth), float(backoff), whole, enabled,
                     policy)


def check_stats(stats: Any, owner: str) -> Tuple[int, list]:
    """Check saved skip statistics; return ``(skipped_steps, scale_history)``."""
    usage = (f"{owner}: the saved fp16 statistics must be a dict {{'skipped_steps': an int "
             ">= 0, 'scale_history': a list of (step, scale) pairs}}")
    if not isinstance(stats, Mapping) or set(stats) != {'skipped_steps', 'scale_history'}:
        raise ValueError(f'{usage}; got {stats!r}.')
    skipped = stats['skipped_steps']
    if not (isinstance(skipped, int) and not isinstance(skipped, bool) and skipped >= 0):
        raise ValueError(f'{usage}; got skipped_steps={skipped!r}.')
    history = stats['scale_history']
    if not isinstance(history, (list, tuple)):
        raise ValueError(f'{usage}; got scale_history={history!r}.')
    pairs = []
    for entry in history:
        ok = isinstance(entry, (list, tuple)) and len(entry) == 2
        if ok:
            step, scale = entry
            ok = (isinstance(step, int) and not isinstance(step, bool) and step >= 0
                  and positive_finite(scale) and scale <= MAX_LOSS_SCALE)
        if not ok:
            raise ValueError(f'{usage}; scale_history holds {entry!r}.')
        pairs.append((step, float(scale)))
    return skipped, pairs


def parse_clip_grad(clip_grad: Any, owner: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Validate ``clip_grad`` into ``('norm' | 'value', kwargs)`` (None: no clipping)."""
    if clip_grad is None:
        return None
    usage = (f"{owner}: clip_grad must be None, dict(max_norm=..., norm_type=2) to clip by "
             "norm, or dict(type='value', clip_value=...) to clip by value")
    if not isinstance(clip_grad, Mapping):
        raise NotADictError(f'If `clip_grad` is not None, it should be a `dict`. {usage}; got '
                            f'{clip_grad!r}.')
    if not clip_grad:
        raise ValueError(f'{usage}; got {clip_grad!r}.')
    kwargs = dict(clip_grad)
    kind = kwargs.pop('type', 'norm')
    if kind == 'norm':
        allowed = ('max_norm', 'norm_type', 'error_if_nonfinite', 'foreach')
        if 'max_norm' not in kwargs:
            raise ValueError(f'{usage}; clipping by norm needs max_norm, got {clip_grad!r}.')
        if not positive_finite(kwargs['max_norm']):
            raise ValueError(f"{usage}; max_norm must be a finite number > 0, got "
                             f"{kwargs['max_norm']!r}.")
        norm_type = kwargs.get('norm_type', 2.0)
        if norm_type in ('inf', 'Inf'):
            kwargs['norm_type'] = norm_type = math.inf
        if not (is_number(norm_type) and norm_type > 0):
            raise ValueError(f"{usage}; norm_type must be a number > 0 or 'inf', got "
                             f'{norm_type!r}.')
    elif kind == 'value':
        allowed = ('clip_value', 'foreach')
        if 'clip_value' not in kwargs or not positive_finite(kwargs['clip_value']):
            raise ValueError(f'{usage}; clipping by value needs clip_value, a finite number '
                             f'> 0, got {clip_grad!r}.')
    else:
        raise ValueError(f"{usage}; type must be 'norm' or 'value', got {kind!r}.")
    unknown = sorted(set(kwargs) - set(allowed), key=str)
    if unknown:
        raise ValueError(f'{usage}; {kind!r} clipping takes {list(allowed)}, got the unknown '
                         f'key(s) {unknown}.')
    kwargs.setdefault('foreach', None)  # torch picks the fused path where the device has one
    return kind, kwargs


# --------------------------------------------------------------------------- non-finite policy


#: The MMEngine plug-in module, and the names under which it registers this package's
#: wrappers and constructors in MMEngine's registries (standard name -> its own name).
#: The builder reads them too, and ``convert_config(..., plugin=True)`` writes them.
PLUGIN_MODULE = 'fp16utils.mmengine'
PLUGIN_NAMES = {
    'OptimWrapper': 'Fp16utilsOptimWrapper',
    'AmpOptimWrapper': 'Fp16utilsAmpOptimWrapper',
    'OptimWrapperDict': 'Fp16utilsOptimWrapperDict',
    'DefaultOptimWrapperConstructor': 'Fp16utilsOptimWrapperConstructor',
    'MultiOptimWrapperConstructor': 'Fp16utilsMultiOptimWrapperConstructor',
}

#: What to do with non-finite gradients when no dynamic loss scale can back off
#: (bfloat16, scaling disabled, or a static scale).
NONFINITE_POLICIES = ('warn', 'raise', 'ignore')


def check_nonfinite_policy(nonfinite: Any, owner: str) -> str:
    """``nonfinite`` when it is one of :data:`NONFINITE_POLICIES`, else a ValueError."""
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(
            f'{owner}: nonfinite must be one of {NONFINITE_POLICIES} (what to do with an '
            'inf/nan gradient when no dynamic loss scale can back off: skip the update '
            f'with a warning, raise FloatingPointError, or apply it); got {nonfinite!r}.')
    return nonfinite


def nonfinite_error(step: int, why: str) -> FloatingPointError:
    """The error that ``nonfinite='raise'`` raises for a step with inf/nan gradients."""
    return FloatingPointError(
        f'step {step}: non-finite gradients (inf/nan) {why}; the update was not applied '
        '(parameters and optimizer state are unchanged). Look for the cause with '
        "fp16utils.find_overflow(model), or pass nonfinite='warn' to skip such steps.")


def check_cache_enabled(cache_enabled: Any, owner: str) -> Optional[bool]:
    """``optim_context``'s ``cache_enabled`` when it is None, True or False, else a TypeError."""
    if cache_enabled is None or isinstance(cache_enabled, bool):
        return cache_enabled
    raise TypeError(
        f'{owner}.optim_context: cache_enabled must be None (torch\'s default), True or '
        f'False, got {cache_enabled!r} ({type(cache_enabled).__name__}).')
