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

    # The train/val stages call the generic ones, so overriding before_iter covers both.
    before_train_epoch = calls('before_epoch')
    before_val_epoch = calls('before_epoch')
    after_train_epoch = calls('after_epoch')
    after_val_epoch = calls('after_epoch')
    before_train_iter = calls('before_iter')
    before_val_iter = calls('before_iter')
    after_train_iter = calls('after_iter')
    after_val_iter = calls('after_iter')
