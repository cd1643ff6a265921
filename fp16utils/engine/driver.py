"""The step driver: what both training styles do around the engine, kept in one place.

The 1.x optimizer wrappers (:mod:`fp16utils.optim`) and the 0.x hooks
(:mod:`fp16utils.hooks.optimizer`) each own a :class:`StepDriver`. It runs the backward
pass under the overflow guard, takes (or skips) the step and says what
happened as a :class:`~fp16utils.StepResult`, counts the steps taken, keeps
the last result, handles an iteration that raises (see
:mod:`fp16utils.engine.interrupt`), and writes the gradients of an unfinished
accumulation window in the one format :func:`~.checks.read_pending_window`
reads back. The wrappers and the hooks add only what their style needs: the
iteration counter and MMEngine's API, or the runner and ``runner.meta``.

Example:
    >>> import torch
    >>> p = torch.nn.Parameter(torch.ones(2))
    >>> optimizer = torch.optim.SGD([p], lr=1.0)
    >>> driver = StepDriver('example', AccumulationWindow(2, 'example', 'counts'), StepEngine())
    >>> driver.backward(p.sum(), step=1, earlier=0, zero_grad=optimizer.zero_grad)
    >>> driver.accumulated().accumulating, driver.pending_window(optimizer, 1, copy=True)
    (True, {'iter': 1, 'grads': [tensor([1., 1.])]})
    >>> driver.backward(p.sum(), step=2, earlier=1, zero_grad=optimizer.zero_grad)
    >>> driver.step(optimizer, step=2, kwargs={}).stepped, driver.steps_taken, p.tolist()
    (True, 1, [-1.0, -1.0])
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Mapping, Optional

import torch

from .._args.spec import check_scaler_state, check_stats
from .base import ResumeState, StepEngine, pending_grads
from .checks import PENDING_KEY, check_tensors
from .guard import OverflowGuard
from .interrupt import Leftovers, guarded_backward
from .outcome import StepResult, accumulating_result, take_step
from .window import AccumulationWindow

__all__ = ['Driven', 'StepDriver', 'check_resume']

_Tensor = torch.Tensor


def check_resume(state: ResumeState, params: List[_Tensor], owner: str,
                 masters: bool) -> None:
    """Check what a checkpoint holds before anything it would change is touched.

    The scaler state (either format), the statistics, the pending gradients
    and, when ``masters``, the float32 master weights are checked against
    ``params``; the engine that loads them checks them again in its own terms.

    Args:
        state: What the checkpoint holds.
        params: The optimizer's parameters (what gradients and masters belong to).
        owner: Who resumes, for the messages.
        masters: Whether saved master weights are used (the legacy backend).

    Raises:
        TypeError, KeyError, ValueError: Naming the entry that does not fit.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(2))
        >>> check_resume(ResumeState(pending=[torch.ones(3)]), [p], 'example', False)
        Traceback (most recent call last):
        ...
        ValueError: example: the saved pending gradients [0] is torch.float32 (3,) on cpu, \
expected a floating-point tensor of shape (2,) with data; load a state saved from the same \
model and optimizer.
    """
    if state.scaler:
        check_scaler_state(state.scaler, owner)
    if state.pending is not None:
        check_tensors(state.pending, params, 'pending gradients', owner, allow_none=True)
    if state.stats:
        check_stats(state.stats, owner)
    if masters and state.masters is not None:
        check_tensors(state.masters, params, 'master weights', owner, allow_none=False)


class StepDriver:
    """Backward, step, records and the pending window, for a wrapper or a hook.

    Args:
        owner: Who drives, for messages.
        window: The accumulation window (how many iterations per update).
        engine: The step engine (a hook sets it when the run starts).
        guard: The overflow guard, or None.

    Attributes:
        steps_taken: Optimizer steps really taken (skipped ones not counted);
            host-side and monotonic.
        last_result: The :class:`~fp16utils.StepResult` of the last iteration, or None.
        restored: The iteration count at which a restored pending window
            continues, or None.
        leftovers: Whether the gradients in place were left by an iteration
            that raised (see :class:`~.interrupt.Leftovers`).
    """

    def __init__(self, owner: str, window: AccumulationWindow,
                 engine: Optional[StepEngine] = None,
                 guard: Optional[OverflowGuard] = None) -> None:
        self.owner = owner
        self.window = window
        self.engine = engine
        self.guard = guard
        self.leftovers = Leftovers(owner)
        self.steps_taken = 0
        self.last_result: Optional[StepResult] = None
        self.restored: Optional[int] = None

    def _engine(self) -> StepEngine:
        engine = self.engine
        if engine is None:
            raise RuntimeError(f'{self.owner}: no step engine yet; start the run first.')
        return engine

    def backward(self, loss: _Tensor, step: int, earlier: int,
                 zero_grad: Callable[[], None], **kwargs: Any) -> None:
        """Backward ``loss`` through the engine, under the overflow guard when it is armed.

        Gradients left by an iteration that raised are discarded first (with
        ``zero_grad()``); when this backward raises, the gradients in place are
        marked as left over.

        Args:
            loss: The loss, already divided for accumulation.
            step: The iteration number (from 1), for the guard's messages.
            earlier: Iterations of the current window done before this one.
            zero_grad: Clears the gradients.
            **kwargs: Passed to ``backward``.
        """
        engine = self._engine()
        self.leftovers.discard(zero_grad, engine.logger, earlier)
        try:
            guarded_backward(engine, self.guard, lambda: engine.backward(loss, **kwargs), step)
        except BaseException:
            self.leftovers.spent = True
            raise

    def step(self, optimizer: Any, step: int, kwargs: Mapping[str, Any],
             then: Optional[Callable[[StepResult], None]] = None) -> StepResult:
        """Take (or skip) the step; record it; return the :class:`~fp16utils.StepResult`.

        Args:
            optimizer: The optimizer to step.
            step: The iteration number, for the engine's records and messages.
            kwargs: Keyword arguments of ``optimizer.step``.
            then: The owner's bookkeeping, called with the result after the
                driver's (also when the step raises once the update is applied).

        Raises:
            RuntimeError: The gradients in place were left by an iteration that raised.
        """
        self.leftovers.refuse_step()
        engine, guard = self._engine(), self.guard

        def done(result: StepResult) -> None:
            self.last_result = result
            if result.stepped:
                self.steps_taken += 1
            if guard is not None:
                guard.record(result.skipped, engine.at_scale_floor)
            if then is not None:
                then(result)

        try:
            return take_step(engine, optimizer, step, kwargs, done)
        except BaseException:  # gradients applied or changed in place: never step them again
            self.leftovers.spent = engine.committed is not None or engine.touched
            raise

    def accumulated(self) -> StepResult:
        """Record an iteration that only accumulated its gradients; return its result."""
        result = self.last_result = accumulating_result(self._engine())
        return result

    def grads_cleared(self) -> None:
        """The gradients were zeroed: none are left over."""
        self.leftovers.spent = False

    def pending_window(self, optimizer: Any, done: int, copy: bool
                       ) -> Optional[Dict[str, Any]]:
        """The unfinished window to save after ``done`` iterations, or None.

        None when ``done`` ends a window or when the gradients in place are
        left over from an iteration that raised.

        Args:
            optimizer: Whose parameters' gradients are saved.
            done: Iterations done.
            copy: Copies of the gradients (saved now), or references (saved later).

        Returns:
            ``{'iter': done, 'grads': [...]}``, as :func:`~.checks.read_pending_window` reads.
        """
        if not done % self.window.counts or self.leftovers.spent:
            return None
        grads = pending_grads(self._engine().grad_params(optimizer), copy=copy)
        return {PENDING_KEY: done, 'grads': grads}

    def restoring(self, pending: bool, done: int) -> None:
        """Note whether a pending window was restored to continue after ``done`` iterations."""
        self.restored = done if pending else None
        if pending:
            self.leftovers.spent = False  # the saved window's gradients are back


class Driven:
    """What the owner of a :class:`StepDriver` (a wrapper, a hook) shows of its records.

    Example:
        >>> from fp16utils.optim import OptimWrapper
        >>> w = OptimWrapper(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=1.0))
        >>> w.steps_taken, w.last_result
        (0, None)
    """

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
