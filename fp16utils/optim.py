"""1.x-style optimizer wrappers: ``OptimWrapper``, ``AmpOptimWrapper``, ``OptimWrapperDict``.

An optimizer wrapper owns everything that happens between a loss and a
parameter update: the loss division for gradient accumulation, the backward
pass, loss scaling, gradient clipping, skipping non-finite steps and zeroing
the gradients. A training step then reads::

    with optim_wrapper.optim_context(model):
        loss = model(inputs).loss
    optim_wrapper.update_params(loss)

:class:`AmpOptimWrapper` runs the forward inside ``torch.autocast`` on the
model's device (CPU included) and scales the loss with ``torch.amp.GradScaler``
(native backend), or keeps float32 master weights for a half model and scales
with :class:`~fp16utils.LossScaler` (legacy backend). :class:`OptimWrapperDict`
groups one wrapper per sub-model (GANs), and :func:`build_optim_wrapper` builds
any of them from a config dict.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from fp16utils import AmpOptimWrapper
    >>> model = nn.Linear(4, 2)
    >>> wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    >>> with wrapper.optim_context(model):
    ...     loss = model(torch.full((2, 4), 0.1)).float().mean()
    >>> wrapper.update_params(loss)
    >>> wrapper.skipped_steps, wrapper.loss_scale
    (0, 65536.0)
"""

from __future__ import annotations

import contextlib
import copy
import logging
import math
import sys
import weakref
from collections import defaultdict
from typing import (
    Any,
    Callable,
    Dict,
    ItemsView,
    Iterator,
    KeysView,
    List,
    Mapping,
    NamedTuple,
    Optional,
    Tuple,
    Union,
    ValuesView,
)

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm

from . import _torch
from .cast import cast_tensor_type
from .scaler import LossScaler, _dense_grads, _is_number, _positive_finite, non_finite_check_
from .wrap import wrap_fp16_model

__all__ = ['AmpOptimWrapper', 'MIN_LOSS_SCALE', 'NONFINITE_POLICIES', 'OptimWrapper',
           'OptimWrapperDict', 'build_optim_wrapper']

logger = logging.getLogger('fp16utils')

#: How many ``(step, scale)`` entries ``scale_history`` keeps (the latest ones).
SCALE_HISTORY_LEN = 64
#: The native loss scale never backs off below this (nor below its initial value),
#: as mmcv's LossScaler never goes below 1.
MIN_LOSS_SCALE = 1.0

_Tensor = torch.Tensor
_clip_grad_norm_ = _torch.clip_grad_norm_  # 'foreach' only where torch takes it
_clip_grad_value_ = _torch.clip_grad_value_


# --------------------------------------------------------------------------- loss scale


class _ScaleSpec(NamedTuple):
    """A parsed ``loss_scale`` argument, independent of the backend."""

    static: bool
    init_scale: float
    growth_factor: float
    backoff_factor: float
    growth_interval: int
    enabled: bool = True


#: ``'dynamic'`` with torch's GradScaler defaults (the 1.x wrappers, the native hook).
_TORCH_DYNAMIC = _ScaleSpec(False, 2.0**16, 2.0, 0.5, 2000)
#: ``'dynamic'`` with mmcv's LossScaler defaults (the legacy 0.x hook).
_MMCV_DYNAMIC = _ScaleSpec(False, 2.0**32, 2.0, 0.5, 1000)

_GRAD_SCALER_ARGS = ('init_scale', 'growth_factor', 'backoff_factor', 'growth_interval',
                     'enabled')
_LOSS_SCALER_ARGS = ('init_scale', 'mode', 'scale_factor', 'scale_window')
_MMCV_STATE_KEYS = ('cur_scale', 'cur_iter', 'mode', 'last_overflow_iter', 'scale_factor',
                    'scale_window')
_GRAD_SCALER_STATE_KEYS = ('scale', 'growth_factor', 'backoff_factor', 'growth_interval',
                           '_growth_tracker')


def _parse_loss_scale(loss_scale: Any, owner: str,
                      dynamic: _ScaleSpec = _TORCH_DYNAMIC) -> _ScaleSpec:
    """Turn ``'dynamic'``, a number or a dict into a :class:`_ScaleSpec`.

    The dict takes GradScaler's arguments (init_scale, growth_factor,
    backoff_factor, growth_interval, enabled) or LossScaler's (init_scale,
    mode, scale_factor, scale_window), so configs written for either backend
    work on both.
    """
    usage = (f"{owner}: loss_scale must be 'dynamic', a positive number (a static scale) "
             'or a dict of scaler arguments (init_scale, growth_factor, backoff_factor, '
             'growth_interval, enabled; or mmcv\'s init_scale, mode, scale_factor, '
             'scale_window)')
    if isinstance(loss_scale, str):
        if loss_scale == 'dynamic':
            return dynamic
        raise ValueError(f"{usage}; got the string {loss_scale!r}.")
    if _is_number(loss_scale):
        if not _positive_finite(loss_scale):
            raise ValueError(f'{usage}; got {loss_scale!r}, which is not a finite number > 0.')
        return dynamic._replace(static=True, init_scale=float(loss_scale))
    if not isinstance(loss_scale, Mapping):
        raise ValueError(f'{usage}; got {type(loss_scale).__name__} {loss_scale!r}.')
    args = dict(loss_scale)
    known = set(_GRAD_SCALER_ARGS) | set(_LOSS_SCALER_ARGS)
    unknown = sorted(set(args) - known, key=str)
    if unknown:
        raise ValueError(f'{usage}; got the unknown key(s) {unknown}.')
    for ours, theirs in (('growth_factor', 'scale_factor'), ('growth_interval', 'scale_window')):
        if ours in args and theirs in args:
            raise ValueError(f'{usage}; {ours!r} and {theirs!r} are the same setting in two '
                             'vocabularies: give only one of them.')
    mode = args.get('mode', 'dynamic')
    if mode not in ('dynamic', 'static'):
        raise ValueError(f"{usage}; mode must be 'dynamic' or 'static', got {mode!r}.")
    static = mode == 'static'
    init_scale = args.get('init_scale', dynamic.init_scale)
    if not _positive_finite(init_scale):
        raise ValueError(f'{usage}; init_scale must be a finite number > 0, got {init_scale!r}.')
    growth = args.get('growth_factor', args.get('scale_factor', dynamic.growth_factor))
    if 'backoff_factor' in args:
        backoff = args['backoff_factor']
    elif 'scale_factor' in args and _positive_finite(growth):
        backoff = 1.0 / growth
    else:
        backoff = dynamic.backoff_factor
    interval = args.get('growth_interval', args.get('scale_window', dynamic.growth_interval))
    enabled = args.get('enabled', True)
    if not isinstance(enabled, bool):
        raise ValueError(f'{usage}; enabled must be True or False, got {enabled!r}.')
    factors_ok = (_positive_finite(growth) and growth > 1 and _positive_finite(backoff)
                  and backoff < 1)
    interval_ok = isinstance(interval, int) and not isinstance(interval, bool) and interval >= 1
    if static:
        # Growth and backoff never happen; keep valid values for GradScaler.
        if not factors_ok:
            growth, backoff = dynamic.growth_factor, dynamic.backoff_factor
        if not interval_ok:
            interval = dynamic.growth_interval
    else:
        if not factors_ok:
            raise ValueError(
                f'{usage}; a dynamic scale needs growth_factor (scale_factor) > 1 and '
                f'0 < backoff_factor < 1, got growth_factor={growth!r}, '
                f'backoff_factor={backoff!r}.')
        if not interval_ok:
            raise ValueError(f'{usage}; growth_interval (scale_window) must be an int >= 1, '
                             f'got {interval!r}.')
    return _ScaleSpec(static, float(init_scale), float(growth), float(backoff), int(interval),
                      enabled)


def _mmcv_to_grad_scaler_state(state: Mapping[str, Any]) -> Tuple[Dict[str, Any], bool]:
    """Map an mmcv ``LossScaler`` state onto GradScaler's; also return whether it is static.

    mmcv grows the scale when ``(cur_iter - last_overflow_iter) % scale_window
    == 0`` at a clean update; GradScaler when ``growth_tracker + 1 ==
    growth_interval``. Both agree when ``growth_tracker = (cur_iter -
    last_overflow_iter - 1) mod scale_window``.
    """
    window = int(state['scale_window'])
    factor = float(state['scale_factor'])
    tracker = (int(state['cur_iter']) - int(state['last_overflow_iter']) - 1) % window
    return {
        'scale': float(state['cur_scale']),
        'growth_factor': factor,
        'backoff_factor': 1.0 / factor,
        'growth_interval': window,
        '_growth_tracker': tracker,
    }, state['mode'] == 'static'


def _grad_scaler_to_mmcv_state(state: Mapping[str, Any], static: bool) -> Dict[str, Any]:
    """Map a GradScaler state onto mmcv's ``LossScaler`` keys (the inverse mapping)."""
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
    }


def _check_state_keys(state: Mapping[str, Any], owner: str) -> str:
    """Say which scaler format ``state`` is in: ``'mmcv'`` or ``'torch'``."""
    if not isinstance(state, Mapping):
        raise TypeError(f'{owner}: a loss scaler state must be a dict, got '
                        f'{type(state).__name__}.')
    if 'cur_scale' in state:
        keys, kind = _MMCV_STATE_KEYS, 'mmcv'
    else:
        keys, kind = _GRAD_SCALER_STATE_KEYS, 'torch'
    missing = [k for k in keys if k not in state]
    if missing:
        raise KeyError(
            f'{owner}: the loss scaler state {sorted(state)} is missing {missing}; expected '
            f'GradScaler.state_dict() keys {list(_GRAD_SCALER_STATE_KEYS)} or mmcv '
            f'LossScaler keys {list(_MMCV_STATE_KEYS)}.')
    return kind


# --------------------------------------------------------------------------- gradient clipping


def _parse_clip_grad(clip_grad: Any, owner: str) -> Optional[Tuple[str, Dict[str, Any]]]:
    """Validate ``clip_grad`` into ``('norm' | 'value', kwargs)`` (None: no clipping)."""
    if clip_grad is None:
        return None
    usage = (f"{owner}: clip_grad must be None, dict(max_norm=..., norm_type=2) to clip by "
             "norm, or dict(type='value', clip_value=...) to clip by value")
    if not isinstance(clip_grad, Mapping) or not clip_grad:
        raise ValueError(f'{usage}; got {clip_grad!r}.')
    kwargs = dict(clip_grad)
    kind = kwargs.pop('type', 'norm')
    if kind == 'norm':
        allowed = ('max_norm', 'norm_type', 'error_if_nonfinite', 'foreach')
        if 'max_norm' not in kwargs:
            raise ValueError(f'{usage}; clipping by norm needs max_norm, got {clip_grad!r}.')
        if not _positive_finite(kwargs['max_norm']):
            raise ValueError(f"{usage}; max_norm must be a finite number > 0, got "
                             f"{kwargs['max_norm']!r}.")
        norm_type = kwargs.get('norm_type', 2.0)
        if norm_type in ('inf', 'Inf'):
            kwargs['norm_type'] = norm_type = math.inf
        if not (_is_number(norm_type) and norm_type > 0):
            raise ValueError(f"{usage}; norm_type must be a number > 0 or 'inf', got "
                             f'{norm_type!r}.')
    elif kind == 'value':
        allowed = ('clip_value', 'foreach')
        if 'clip_value' not in kwargs or not _positive_finite(kwargs['clip_value']):
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


def _clip(params: List[_Tensor], clip: Tuple[str, Dict[str, Any]]) -> Optional[_Tensor]:
    """Clip the gradients of ``params``; return the total norm (norm clipping) or None."""
    kind, kwargs = clip
    if kind == 'norm':
        return _clip_grad_norm_(params, **kwargs)
    _clip_grad_value_(params, **kwargs)
    return None


def _flat_params(optimizer: torch.optim.Optimizer) -> List[_Tensor]:
    return [p for group in optimizer.param_groups for p in group['params']]


def _pending_grads(params: List[_Tensor], copy: bool) -> List[Optional[_Tensor]]:
    """The gradients accumulated so far in an unfinished window (copies, or references)."""
    if copy:
        return [None if p.grad is None else p.grad.detach().clone() for p in params]
    return [p.grad for p in params]


def _check_pending(params: List[_Tensor], grads: List[Optional[_Tensor]], owner: str) -> None:
    """Raise when saved pending gradients do not fit ``params``."""
    if len(grads) != len(params) or any(
            g is not None and g.shape != p.shape for p, g in zip(params, grads)):
        raise ValueError(
            f'{owner}: the saved pending gradients ({len(grads)} tensors) do not match the '
            f'{len(params)} parameters here; load a state saved from the same model and '
            'optimizer.')


def _restore_grads(params: List[_Tensor], grads: List[Optional[_Tensor]], owner: str) -> None:
    """Put saved pending gradients back; nothing is changed when they do not fit."""
    _check_pending(params, grads, owner)
    for p, g in zip(params, grads):
        p.grad = None if g is None else g.detach().to(p.device, p.dtype, copy=True)


# --------------------------------------------------------------------------- scaling engines


#: What to do with non-finite gradients when no dynamic loss scale can back off
#: (bfloat16, scaling disabled, or a static scale).
NONFINITE_POLICIES = ('warn', 'raise', 'ignore')


def _check_nonfinite_policy(nonfinite: Any, owner: str) -> str:
    if nonfinite not in NONFINITE_POLICIES:
        raise ValueError(
            f'{owner}: nonfinite must be one of {NONFINITE_POLICIES} (what to do with an '
            'inf/nan gradient when no dynamic loss scale can back off: skip the update '
            f'with a warning, raise FloatingPointError, or apply it); got {nonfinite!r}.')
    return nonfinite


def _nonfinite_error(step: int, why: str) -> FloatingPointError:
    return FloatingPointError(
        f'step {step}: non-finite gradients (inf/nan) {why}; the update was not applied '
        '(parameters and optimizer state are unchanged). Look for the cause with '
        "fp16utils.find_overflow(model), or pass nonfinite='warn' to skip such steps.")


class _ScaleRecord:
    """Skipped-step count, scale history and the log line, shared by every engine.

    Nothing here touches the device: the scale it is given is a host float.
    """

    enabled: bool

    def __init__(self, nonfinite: str = 'warn') -> None:
        self.skipped_steps = 0
        self.scale_history: List[Tuple[int, float]] = []
        self.nonfinite = nonfinite

    def stats(self) -> Dict[str, Any]:
        """The skip count and scale history, for checkpoints."""
        return {'skipped_steps': self.skipped_steps, 'scale_history': list(self.scale_history)}

    def load_stats(self, stats: Optional[Mapping[str, Any]]) -> None:
        if not stats:
            return
        self.skipped_steps = int(stats['skipped_steps'])
        self.scale_history = [(int(step), float(scale))
                              for step, scale in stats['scale_history']][-SCALE_HISTORY_LEN:]

    def _unscaled_skip(self, grads: List[_Tensor], step: int) -> bool:
        """No loss scaling: apply the non-finite policy; True when the step is skipped.

        One fused check and one device sync, unless the policy is ``'ignore'``.
        """
        if self.nonfinite == 'ignore' or not grads or not non_finite_check_(grads):
            return False
        if self.nonfinite == 'raise':
            raise _nonfinite_error(step, 'and no loss scaling to back off')
        self.skipped_steps += 1
        logger.warning('step %d: non-finite gradients (inf/nan) and no loss scaling to back '
                       'off; update skipped', step)
        return True

    def _note_scale(self, step: int, scale: float) -> None:
        history = self.scale_history
        if history and history[-1][1] == scale:
            return
        history.append((step, scale))
        if len(history) > SCALE_HISTORY_LEN:
            del history[0]

    def _record(self, step: int, skipped: bool, old: float, new: float) -> None:
        if skipped:
            self.skipped_steps += 1
            logger.warning(
                'step %d: non-finite gradients (inf/nan), update skipped; loss scale %s -> %s',
                step, old, new)
        if new != old:
            self._note_scale(step, new)


class _NativeEngine(_ScaleRecord):
    """``torch.amp.GradScaler`` with skip detection and no extra device syncs.

    ``GradScaler.unscale_`` checks and unscales the gradients (fused kernels)
    and records per-device ``found_inf`` flags; the engine reads them once
    (the one ``.item()`` that ``GradScaler.step`` would do anyway) and steps
    the optimizer only when they are clear, as ``GradScaler.step`` does.
    Optimizers that handle scaling in their own kernels (``fused=True``) go
    through ``GradScaler.step`` itself; for them the flag read is one sync
    that GradScaler alone would not make. The scale and growth tracker are
    mirrored on the host: the tracker from the skip flag, the scale read
    back (``get_scale()``, one more sync) only on the rare steps where it
    changes (a skip, or a growth), so ``state_dict()`` and ``loss_scale``
    cost no sync.
    """

    def __init__(self, spec: _ScaleSpec, dtype: torch.dtype,
                 device_type: Callable[[], str], nonfinite: str = 'warn') -> None:
        super().__init__(nonfinite)
        self.enabled = spec.enabled and _torch.needs_loss_scaling(dtype)
        self.static = spec.static
        # GradScaler has no floor: a long run of overflows would shrink the scale
        # until 1/scale is inf and unscaling a clean gradient gives 0 * inf = nan.
        self._min_scale = min(MIN_LOSS_SCALE, spec.init_scale)
        self._device_type = device_type
        self._scaler: Optional[torch.amp.GradScaler] = None
        self._scale = spec.init_scale
        self._tracker = 0
        self._growth_factor = spec.growth_factor
        self._backoff_factor = spec.backoff_factor
        self._growth_interval = spec.growth_interval
        if self.enabled:
            self._note_scale(0, self._scale)

    @property
    def scaler(self) -> torch.amp.GradScaler:
        scaler = self._scaler
        if scaler is None:
            scaler = _torch.make_grad_scaler(
                self._device_type(), init_scale=self._scale,
                growth_factor=self._growth_factor, backoff_factor=self._backoff_factor,
                growth_interval=self._growth_interval, enabled=self.enabled)
            if self.enabled:
                scaler.load_state_dict(self.state_dict())
            self._scaler = scaler
        return scaler

    @property
    def loss_scale(self) -> float:
        return self._scale if self.enabled else 1.0

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        if self.enabled:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)

    def zero_grad(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        optimizer.zero_grad(**kwargs)

    def step(self, optimizer: torch.optim.Optimizer, clip: Optional[Callable[[], None]],
             step: int, kwargs: Mapping[str, Any]) -> bool:
        scaler = self._scaler
        if not self.enabled or scaler is None or scaler._scale is None:
            # No loss scaling (bfloat16, or disabled), or no scaled backward yet.
            if self.nonfinite != 'ignore' and self._unscaled_skip(
                    _dense_grads(_flat_params(optimizer)), step):
                return True
            if clip is not None:
                clip()
            optimizer.step(**kwargs)
            return False
        if 'closure' in kwargs:
            raise RuntimeError('optimizer.step(closure=...) is not supported with loss '
                               'scaling (a closure would backward an unscaled loss); call '
                               'step() without it.')
        try:
            scaler.unscale_(optimizer)
        except ValueError as err:
            raise ValueError(
                f'{err} The native backend keeps float32 parameters and autocasts the '
                "forward; for a model converted to half, use backend='legacy' (float32 "
                'master weights).') from None
        if clip is not None:
            clip()
        found = _found_inf(scaler, optimizer)
        if not found:  # no parameter has a gradient: nothing to check or skip
            optimizer.step(**kwargs)
            scaler.update(self._scale)
            return False
        # The one device sync of the step (GradScaler.step would do the same).
        if len(found) == 1:
            skipped = bool(next(iter(found.values())).item())
        else:
            skipped = any(bool(v.item()) for v in found.values())
        if getattr(optimizer, '_step_supports_amp_scaling', False):
            scaler.step(optimizer, **kwargs)  # fused optimizers skip inside their kernel
        elif not skipped:
            optimizer.step(**kwargs)  # what GradScaler.step does once the flag is known
        old = self._scale
        if self.static:
            scaler.update(old)
            if skipped and self.nonfinite == 'raise':
                raise _nonfinite_error(step, f'with the static loss scale {old}')
        elif skipped:
            scaler.update()
            self._tracker = 0
            self._scale = scaler.get_scale()
            if self._scale < self._min_scale:
                scaler.update(self._min_scale)
                self._scale = self._min_scale
        else:
            scaler.update()
            self._tracker += 1
            if self._tracker == self._growth_interval:
                self._tracker = 0
                self._scale = scaler.get_scale()
        self._record(step, skipped, old, self._scale)
        return skipped

    def state_dict(self) -> Dict[str, Any]:
        """GradScaler.state_dict(), built from the host mirror (no sync)."""
        if not self.enabled:
            return {}
        return {
            'scale': self._scale,
            'growth_factor': self._growth_factor,
            'backoff_factor': self._backoff_factor,
            'growth_interval': self._growth_interval,
            '_growth_tracker': self._tracker,
        }

    def load_state_dict(self, state: Mapping[str, Any], step: int, owner: str) -> None:
        if not self.enabled or not state:
            return
        if _check_state_keys(state, owner) == 'mmcv':
            new, static = _mmcv_to_grad_scaler_state(state)
        else:
            new, static = dict(state), self.static
        if not _positive_finite(new['scale']):
            raise ValueError(f"{owner}: the loss scaler state has scale {new['scale']!r}; "
                             'expected a finite number > 0.')
        self.static = static
        self._scale = float(new['scale'])
        self._tracker = int(new['_growth_tracker'])
        self._growth_factor = float(new['growth_factor'])
        self._backoff_factor = float(new['backoff_factor'])
        self._growth_interval = int(new['growth_interval'])
        if self._scaler is not None:
            self._scaler.load_state_dict(self.state_dict())
        self._note_scale(step, self._scale)


def _found_inf(scaler: torch.amp.GradScaler, optimizer: torch.optim.Optimizer
               ) -> Dict[Any, _Tensor]:
    """The per-device found-inf flags that ``scaler.unscale_(optimizer)`` recorded."""
    getter = getattr(scaler, '_found_inf_per_device', None)
    if getter is not None:
        return getter(optimizer)
    return scaler._per_optimizer_states[id(optimizer)]['found_inf_per_device']


class _LegacyEngine(_ScaleRecord):
    """Float32 master weights for a half model, scaled by :class:`LossScaler`.

    On construction the optimizer's parameters (the model's float32 ones) are
    cloned into float32 masters that replace them in ``param_groups`` (the
    optimizer object is kept; its state is re-keyed to the masters). After
    that the model may be converted to half: each step copies the model's
    gradients into the masters, checks and unscales them in one fused pass,
    steps the optimizer and copies the masters back into the model, all with
    foreach kernels.
    """

    def __init__(self, optimizer: torch.optim.Optimizer, spec: _ScaleSpec,
                 dtype: torch.dtype, owner: str, nonfinite: str = 'warn') -> None:
        super().__init__(nonfinite)
        originals = _flat_params(optimizer)
        bad = sorted({str(p.dtype) for p in originals if p.dtype != torch.float32})
        if bad:
            raise ValueError(
                f'{owner}: the legacy backend needs an optimizer built on the float32 '
                f'model, but it holds {bad} parameters; build the optimizer before the '
                'model is converted to half, and let the wrapper convert it.')
        if len({id(p) for p in originals}) != len(originals):
            raise ValueError(f'{owner}: a parameter appears twice in the optimizer\'s '
                             'param_groups; give each parameter to one group only.')
        if spec.enabled and _torch.needs_loss_scaling(dtype) and not spec.static and (
                not math.isclose(spec.growth_factor * spec.backoff_factor, 1.0, rel_tol=1e-6)):
            raise ValueError(
                f"{owner}: the legacy backend's LossScaler backs off by 1/growth_factor, "
                f'but loss_scale asks for growth_factor={spec.growth_factor} and '
                f'backoff_factor={spec.backoff_factor}; drop backoff_factor or make it '
                '1/growth_factor.')
        self.enabled = spec.enabled and _torch.needs_loss_scaling(dtype)
        self.loss_scaler = LossScaler(
            init_scale=spec.init_scale, mode='static' if spec.static else 'dynamic',
            scale_factor=spec.growth_factor, scale_window=spec.growth_interval)
        #: Called with the masters once their gradients are in (the hook's all-reduce).
        self.reduce: Optional[Callable[[List[nn.Parameter]], None]] = None
        with torch.no_grad():
            masters = [nn.Parameter(p.detach().clone(memory_format=torch.preserve_format),
                                    requires_grad=p.requires_grad) for p in originals]
        mapping = {p: m for p, m in zip(originals, masters)}
        start = 0
        for group in optimizer.param_groups:
            count = len(group['params'])
            group['params'] = masters[start:start + count]
            start += count
        state = defaultdict(dict)
        for key, value in optimizer.state.items():
            state[mapping.get(key, key)] = value
        optimizer.state = state
        self.model_params: List[_Tensor] = originals
        self.masters: List[nn.Parameter] = masters
        if self.enabled:
            self._note_scale(0, self.loss_scaler.loss_scale)

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale if self.enabled else 1.0

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        if self.enabled:
            loss = loss.float() * self.loss_scaler.cur_scale
        loss.backward(**kwargs)

    def zero_grad(self, optimizer: torch.optim.Optimizer, set_to_none: bool = True) -> None:
        optimizer.zero_grad(set_to_none=set_to_none)
        if set_to_none:
            for p in self.model_params:
                p.grad = None
        else:
            grads = [p.grad for p in self.model_params if p.grad is not None]
            if grads:
                torch._foreach_zero_(grads)

    def copy_grads_to_masters(self) -> List[_Tensor]:
        """Copy the model's gradients into the masters' (float32); return those."""
        src: List[_Tensor] = []
        dst: List[_Tensor] = []
        for p, m in zip(self.model_params, self.masters):
            grad = p.grad
            if grad is None:
                m.grad = None
                continue
            mgrad = m.grad
            if mgrad is None:
                mgrad = m.grad = torch.empty_like(m)
            src.append(grad)
            dst.append(mgrad)
        if dst:
            _torch.foreach_copy_(dst, src)
        return dst

    def copy_masters_to_model(self) -> None:
        with torch.no_grad():
            _torch.foreach_copy_(self.model_params, self.masters)

    def step(self, optimizer: torch.optim.Optimizer, clip: Optional[Callable[[], None]],
             step: int, kwargs: Mapping[str, Any]) -> bool:
        grads = self.copy_grads_to_masters()
        if self.reduce is not None:
            self.reduce(self.masters)
            # The reduction may give a master a gradient it had not (another rank had one).
            grads = [m.grad for m in self.masters if m.grad is not None]
        scaler = self.loss_scaler
        old = scaler.cur_scale
        if not self.enabled:
            if self._unscaled_skip(grads, step):
                return True
            overflow = False
        else:
            overflow = non_finite_check_(grads, 1.0 / old)
            if overflow and scaler.mode == 'static' and self.nonfinite == 'raise':
                raise _nonfinite_error(step, f'with the static loss scale {old}')
        if not overflow:
            if clip is not None:
                clip()
            optimizer.step(**kwargs)
            self.copy_masters_to_model()
        if self.enabled:
            scaler.update_scale(overflow)
            self._record(step, overflow, old, scaler.cur_scale)
        return overflow

    def state_dict(self) -> Dict[str, Any]:
        return self.loss_scaler.state_dict() if self.enabled else {}

    def load_state_dict(self, state: Mapping[str, Any], step: int, owner: str) -> None:
        if not self.enabled or not state:
            return
        if _check_state_keys(state, owner) == 'torch':
            state = _grad_scaler_to_mmcv_state(state, self.loss_scaler.mode == 'static')
        self.loss_scaler.load_state_dict(state)
        self._note_scale(step, self.loss_scaler.loss_scale)

    def load_masters(self, masters: Optional[List[_Tensor]], owner: str) -> None:
        """Restore the float32 masters (None: re-read them from the model) and sync the model."""
        with torch.no_grad():
            if masters is None:
                _torch.foreach_copy_(self.masters, self.model_params)
                return
            if len(masters) != len(self.masters) or any(
                    a.shape != b.shape for a, b in zip(masters, self.masters)):
                raise ValueError(
                    f'{owner}: the saved master weights ({len(masters)} tensors) do not match '
                    f"this optimizer's {len(self.masters)} parameters; load a state saved "
                    'from the same model and optimizer.')
            _torch.foreach_copy_(self.masters, list(masters))
            _torch.foreach_copy_(self.model_params, self.masters)


_Engine = Union[_NativeEngine, _LegacyEngine]


# --------------------------------------------------------------------------- wrappers


def _check_optimizer(optimizer: Any, owner: str) -> None:
    if not (hasattr(optimizer, 'param_groups') and hasattr(optimizer, 'step')
            and hasattr(optimizer, 'zero_grad')):
        raise TypeError(
            f'{owner} wraps a torch.optim.Optimizer, got {type(optimizer).__name__}; build '
            'one first, e.g. torch.optim.SGD(model.parameters(), lr=0.01).')


def _check_counts(accumulative_counts: Any, owner: str) -> int:
    if (isinstance(accumulative_counts, bool) or not isinstance(accumulative_counts, int)
            or accumulative_counts < 1):
        raise ValueError(f'{owner}: accumulative_counts must be an int >= 1, got '
                         f'{accumulative_counts!r}.')
    return accumulative_counts


def _first_tensor(model: nn.Module) -> Optional[_Tensor]:
    for tensor in model.parameters():
        return tensor
    for tensor in model.buffers():
        return tensor
    return None


class OptimWrapper:
    """An optimizer with gradient accumulation and clipping, driven by ``update_params``.

    ``update_params(loss)`` divides the loss by the number of iterations being
    accumulated, runs the backward pass, and every ``accumulative_counts``
    calls clips the gradients, steps the optimizer and zeroes the gradients.
    When :meth:`initialize_count_status` has set the total number of
    iterations, the last incomplete window is divided by its own length and
    stepped at the last iteration.

    Args:
        optimizer: The torch optimizer to drive.
        accumulative_counts: Iterations whose gradients are summed per update.
        clip_grad: None, ``dict(max_norm=..., norm_type=2)`` (clip by norm,
            with torch's fused kernels where the device has them) or
            ``dict(type='value', clip_value=...)``.

    Attributes:
        grad_norm: The total gradient norm of the last norm-clipped step, as a
            0-dim tensor (``float()`` it to log; that costs a device sync), or None.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Linear(2, 1)
        >>> wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                        accumulative_counts=2, clip_grad=dict(max_norm=1.0))
        >>> for _ in range(2):
        ...     with wrapper.optim_context(model):
        ...         loss = model(torch.ones(1, 2)).sum()
        ...     wrapper.update_params(loss)
        >>> wrapper.inner_count, wrapper.grad_norm is not None
        (2, True)
    """

    def __init__(self, optimizer: torch.optim.Optimizer, accumulative_counts: int = 1,
                 clip_grad: Optional[Mapping[str, Any]] = None) -> None:
        owner = type(self).__name__
        _check_optimizer(optimizer, owner)
        self._accumulative_counts = _check_counts(accumulative_counts, owner)
        self._clip = _parse_clip_grad(clip_grad, owner)
        self.optimizer = optimizer
        self.grad_norm: Optional[_Tensor] = None
        self._inner_count = 0
        self._restored_count: Optional[int] = None
        self._max_counts = -1
        self._remainder_counts = -1

    # -- counters ---------------------------------------------------------------------------

    @property
    def accumulative_counts(self) -> int:
        """Iterations accumulated per update."""
        return self._accumulative_counts

    @property
    def inner_count(self) -> int:
        """Backward passes so far (the iteration count, restored on resume)."""
        return self._inner_count

    @property
    def max_counts(self) -> int:
        """Total iterations as set by :meth:`initialize_count_status` (-1: unknown)."""
        return self._max_counts

    @property
    def clip_grad(self) -> Optional[Dict[str, Any]]:
        """The validated clipping settings (a new dict), or None."""
        if self._clip is None:
            return None
        kind, kwargs = self._clip
        return {'type': kind, **kwargs}

    def initialize_count_status(self, model: nn.Module, init_counts: int,
                                max_counts: int) -> None:
        """Set the iteration counter (on resume) and the total number of iterations.

        Args:
            model: The model being trained (checked for BatchNorm, which makes
                accumulated small batches differ from one large batch).
            init_counts: Iterations already done.
            max_counts: Total iterations; the last ``max_counts %
                accumulative_counts`` are accumulated as a shorter window.

        Example:
            >>> import torch
            >>> w = OptimWrapper(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1),
            ...                  accumulative_counts=4)
            >>> w.initialize_count_status(torch.nn.Identity(), 0, 6)
            >>> w.max_counts
            6
        """
        restored = self._restored_count
        self._restored_count = None
        self._inner_count = int(init_counts)
        self._max_counts = int(max_counts)
        if restored is not None and restored != self._inner_count:
            for p in self._grad_params():  # they belong to another iteration: drop them
                p.grad = None
        if self._inner_count % self._accumulative_counts != 0 and restored != self._inner_count:
            logger.warning(
                'Resumed at iteration %d, which is not a multiple of accumulative_counts=%d, '
                'without the gradients of the interrupted accumulation window (save the '
                "wrapper's state_dict() with the checkpoint to keep them).",
                self._inner_count, self._accumulative_counts)
        if self._accumulative_counts > 1 and any(
                isinstance(m, _BatchNorm) for m in model.modules()):
            logger.warning(
                'Gradient accumulation with BatchNorm layers: the statistics come from the '
                'small batches, so results may differ slightly from one large batch.')
        self._remainder_counts = self._max_counts % self._accumulative_counts

    def should_update(self) -> bool:
        """Whether the optimizer steps after the current backward pass."""
        count = self._inner_count
        return count % self._accumulative_counts == 0 or count == self._max_counts

    def should_sync(self) -> bool:
        """Whether the next backward pass must all-reduce gradients (DDP)."""
        nxt = self._inner_count + 1
        return nxt % self._accumulative_counts == 0 or nxt == self._max_counts

    # -- the step ---------------------------------------------------------------------------

    def scale_loss(self, loss: _Tensor) -> _Tensor:
        """Divide ``loss`` by the number of iterations accumulated in this window.

        Example:
            >>> import torch
            >>> w = OptimWrapper(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1),
            ...                  accumulative_counts=4)
            >>> w.scale_loss(torch.tensor(8.)).item()
            2.0
        """
        counts = self._accumulative_counts
        if counts == 1:
            return loss
        if self._max_counts > 0 and self._remainder_counts > 0 and (
                self._inner_count >= self._max_counts - self._remainder_counts):
            counts = self._remainder_counts
        return loss / counts

    def update_params(self, loss: _Tensor, step_kwargs: Optional[Dict[str, Any]] = None,
                      zero_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Backward ``loss``; step and zero the gradients when the window is complete.

        Args:
            loss: The loss of this iteration (not yet divided for accumulation).
            step_kwargs: Keyword arguments for :meth:`step`.
            zero_kwargs: Keyword arguments for :meth:`zero_grad`.
        """
        self.backward(self.scale_loss(loss))
        if self.should_update():
            self.step(**(step_kwargs or {}))
            self.zero_grad(**(zero_kwargs or {}))

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        """Run ``loss.backward(**kwargs)`` and count the iteration."""
        loss.backward(**kwargs)
        self._inner_count += 1

    def step(self, **kwargs: Any) -> None:
        """Clip the gradients (if configured) and step the optimizer."""
        if self._clip is not None:
            self._clip_grad()
        self.optimizer.step(**kwargs)

    def zero_grad(self, **kwargs: Any) -> None:
        """Zero the optimizer's gradients (``set_to_none`` and friends pass through)."""
        self.optimizer.zero_grad(**kwargs)

    def _clip_grad(self) -> None:
        assert self._clip is not None
        norm = _clip(_flat_params(self.optimizer), self._clip)
        if norm is not None:
            self.grad_norm = norm

    def optim_context(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Context for the forward pass: no DDP gradient sync while accumulating.

        Args:
            model: The model (or the sub-model this wrapper optimizes).

        Returns:
            A context manager (``model.no_sync()`` when the next backward pass
            only accumulates and the model has it, else a no-op).
        """
        if not self.should_sync() and hasattr(model, 'no_sync'):
            return model.no_sync()
        return _NULL_CONTEXT

    # -- optimizer passthrough --------------------------------------------------------------

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        """The optimizer's ``param_groups``."""
        return self.optimizer.param_groups

    @property
    def defaults(self) -> Dict[str, Any]:
        """The optimizer's ``defaults``."""
        return self.optimizer.defaults

    def get_lr(self) -> Dict[str, List[float]]:
        """The learning rate of each param group, as ``{'lr': [...]}``.

        Example:
            >>> import torch
            >>> OptimWrapper(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))],
            ...                              lr=0.5)).get_lr()
            {'lr': [0.5]}
        """
        return {'lr': [group['lr'] for group in self.optimizer.param_groups]}

    def get_momentum(self) -> Dict[str, List[float]]:
        """The momentum of each group (``betas[0]`` for Adam-like), as ``{'momentum': [...]}``.

        Example:
            >>> import torch
            >>> OptimWrapper(torch.optim.Adam([torch.nn.Parameter(torch.ones(1))])
            ...              ).get_momentum()
            {'momentum': [0.9]}
        """
        momentum = []
        for group in self.optimizer.param_groups:
            if 'momentum' in group:
                momentum.append(group['momentum'])
            elif 'betas' in group:
                momentum.append(group['betas'][0])
            else:
                momentum.append(0)
        return {'momentum': momentum}

    def _grad_params(self) -> List[_Tensor]:
        """The tensors whose ``.grad`` accumulates over a window."""
        return _flat_params(self.optimizer)

    def _add_pending(self, state: Dict[str, Any]) -> Dict[str, Any]:
        """Add the unfinished accumulation window (if any) to ``state``."""
        if self._inner_count % self._accumulative_counts:
            state['pending_window'] = {
                'inner_count': self._inner_count,
                'grads': _pending_grads(self._grad_params(), copy=True)}
        return state

    def _load_pending(self, pending: Optional[Mapping[str, Any]]) -> None:
        if pending is None:
            self._restored_count = None
            return
        _restore_grads(self._grad_params(), list(pending['grads']), type(self).__name__)
        self._inner_count = self._restored_count = int(pending['inner_count'])

    def state_dict(self) -> Dict[str, Any]:
        """The optimizer's state dict, plus ``'pending_window'`` when saved mid-window.

        In the middle of an accumulation window, ``'pending_window'`` holds the
        iteration count and a copy of the gradients accumulated so far, so a
        resumed run continues the window exactly where it stopped.
        """
        return self._add_pending(self.optimizer.state_dict())

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a state written by :meth:`state_dict` (the argument is not changed)."""
        state = dict(state_dict)
        pending = state.pop('pending_window', None)
        if pending is not None:  # checked first, so a mismatch changes nothing
            _check_pending(self._grad_params(), list(pending['grads']), type(self).__name__)
        self.optimizer.load_state_dict(state)
        self._load_pending(pending)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(optimizer={type(self.optimizer).__name__}, '
                f'accumulative_counts={self._accumulative_counts}, '
                f'clip_grad={self.clip_grad})')


class AmpOptimWrapper(OptimWrapper):
    """Mixed-precision :class:`OptimWrapper`: autocast forward, scaled loss, skipped overflows.

    Native backend (torch >= 1.6): :meth:`optim_context` runs the forward
    inside ``torch.autocast`` on the model's device type (CPU included) with
    ``dtype``; the loss is scaled with a ``torch.amp.GradScaler`` made lazily
    for the device of the parameters; gradients are unscaled before
    clipping, and a step whose gradients hold an inf or a nan is skipped
    (parameters and optimizer state untouched) while the scale backs off.

    Legacy backend (older torch, or ``backend='legacy'`` for pure half
    training): pass ``model=``. The wrapper then owns float32 master copies
    of the optimizer's parameters (they replace the model's parameters in the
    optimizer's ``param_groups``; the optimizer object is kept) and converts
    the model with ``wrap_fp16_model(model, dtype, backend='legacy')``. Inside
    :meth:`optim_context` the model's float32 tensor inputs are cast to
    ``dtype`` and its outputs back to float32. Each step copies the half
    gradients into the masters, lets :class:`LossScaler` decide on a skip,
    steps the masters and copies them back into the model (foreach kernels).
    Build the optimizer on the float32 model, before wrapping.

    Cost: on the native backend a step synchronises with the device once,
    the ``.item()`` that ``GradScaler.step`` always does (the skip flag is
    read right before it, so the two reads share one wait). The scale itself
    is read back (``get_scale()``, one more sync) only on the steps where it
    changes: a skip, or a growth every ``growth_interval`` clean steps.
    ``state_dict()`` costs no sync. The legacy backend also syncs once per
    step (the fused overflow check).

    Args:
        optimizer: Optimizer built on the (float32) model parameters.
        loss_scale: ``'dynamic'`` (GradScaler's defaults: 2**16, x2 every 2000
            clean steps, /2 on overflow), a number (a static scale: never
            grows or backs off, but a non-finite step is still skipped), or a
            dict of GradScaler arguments (init_scale, growth_factor,
            backoff_factor, growth_interval, enabled; mmcv's init_scale,
            mode, scale_factor, scale_window are accepted too).
        dtype: ``torch.float16`` (default) or ``torch.bfloat16`` (or their
            names). bfloat16 needs no loss scaling and gets none.
        backend: ``'native'``, ``'legacy'`` or None for the default (see
            ``fp16utils._torch.default_backend``).
        accumulative_counts: See :class:`OptimWrapper`.
        clip_grad: See :class:`OptimWrapper`.
        model: The float32 model the optimizer was built on. Required by the
            legacy backend (it is converted in place); unused by the native one.
        nonfinite: What to do with an inf/nan gradient when no dynamic scale
            can back off (bfloat16, scaling disabled, a static scale):
            ``'warn'`` (default) skips the update and logs a warning,
            ``'raise'`` raises ``FloatingPointError`` before anything changes
            (the gradients are left in place for inspection: call
            :meth:`zero_grad` before training on),
            ``'ignore'`` applies it as plain torch would (and saves the one
            fused check and device sync it costs when nothing is scaled).
            With a dynamic scale an overflow always skips and backs off, and
            the scale never goes below ``min(1, init_scale)``.

    Attributes:
        skipped_steps: Steps skipped for non-finite gradients.
        scale_history: ``(step, scale)`` at the start and at each change of
            the scale, latest :data:`SCALE_HISTORY_LEN` kept; ``step`` is the
            iteration count (:attr:`inner_count`) of the update.

    Raises:
        ValueError: For a bad ``loss_scale``, ``dtype``, ``backend`` or
            ``clip_grad``, or the legacy backend without ``model``. Nothing
            is changed then.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Linear(4, 2)
        >>> wrapper = AmpOptimWrapper(torch.optim.Adam(model.parameters()),
        ...                           loss_scale=dict(init_scale=1024.), dtype='float16')
        >>> with wrapper.optim_context(model):
        ...     out = model(torch.ones(3, 4))
        >>> out.dtype
        torch.float16
        >>> wrapper.update_params(out.float().sum())
        >>> wrapper.state_dict()['loss_scaler']['scale']
        1024.0
    """

    def __init__(self, optimizer: torch.optim.Optimizer,
                 loss_scale: Union[str, float, Mapping[str, Any]] = 'dynamic',
                 dtype: Union[torch.dtype, str, None] = None, backend: Optional[str] = None,
                 accumulative_counts: int = 1, clip_grad: Optional[Mapping[str, Any]] = None,
                 model: Optional[nn.Module] = None, nonfinite: str = 'warn') -> None:
        owner = type(self).__name__
        nonfinite = _check_nonfinite_policy(nonfinite, owner)
        super().__init__(optimizer, accumulative_counts, clip_grad)
        spec = _parse_loss_scale(loss_scale, owner)
        self.dtype: torch.dtype = _torch.resolve_dtype(dtype)
        params = _flat_params(optimizer)
        self.backend: str = _torch.backend_for(
            backend, params[0].device.type if params else 'cpu', self.dtype, model)
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f'{owner}: model must be an nn.Module, got {type(model).__name__}.')
        self._ctx_model: Optional[weakref.ref] = None
        self._ctx_tensor: Optional[_Tensor] = None
        self._model = model
        self._engine: _Engine
        if self.backend == 'legacy':
            if model is None:
                raise ValueError(
                    f'{owner}: the legacy backend converts the model to {self.dtype} and keeps '
                    'float32 master weights, so it needs the model: pass '
                    f"{owner}(optimizer, ..., model=model) (or backend='native' on "
                    'torch >= 1.6).')
            self._engine = _LegacyEngine(optimizer, spec, self.dtype, owner, nonfinite)
            wrap_fp16_model(model, self.dtype, backend='legacy')
        else:
            self._engine = _NativeEngine(spec, self.dtype, self._param_device_type, nonfinite)

    def _param_device_type(self) -> str:
        return _flat_params(self.optimizer)[0].device.type

    # -- read-only state --------------------------------------------------------------------

    @property
    def loss_scaler(self) -> Union[torch.amp.GradScaler, LossScaler]:
        """The ``torch.amp.GradScaler`` (native) or :class:`LossScaler` (legacy)."""
        engine = self._engine
        return engine.scaler if isinstance(engine, _NativeEngine) else engine.loss_scaler

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 when no scaling is done); reading it costs no sync."""
        return self._engine.loss_scale

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because a gradient held an inf or a nan."""
        return self._engine.skipped_steps

    @property
    def scale_history(self) -> List[Tuple[int, float]]:
        """``(step, scale)`` at the start and at each change of the loss scale."""
        return self._engine.scale_history

    @property
    def master_params(self) -> Optional[List[nn.Parameter]]:
        """The float32 master weights (legacy backend), else None."""
        engine = self._engine
        return engine.masters if isinstance(engine, _LegacyEngine) else None

    # -- the step ---------------------------------------------------------------------------

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        """Backward the scaled ``loss`` and count the iteration."""
        self._engine.backward(loss, **kwargs)
        self._inner_count += 1

    def step(self, **kwargs: Any) -> None:
        """Unscale, clip, and step unless a gradient is non-finite; update the scale."""
        self._engine.step(self.optimizer, self._clip_grad if self._clip is not None else None,
                          self._inner_count, kwargs)

    def zero_grad(self, **kwargs: Any) -> None:
        """Zero the gradients (the model's half ones too on the legacy backend)."""
        self._engine.zero_grad(self.optimizer, **kwargs)

    def optim_context(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Context for the forward pass: autocast (native) or half inputs (legacy).

        Native: ``torch.autocast`` on the model's device type with
        :attr:`dtype`. Legacy: float32 tensor inputs of ``model`` are cast to
        :attr:`dtype` and its outputs back to float32. In both cases the DDP
        gradient all-reduce is suppressed while accumulating.

        Args:
            model: The model (or the sub-model) run inside the context.

        Returns:
            A context manager, to be entered once.
        """
        if self.backend == 'native':
            inner: contextlib.AbstractContextManager = _torch.autocast_for(
                self._model_device_type(model), self.dtype)
        else:
            inner = _CastIO(model, self.dtype)
        if not self.should_sync() and hasattr(model, 'no_sync'):
            return _Both(model.no_sync(), inner)
        return inner

    def _model_device_type(self, model: nn.Module) -> str:
        ref = self._ctx_model
        if ref is None or ref() is not model:
            self._ctx_model = weakref.ref(model)
            self._ctx_tensor = _first_tensor(model)
        tensor = self._ctx_tensor
        if tensor is None:
            return self._param_device_type()
        return tensor.device.type  # follows model.to(device): parameters keep their identity

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The optimizer state plus ``'loss_scaler'`` (and ``'master_params'`` on legacy).

        ``'loss_scaler'`` is ``GradScaler.state_dict()`` on the native backend
        and ``LossScaler.state_dict()`` (mmcv's keys) on the legacy one; each
        backend loads either. ``'master_params'`` holds the float32 master
        weights (references, like the optimizer state), needed to resume a
        half model exactly.
        """
        state = self.optimizer.state_dict()
        state['loss_scaler'] = self._engine.state_dict()
        state['fp16_stats'] = self._engine.stats()
        if isinstance(self._engine, _LegacyEngine):
            state['master_params'] = list(self._engine.masters)
        return self._add_pending(state)

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state written by :meth:`state_dict` (the argument is not changed).

        Without ``'master_params'`` (a native checkpoint), the legacy backend
        re-reads its masters from the model's current weights.
        """
        owner = type(self).__name__
        state = dict(state_dict)
        scaler_state = state.pop('loss_scaler', None)
        masters = state.pop('master_params', None)
        pending = state.pop('pending_window', None)
        stats = state.pop('fp16_stats', None)
        if scaler_state:
            _check_state_keys(scaler_state, owner)
        if pending is not None:  # checked first, so a mismatch changes nothing
            _check_pending(self._grad_params(), list(pending['grads']), owner)
        self.optimizer.load_state_dict(state)
        engine = self._engine
        engine.load_stats(stats)  # first: loading the scale then notes it if it differs
        if scaler_state:
            engine.load_state_dict(scaler_state, self._inner_count, owner)
        if isinstance(engine, _LegacyEngine):
            engine.load_masters(masters, owner)
        self._load_pending(pending)

    def _grad_params(self) -> List[_Tensor]:
        engine = self._engine
        if isinstance(engine, _LegacyEngine):
            return engine.model_params  # the half model's gradients accumulate
        return _flat_params(self.optimizer)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(optimizer={type(self.optimizer).__name__}, '
                f'backend={self.backend!r}, dtype={self.dtype}, loss_scale={self.loss_scale}, '
                f'accumulative_counts={self._accumulative_counts}, '
                f'clip_grad={self.clip_grad})')


_NULL_CONTEXT = contextlib.nullcontext()


class _Both:
    """Enter ``outer`` then ``inner``; exit in reverse (a two-item ExitStack, cheaper)."""

    __slots__ = ('outer', 'inner')

    def __init__(self, outer: contextlib.AbstractContextManager,
                 inner: contextlib.AbstractContextManager) -> None:
        self.outer = outer
        self.inner = inner

    def __enter__(self) -> None:
        self.outer.__enter__()
        try:
            self.inner.__enter__()
        except BaseException:
            if not self.outer.__exit__(*sys.exc_info()):
                raise

    def __exit__(self, *exc: Any) -> bool:
        try:
            suppressed = bool(self.inner.__exit__(*exc))
        except BaseException:
            if not self.outer.__exit__(*sys.exc_info()):
                raise
            return True
        if suppressed:
            exc = (None, None, None)
        return bool(self.outer.__exit__(*exc)) or suppressed


class _CastIO:
    """Cast ``model``'s float32 inputs to ``dtype`` and its ``dtype`` outputs to float32."""

    __slots__ = ('model', 'dtype', 'handles')

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.model = model
        self.dtype = dtype
        self.handles: Tuple[Any, ...] = ()

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
        return (cast_tensor_type(args, torch.float32, self.dtype),
                cast_tensor_type(kwargs, torch.float32, self.dtype))

    def _post(self, module: nn.Module, args: tuple, output: Any) -> Any:
        return cast_tensor_type(output, self.dtype, torch.float32)

    def __enter__(self) -> None:
        self.handles = (_torch.register_forward_pre_hook_with_kwargs(self.model, self._pre),
                        self.model.register_forward_hook(self._post))

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = ()


class OptimWrapperDict:
    """Several optimizer wrappers under names, for models with several optimizers (GANs).

    It behaves as a read-only mapping from names to wrappers. Stepping is each
    wrapper's business: ``update_params``, ``backward``, ``step``,
    ``zero_grad`` and ``optim_context`` on the dict raise NotImplementedError.

    Args:
        **wrappers: One :class:`OptimWrapper` (or subclass) per name.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> gen, disc = nn.Linear(2, 2), nn.Linear(2, 1)
        >>> wrappers = OptimWrapperDict(
        ...     generator=OptimWrapper(torch.optim.Adam(gen.parameters(), lr=1e-4)),
        ...     discriminator=OptimWrapper(torch.optim.Adam(disc.parameters(), lr=4e-4)))
        >>> sorted(wrappers.get_lr().items())
        [('discriminator.lr', [0.0004]), ('generator.lr', [0.0001])]
        >>> 'generator' in wrappers, len(wrappers)
        (True, 2)
    """

    def __init__(self, **wrappers: OptimWrapper) -> None:
        for name, wrapper in wrappers.items():
            if not isinstance(wrapper, OptimWrapper):
                raise TypeError(
                    f'OptimWrapperDict entry {name!r} must be an OptimWrapper (or '
                    f'AmpOptimWrapper), got {type(wrapper).__name__}; wrap the optimizer '
                    'first, e.g. OptimWrapper(optimizer).')
        self.optim_wrappers: Dict[str, OptimWrapper] = dict(wrappers)

    def _per_entry(self, what: str) -> NotImplementedError:
        names = list(self.optim_wrappers)
        example = names[0] if names else 'generator'
        return NotImplementedError(
            f'OptimWrapperDict.{what}() is ambiguous: this dict holds one wrapper per '
            f'sub-model {names}; call it on one of them, e.g. '
            f"optim_wrapper[{example!r}].{what}(...).")

    def update_params(self, loss: _Tensor, step_kwargs: Optional[Dict[str, Any]] = None,
                      zero_kwargs: Optional[Dict[str, Any]] = None) -> None:
        """Not supported: call ``update_params`` on one entry."""
        raise self._per_entry('update_params')

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        """Not supported: call ``backward`` on one entry."""
        raise self._per_entry('backward')

    def step(self, **kwargs: Any) -> None:
        """Not supported: call ``step`` on one entry."""
        raise self._per_entry('step')

    def zero_grad(self, **kwargs: Any) -> None:
        """Not supported: call ``zero_grad`` on one entry."""
        raise self._per_entry('zero_grad')

    def optim_context(self, model: nn.Module) -> contextlib.AbstractContextManager:
        """Not supported: use one entry's ``optim_context``."""
        raise self._per_entry('optim_context')

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        """Not supported: read ``param_groups`` of one entry."""
        raise self._per_entry('param_groups')

    def initialize_count_status(self, model: nn.Module, init_counts: int,
                                max_counts: int) -> None:
        """Call :meth:`OptimWrapper.initialize_count_status` on every entry."""
        for wrapper in self.optim_wrappers.values():
            wrapper.initialize_count_status(model, init_counts, max_counts)

    def get_lr(self) -> Dict[str, List[float]]:
        """Every entry's learning rates, keyed ``'<name>.lr'``."""
        return {f'{name}.lr': w.get_lr()['lr'] for name, w in self.optim_wrappers.items()}

    def get_momentum(self) -> Dict[str, List[float]]:
        """Every entry's momentum, keyed ``'<name>.momentum'``."""
        return {f'{name}.momentum': w.get_momentum()['momentum']
                for name, w in self.optim_wrappers.items()}

    def state_dict(self) -> Dict[str, Any]:
        """``{name: wrapper.state_dict()}``."""
        return {name: w.state_dict() for name, w in self.optim_wrappers.items()}

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load ``{name: state}``; an unknown name is a KeyError and nothing is loaded."""
        unknown = [name for name in state_dict if name not in self.optim_wrappers]
        if unknown:
            raise KeyError(
                f'OptimWrapperDict.load_state_dict() got states for {unknown}, which are not '
                f'entries of this dict {list(self.optim_wrappers)}.')
        for name, state in state_dict.items():
            self.optim_wrappers[name].load_state_dict(state)

    def __getitem__(self, name: str) -> OptimWrapper:
        try:
            return self.optim_wrappers[name]
        except KeyError:
            raise KeyError(f'OptimWrapperDict has no entry {name!r}; its entries are '
                           f'{list(self.optim_wrappers)}.') from None

    def __contains__(self, name: object) -> bool:
        return name in self.optim_wrappers

    def __len__(self) -> int:
        return len(self.optim_wrappers)

    def __iter__(self) -> Iterator[str]:
        return iter(self.optim_wrappers)

    def keys(self) -> KeysView[str]:
        """The entry names."""
        return self.optim_wrappers.keys()

    def values(self) -> ValuesView[OptimWrapper]:
        """The wrappers."""
        return self.optim_wrappers.values()

    def items(self) -> ItemsView[str, OptimWrapper]:
        """``(name, wrapper)`` pairs."""
        return self.optim_wrappers.items()

    def __repr__(self) -> str:
        inner = ', '.join(f'{name}={w!r}' for name, w in self.optim_wrappers.items())
        return f'OptimWrapperDict({inner})'


# --------------------------------------------------------------------------- building


_WRAPPER_TYPES: Dict[str, type] = {'OptimWrapper': OptimWrapper,
                                   'AmpOptimWrapper': AmpOptimWrapper}
_SINGLE_CONSTRUCTORS = ('DefaultOptimWrapperConstructor', 'OptimWrapperConstructor')
_MULTI_CONSTRUCTORS = ('MultiOptimWrapperConstructor',)
_COMMON_KEYS = ('type', 'optimizer', 'accumulative_counts', 'clip_grad')
_AMP_KEYS = ('loss_scale', 'dtype', 'backend', 'nonfinite')


def _optimizer_classes() -> Dict[str, type]:
    return {name: cls for name, cls in vars(torch.optim).items()
            if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer}


class _Plan(NamedTuple):
    """A validated wrapper config, ready to build without further checks."""

    where: str
    wrapper_cls: type
    optimizer_cls: type
    optimizer_kwargs: Dict[str, Any]
    wrapper_kwargs: Dict[str, Any]


def _plan(cfg: Mapping[str, Any], where: str) -> _Plan:
    cfg = dict(cfg)
    wtype = cfg.pop('type', 'OptimWrapper')
    if isinstance(wtype, type) and issubclass(wtype, OptimWrapper):
        wrapper_cls = wtype
    elif isinstance(wtype, str) and wtype in _WRAPPER_TYPES:
        wrapper_cls = _WRAPPER_TYPES[wtype]
    else:
        raise ValueError(f'{where}: unknown wrapper type {wtype!r}; expected one of '
                         f'{list(_WRAPPER_TYPES)}.')
    is_amp = issubclass(wrapper_cls, AmpOptimWrapper)
    allowed = _COMMON_KEYS + (_AMP_KEYS if is_amp else ())
    unknown = sorted(set(cfg) - set(allowed), key=str)
    if unknown:
        hint = ''
        if set(unknown) & set(_AMP_KEYS):
            hint = " (loss_scale, dtype and backend belong to type='AmpOptimWrapper')"
        elif 'paramwise_cfg' in unknown:
            hint = (' (paramwise_cfg is not supported: build the optimizer with your own '
                    'param groups and wrap it yourself)')
        raise ValueError(f'{where}: unknown key(s) {unknown}{hint}; a '
                         f'{wrapper_cls.__name__} config takes {list(allowed)}.')
    if 'optimizer' not in cfg:
        raise ValueError(f"{where}: missing 'optimizer', e.g. optimizer=dict(type='Adam', "
                         'lr=1e-4).')
    opt_cfg = cfg.pop('optimizer')
    if not isinstance(opt_cfg, Mapping) or 'type' not in opt_cfg:
        raise ValueError(f"{where}.optimizer must be a dict with a 'type', e.g. "
                         f"dict(type='Adam', lr=1e-4); got {opt_cfg!r}.")
    opt_kwargs = dict(opt_cfg)
    otype = opt_kwargs.pop('type')
    if isinstance(otype, type) and issubclass(otype, torch.optim.Optimizer):
        opt_cls = otype
    else:
        classes = _optimizer_classes()
        if not isinstance(otype, str) or otype not in classes:
            raise ValueError(f'{where}.optimizer: unknown optimizer type {otype!r}; expected '
                             f'a torch.optim class name, one of {sorted(classes)}.')
        opt_cls = classes[otype]
    # Validate the wrapper arguments now, so that building changes nothing on error.
    owner = f'{where} ({wrapper_cls.__name__})'
    _check_counts(cfg.get('accumulative_counts', 1), owner)
    _parse_clip_grad(cfg.get('clip_grad'), owner)
    if is_amp:
        _parse_loss_scale(cfg.get('loss_scale', 'dynamic'), owner)
        cfg['dtype'] = _torch.resolve_dtype(cfg.get('dtype'))
        _torch.resolve_backend(cfg.get('backend'))
    return _Plan(where, wrapper_cls, opt_cls, opt_kwargs, cfg)


def _make_optimizer(plan: _Plan, module: nn.Module) -> torch.optim.Optimizer:
    try:
        return plan.optimizer_cls(module.parameters(), **plan.optimizer_kwargs)
    except (TypeError, ValueError) as err:
        raise type(err)(f'{plan.where}.optimizer: {plan.optimizer_cls.__name__} rejected '
                        f'{plan.optimizer_kwargs}: {err}') from None


def _make_wrapper(plan: _Plan, optimizer: torch.optim.Optimizer,
                  module: nn.Module) -> OptimWrapper:
    kwargs = dict(plan.wrapper_kwargs)
    if issubclass(plan.wrapper_cls, AmpOptimWrapper):
        kwargs['model'] = module
    return plan.wrapper_cls(optimizer, **kwargs)


def _unwrap(model: nn.Module) -> nn.Module:
    parallel = (nn.DataParallel, nn.parallel.DistributedDataParallel)
    return model.module if isinstance(model, parallel) else model


def build_optim_wrapper(model: nn.Module, cfg: Mapping[str, Any]
                        ) -> Union[OptimWrapper, OptimWrapperDict]:
    """Build an optimizer wrapper (or a dict of them) from a 1.x ``optim_wrapper`` config.

    Single wrapper: ``dict(type='OptimWrapper' | 'AmpOptimWrapper',
    optimizer=dict(type='Adam', lr=...), accumulative_counts=1,
    clip_grad=None)``, plus ``loss_scale``, ``dtype`` and ``backend`` for
    ``AmpOptimWrapper``. ``constructor`` may be omitted,
    ``'DefaultOptimWrapperConstructor'`` or ``'OptimWrapperConstructor'``.

    One wrapper per sub-model: ``constructor='MultiOptimWrapperConstructor'``
    and one such config per attribute name of ``model`` (``generator=dict(...),
    discriminator=dict(...)``); each optimizer is built on
    ``getattr(model, name).parameters()`` and the result is an
    :class:`OptimWrapperDict`. The per-name layout is also recognised under
    ``'OptimWrapperConstructor'`` when the config has no ``optimizer`` key.

    Everything is validated before anything is built, so an error leaves the
    model as it was. On the legacy backend each ``AmpOptimWrapper`` converts
    its (sub-)model to half and owns its float32 master weights.

    Args:
        model: The model (DataParallel / DistributedDataParallel are unwrapped
            to find sub-models).
        cfg: The config; it is not changed.

    Returns:
        An :class:`OptimWrapper`, :class:`AmpOptimWrapper` or
        :class:`OptimWrapperDict`.

    Raises:
        ValueError: For an unknown wrapper, optimizer or constructor type, an
            unknown key, a bad argument, or a sub-model name the model lacks;
            the message names what exists.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class GAN(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.generator, self.discriminator = nn.Linear(2, 2), nn.Linear(2, 1)
        >>> wrappers = build_optim_wrapper(GAN(), dict(
        ...     constructor='MultiOptimWrapperConstructor',
        ...     generator=dict(type='AmpOptimWrapper', optimizer=dict(type='Adam', lr=1e-4)),
        ...     discriminator=dict(optimizer=dict(type='SGD', lr=0.1))))
        >>> type(wrappers['generator']).__name__, type(wrappers['discriminator']).__name__
        ('AmpOptimWrapper', 'OptimWrapper')
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f'build_optim_wrapper() takes an nn.Module, got '
                        f'{type(model).__name__}.')
    if not isinstance(cfg, Mapping):
        raise TypeError(f'build_optim_wrapper() takes a config dict, got {type(cfg).__name__}.')
    cfg = copy.deepcopy(dict(cfg))
    constructor = cfg.pop('constructor', None)
    known = (None, *_SINGLE_CONSTRUCTORS, *_MULTI_CONSTRUCTORS)
    if constructor not in known:
        raise ValueError(f'optim_wrapper: unknown constructor {constructor!r}; expected one '
                         f'of {list(known[1:])} (or none).')
    per_name = constructor in _MULTI_CONSTRUCTORS or (
        constructor == 'OptimWrapperConstructor' and 'optimizer' not in cfg and cfg
        and all(isinstance(v, Mapping) and 'optimizer' in v for v in cfg.values()))
    if not per_name:
        plan = _plan(cfg, 'optim_wrapper')
        return _make_wrapper(plan, _make_optimizer(plan, model), model)

    if not cfg:
        raise ValueError(f'optim_wrapper: constructor={constructor!r} needs one config per '
                         'sub-model, e.g. generator=dict(optimizer=...), '
                         'discriminator=dict(optimizer=...).')
    base = _unwrap(model)
    children = [name for name, _ in base.named_children()]
    plans = []
    for name, entry in cfg.items():
        where = f'optim_wrapper.{name}'
        if not isinstance(entry, Mapping):
            raise ValueError(f'{where} must be a wrapper config dict (one per sub-model), '
                             f'got {entry!r}.')
        module = getattr(base, name, None) if isinstance(name, str) else None
        if not isinstance(module, nn.Module):
            raise ValueError(f'{where}: the model ({type(base).__name__}) has no sub-module '
                             f'{name!r}; its sub-modules are {children}.')
        plans.append((name, module, _plan(entry, where)))
    optimizers = [(name, module, plan, _make_optimizer(plan, module))
                  for name, module, plan in plans]
    return OptimWrapperDict(**{name: _make_wrapper(plan, optimizer, module)
                               for name, module, plan, optimizer in optimizers})
