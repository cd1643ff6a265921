"""The base step engine: float32 steps, the records, and the resume sequence.

Example:
    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> engine = StepEngine()
    >>> engine.backward(p.sum())
    >>> engine.step(torch.optim.SGD([p], lr=1.0), step=1, kwargs={})
    False
    >>> p.tolist()
    [0.0, 0.0]
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Dict, List, Mapping, NamedTuple, Optional, Tuple

import torch
from torch import nn

from .._args.spec import SCALE_HISTORY_LEN, check_scaler_state, check_stats, nonfinite_error
from .._torch import compat, ops
from ..scaler import non_finite_check_
from . import ranks
from .checks import check_tensors, read_pending_window

__all__ = ['Clip', 'ResumeState', 'StepEngine', 'check_pending', 'flat_params',
           'pending_grads', 'resume_state_from_meta']

logger = logging.getLogger('fp16utils')

_Tensor = torch.Tensor
Clip = Tuple[str, Dict[str, Any]]


def flat_params(optimizer: torch.optim.Optimizer) -> List[_Tensor]:
    """Every parameter of ``optimizer``'s param groups, in order.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(1))
        >>> flat_params(torch.optim.SGD([p], lr=1.0)) == [p]
        True
    """
    return [p for group in optimizer.param_groups for p in group['params']]


def optimizer_device_type(optimizer: Any) -> str:
    """Where ``optimizer``'s first parameter lives; ``'cpu'`` when it has none (or no
    optimizer is given yet): with no parameter there is nothing to step.

    Example:
        >>> optimizer_device_type(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0))
        'cpu'
    """
    params = [] if optimizer is None else flat_params(optimizer)
    return params[0].device.type if params else 'cpu'


def _dense_grads(params: List[Any]) -> List[_Tensor]:
    """The dense gradients of ``params`` (a DTensor's local shard), skipping those without one."""
    grads = []
    for p in params:
        grad = p.grad
        if grad is None:
            continue
        if grad.is_sparse:
            grad = ops.sparse_values(grad)
        grads.append(ops.local_tensor(grad))  # FSDP2: this rank's shard
    return grads


def _clip(params: List[_Tensor], clip: Clip) -> Optional[_Tensor]:
    """Clip the gradients of ``params``; return the total norm (norm clipping) or None."""
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
    """Read what the 0.x hooks keep in ``runner.meta['fp16']``; raise when it is malformed.

    Args:
        meta: ``runner.meta`` (a dict or None).
        step: The iteration the run resumes at: a pending window saved for
            another iteration is left out.
        owner: Who resumes, for error messages.

    Returns:
        ``runner.meta['fp16']`` (an empty dict when absent) and what it holds.

    Example:
        >>> resume_state_from_meta(None, 0, 'hook')
        ({}, ResumeState(scaler=None, stats=None, masters=None, pending=None))
    """
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


class StepEngine:
    """Float32 steps: backward, clip, step. The base engine, with no-op defaults.

    Args:
        clip: A parsed ``clip_grad`` (see :func:`fp16utils._args.spec.parse_clip_grad`).
        nonfinite: What to do with an inf/nan gradient (``'ignore'``: apply it).

    Attributes:
        grad_norm: The total norm of the last norm-clipped step (a 0-dim tensor).
        clip_params: What to clip (None: the optimizer's parameters).
        clip_fn: Clips instead of the configured clipping when set (a 0.x hook's
            overridden ``clip_grads(params)``); returns the total norm or None.
        logger: Where skipped steps are reported (anything with ``warning(str)``).
        agree_across_ranks: Whether ranks agree on a skip (see :mod:`.ranks`):
            None (default: when the world size is > 1), True, False or a group.
    """

    #: Whether the loss is scaled.
    enabled = False

    def __init__(self, clip: Optional[Clip] = None, nonfinite: str = 'ignore') -> None:
        self.clip = clip
        self.clip_params: Optional[List[_Tensor]] = None
        self.clip_fn: Optional[Callable[[List[_Tensor]], Any]] = None
        self.grad_norm: Optional[_Tensor] = None
        self.nonfinite = nonfinite
        self.skipped_steps = 0
        self.scale_history: List[Tuple[int, float]] = []
        self.logger: Any = logger
        self.agree_across_ranks: Any = None
        #: None while the step being taken has changed nothing it cannot put back;
        #: once the optimizer applied the update, how the step completes
        #: (``'step'``: a clean step the scale counts; ``'plain'``: the scale stays).
        self.committed: Optional[str] = None
        #: Whether the step being taken has changed the gradients it was given
        #: (unscaled or clipped them in place): then they cannot be stepped again.
        self.touched = False
        #: This rank's reason to raise at the next step (the overflow guard's error
        #: when the ranks agree): folded into the agreed flag, raised on every rank.
        self.veto: Optional[BaseException] = None

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
        """Whether a dynamic loss scale sits at its floor (cannot back off further); no sync."""
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
        """Zero the gradients."""
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

        A step that raises (``KeyboardInterrupt`` included) before the optimizer
        applied the update leaves the engine as it was before it: scale, growth
        counters, skip count, scale history and the scaler's per-iteration state
        (a later ``unscale_`` runs again). Once the update is applied, the step is
        completed instead (the scale counts the clean step, masters reach the
        model) and the exception goes on; :attr:`committed` tells which.

        Args:
            optimizer: The optimizer to step.
            step: The iteration number, for the records and the messages.
            kwargs: Keyword arguments of ``optimizer.step``.
        """
        token = self.save_point()
        self.committed, self.touched = None, False
        try:
            return self._step(optimizer, step, kwargs)
        except BaseException:
            if self.committed is None:
                self.roll_back(token)
            else:
                self._settle(token, step)
            raise
        finally:
            self.veto = None

    def _step(self, optimizer: torch.optim.Optimizer, step: int,
              kwargs: Mapping[str, Any]) -> bool:
        """:meth:`step` without the recovery: what the engine does."""
        if self.veto is not None and ranks.reducer(self.agree_across_ranks) is None:
            raise self.veto  # nobody to agree with
        if self.nonfinite != 'ignore' and self._unscaled_skip(
                _dense_grads(flat_params(optimizer)), step):
            return True
        self.touched = self.clip is not None
        self.clip_grads(optimizer)
        optimizer.step(**kwargs)
        self.committed = 'plain'
        return False

    def save_point(self) -> Any:
        """What :meth:`roll_back` needs to put the engine back as it is now (host-side)."""
        return self.skipped_steps, list(self.scale_history), self.grad_norm

    def roll_back(self, token: Any) -> None:
        """Put back what :meth:`save_point` saw (after a step that raised)."""
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
        """No loss scaling: apply the non-finite policy; True when the step is skipped.

        One fused check and one device sync, unless the policy is ``'ignore'``.
        """
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
        """Restore a checkpoint: everything is checked before anything changes.

        Args:
            state: What the checkpoint holds.
            step: The iteration the run resumes at (for the scale history).
            owner: Who resumes, for error messages.
            grad_params: Where pending gradients go back (see :meth:`grad_params`).
            load_optimizer: Loads the optimizer state, after the checks; it must
                leave the optimizer as it was when it raises.
            reread_masters: Without saved masters, re-read them from the model.
        """
        commit = self.prepare_resume(state, step, owner, grad_params, reread_masters)
        if load_optimizer is not None:
            load_optimizer()
        commit()

    def prepare_resume(self, state: ResumeState, step: int, owner: str,
                       grad_params: List[_Tensor], reread_masters: bool = False
                       ) -> Callable[[], None]:
        """Check everything :meth:`resume` would load; return what loads it (cannot fail).

        Raises:
            TypeError, KeyError, ValueError: Naming the entry that does not fit;
                nothing is changed then.
        """
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
        """Raise, naming the key and the value, when ``state`` cannot be loaded."""
        check_scaler_state(state, owner)

    def _load_scaler_state(self, state: Mapping[str, Any]) -> None:
        """Load a checked scaler state (either format)."""

    def _check_masters(self, masters: Any, owner: str) -> Optional[List[_Tensor]]:
        """Raise when saved master weights do not fit; return them as a list (or None)."""
        return None

    def _load_masters(self, masters: Optional[List[_Tensor]], reread: bool) -> None:
        """Restore checked master weights."""

    def checkpoint(self) -> Dict[str, Any]:
        """What the engine adds to a checkpoint: scaler state, stats, masters."""
        return {'loss_scaler': self.state_dict(), 'stats': self.stats()}
