"""Gradient accumulation arithmetic, shared by the 1.x wrappers and the 0.x hook.

Example:
    >>> window = AccumulationWindow(2, 'OptimWrapper', 'accumulative_counts')
    >>> window.start(5)
    >>> [window.divisor(i) for i in range(5)], window.completes(4)
    ([2, 2, 2, 2, 1], True)
"""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from .._args.spec import check_positive_int
from .._torch.models import BatchNormBase as _BatchNorm

__all__ = ['AccumulationWindow']


class AccumulationWindow:
    """Gradient accumulation over ``counts`` iterations, with a shorter last window.

    Iterations are counted from 0. Iteration ``i``'s loss is divided by
    :meth:`divisor` and the optimizer steps after it when :meth:`completes`
    says so. With ``max_counts`` set, the last ``max_counts % counts``
    iterations form a window of their own, divided by its length.

    Args:
        counts: Iterations per window (int >= 1).
        owner: Who uses it, for error messages.
        name: The argument's name, for error messages.

    Example:
        >>> window = AccumulationWindow(3, 'hook', 'cumulative_iters')
        >>> window.start(7)
        >>> [window.divisor(i) for i in range(7)]
        [3, 3, 3, 3, 3, 3, 1]
        >>> [i for i in range(7) if window.completes(i)]
        [2, 5, 6]
    """

    __slots__ = ('counts', 'name', 'max_counts', 'remainder', 'started')

    def __init__(self, counts: Any, owner: str, name: str) -> None:
        self.counts: int = check_positive_int(counts, owner, name)
        self.name = name
        self.max_counts = -1
        self.remainder = 0
        #: Whether :meth:`start` has run since the window was made (or :attr:`started`
        #: was set back to False for a new run).
        self.started = False

    def start(self, max_counts: Optional[int]) -> None:
        """Set the total number of iterations (None, -1 or 0: unknown)."""
        self.max_counts = -1 if max_counts is None else int(max_counts)
        self.remainder = self.max_counts % self.counts if self.max_counts > 0 else 0
        self.started = True

    @property
    def divisible(self) -> int:
        """The iterations before the last, shorter window (0 while the total is unknown).

        Example:
            >>> window = AccumulationWindow(4, 'hook', 'cumulative_iters')
            >>> window.start(10); window.divisible, window.remainder
            (8, 2)
        """
        return max(self.max_counts, 0) - self.remainder

    def divisor(self, index: int) -> int:
        """What iteration ``index``'s loss is divided by."""
        if self.remainder and index >= self.max_counts - self.remainder:
            return self.remainder
        return self.counts

    def completes(self, index: int) -> bool:
        """Whether the optimizer steps after iteration ``index``."""
        done = index + 1
        return done % self.counts == 0 or done == self.max_counts

    def warn_on_start(self, model: nn.Module, done: int, restored: bool,
                      log: Any, keep_hint: str) -> None:
        """Warn about what makes accumulated results differ from one large batch.

        Args:
            model: Checked for BatchNorm layers (their statistics come from
                the small batches).
            done: Iterations already done.
            restored: Whether the gradients of an unfinished window were restored.
            log: A logger (anything with ``warning(str)``).
            keep_hint: How to keep the window's gradients in a checkpoint.
        """
        if done % self.counts and not restored:
            log.warning(
                f'Resumed iteration number {done} is not a multiple of '
                f'{self.name}={self.counts}: the gradients of the interrupted '
                f'accumulation window are lost ({keep_hint} to keep them).')
        if self.counts > 1 and any(isinstance(m, _BatchNorm) for m in model.modules()):
            log.warning(f'Gradient accumulative training with BatchNorm layers '
                        f'({self.name}={self.counts}): the statistics come from the small '
                        'batches, so results may differ slightly from one large batch.')
