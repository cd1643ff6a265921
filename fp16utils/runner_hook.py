"""The plain base of the 0.x hooks while mmcv is not imported: every stage of an mmcv hook.

Example:
    >>> RunnerHook().before_epoch(runner=None)
    >>> RunnerHook.priority
    'ABOVE_NORMAL'
"""

from __future__ import annotations

from typing import Any, Callable

__all__ = ['RunnerHook', 'calls']


def calls(stage: str) -> Callable[[Any, Any], None]:
    """A hook stage that calls the stage named ``stage`` (as mmcv's ``Hook`` does)."""

    def call(self: Any, runner: Any) -> None:
        getattr(self, stage)(runner)

    call.__doc__ = f'Calls :meth:`{stage}`.'
    return call


def _total(runner: Any, name: str) -> Any:
    """``runner.max_iters`` (or ``max_epochs``), else mmcv's private ``_max_iters``."""
    value = getattr(runner, name, None)
    return getattr(runner, f'_{name}', None) if value is None else value


class RunnerHook:
    """The base of the hooks while mmcv is not imported: every stage of an mmcv hook.

    A runner other than mmcv's calls the stages it knows; the ones the hooks
    do not use do nothing. ``priority`` is ``'ABOVE_NORMAL'``, where mmcv
    registers optimizer hooks. Once ``mmcv.runner`` is imported, the hooks'
    base becomes ``mmcv.runner.Hook`` instead (whose ``register_hook`` sets
    ``priority`` itself and refuses a hook that already has one).

    Example:
        >>> RunnerHook().before_epoch(runner=None)
        >>> RunnerHook.priority
        'ABOVE_NORMAL'
    """

    priority = 'ABOVE_NORMAL'

    def before_run(self, runner: Any) -> None:
        """Nothing to do."""

    def after_run(self, runner: Any) -> None:
        """Nothing to do."""

    def before_epoch(self, runner: Any) -> None:
        """Nothing to do."""

    def after_epoch(self, runner: Any) -> None:
        """Nothing to do."""

    def before_iter(self, runner: Any) -> None:
        """Nothing to do."""

    def after_iter(self, runner: Any) -> None:
        """Nothing to do."""

    # What mmcv's Hook gives its subclasses to decide when to act (0.x hooks call them).
    # The runner's public max_iters / max_epochs are read (mmcv's Hook reads the private
    # _max_iters / _max_epochs, which its own runners have; either is taken here).

    def every_n_epochs(self, runner: Any, n: int) -> bool:
        """Whether the epoch just finished is a multiple of ``n`` (False for ``n <= 0``)."""
        return (runner.epoch + 1) % n == 0 if n > 0 else False

    def every_n_inner_iters(self, runner: Any, n: int) -> bool:
        """Whether the iteration within the epoch is a multiple of ``n``."""
        return (runner.inner_iter + 1) % n == 0 if n > 0 else False

    def every_n_iters(self, runner: Any, n: int) -> bool:
        """Whether the iteration just run is a multiple of ``n`` (counted from 1).

        Example:
            >>> from types import SimpleNamespace
            >>> [RunnerHook().every_n_iters(SimpleNamespace(iter=i), 2) for i in range(4)]
            [False, True, False, True]
        """
        return (runner.iter + 1) % n == 0 if n > 0 else False

    def end_of_epoch(self, runner: Any) -> bool:
        """Whether the iteration just run is the last of its epoch."""
        return runner.inner_iter + 1 == len(runner.data_loader)

    def is_last_epoch(self, runner: Any) -> bool:
        """Whether the epoch just run is the last one."""
        return runner.epoch + 1 == _total(runner, 'max_epochs')

    def is_last_iter(self, runner: Any) -> bool:
        """Whether the iteration just run is the last one.

        Example:
            >>> from types import SimpleNamespace
            >>> RunnerHook().is_last_iter(SimpleNamespace(iter=4, max_iters=5))
            True
        """
        return runner.iter + 1 == _total(runner, 'max_iters')

    # The train/val stages call the generic ones, so overriding before_iter covers both.
    before_train_epoch = calls('before_epoch')
    before_val_epoch = calls('before_epoch')
    after_train_epoch = calls('after_epoch')
    after_val_epoch = calls('after_epoch')
    before_train_iter = calls('before_iter')
    before_val_iter = calls('before_iter')
    after_train_iter = calls('after_iter')
    after_val_iter = calls('after_iter')
