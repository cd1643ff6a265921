"""``skip_aware_hooks``: which runner hooks do not advance on a skipped step, and its checks.

The option of the 0.x optimizer hooks and of the MMEngine plug-in's wrappers. ``False``
(the default) keeps what mmcv and MMEngine do; ``True`` follows the framework's schedule
and EMA hooks (:data:`MMCV_FOLLOWED`, :data:`MMENGINE_FOLLOWED`); a list names the hook
classes to follow instead (classes, class names, or ``module.QualName``). Classes are
matched along each hook's MRO by name, so nothing here imports mmcv or MMEngine.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence, Tuple, Union

from .numbers import as_whole

__all__ = ['MMCV_FOLLOWED', 'MMENGINE_FOLLOWED', 'OPTION', 'RECORD_KEYS', 'Followed',
           'check_record', 'check_skip_aware_hooks', 'describe', 'follows', 'record']

#: The option's name (a keyword argument, and a key of a 0.x config's ``fp16`` dict).
OPTION = 'skip_aware_hooks'

#: mmcv 1.x's hooks that compute from ``runner.iter`` or act after each iteration:
#: the LR and momentum updaters (all policies), mmcv's EMA hook and mmdet 2.x's EMA hooks.
MMCV_FOLLOWED = ('mmcv.runner.hooks.lr_updater.LrUpdaterHook',
                 'mmcv.runner.hooks.momentum_updater.MomentumUpdaterHook',
                 'mmcv.runner.hooks.ema.EMAHook',
                 'mmdet.core.hook.ema.BaseEMAHook')

#: MMEngine's hooks that step param schedulers or EMA models after each iteration.
MMENGINE_FOLLOWED = ('mmengine.hooks.param_scheduler_hook.ParamSchedulerHook',
                     'mmengine.hooks.ema_hook.EMAHook')

#: The hook classes to follow: classes, class names, or ``module.QualName`` strings.
Followed = Tuple[Union[str, type], ...]


def _bad_entry(entry: Any) -> Optional[str]:
    """Why ``entry`` cannot name a hook class (None: it can)."""
    if isinstance(entry, type):
        return None
    if not isinstance(entry, str):
        return f'{entry!r} ({type(entry).__name__}) is neither a class nor a class name'
    if not entry or not all(part.isidentifier() for part in entry.split('.')):
        return f'{entry!r} is not a class name (e.g. \'EMAHook\' or \'mmcv.runner.EMAHook\')'
    return None


def check_skip_aware_hooks(value: Any, owner: str, defaults: Sequence[str]
                           ) -> Optional[Followed]:
    """The hook classes ``value`` asks to follow (None: the option is off), or an error.

    Args:
        value: ``False`` / ``None`` (off), ``True`` (``defaults``), or a class, a class
            name, or a non-empty list or tuple of them.
        owner: Who takes the option, for the messages.
        defaults: What ``True`` follows (:data:`MMCV_FOLLOWED` or :data:`MMENGINE_FOLLOWED`).

    Returns:
        A tuple of classes and names, or None.

    Raises:
        TypeError: ``value`` is of another type (``1`` is not ``True``), or an entry is
            neither a class nor a string.
        ValueError: An empty list, or a string that is no class name.

    Example:
        >>> check_skip_aware_hooks(True, 'Fp16OptimizerHook', MMCV_FOLLOWED)[2]
        'mmcv.runner.hooks.ema.EMAHook'
        >>> check_skip_aware_hooks(['EMAHook'], 'Fp16OptimizerHook', MMCV_FOLLOWED)
        ('EMAHook',)
    """
    usage = (f'{owner}: {OPTION} must be False (the default: the runner\'s hooks advance at '
             'every iteration, as in mmcv and MMEngine), True (its schedule and EMA hooks '
             'follow the steps really taken) or a list of the hook classes (or class names) '
             'to follow')
    if value is None or value is False:
        return None
    if value is True:
        return tuple(defaults)
    if isinstance(value, (str, type)):
        value = (value,)
    elif not isinstance(value, (list, tuple)):
        raise TypeError(f'{usage}; got {value!r} ({type(value).__name__}).')
    if not value:
        raise ValueError(f'{usage}; got an empty {type(value).__name__} (pass False to follow '
                         'none).')
    for entry in value:
        why = _bad_entry(entry)
        if why is not None:
            error = TypeError if not isinstance(entry, str) else ValueError
            raise error(f'{usage}; {why}.')
    return tuple(value)


def follows(cls: type, followed: Followed) -> bool:
    """Whether a hook of class ``cls`` is one of ``followed`` (along its MRO, by name).

    Example:
        >>> class EMAHook: pass
        >>> class MyEMA(EMAHook): pass
        >>> follows(MyEMA, ('EMAHook',)), follows(MyEMA, ('LrUpdaterHook',))
        (True, False)
    """
    for klass in cls.__mro__:
        names = (klass.__name__, f'{klass.__module__}.{klass.__qualname__}')
        for entry in followed:
            if entry is klass or entry in names:
                return True
    return False


def describe(followed: Followed) -> str:
    """``followed`` as it reads in a message: ``'LrUpdaterHook, EMAHook'``."""
    return ', '.join(entry.__name__ if isinstance(entry, type) else entry.rpartition('.')[2]
                     for entry in followed)


#: What a run saves of its skips (in ``runner.meta['fp16'][OPTION]`` on mmcv, in the
#: ``MessageHub`` on MMEngine): the iterations skipped so far, the 0-based iteration of
#: the last skip (-1: none yet) and how many iterations that skip counted (a window's).
RECORD_KEYS = ('skipped_iters', 'last_skipped', 'last_count')


def record(skipped_iters: int = 0, last_skipped: int = -1, last_count: int = 0
           ) -> Dict[str, int]:
    """A saved record (see :data:`RECORD_KEYS`).

    Example:
        >>> record(2, 5, 1)
        {'skipped_iters': 2, 'last_skipped': 5, 'last_count': 1}
    """
    return dict(zip(RECORD_KEYS, (skipped_iters, last_skipped, last_count)))


def check_record(saved: Any, where: str, owner: str) -> Tuple[int, int, int]:
    """The fields of a saved record, checked.

    Args:
        saved: What the run holds under ``where``.
        where: Where it was read, for the message.
        owner: Who reads it, for the message.

    Returns:
        ``(skipped_iters, last_skipped, last_count)``.

    Raises:
        ValueError: ``saved`` is not such a record: a dict of those three whole
            numbers with ``0 <= last_count <= skipped_iters <= last_skipped + 1``.

    Example:
        >>> check_record(record(2, 5, 1), 'meta', 'Fp16OptimizerHook')
        (2, 5, 1)
    """
    fields = None
    if isinstance(saved, dict) and set(saved) == set(RECORD_KEYS):
        fields = tuple(as_whole(saved[key]) for key in RECORD_KEYS)
    if fields is None or None in fields or not (
            0 <= fields[2] <= fields[0] <= fields[1] + 1):
        raise ValueError(
            f'{owner}: {where} must be the record of the skipped iterations that {OPTION} '
            f'saves, a dict of whole numbers {record(2, 5, 1)!r} ({", ".join(RECORD_KEYS)}: '
            f'skipped so far, the last one, its length); got {saved!r}.')
    return fields  # type: ignore[return-value]
