"""The base step engine (float32: backward, clip, step), its step state, the resume sequence."""

from __future__ import annotations

import enum
import logging
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import nn

from .._args.spec import SCALE_HISTORY_LEN, check_scaler_state, check_stats, nonfinite_error
from .._torch import compat, ops
from ..scaler import non_finite_check_
from . import ranks
from .checks import check_tensors, read_pending_window

__all__ = ['Clip', 'ResumeState', 'StepEngine', 'StepState', 'check_pending', 'flat_params',
           'pending_grads', 'resume_state_from_meta']

_logger = logging.getLogger('fp16utils')

_Tensor = torch.Tensor
_STRIDED = torch.strided
Clip = Tuple[str, Dict[str, Any]]


def flat_params(optimizer: torch.optim.Optimizer) -> List[_Tensor]:
    """Every parameter of ``optimizer``'s param groups, in order."""
    return [p for group in optimizer.param_groups for p in group['params']]


def optimizer_device_type(optimizer: Any) -> str:
    """The device type of ``optimizer``'s first parameter; ``'cpu'`` without one."""
    params = [] if optimizer is None else flat_params(optimizer)
    return params[0].device.type if params else 'cpu'


def _dense_grads(params: List[Any]) -> List[_Tensor]:
    """The dense gradients of ``params`` (a DTensor's local shard), skipping those without one."""
    grads = [g for g in [p.grad for p in params] if g is not None]
    for g in grads:
        if type(g) is not _Tensor or g.layout is not _STRIDED:  # sparse, DTensor (FSDP2)
            return [ops.local_tensor(ops.sparse_values(g) if g.is_sparse else g)
                    for g in grads]
    return grads


def _clip(params: List[_Tensor], clip: Clip) -> Optional[_Tensor]:
    kind, kwargs = clip
    if kind == 'norm':
        return compat.clip_grad_norm_(params, **kwargs)
    compat.clip_grad_value_(params, **kwargs)
    return None


def pending_grads(params: List[_Tensor], copy: bool) -> List[Optional[_Tensor]]:
    """The gradients accumulated so far in an unfinished window (copies, or references)."""
    if copy:
        return [None if p.grad is None else p.grad.detach().clone() for p in params]
    return [p.grad for p in params]


def check_pending(params: List[_Tensor], grads: Any, owner: str) -> List[Optional[_Tensor]]:
    """Raise when saved pending gradients do not fit ``params``; return them as a list."""
    return check_tensors(grads, params, 'pending gradients', owner, allow_none=True)


def _restore_grads(params: List[_Tensor], grads: List[Optional[_Tensor]]) -> None:
    for p, g in zip(params, grads):
        p.grad = None if g is None else g.detach().to(p.device, p.dtype, copy=True)


class ResumeState(NamedTuple):
    """What a checkpoint holds for an engine, whatever the training style wrote it."""

    #: A ``GradScaler`` or mmcv ``LossScaler`` state dict (empty or None: none saved).
    scaler: Optional[Mapping[str, Any]] = None
    #: ``{'skipped_steps': ..., 'scale_history': ...}`` or None.
    stats: Optional[Mapping[str, Any]] = None
    #: The float32 master weights (legacy backend) or None.
    masters: Optional[List[_Tensor]] = None
    #: The gradients of an unfinished accumulation window, or None.
    pending: Optional[List[Optional[_Tensor]]] = None


def resume_state_from_meta(meta: Any, step: int, owner: str
                           ) -> Tuple[Dict[str, Any], ResumeState]:
    """``runner.meta['fp16']`` (``{}`` when absent) and what it holds; a pending window
    saved for an iteration other than ``step`` is left out."""
    if meta is not None and not isinstance(meta, Mapping):
        raise TypeError(f'{owner}: runner.meta must be a dict or None, got '
                        f'{type(meta).__name__} {meta!r}.')
    fp16_meta = (meta or {}).get('fp16')
    if fp16_meta is not None and not isinstance(fp16_meta, Mapping):
        raise TypeError(f"{owner}: runner.meta['fp16'] must be a dict (the loss scaler "
                        f'state and the statistics), got {type(fp16_meta).__name__} '
                        f'{fp16_meta!r}.')
    fp16_meta = fp16_meta or {}
    pending = fp16_meta.get('pending_window')
    grads = None
    if pending is not None:
        it, saved = read_pending_window(pending, "runner.meta['fp16']['pending_window']", owner)
        if it == step:
            grads = saved
    return fp16_meta, ResumeState(fp16_meta.get('loss_scaler'), fp16_meta.get('stats'),
                                  fp16_meta.get('master_params'), grads)


class StepState(enum.Enum):
    """Where the gradients in place stand: a step moves them READY -> UNSCALED -> APPLIED
    or STEPPED -> READY; an iteration that raised leaves them SPENT until discarded."""

    READY = 'ready'  #: usable: a backward adds to them, a step may take them
    UNSCALED = 'unscaled'  #: a step under way unscaled or clipped them in place
    APPLIED = 'applied'  #: the optimizer applied them; the scale's growth count stays
    STEPPED = 'stepped'  #: the optimizer applied them; a dynamic scale counts a clean step
    SPENT = 'spent'  #: an iteration raised after its backward began: discard them first

    @property
    def applied(self) -> bool:
        return self is StepState.APPLIED or self is StepState.STEPPED


#: The moves a step makes; any state may go to READY (returned, cleared) or SPENT (raised).
_STEP_MOVES = {
    StepState.READY: (StepState.UNSCALED, StepState.APPLIED, StepState.STEPPED),
    StepState.UNSCALED: (StepState.APPLIED, StepState.STEPPED),
}
for _state in StepState:  # kept on each member: a move then hashes no enum (Python-level)
    _state.moves = (StepState.READY, StepState.SPENT, *_STEP_MOVES.get(_state, ()))
del _state


class StepEngine:
    """Float32 steps (backward, clip, step): the base engine, with no-op defaults."""

    #: Whether the loss is scaled.
    enabled = False

    def __init__(self, clip: Optional[Clip] = None, nonfinite: str = 'ignore', *,
                 clip_params: Optional[List[_Tensor]] = None,
                 clip_fn: Optional[Callable[[List[_Tensor]], Any]] = None,
                 logger: Any = None, agree_across_ranks: Any = None) -> None:
        self.clip = clip
        self.clip_params = clip_params  # what to clip (None: the optimizer's parameters)
        self.clip_fn = clip_fn  # clips instead of ``clip`` (a 0.x hook's clip_grads)
        self.grad_norm: Optional[_Tensor] = None
        self.nonfinite = nonfinite  # see fp16utils._args.spec.NONFINITE_POLICIES
        self.skipped_steps = 0
        self.scale_history: List[Tuple[int, float]] = []
        self.logger: Any = _logger if logger is None else logger
        self.agree_across_ranks = agree_across_ranks  # see .ranks
        self.state = StepState.READY
        #: This rank's reason to raise at the next step (the overflow guard's error
        #: when the ranks agree): folded into the agreed flag, raised on every rank.
        self.veto: Optional[BaseException] = None

    def move(self, to: StepState) -> None:
        """Move :attr:`state` to ``to``; every move of the step state goes through here."""
        if to not in self.state.moves:
            raise RuntimeError(f'step state {self.state.name} cannot move to {to.name}')
        self.state = to

    # -- what the wrapper or hook reads -------------------------------------------------------

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 when nothing is scaled); no device sync."""
        return 1.0

    @property
    def scaler(self) -> Any:
        """The scaler object (GradScaler or LossScaler), or None."""
        return None

    @property
    def at_scale_floor(self) -> bool:
        """Whether a dynamic loss scale sits at its floor; no sync."""
        return False

    @property
    def masters(self) -> Optional[List[nn.Parameter]]:
        """The float32 master weights (legacy backend), else None."""
        return None

    def grad_params(self, optimizer: torch.optim.Optimizer) -> List[_Tensor]:
        """The tensors whose ``.grad`` accumulates over a window."""
        return flat_params(optimizer)

    # -- the step ---------------------------------------------------------------------------

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        """Backward ``loss`` (scaled, where the engine scales)."""
        loss.backward(**kwargs)

    def zero_grad(self, optimizer: torch.optim.Optimizer, **kwargs: Any) -> None:
        optimizer.zero_grad(**kwargs)

    def clip_grads(self, optimizer: torch.optim.Optimizer) -> None:
        """Clip the (unscaled) gradients, when clipping is configured."""
        clip = self.clip
        if clip is None:
            return
        params = self.clip_params
        params = flat_params(optimizer) if params is None else params
        norm = _clip(params, clip) if self.clip_fn is None else self.clip_fn(params)
        if norm is not None:
            self.grad_norm = norm

    def step(self, optimizer: torch.optim.Optimizer, step: int,
             kwargs: Mapping[str, Any]) -> bool:
        """Clip and step; return True when the step was skipped.

        A step that raises before the optimizer applied the update is rolled
        back (scale, counters, history, the scaler's per-iteration state); one
        that raises after it is completed (:meth:`_settle`). Either way the
        exception goes on and :attr:`state` says how far the step got.
        """
        token = self.save_point()
        self.move(StepState.READY)
        try:
            skipped = self._step(optimizer, step, kwargs)
        except BaseException:
            if self.state.applied:
                self._settle(token, step)
            else:
                self.roll_back(token)
            raise
        finally:
            self.veto = None
        self.move(StepState.READY)
        return skipped

    def _step(self, optimizer: torch.optim.Optimizer, step: int,
              kwargs: Mapping[str, Any]) -> bool:
        if self.veto is not None and ranks.reducer(self.agree_across_ranks) is None:
            raise self.veto  # nobody to agree with
        if self.nonfinite != 'ignore' and self._unscaled_skip(
                _dense_grads(flat_params(optimizer)), step):
            return True
        if self.clip is not None:
            self.move(StepState.UNSCALED)
        self.clip_grads(optimizer)
        optimizer.step(**kwargs)
        self.move(StepState.APPLIED)
        return False

    def save_point(self) -> Any:
        """What :meth:`roll_back` needs to put the engine back as it is now (host-side)."""
        return self.skipped_steps, list(self.scale_history), self.grad_norm

    def roll_back(self, token: Any) -> None:
        self.skipped_steps, self.scale_history, self.grad_norm = token[0], list(token[1]), token[2]

    def _settle(self, token: Any, step: int) -> None:
        """Complete a step that raised after the optimizer applied the update."""
        self.skipped_steps, self.scale_history = token[0], list(token[1])

    def _agreement(self) -> Tuple[Optional[ranks.Reducer], List[_Tensor]]:
        """This step's rank agreement (None: decide alone), with :attr:`veto` folded in."""
        reduce = ranks.reducer(self.agree_across_ranks)
        if reduce is None:
            return None, []
        return ranks.with_veto(reduce, self.veto is not None)

    def _vetoed(self, step: int, agreed: float) -> None:
        """Raise on every rank when a rank vetoed this step (``agreed``: the agreed flag)."""
        if agreed < ranks.VETO:
            return
        if self.veto is not None:
            raise self.veto
        err = FloatingPointError(
            f'step {step}: the overflow guard of another rank found non-finite values in its '
            'guarded forward and backward (that rank\'s error names the module); every rank '
            'raises at this step, and nothing was updated.')
        err.report = None  # type: ignore[attr-defined]
        raise err

    def _unscaled_skip(self, grads: List[_Tensor], step: int) -> bool:
        """No loss scaling: apply the non-finite policy (one fused check); True: skipped."""
        if self.nonfinite == 'ignore':
            return False
        reduce, seen = self._agreement()  # every rank takes part
        if (not grads and reduce is None) or not non_finite_check_(grads, reduce=reduce):
            return False
        if seen:
            self._vetoed(step, seen[-1].item())
        if self.nonfinite == 'raise':
            raise nonfinite_error(step, 'and no loss scaling to back off')
        self.skipped_steps += 1
        self.logger.warning(f'step {step}: non-finite gradients (inf/nan) and no loss '
                            'scaling to back off; update skipped')
        return True

    def _record(self, step: int, skipped: bool, old: float, new: float) -> None:
        if skipped:
            self.skipped_steps += 1
            self.logger.warning(f'step {step}: non-finite gradients (inf/nan), update '
                                f'skipped; loss scale {old} -> {new}')
        if new != old:
            self._note_scale(step, new)

    def _note_scale(self, step: int, scale: float) -> None:
        history = self.scale_history
        if history and history[-1][1] == scale:
            return
        history.append((step, scale))
        if len(history) > SCALE_HISTORY_LEN:
            del history[0]

    def _last_noted(self) -> int:
        """The step of the last scale noted (0 before any)."""
        return self.scale_history[-1][0] if self.scale_history else 0

    # -- state ------------------------------------------------------------------------------

    def state_dict(self) -> Dict[str, Any]:
        """The scaler state (empty here: this engine has no scaler)."""
        return {}

    def stats(self) -> Dict[str, Any]:
        """The skip count and scale history, for checkpoints."""
        return {'skipped_steps': self.skipped_steps, 'scale_history': list(self.scale_history)}

    def resume(self, state: ResumeState, step: int, owner: str, grad_params: List[_Tensor],
               load_optimizer: Optional[Callable[[], None]] = None,
               reread_masters: bool = False) -> None:
        """Restore a checkpoint: all is checked, then ``load_optimizer()``, then the rest."""
        commit = self.prepare_resume(state, step, owner, grad_params, reread_masters)
        if load_optimizer is not None:
            load_optimizer()
        commit()

    def prepare_resume(self, state: ResumeState, step: int, owner: str,
                       grad_params: List[_Tensor], reread_masters: bool = False
                       ) -> Callable[[], None]:
        """Check everything :meth:`resume` would load (raising changes nothing); return
        what loads it, which cannot fail."""
        scaler_state = state.scaler or None
        if scaler_state is not None:
            self._check_scaler_state(scaler_state, owner)
        pending = None
        if state.pending is not None:
            pending = check_pending(grad_params, state.pending, owner)
        masters = self._check_masters(state.masters, owner)
        stats = check_stats(state.stats, owner) if state.stats else None

        def commit() -> None:
            if stats is not None:  # first: loading the scale then notes it when it differs
                self.skipped_steps = stats[0]
                self.scale_history = stats[1][-SCALE_HISTORY_LEN:]
            if self.enabled and scaler_state is not None:
                self._load_scaler_state(scaler_state)
                self._note_scale(step, self.loss_scale)
            self._load_masters(masters, reread_masters)
            if pending is not None:
                _restore_grads(grad_params, pending)

        return commit

    def _check_scaler_state(self, state: Mapping[str, Any], owner: str) -> None:
        check_scaler_state(state, owner)

    def _load_scaler_state(self, state: Mapping[str, Any]) -> None:
        """Load a checked scaler state (either format)."""

    def _check_masters(self, masters: Any, owner: str) -> Optional[List[_Tensor]]:
        return None

    def _load_masters(self, masters: Optional[List[_Tensor]], reread: bool) -> None:
        """Restore checked master weights."""

    def checkpoint(self) -> Dict[str, Any]:
        """What the engine adds to a checkpoint: scaler state, stats, masters."""
        return {'loss_scaler': self.state_dict(), 'stats': self.stats()}
