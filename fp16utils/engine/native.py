"""The native step engine (``torch.amp.GradScaler``, a scale floor, one sync per step) and
:class:`HostScale`, the host's copy of the GradScaler's scale state (no sync to read it)."""

from __future__ import annotations

from typing import Any, Callable, Dict, Mapping, Optional, Tuple

import torch

from .._args.limits import grad_scaler_bounds_error, to_float32
from .._args.policy import (
    at_floor,
    bounded_growth,
    check_policy_state,
    floor_of,
    on_clean,
    on_overflow,
    policy_state,
)
from .._args.spec import (
    ScaleSpec,
    check_scaler_state,
    grow_scale,
    mmcv_to_grad_scaler_state,
    nonfinite_error,
    shrink_scale,
)
from .._torch import dtypes, factory
from .._torch import state as _state
from . import ranks
from .base import Clip, StepEngine, StepState

__all__ = ['HostScale', 'NativeEngine']

_Tensor = torch.Tensor


class HostScale:
    """A GradScaler's scale, growth tracker, factors and interval on the host, with the scale
    policy (:class:`~fp16utils._args.policy.ScalePolicy`: hysteresis, floor, ceiling)."""

    def __init__(self, spec: ScaleSpec) -> None:
        self.scale = spec.init_scale
        self.tracker = 0  # GradScaler's _growth_tracker
        self.growth_factor = spec.growth_factor
        self.backoff_factor = spec.backoff_factor
        self.growth_interval = spec.growth_interval
        self.policy = spec.policy
        self.left = spec.policy.hysteresis  # overflows still tolerated (cur_hysteresis)
        self.min_scale = min(floor_of(spec.policy), spec.init_scale)

    def back_off(self, step: int = 0) -> float:
        """After an overflow at ``step``: GradScaler's float32 backoff (unless the hysteresis
        tolerates it), never below the floor; the policy's action when it is there already."""
        backs_off, left = on_overflow(self.left)
        if backs_off and self.scale <= self.min_scale:
            at_floor(self.policy, self.scale, f'step {step}')  # may raise: nothing changed
        self.left = left
        self.tracker = 0
        if backs_off:
            backed_off = to_float32(to_float32(self.scale) * self.backoff_factor)
            self.scale = shrink_scale(self.scale, backed_off, self.min_scale)
        return self.scale

    def count_clean(self) -> bool:
        """After a clean step: count it, grow every ``growth_interval`` (up to the ceiling);
        True when the growth interval completed."""
        self.tracker += 1
        grows = self.tracker == self.growth_interval
        if grows:
            self.tracker = 0
            self.scale = bounded_growth(
                self.scale, grow_scale(self.scale, self.growth_factor, float32=True),
                self.policy)
        self.left = on_clean(self.policy, self.left, grows)
        return grows

    def save(self) -> Tuple[float, int, int]:
        return self.scale, self.tracker, self.left

    def restore(self, saved: Tuple[float, int, int]) -> None:
        self.scale, self.tracker, self.left = saved

    def lower_floor_to_scale(self) -> None:
        """Take the current scale as the floor when it is below the policy's (a scale given
        from outside)."""
        self.min_scale = min(floor_of(self.policy), self.scale)

    def state_dict(self) -> Dict[str, Any]:
        return {
            'scale': self.scale,
            'growth_factor': self.growth_factor,
            'backoff_factor': self.backoff_factor,
            'growth_interval': self.growth_interval,
            '_growth_tracker': self.tracker,
            **policy_state(self.policy, self.left),
        }

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        self.scale = float(state['scale'])
        self.tracker = int(state['_growth_tracker'])
        self.growth_factor = float(state['growth_factor'])
        self.backoff_factor = float(state['backoff_factor'])
        self.growth_interval = int(state['growth_interval'])
        saved = check_policy_state(state, 'the loss scaler state')
        if saved is None:  # a state without a policy (mmcv's, torch's): ours stays
            self.left = self.policy.hysteresis
            return
        self.policy, self.left = saved
        if self.policy.min_scale is not None:
            self.min_scale = self.policy.min_scale


class NativeEngine(StepEngine):
    """``torch.amp.GradScaler`` steps with skip detection, a scale floor and no extra syncs."""

    backend = 'native'

    def __init__(self, spec: ScaleSpec, dtype: torch.dtype,
                 device_type: Callable[[], str], nonfinite: str = 'warn',
                 clip: Optional[Clip] = None, agree_across_ranks: Any = None,
                 owner: str = 'NativeEngine', **kwargs: Any) -> None:
        super().__init__(clip, nonfinite, agree_across_ranks=agree_across_ranks, **kwargs)
        self.enabled = spec.enabled and dtypes.needs_loss_scaling(dtype)
        self.static = spec.static
        self._host = HostScale(spec)
        self._device_type = device_type  # the gradients' device type: the scaler is made lazily
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
        """Scale with ``scaler``, a GradScaler made elsewhere, kept as it is (one sync)."""
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
            self._note_scale(self._last_noted(), self._host.scale)

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
        self._note_scale(self._last_noted(), self._host.scale)

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
        self.move(StepState.UNSCALED)
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
            self.move(StepState.APPLIED)
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
            self.move(StepState.APPLIED if self.static else StepState.STEPPED)
        old = host.scale
        if self.static:
            self._quiet_update(scaler, old)
            if skipped and self.nonfinite == 'raise':
                raise nonfinite_error(step, f'with the static loss scale {old}')
        else:
            # GradScaler's update (the tracker, its per-iteration records), then the
            # scale that the host computed, floored and capped, when it changed.
            self._quiet_update(scaler)
            if skipped:
                host.back_off(step)
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
        if self.state is StepState.STEPPED:
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
        """``GradScaler.state_dict()`` from the host mirror (no sync); never ``{}``, which
        an enabled GradScaler refuses, also when nothing is scaled."""
        self._follow_scaler()
        return self._host.state_dict()

    def __setstate__(self, state: Dict[str, Any]) -> None:
        """After ``pickle``/``copy.deepcopy``: watch the GradScaler (made here: an
        ObservedGradScaler again) as before."""
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
