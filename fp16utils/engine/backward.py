"""Around a backward: the overflow guard's watch, and the gradients an iteration that raised
left in place (discarded before the next backward, never stepped)."""

from __future__ import annotations

from typing import Callable, Optional

from . import ranks
from .base import StepEngine, StepState
from .guard import OverflowGuard

__all__ = ['discard_spent', 'guarded_backward', 'refuse_spent']


def guarded_backward(engine: StepEngine, guard: Optional[OverflowGuard],
                     backward: Callable[[], None], step: int) -> None:
    """Run ``backward()``, checked by the overflow guard when it watches; when the ranks
    agree, the guard's error becomes the engine's ``veto``, raised by every rank at the step."""
    if guard is None or not guard.watching:
        backward()
        return
    defer = ranks.reducer(engine.agree_across_ranks) is not None
    error = guard.backward(backward, engine.logger, step, defer)
    if error is not None:
        engine.veto = error


def discard_spent(engine: StepEngine, zero_grad: Callable[[], None], owner: str,
                  earlier: int) -> None:
    """Before a backward: discard spent gradients with ``zero_grad()`` (``earlier``: the
    iterations of the window that go with them)."""
    if engine.state is not StepState.SPENT:
        return
    zero_grad()
    engine.move(StepState.READY)
    if earlier:
        engine.logger.warning(
            f'{owner}: an iteration raised after its backward began; its gradients '
            f'and those of the {earlier} earlier iteration(s) of its accumulation window '
            'were discarded, so this window updates with the gradients of its remaining '
            'iterations.')


def refuse_spent(engine: StepEngine, owner: str) -> None:
    """Raise when the gradients in place are spent."""
    if engine.state is StepState.SPENT:
        raise RuntimeError(
            f'{owner}.step(): the last iteration raised after its backward began, so '
            'the gradients in place are not usable (partial, or already unscaled); run a '
            'new backward first (it discards them), or call zero_grad().')
