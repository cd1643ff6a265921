"""The base of the 0.x hooks: :class:`RunnerHook` (every stage of an mmcv hook), replaced by
``mmcv.runner.Hook`` as soon as mmcv's hook module is imported, before or after this one
(a ``sys.meta_path`` finder notices it); nothing here imports mmcv."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import logging
import sys
from typing import Any, Callable, List, Optional, Sequence, TypeVar

__all__ = ['RunnerHook', 'calls', 'follow_mmcv', 'follows_mmcv', 'set_base']

logger = logging.getLogger('fp16utils')
_Class = TypeVar('_Class', bound=type)


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
    """The hooks' base without mmcv: every stage of an mmcv hook (unused ones do nothing)."""

    #: Where mmcv registers optimizer hooks (mmcv's ``Hook`` has none: its runner sets it).
    priority = 'ABOVE_NORMAL'

    def before_run(self, runner: Any) -> None:
        pass

    def after_run(self, runner: Any) -> None:
        pass

    def before_epoch(self, runner: Any) -> None:
        pass

    def after_epoch(self, runner: Any) -> None:
        pass

    def before_iter(self, runner: Any) -> None:
        pass

    def after_iter(self, runner: Any) -> None:
        pass

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
        """Whether the iteration just run is a multiple of ``n`` (counted from 1)."""
        return (runner.iter + 1) % n == 0 if n > 0 else False

    def end_of_epoch(self, runner: Any) -> bool:
        """Whether the iteration just run is the last of its epoch."""
        return runner.inner_iter + 1 == len(runner.data_loader)

    def is_last_epoch(self, runner: Any) -> bool:
        """Whether the epoch just run is the last one."""
        return runner.epoch + 1 == _total(runner, 'max_epochs')

    def is_last_iter(self, runner: Any) -> bool:
        """Whether the iteration just run is the last one."""
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


# -- mmcv's Hook as the base, once mmcv's runner is imported ---------------------------------

#: The module that defines ``mmcv.runner.Hook`` (mmcv 0.x and 1.x; mmcv 2.x has none).
_MMCV_HOOK_MODULE = 'mmcv.runner.hooks.hook'


#: The classes whose base follows mmcv's ``Hook`` (see :func:`follows_mmcv`).
_FOLLOWERS: List[type] = []


def follows_mmcv(cls: _Class) -> _Class:
    """Mark ``cls`` (derived from :class:`RunnerHook` alone), and so its subclasses, to take
    mmcv's ``Hook`` as its base."""
    _FOLLOWERS.append(cls)
    follow_mmcv()
    return cls


def set_base(base: Optional[type] = None) -> None:
    """Make ``base`` (mmcv's ``Hook``; None: the plain base) the base of the marked classes."""
    base = RunnerHook if base is None else base
    for cls in _FOLLOWERS:
        if cls.__bases__ == (base,):
            continue
        try:
            cls.__bases__ = (base,)
        except TypeError as err:  # a user class that lists mmcv's Hook before ours
            logger.warning('fp16utils hooks could not take %s.%s as their base (%s); mmcv '
                           'runners will refuse them.', base.__module__, base.__qualname__, err)


def follow_mmcv() -> None:
    """Take ``mmcv.runner.Hook`` as the base if mmcv's hook module is imported; never import it."""
    module = sys.modules.get(_MMCV_HOOK_MODULE)
    base = getattr(module, 'Hook', None)
    if isinstance(base, type) and any(cls.__bases__[0] is not base for cls in _FOLLOWERS):
        set_base(base)


class _LoaderThenFollow(importlib.abc.Loader):
    """Loads mmcv's hook module with its own loader, then calls :func:`follow_mmcv`."""

    def __init__(self, loader: Any) -> None:
        self._loader = loader

    def create_module(self, spec: Any) -> Any:
        return self._loader.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._loader.exec_module(module)
        follow_mmcv()

    def __getattr__(self, name: str) -> Any:  # get_source, get_filename, ...: the real loader's
        return getattr(self._loader, name)


class _MmcvHookWatcher(importlib.abc.MetaPathFinder):
    """Notices the import of mmcv's hook module (``sys.meta_path``); finds nothing else."""

    def find_spec(self, fullname: str, path: Optional[Sequence[str]],
                  target: Any = None) -> Any:
        if fullname != _MMCV_HOOK_MODULE:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        if spec is None or not hasattr(spec.loader, 'exec_module'):
            return None  # the other finders decide; hooks made later still follow mmcv
        spec.loader = _LoaderThenFollow(spec.loader)
        return spec


if not any(isinstance(finder, _MmcvHookWatcher) for finder in sys.meta_path):
    sys.meta_path.insert(0, _MmcvHookWatcher())
