"""Gradient accumulation arithmetic, shared by the 1.x wrappers and the 0.x hooks."""

from __future__ import annotations

from typing import Any, Optional

from torch import nn

from .._args.spec import check_positive_int
from .._torch.models import BatchNormBase as _BatchNorm

__all__ = ['AccumulationWindow', 'window_length']


def window_length(counts: int, max_counts: int, index: int) -> int:
    """How many iterations the window holding iteration ``index`` (from 0) has: ``counts``,
    or ``max_counts % counts`` for the last, shorter one (``max_counts`` <= 0: unknown)."""
    remainder = max_counts % counts if max_counts > 0 else 0
    if remainder and index >= max_counts - remainder:
        return remainder
    return counts


class AccumulationWindow:
    """Accumulation over ``counts`` iterations (from 0); the last ``max_counts % counts``
    form a shorter window of their own."""

    __slots__ = ('counts', 'name', 'max_counts', 'remainder', 'started')

    def __init__(self, counts: Any, owner: str, name: str) -> None:
        self.counts: int = check_positive_int(counts, owner, name)
        self.name = name
        self.max_counts = -1
        self.remainder = 0
        self.started = False  # whether start() ran in this run

    def start(self, max_counts: Optional[int]) -> None:
        """Set the total number of iterations (None, -1 or 0: unknown)."""
        self.max_counts = -1 if max_counts is None else int(max_counts)
        self.remainder = self.max_counts % self.counts if self.max_counts > 0 else 0
        self.started = True

    @property
    def divisible(self) -> int:
        """The iterations before the last, shorter window (0 while the total is unknown)."""
        return max(self.max_counts, 0) - self.remainder

    def divisor(self, index: int) -> int:
        """What iteration ``index``'s loss is divided by."""
        return window_length(self.counts, self.max_counts, index)

    def completes(self, index: int) -> bool:
        """Whether the optimizer steps after iteration ``index``."""
        done = index + 1
        return done % self.counts == 0 or done == self.max_counts

    def warn_on_start(self, model: nn.Module, done: int, restored: bool,
                      log: Any, keep_hint: str) -> None:
        """Warn when a resumed window lost its gradients, or BatchNorm sees small batches."""
        if done % self.counts and not restored:
            log.warning(
                f'Resumed iteration number {done} is not a multiple of '
                f'{self.name}={self.counts}: the gradients of the interrupted '
                f'accumulation window are lost ({keep_hint} to keep them).')
        if self.counts > 1 and any(isinstance(m, _BatchNorm) for m in model.modules()):
            log.warning(f'Gradient accumulative training with BatchNorm layers '
                        f'({self.name}={self.counts}): the statistics come from the small '
                        'batches, so results may differ slightly from one large batch.')
