"""The native step engine: ``torch.amp.GradScaler`` with a floor and one sync per step.

Example:
    >>> import torch
    >>> from fp16utils._args.spec import TORCH_DYNAMIC
    >>> engine = NativeEngine(TORCH_DYNAMIC, torch.bfloat16, lambda: 'cpu')
    >>> engine.enabled, engine.loss_scale  # bfloat16 needs no loss scaling
    (False, 1.0)
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional

import torch

from .._args.limits import grad_scaler_bounds_error
from .._args.spec import ScaleSpec, check_scaler_state, mmcv_to_grad_scaler_state, nonfinite_error
from .._torch import dtypes, factory
from .._torch import state as _state
from . import ranks
from .base import Clip, StepEngine
from .host_scale import HostScale

__all__ = ['NativeEngine']

_Tensor = torch.Tensor


class NativeEngine(StepEngine):
    """``torch.amp.GradScaler`` with skip detection, a scale floor and no extra syncs.

    ``GradScaler.unscale_`` checks and unscales the gradients (fused kernels)
    and records per-device found-inf flags; the engine reads them once (the
    one ``.item()`` that ``GradScaler.step`` would do anyway) and steps the
    optimizer only when they are clear, as ``GradScaler.step`` does.
    Optimizers that handle scaling in their own kernels (``fused=True``) go
    through ``GradScaler.step`` itself. The scale and growth tracker are
    mirrored on the host (:class:`~.host_scale.HostScale`, which moves them as
    GradScaler's update kernel does), so ``state_dict()`` and ``loss_scale``
    cost no sync, nor does a step that backs off or grows the scale; the state
    is re-read (one sync) only when somebody else loads a state into, or sets
    the scale of, the GradScaler.

    The GradScaler made here is an
    :class:`~fp16utils._torch.state.ObservedGradScaler`, which counts such
    outside changes and checks a state loaded from outside before it is
    applied. A GradScaler given with :meth:`adopt_scaler` is kept as it is
    (its class, its identity) and watched through its host-side fingerprint
    (:func:`~fp16utils._torch.state.grad_scaler_fingerprint`): an unusable
    state loaded into it from outside is refused when the engine next looks.

    Args:
        spec: The parsed ``loss_scale``.
        dtype: The low-precision dtype (bfloat16 gets no scaling).
        device_type: Returns the device type of the gradients (the GradScaler
            is made lazily, at the first scaled backward).
        nonfinite: See :data:`fp16utils._args.spec.NONFINITE_POLICIES`.
        clip: A parsed ``clip_grad``.
        agree_across_ranks: None (agree when the world size is > 1), True,
            False or a process group: the found-inf flag is all-reduced (max)
            before it is read, in the same sync (see :mod:`.ranks`).
        owner: Who builds it, for error messages.

    Raises:
        ValueError: A ``growth_interval`` that ``GradScaler`` cannot take (above
            2**63 - 1); nothing is made then.
    """

    def __init__(self, spec: ScaleSpec, dtype: torch.dtype,
                 device_type: Callable[[], str], nonfinite: str = 'warn',
                 clip: Optional[Clip] = None, agree_across_ranks: Any = None,
                 owner: str = 'NativeEngine') -> None:
        super().__init__(clip, nonfinite)
        self.agree_across_ranks = agree_across_ranks
        self.enabled = spec.enabled and dtypes.needs_loss_scaling(dtype)
        self.static = spec.static
        self._host = HostScale(spec)
        self._device_type = device_type
        self._scaler: Optional[Any] = None
        self._made_here = True  # an ObservedGradScaler made here, not one adopted
        self._seen_changes: Any = 0
        if self.enabled:
            problem = grad_scaler_bounds_error(owner, 0 if spec.static else spec.growth_interval)
            if problem:
                raise ValueError(problem)
            self._note_scale(0, self._host.scale)

    @property
    def scaler(self) -> Any:
        """The GradScaler, made on first use for the gradients' device."""
        scaler = self._scaler
        if scaler is None:
            host = self._host
            args = dict(init_scale=host.scale, growth_factor=host.growth_factor,
                        backoff_factor=host.backoff_factor,
                        growth_interval=host.growth_interval, enabled=self.enabled)
            if self.enabled:
                scaler = _state.make_observed_grad_scaler(
                    self._device_type(), self._check_outside_state, **args)
                _state.quiet_grad_scaler_load(scaler, host.state_dict())  # the tracker too
            else:
                scaler = factory.make_grad_scaler(self._device_type(), **args)
            self._scaler, self._made_here = scaler, True
            self._seen_changes = self._changes(scaler)
        return scaler

    def adopt_scaler(self, scaler: Any) -> None:
        """Scale with ``scaler``, a GradScaler made elsewhere, from now on (one sync).

        Its state becomes the host mirror; it stays as it is (its class, its
        methods: a ``ShardedGradScaler`` keeps agreeing across ranks) and is
        watched through its host-side fingerprint. A disabled one turns scaling
        off, as it would in plain torch.
        """
        if not all(callable(getattr(scaler, name, None))
                   for name in ('scale', 'unscale_', 'update', 'is_enabled', 'state_dict')):
            raise TypeError(
                f'The native backend scales with a torch GradScaler; got '
                f"{type(scaler).__name__}, which lacks its methods. Give a GradScaler (or "
                "backend='legacy' for an mmcv LossScaler).")
        self.enabled = bool(scaler.is_enabled())
        self._scaler, self._made_here = scaler, False
        self._seen_changes = self._changes(scaler)
        if self.enabled:
            self._host.load_state_dict(scaler.state_dict())
            self._host.lower_floor_to_scale()
            self._note_scale(self.scale_history[-1][0] if self.scale_history else 0,
                             self._host.scale)

    @property
    def loss_scale(self) -> float:
        if not self.enabled:
            return 1.0
        self._follow_scaler()
        return self._host.scale

    @property
    def at_scale_floor(self) -> bool:
        return self.enabled and not self.static and self.loss_scale <= self._host.min_scale

    @staticmethod
    def _check_outside_state(state: Any, where: str = 'GradScaler.load_state_dict()') -> None:
        """Refuse a state loaded into the GradScaler from outside that is not usable."""
        if check_scaler_state(state, where) != 'torch':
            raise KeyError(f"{where} takes GradScaler.state_dict()'s keys, got mmcv "
                           "LossScaler's; load it through the wrapper's (or hook's) "
                           'load_state_dict instead.')
        NativeEngine._check_bounds(state, False, where)

    def _changes(self, scaler: Any) -> Any:
        """What an outside change to ``scaler`` changes: a count, or a fingerprint."""
        if self._made_here:
            return _state.grad_scaler_changes(scaler)
        return _state.grad_scaler_fingerprint(scaler)

    def _quiet_update(self, scaler: Any, new_scale: Any = None) -> None:
        """``scaler.update(new_scale)``, not taken for an outside change."""
        _state.quiet_grad_scaler_update(scaler, new_scale)
        self._seen_changes = self._changes(scaler)

    def _quiet_load(self, scaler: Any) -> None:
        """Give ``scaler`` the host mirror, not taken for an outside change."""
        _state.quiet_grad_scaler_load(scaler, self._host.state_dict())
        self._seen_changes = self._changes(scaler)

    def _check_scaler_state(self, state: Mapping[str, Any], owner: str) -> None:
        if check_scaler_state(state, owner) == 'mmcv':
            state, static = mmcv_to_grad_scaler_state(state)
        else:
            static = self.static
        if self.enabled:
            self._check_bounds(state, static, owner)

    @staticmethod
    def _check_bounds(state: Mapping[str, Any], static: bool, owner: str) -> None:
        """Refuse a checked GradScaler state whose counters GradScaler cannot hold."""
        problem = grad_scaler_bounds_error(owner, 0 if static else state['growth_interval'],
                                           state['_growth_tracker'])
        if problem:
            raise ValueError(problem)

    def _follow_scaler(self) -> None:
        """When somebody else changed the GradScaler, take its state as the truth."""
        scaler = self._scaler
        if scaler is None:
            return
        changes = self._changes(scaler)
        if changes == self._seen_changes:
            return
        state = scaler.state_dict()
        if not self._made_here and self.enabled:  # not checked before it was applied
            try:
                self._check_outside_state(state, 'the GradScaler given to fp16utils')
            except ValueError as err:
                self._quiet_load(scaler)
                raise ValueError(f'{err} Its state was changed from outside (load_state_dict '
                                 'or update); the last usable state was put back.') from None
        self._seen_changes = changes
        self._host.load_state_dict(state)
        if type(state['growth_interval']) is not int:  # 2.0: torch's update needs an int
            self._quiet_load(scaler)
        self._note_scale(self.scale_history[-1][0] if self.scale_history else 0,
                         self._host.scale)

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        if self.enabled:
            loss = self.scaler.scale(loss)
        loss.backward(**kwargs)

    def _step(self, optimizer: torch.optim.Optimizer, step: int,
              kwargs: Mapping[str, Any]) -> bool:
        scaler = self._scaler
        if not self.enabled or scaler is None or not _state.grad_scaler_started(scaler):
            # No loss scaling (bfloat16, or disabled), or no scaled backward yet.
            return super()._step(optimizer, step, kwargs)
        if 'closure' in kwargs:
            raise RuntimeError('optimizer.step(closure=...) is not supported with loss '
                               'scaling (a closure would backward an unscaled loss); call '
                               'step() without it.')
        self.touched = True
        try:
            scaler.unscale_(optimizer)
        except ValueError as err:
            raise ValueError(
                f'{err} The native backend keeps float32 parameters and autocasts the '
                "forward; for a model converted to half, use backend='legacy' (float32 "
                'master weights).') from None
        # torch's clip_grad_norm_(error_if_nonfinite=True) would raise on an overflow
        # that is only a skipped step: then the flag is read first, and clean
        # gradients are clipped (a non-finite norm of finite gradients still raises).
        check_first = self._clip_raises_on_nonfinite()
        if not check_first:
            self.clip_grads(optimizer)
        self._follow_scaler()
        found = _state.grad_scaler_found_inf(scaler, optimizer)
        host = self._host
        reduce, _ = self._agreement()
        if reduce is not None:  # in place: fused kernels and the update see the agreed flag
            found = ranks.agree_found(found, self._device_type(), reduce)
        if not found:  # no parameter has a gradient: nothing to check or skip
            if check_first:
                self.clip_grads(optimizer)
            optimizer.step(**kwargs)
            self.committed = 'plain'
            self._quiet_update(scaler, host.scale)
            return False
        # The one device sync of the step (GradScaler.step would do the same).
        if len(found) == 1:
            flag = next(iter(found.values())).item()
        else:
            flag = max(v.item() for v in found.values())
        self._vetoed(step, flag)
        skipped = bool(flag)
        if check_first and not skipped:
            self.clip_grads(optimizer)
        if _state.optimizer_handles_unscaling(optimizer):
            scaler.step(optimizer, **kwargs)  # fused optimizers skip inside their kernel
        elif not skipped:
            optimizer.step(**kwargs)  # what GradScaler.step does once the flag is known
        if not skipped:
            self.committed = 'plain' if self.static else 'step'
        old = host.scale
        if self.static:
            self._quiet_update(scaler, old)
            if skipped and self.nonfinite == 'raise':
                raise nonfinite_error(step, f'with the static loss scale {old}')
        else:
            # GradScaler's update (the tracker, its per-iteration records), then the
            # scale that the host computed, floored and capped, when it changed: the
            # host knows it without reading the device.
            self._quiet_update(scaler)
            if skipped:
                host.back_off()
            if skipped or host.count_clean():
                self._quiet_update(scaler, host.scale)
        self._record(step, skipped, old, host.scale)
        return skipped

    def _clip_raises_on_nonfinite(self) -> bool:
        clip = self.clip
        return clip is not None and clip[0] == 'norm' and bool(
            clip[1].get('error_if_nonfinite', False))

    # -- a step that raised -----------------------------------------------------------------

    def save_point(self) -> Any:
        self._follow_scaler()  # an outside change made before the step is kept
        return super().save_point(), self._host.save()

    def roll_back(self, token: Any) -> None:
        base, saved = token
        self._host.restore(saved)
        super().roll_back(base)
        self._reload_scaler()

    def _settle(self, token: Any, step: int) -> None:
        """The optimizer stepped: count the clean step as the GradScaler's update would."""
        base, saved = token
        super()._settle(base, step)
        host = self._host
        host.restore(saved)
        old = host.scale
        if self.committed == 'step':
            host.count_clean()
        self._reload_scaler()
        self._record(step, False, old, host.scale)

    def _reload_scaler(self) -> None:
        """Give the GradScaler the host mirror and a fresh iteration."""
        scaler = self._scaler
        if scaler is None or not self.enabled:
            return
        _state.reset_grad_scaler_step(scaler)
        self._quiet_load(scaler)

    def state_dict(self) -> Dict[str, Any]:
        """``GradScaler.state_dict()``, built from the host mirror (no sync).

        Also when nothing is scaled (bfloat16, scaling disabled): then the state
        of the scale the configuration would use, never ``{}``, which an enabled
        GradScaler (MMEngine's, mmcv's on a GPU) refuses to load.
        """
        self._follow_scaler()
        return self._host.state_dict()

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """After ``pickle``/``copy.deepcopy``: watch the GradScaler as before.

        The one made here comes back a plain GradScaler: an ObservedGradScaler
        takes over its state.
        """
        self.__dict__.update(state)
        scaler = self._scaler
        if scaler is not None and self.enabled:
            if self._made_here:
                self._scaler = scaler = _state.observed_grad_scaler(
                    scaler, self._check_outside_state)
            self._seen_changes = self._changes(scaler)

    def _load_scaler_state(self, state: Mapping[str, Any]) -> None:
        if 'cur_scale' in state:
            new, self.static = mmcv_to_grad_scaler_state(state)
        else:
            new = dict(state)
        self._follow_scaler()  # an outside change made before this load is superseded
        self._host.load_state_dict(new)
        if self._scaler is not None:
            self._quiet_load(self._scaler)
