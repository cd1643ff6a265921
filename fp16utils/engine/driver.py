"""The step driver both training styles share (backward, step, records, the pending window),
and :class:`StepResult`, what one iteration did."""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional, Union

import torch

from .._args.spec import check_scaler_state, check_stats
from .backward import discard_spent, guarded_backward, refuse_spent
from .base import ResumeState, StepEngine, StepState, pending_grads
from .checks import PENDING_KEY, check_tensors
from .guard import OverflowGuard
from .window import AccumulationWindow

__all__ = ['Driven', 'StepDriver', 'StepResult', 'check_resume']

_Tensor = torch.Tensor
_Norm = Union[_Tensor, float, None]
_FIELDS = ('stepped', 'skipped', 'accumulating', 'scale', 'grad_norm')


class StepResult:
    """What one optimizer-wrapper (or hook) iteration did: stepped, skipped or accumulated.

    Exactly one of :attr:`stepped`, :attr:`skipped` and :attr:`accumulating`
    is True. Results are immutable, compare equal field by field, hash,
    pickle, and cost no device synchronisation to make: the gradient norm is
    kept as the 0-dim tensor the clipping returned and converted to a float
    (one sync) the first time :attr:`grad_norm` is read.

    Args:
        stepped: The optimizer stepped: the parameters changed.
        skipped: The gradients held an inf or a nan and the update was
            skipped: parameters and optimizer state are unchanged.
        accumulating: The gradients were accumulated; the optimizer steps at
            the end of the accumulation window.
        scale: The loss scale this iteration's gradients were multiplied by
            (for a step: before a skip backs it off or a growth raises it);
            None when nothing is scaled (float32, bfloat16, scaling disabled).
        grad_norm: The total gradient norm when this step clipped by norm
            (a 0-dim tensor or a float), else None.

    Raises:
        ValueError: Not exactly one of ``stepped``, ``skipped``, ``accumulating`` is True.

    Example:
        >>> r = StepResult(stepped=True, scale=1024.0, grad_norm=torch.tensor(2.0))
        >>> r.stepped, r.skipped, r.scale, r.grad_norm
        (True, False, 1024.0, 2.0)
    """

    __slots__ = ('stepped', 'skipped', 'accumulating', 'scale', '_norm')

    stepped: bool
    skipped: bool
    accumulating: bool
    scale: Optional[float]

    def __init__(self, stepped: bool = False, skipped: bool = False,
                 accumulating: bool = False, scale: Optional[float] = None,
                 grad_norm: _Norm = None) -> None:
        if int(stepped) + int(skipped) + int(accumulating) != 1:
            raise ValueError(
                f'StepResult: exactly one of stepped, skipped and accumulating must be True, '
                f'got stepped={stepped!r}, skipped={skipped!r}, accumulating={accumulating!r}.')
        if grad_norm is not None and not isinstance(grad_norm, torch.Tensor):
            grad_norm = float(grad_norm)
        setter = object.__setattr__
        setter(self, 'stepped', bool(stepped))
        setter(self, 'skipped', bool(skipped))
        setter(self, 'accumulating', bool(accumulating))
        setter(self, 'scale', None if scale is None else float(scale))
        setter(self, '_norm', grad_norm)

    @property
    def grad_norm(self) -> Optional[float]:
        """The total gradient norm of a norm-clipped step, or None (one sync on first read)."""
        norm = self._norm
        if isinstance(norm, torch.Tensor):
            norm = float(norm)
            object.__setattr__(self, '_norm', norm)
        return norm

    def to_dict(self) -> Dict[str, Any]:
        """The fields as a plain dict (reads :attr:`grad_norm`)."""
        return {name: getattr(self, name) for name in _FIELDS}

    def _key(self) -> tuple:
        return tuple(getattr(self, name) for name in _FIELDS)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f'StepResult is immutable: cannot set {name!r}; make a new one.')

    def __delattr__(self, name: str) -> None:
        raise AttributeError(f'StepResult is immutable: cannot delete {name!r}.')

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, StepResult):
            return NotImplemented
        return self._key() == other._key()

    def __hash__(self) -> int:
        return hash(self._key())

    def __reduce__(self) -> tuple:
        return (StepResult, self._key())

    def __repr__(self) -> str:
        fields = ', '.join(f'{name}={getattr(self, name)!r}' for name in _FIELDS)
        return f'StepResult({fields})'


def _scale(engine: StepEngine) -> Optional[float]:
    return engine.loss_scale if engine.enabled else None


def check_resume(state: ResumeState, params: List[_Tensor], owner: str,
                 masters: bool) -> None:
    """Check what a checkpoint holds against ``params`` (and saved masters when ``masters``)
    before anything it would change is touched."""
    if state.scaler:
        check_scaler_state(state.scaler, owner)
    if state.pending is not None:
        check_tensors(state.pending, params, 'pending gradients', owner, allow_none=True)
    if state.stats:
        check_stats(state.stats, owner)
    if masters and state.masters is not None:
        check_tensors(state.masters, params, 'master weights', owner, allow_none=False)


class StepDriver:
    """Backward, step, the records and the pending window, for a wrapper or a hook.

    The gradients' progress through a step is the engine's :class:`~.base.StepState`.
    """

    def __init__(self, owner: str, window: AccumulationWindow,
                 engine: Optional[StepEngine] = None,
                 guard: Optional[OverflowGuard] = None) -> None:
        self.owner = owner
        self.window = window
        self.engine = engine  # a hook's comes when the run starts
        self.guard = guard
        self.steps_taken = 0  # steps really taken (not skipped); host-side, monotonic
        self.last_result: Optional[StepResult] = None
        self.restored: Optional[int] = None  # where a restored pending window continues

    def _engine(self) -> StepEngine:
        engine = self.engine
        if engine is None:
            raise RuntimeError(f'{self.owner}: no step engine yet; start the run first.')
        return engine

    def backward(self, loss: _Tensor, step: int, earlier: int,
                 zero_grad: Callable[[], None], **kwargs: Any) -> None:
        """Backward ``loss`` through the engine, guarded; spent gradients are discarded first.

        ``earlier``: iterations of the window before this one; ``step``: from 1.
        """
        engine = self._engine()
        discard_spent(engine, zero_grad, self.owner, earlier)
        try:
            guarded_backward(engine, self.guard, lambda: engine.backward(loss, **kwargs), step)
        except BaseException:
            engine.move(StepState.SPENT)
            raise

    def step(self, optimizer: Any, step: int, kwargs: Mapping[str, Any]) -> StepResult:
        """Take (or skip) the step, record it and return its result.

        A step that raises once the update is applied is recorded as taken; gradients it
        changed are spent. No device sync beyond the engine's.
        """
        engine = self._engine()
        refuse_spent(engine, self.owner)
        scale, before = _scale(engine), engine.grad_norm
        try:
            skipped = engine.step(optimizer, step, kwargs)
        except BaseException:
            if engine.state.applied:
                self._record(engine, StepResult(stepped=True, scale=scale,
                                                grad_norm=_new_norm(engine, before)))
            if engine.state is not StepState.READY:
                engine.move(StepState.SPENT)
            raise
        result = StepResult(stepped=not skipped, skipped=skipped, scale=scale,
                            grad_norm=_new_norm(engine, before))
        self._record(engine, result)
        return result

    def _record(self, engine: StepEngine, result: StepResult) -> None:
        self.last_result = result
        if result.stepped:
            self.steps_taken += 1
        if self.guard is not None:
            self.guard.record(result.skipped, engine.at_scale_floor)

    def accumulated(self) -> StepResult:
        """Record an iteration that only accumulated its gradients; return its result."""
        result = self.last_result = StepResult(accumulating=True, scale=_scale(self._engine()))
        return result

    def raised(self) -> None:
        """An iteration raised after its backward began: its gradients are spent."""
        self._engine().move(StepState.SPENT)

    def grads_cleared(self) -> None:
        if self.engine is not None:
            self.engine.move(StepState.READY)

    def pending_window(self, optimizer: Any, done: int, copy: bool
                       ) -> Optional[Dict[str, Any]]:
        """``{'iter': done, 'grads': [...]}`` to save after ``done`` iterations; None when
        ``done`` ends a window or the gradients are spent."""
        engine = self._engine()
        if not done % self.window.counts or engine.state is StepState.SPENT:
            return None
        return {PENDING_KEY: done, 'grads': pending_grads(engine.grad_params(optimizer), copy)}

    def restoring(self, pending: bool, done: int) -> None:
        """Note whether a pending window was restored to continue after ``done`` iterations."""
        self.restored = done if pending else None
        if pending:
            self._engine().move(StepState.READY)  # the saved window's gradients are back


def _new_norm(engine: StepEngine, before: Optional[_Tensor]) -> Optional[_Tensor]:
    """The norm this step's clipping returned (None when it did not clip by norm)."""
    norm = engine.grad_norm
    return None if norm is before else norm


class Driven:
    """What the owner of a :class:`StepDriver` (a wrapper, a hook) shows of its records."""

    __slots__ = ()
    _driver: StepDriver

    @property
    def steps_taken(self) -> int:
        """Optimizer steps really taken (skipped ones not counted) by this object.

        Host-side and monotonic (not saved with the state: a resumed object
        counts from 0); :func:`~fp16utils.skip_aware` followers read it.
        """
        return self._driver.steps_taken

    @property
    def last_result(self) -> Optional[StepResult]:
        """The :class:`~fp16utils.StepResult` of the last iteration (None before any)."""
        return self._driver.last_result
