"""The legacy step engine: float32 master weights for a half model, scaled by ``LossScaler``."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any, Callable, Dict, List, Mapping, Optional

import torch
from torch import nn

from .._args.policy import floor_of
from .._args.spec import (
    MIN_LOSS_SCALE,
    ScaleSpec,
    grad_scaler_to_mmcv_state,
    mmcv_to_grad_scaler_state,
    nonfinite_error,
)
from .._torch import compat, dtypes, ops
from ..scaler import LossScaler, non_finite_check_
from . import ranks
from .base import Clip, StepEngine, StepState, flat_params
from .checks import check_tensors

__all__ = ['LegacyEngine']

_Tensor = torch.Tensor


class LegacyEngine(StepEngine):
    """Steps float32 masters of a half model's parameters (the optimizer's, re-pointed)."""

    backend = 'legacy'

    def __init__(self, optimizer: torch.optim.Optimizer, spec: ScaleSpec,
                 dtype: torch.dtype, owner: str, nonfinite: str = 'warn',
                 clip: Optional[Clip] = None, *,
                 reduce: Optional[Callable[[List[nn.Parameter]], None]] = None,
                 **kwargs: Any) -> None:
        super().__init__(clip, nonfinite, **kwargs)
        originals = flat_params(optimizer)
        bad = sorted({str(p.dtype) for p in originals if p.dtype != torch.float32})
        if bad:
            raise ValueError(
                f'{owner}: the legacy backend needs an optimizer built on the float32 '
                f'model, but it holds {bad} parameters; build the optimizer before the '
                'model is converted to half, and let the wrapper convert it.')
        if any(p.is_meta for p in originals):
            raise ValueError(
                f'{owner}: the optimizer holds parameters on the meta device (no data), and '
                'the legacy backend copies them into float32 master weights now; materialise '
                'the model first (model.to_empty(device=...) and initialise it), then build '
                'the optimizer and the wrapper.')
        if len({id(p) for p in originals}) != len(originals):
            raise ValueError(f'{owner}: a parameter appears twice in the optimizer\'s '
                             'param_groups; give each parameter to one group only.')
        if spec.enabled and dtypes.needs_loss_scaling(dtype) and not spec.static and (
                not math.isclose(spec.growth_factor * spec.backoff_factor, 1.0, rel_tol=1e-6)):
            raise ValueError(
                f"{owner}: the legacy backend's LossScaler backs off by 1/growth_factor, "
                f'but loss_scale asks for growth_factor={spec.growth_factor} and '
                f'backoff_factor={spec.backoff_factor}; drop backoff_factor or make it '
                '1/growth_factor.')
        self.enabled = spec.enabled and dtypes.needs_loss_scaling(dtype)
        self.loss_scaler = LossScaler(
            init_scale=spec.init_scale, mode='static' if spec.static else 'dynamic',
            scale_factor=spec.growth_factor, scale_window=spec.growth_interval,
            **spec.policy.given())
        self.reduce = reduce  # called with the masters once their gradients are in
        self.model_params: List[_Tensor] = []
        self._masters: List[nn.Parameter] = []
        self._groups = 0
        self._owner = owner
        self._adopt(optimizer, originals)
        self.clip_params = self._masters
        if self.enabled:
            self._note_scale(0, self.loss_scaler.loss_scale)

    def _adopt(self, optimizer: torch.optim.Optimizer, originals: List[_Tensor]) -> None:
        """Give the param groups from ``self._groups`` on float32 masters of ``originals``."""
        with torch.no_grad():
            masters = [nn.Parameter(p.detach().clone(memory_format=torch.preserve_format),
                                    requires_grad=p.requires_grad) for p in originals]
        mapping = {p: m for p, m in zip(originals, masters)}
        start = 0
        for group in optimizer.param_groups[self._groups:]:
            count = len(group['params'])
            group['params'] = masters[start:start + count]
            start += count
        state: Dict[Any, Any] = defaultdict(dict)
        for key, value in optimizer.state.items():
            state[mapping.get(key, key)] = value
        optimizer.state = state
        self.model_params.extend(originals)
        self._masters.extend(masters)
        self._groups = len(optimizer.param_groups)

    def adopt_added_groups(self, optimizer: torch.optim.Optimizer) -> None:
        """Give float32 masters to param groups appended since wrapping (``add_param_group``)."""
        if len(optimizer.param_groups) == self._groups:
            return
        added = [p for g in optimizer.param_groups[self._groups:] for p in g['params']]
        known = {id(p) for p in self.model_params}
        bad = [p for p in added if p.dtype != torch.float32 or id(p) in known]
        if bad or len({id(p) for p in added}) != len(added):
            raise ValueError(
                f'{self._owner}: a param group was added to the optimizer after wrapping '
                f'(add_param_group) with {len(added)} parameters of dtypes '
                f'{sorted({str(p.dtype) for p in added})}; the legacy backend steps float32 '
                'master copies, so an added group must hold float32 parameters that the '
                'optimizer does not hold yet. Add the parameters before wrapping (before the '
                'model is converted to half), or remove the group. Nothing was changed.')
        self._adopt(optimizer, added)

    def adopt_scaler(self, scaler: Any) -> None:
        """Decide skips and scales with ``scaler``, an mmcv-style LossScaler made elsewhere."""
        if not (all(callable(getattr(scaler, name, None))
                    for name in ('update_scale', 'state_dict', 'load_state_dict'))
                and hasattr(scaler, 'cur_scale') and hasattr(scaler, 'mode')):
            raise TypeError(
                f"{self._owner}: the legacy backend scales with an mmcv LossScaler "
                f'(cur_scale, mode, update_scale, state_dict); got {type(scaler).__name__}. '
                "Give a LossScaler (or backend='native' for a torch GradScaler).")
        self.loss_scaler = scaler
        if self.enabled:
            self._note_scale(self._last_noted(), float(scaler.cur_scale))

    @property
    def loss_scale(self) -> float:
        return self.loss_scaler.loss_scale if self.enabled else 1.0

    @property
    def scaler(self) -> LossScaler:
        return self.loss_scaler

    @property
    def at_scale_floor(self) -> bool:
        scaler = self.loss_scaler
        policy = getattr(scaler, 'policy', None)  # an mmcv LossScaler adopted has none
        floor = MIN_LOSS_SCALE if policy is None else floor_of(policy)
        return self.enabled and scaler.mode == 'dynamic' and scaler.cur_scale <= floor

    @property
    def masters(self) -> List[nn.Parameter]:
        return self._masters

    def grad_params(self, optimizer: torch.optim.Optimizer) -> List[_Tensor]:
        return self.model_params  # the half model's gradients accumulate

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
                ops.foreach_zero_(grads)

    def copy_grads_to_masters(self) -> List[_Tensor]:
        """Copy the model's gradients into the masters' (float32; a sparse one's values)."""
        src: List[_Tensor] = []
        dst: List[_Tensor] = []
        sparse: List[_Tensor] = []
        for p, m in zip(self.model_params, self._masters):
            grad = p.grad
            if grad is None:
                m.grad = None
                continue
            if grad.is_sparse:
                m.grad = grad.to(torch.float32, copy=True)
                sparse.append(ops.sparse_values(m.grad))
                continue
            mgrad = m.grad
            if mgrad is None:
                mgrad = m.grad = torch.empty_like(m)
            src.append(grad)
            dst.append(mgrad)
        if dst:
            compat.foreach_copy_(dst, src)
        return dst + sparse if sparse else dst

    def copy_masters_to_model(self) -> None:
        """Copy the float32 masters into the (half) model's parameters."""
        with torch.no_grad():
            compat.foreach_copy_(self.model_params, self._masters)

    def _step(self, optimizer: torch.optim.Optimizer, step: int,
              kwargs: Mapping[str, Any]) -> bool:
        self.adopt_added_groups(optimizer)
        grads = self.copy_grads_to_masters()
        if self.reduce is not None:
            self.reduce(self._masters)
            # The reduction may give a master a gradient it had not (another rank had one).
            grads = [m.grad for m in self._masters if m.grad is not None]
        scaler = self.loss_scaler
        old = scaler.cur_scale
        if not self.enabled:
            if self.veto is not None and ranks.reducer(self.agree_across_ranks) is None:
                raise self.veto
            if self._unscaled_skip(grads, step):
                return True
            overflow = False
        else:
            reduce, seen = self._agreement()
            overflow = non_finite_check_(grads, 1.0 / old, reduce=reduce)
            if overflow and seen:
                self._vetoed(step, seen[-1].item())
            elif self.veto is not None and reduce is None:
                raise self.veto
            if overflow and scaler.mode == 'static' and self.nonfinite == 'raise':
                raise nonfinite_error(step, f'with the static loss scale {old}')
        if not overflow:
            self.clip_grads(optimizer)
            optimizer.step(**kwargs)
            self.move(StepState.STEPPED)
            self.copy_masters_to_model()
        if self.enabled:
            scaler.update_scale(overflow)
            self._record(step, overflow, old, scaler.cur_scale)
        return overflow

    def save_point(self) -> Any:
        return super().save_point(), self.loss_scaler.state_dict()

    def roll_back(self, token: Any) -> None:
        base, state = token
        super().roll_back(base)
        for key, value in state.items():
            setattr(self.loss_scaler, key, value)

    def _settle(self, token: Any, step: int) -> None:
        """The masters stepped: the model gets them, and the scale counts the clean step."""
        base, state = token
        super()._settle(base, step)
        scaler = self.loss_scaler
        for key, value in state.items():
            setattr(scaler, key, value)
        self.copy_masters_to_model()
        if self.enabled:
            old = scaler.cur_scale
            scaler._advance(False)
            self._record(step, False, old, scaler.cur_scale)

    def state_dict(self) -> Dict[str, Any]:
        if self.enabled:
            return self.loss_scaler.state_dict()
        # Nothing scaled (bfloat16): GradScaler's keys, which an enabled GradScaler loads.
        return mmcv_to_grad_scaler_state(self.loss_scaler.state_dict())[0]

    def checkpoint(self) -> Dict[str, Any]:
        return {**super().checkpoint(), 'master_params': self._masters}  # references

    def _load_scaler_state(self, state: Mapping[str, Any]) -> None:
        if 'cur_scale' not in state:
            state = grad_scaler_to_mmcv_state(state, self.loss_scaler.mode == 'static')
        self.loss_scaler.load_state_dict(state)

    def _check_masters(self, masters: Any, owner: str) -> Optional[List[_Tensor]]:
        if masters is None:
            return None
        return check_tensors(masters, self._masters, 'master weights', owner, allow_none=False)

    def _load_masters(self, masters: Optional[List[_Tensor]], reread: bool) -> None:
        with torch.no_grad():
            if masters is None:
                if reread:
                    compat.foreach_copy_(self._masters, self.model_params)
                return
            compat.foreach_copy_(self._masters, list(masters))
            compat.foreach_copy_(self.model_params, self._masters)
