"""The overflow guard: after a run of skipped steps, diagnose the next step with find_overflow."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Callable, Mapping, Optional

from torch import nn

from ..debug import OverflowReport, find_overflow

__all__ = ['GUARD_ACTIONS', 'OverflowGuard']

#: What an armed guard does when its step shows non-finite values.
GUARD_ACTIONS = ('diagnose', 'raise')
_KEYS = ('max_consecutive', 'action')


class OverflowGuard:
    """Counts skipped steps in a row; once armed (one diagnosis per streak), watches the
    next forward (:meth:`watch`) and backward (:meth:`check`)."""

    __slots__ = ('max_consecutive', 'action', 'owner', 'streak', 'armed', 'diagnosed',
                 'report', '_watch', '_at_floor')

    def __init__(self, max_consecutive: int = 3, action: str = 'diagnose',
                 owner: str = 'overflow_guard') -> None:
        if (isinstance(max_consecutive, bool) or not isinstance(max_consecutive, int)
                or max_consecutive < 1):
            raise ValueError(
                f"{owner}: overflow_guard['max_consecutive'] must be an int >= 1 (skipped "
                f'steps in a row before the next step is diagnosed), got {max_consecutive!r}.')
        if action not in GUARD_ACTIONS:
            raise ValueError(
                f"{owner}: overflow_guard['action'] must be one of {list(GUARD_ACTIONS)}, got "
                f"{action!r}: 'diagnose' logs which module went non-finite, 'raise' raises "
                'FloatingPointError with the report.')
        self.max_consecutive = max_consecutive
        self.action = action
        self.owner = owner
        self.streak = 0
        self.armed = False
        self.diagnosed = False
        self.report: Optional[OverflowReport] = None
        self._watch: Optional[contextlib.ExitStack] = None
        self._at_floor = False

    @classmethod
    def parse(cls, config: Optional[Mapping[str, Any]], owner: str) -> Optional[OverflowGuard]:
        """Build a guard from ``overflow_guard=dict(...)``; None stays None."""
        if config is None:
            return None
        if not isinstance(config, Mapping):
            raise TypeError(
                f'{owner}: overflow_guard must be a dict such as dict(max_consecutive=3, '
                f"action='diagnose'), or None; got {type(config).__name__}.")
        unknown = sorted(str(k) for k in config if k not in _KEYS)
        if unknown:
            raise ValueError(f'{owner}: overflow_guard got unknown key(s) {unknown}; its keys '
                             f'are {list(_KEYS)}.')
        return cls(owner=owner, **config)

    # -- counting (host-side, no sync) ------------------------------------------------------

    def record(self, skipped: bool, at_floor: bool) -> None:
        """Count one step; arm the guard, or reset it after a step taken."""
        if not skipped:
            self.streak = 0
            self.armed = self.diagnosed = False
            return
        self.streak += 1
        self._at_floor = at_floor
        if not self.diagnosed and (self.streak >= self.max_consecutive or at_floor):
            self.armed = True

    # -- watching ---------------------------------------------------------------------------

    @property
    def watching(self) -> bool:
        return self._watch is not None

    def watch(self, model: nn.Module) -> None:
        """Attach :func:`~fp16utils.find_overflow`'s watchers to ``model`` when armed."""
        self.stop()  # a watch whose backward never came
        if not self.armed:
            return
        stack = contextlib.ExitStack()
        self.report = stack.enter_context(find_overflow(model))
        self._watch = stack

    def stop(self, *exc: Any) -> None:
        """Remove the watchers (``exc``: the exception being raised, if any)."""
        stack, self._watch = self._watch, None
        if stack is not None:
            stack.__exit__(*(exc or (None, None, None)))

    def backward(self, backward: Callable[[], None], logger: Any, step: int,
                 defer: bool = False) -> Optional[FloatingPointError]:
        """Run the watched ``backward()``, then :meth:`check`; watchers removed on error too."""
        try:
            backward()
        except BaseException:
            self.stop(*sys.exc_info())
            raise
        return self.check(logger, step, defer)

    def check(self, logger: Any, step: int, defer: bool = False
              ) -> Optional[FloatingPointError]:
        """After the watched backward: remove the watchers, then log, or raise the error
        (``defer``: return it, for every rank to raise at the step)."""
        if self._watch is None:
            return None
        self.stop()
        self.armed = False
        self.diagnosed = True
        report = self.report
        if report is None or report.ok:
            return None
        why = (f'{self.streak} skipped step(s) in a row'
               + (' with the loss scale at its floor' if self._at_floor else ''))
        where = report.first_module
        found = (f'first non-finite module: {where!r}' if where is not None
                 else 'non-finite parameter gradients')
        if self.action == 'raise':
            err = FloatingPointError(
                f'{self.owner}: step {step}: {why}; the guarded forward and backward found '
                f'{found}. Nothing was updated. Read the full report in this exception\'s '
                '`.report` attribute (print(err.report), err.report.to_dict()).')
            err.report = report  # type: ignore[attr-defined]
            if defer:
                return err
            raise err
        logger.warning(f'{self.owner}: step {step}: {why}; overflow guard report ({found}):\n'
                       f'{report}')
        return None

    def __repr__(self) -> str:
        return (f'OverflowGuard(max_consecutive={self.max_consecutive}, '
                f'action={self.action!r}, streak={self.streak}, armed={self.armed})')
