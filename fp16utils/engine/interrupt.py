"""Iterations that raise: the wrapper's (or hook's) counters, leftover gradients, the guard.

An iteration can raise anywhere: ``KeyboardInterrupt`` in a notebook, an error
in a forward hook, ``nonfinite='raise'``, the overflow guard. The engine puts
its own state back (see :meth:`StepEngine.step`); the optimizer wrapper or
runner hook that drives it does the same with its counters, and uses
:class:`Leftovers` for the gradients the iteration left:

- raised in the forward: nothing changed, the gradients of an accumulation
  window so far are intact, and the next iteration goes on with them;
- raised in or after the backward, before the optimizer applied the update:
  the counters are as before the iteration, the parameters and optimizer
  state unchanged, but the gradients in place may be partial (a backward cut
  short), unscaled or clipped; they are never applied: they stay for
  inspection until the next backward discards them (or ``zero_grad()``), and
  a ``step()`` before that is refused. Under gradient accumulation the
  window's earlier gradients go with them (a warning says how many
  iterations); the update schedule is unchanged;
- raised after the optimizer applied the update (the scale update, the
  bookkeeping): the step is completed (counted, the scale updated once, the
  masters copied to the model), then the exception goes on.

Example:
    >>> left = Leftovers('example')
    >>> left.spent = True
    >>> left.refuse_step()
    Traceback (most recent call last):
    ...
    RuntimeError: example.step(): the last iteration raised after its backward began, so \
the gradients in place are not usable (partial, or already unscaled); run a new backward \
first (it discards them), or call zero_grad().
"""

from __future__ import annotations

from typing import Any, Callable, Optional

from . import ranks
from .base import StepEngine
from .guard import OverflowGuard

__all__ = ['Leftovers', 'guarded_backward']


def guarded_backward(engine: StepEngine, guard: Optional[OverflowGuard],
                     backward: Callable[[], None], step: int) -> None:
    """Run ``backward()``; when the overflow guard watches it, check it after.

    When the ranks agree on skips, the guard's ``FloatingPointError`` is not
    raised here, by this rank alone (the others would wait in the step's
    all-reduce): it becomes the engine's :attr:`~StepEngine.veto`, and every
    rank raises it at the step, from the one agreed flag.

    Example:
        >>> import torch
        >>> p = torch.nn.Parameter(torch.ones(1))
        >>> guarded_backward(StepEngine(), None, lambda: p.sum().backward(), 1)
        >>> p.grad.tolist()
        [1.0]
    """
    if guard is None or not guard.watching:
        backward()
        return
    defer = ranks.reducer(engine.agree_across_ranks) is not None
    error = guard.backward(backward, engine.logger, step, defer)
    if error is not None:
        engine.veto = error


class Leftovers:
    """Whether the gradients in place were left by an iteration that raised after its backward.

    Args:
        owner: Who keeps them, for messages.

    Attributes:
        spent: True from such an exception until the gradients are discarded.
    """

    __slots__ = ('owner', 'spent')

    def __init__(self, owner: str) -> None:
        self.owner = owner
        self.spent = False

    def discard(self, zero_grad: Callable[[], None], logger: Any, earlier: int) -> None:
        """Before a backward: discard spent gradients with ``zero_grad()``.

        Args:
            zero_grad: Clears the gradients.
            logger: Told when gradients of earlier iterations of an
                accumulation window go too (anything with ``warning(str)``).
            earlier: Iterations of the current window done before the one
                that raised.
        """
        if not self.spent:
            return
        zero_grad()
        self.spent = False
        if earlier:
            logger.warning(
                f'{self.owner}: an iteration raised after its backward began; its gradients '
                f'and those of the {earlier} earlier iteration(s) of its accumulation window '
                'were discarded, so this window updates with the gradients of its remaining '
                'iterations.')

    def refuse_step(self) -> None:
        """Raise when the gradients in place are spent (see the module docstring)."""
        if self.spent:
            raise RuntimeError(
                f'{self.owner}.step(): the last iteration raised after its backward began, so '
                'the gradients in place are not usable (partial, or already unscaled); run a '
                'new backward first (it discards them), or call zero_grad().')
