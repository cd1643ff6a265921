"""Skip-aware followers: LR schedulers and EMA models that advance only on optimizer steps
really taken (a skipped step changes no parameter).
"""

from __future__ import annotations

import weakref
from copy import deepcopy
from typing import Any, Callable, Optional

__all__ = ['SkipAware', 'skip_aware']

#: The methods that advance a follower.
_ADVANCING = ('step', 'update_parameters')
_OWN = ('_inner', '_source', '_mark')


def _steps_taken(source: Any) -> int:
    return source.steps_taken


class SkipAware:
    """A forwarding proxy that lets ``step()`` / ``update_parameters()`` through after real steps.

    Everything else goes to the wrapped object (:attr:`__wrapped__`), so its
    ``state_dict()`` is the plain object's. It holds the optimizer wrapper weakly;
    copied or pickled without it, it forwards everything but refuses to advance.
    """

    __slots__ = _OWN + ('__weakref__',)

    def __init__(self, obj: Any, source: Any, mark: Optional[int] = None) -> None:
        setter = object.__setattr__
        setter(self, '_inner', obj)
        setter(self, '_source', None if source is None else weakref.ref(source))
        setter(self, '_mark', _steps_taken(source) if mark is None and source is not None
               else mark)

    @property
    def __wrapped__(self) -> Any:
        """The scheduler or EMA model this proxy advances."""
        return self._inner

    def _advance(self, method: str) -> bool:
        ref = self._source
        source = None if ref is None else ref()
        if source is None:
            raise ReferenceError(
                f'skip_aware({type(self._inner).__name__}).{method}(): the optimizer wrapper '
                'it follows is gone (deleted, or this follower was copied or unpickled '
                'without it); make a new follower with skip_aware(obj, optim_wrapper).')
        taken = _steps_taken(source)
        if taken == self._mark:
            return False
        object.__setattr__(self, '_mark', taken)
        return True

    def _method(self, name: str) -> Callable[..., Any]:
        method = getattr(self._inner, name, None)
        if method is None:
            raise AttributeError(f'{type(self._inner).__name__!r} object has no attribute '
                                 f'{name!r}, so skip_aware() has nothing to forward.')
        return method

    def step(self, *args: Any, **kwargs: Any) -> Any:
        """``obj.step(...)``, only if an optimizer step was taken since the last advance."""
        method = self._method('step')
        if self._advance('step'):
            return method(*args, **kwargs)
        return None

    def update_parameters(self, *args: Any, **kwargs: Any) -> Any:
        """``obj.update_parameters(model)``, only if a step was taken since the last advance."""
        method = self._method('update_parameters')
        if self._advance('update_parameters'):
            return method(*args, **kwargs)
        return None

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return self._inner(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        if name in _OWN:  # not set yet (during unpickling)
            raise AttributeError(name)
        return getattr(self._inner, name)

    def __setattr__(self, name: str, value: Any) -> None:
        if name in _OWN:
            object.__setattr__(self, name, value)
        else:
            setattr(self._inner, name, value)

    def __delattr__(self, name: str) -> None:
        delattr(self._inner, name)

    def __dir__(self) -> list:
        return sorted(set(dir(self._inner)) | {'__wrapped__'})

    def __reduce__(self) -> tuple:
        ref = self._source
        return (_rebuild, (self._inner, None if ref is None else ref(), self._mark))

    def __deepcopy__(self, memo: dict) -> SkipAware:
        # Defined here, or copy.deepcopy would find the followed object's own
        # __deepcopy__ through __getattr__ and return a copy that is no follower.
        ref = self._source
        copy = SkipAware.__new__(SkipAware)
        memo[id(self)] = copy
        setter = object.__setattr__
        setter(copy, '_inner', deepcopy(self._inner, memo))
        source = None if ref is None else ref()
        setter(copy, '_source', None if source is None else weakref.ref(deepcopy(source, memo)))
        setter(copy, '_mark', self._mark)
        return copy

    def __repr__(self) -> str:
        return f'skip_aware({self._inner!r})'


def _rebuild(obj: Any, source: Any, mark: int) -> SkipAware:
    return SkipAware(obj, source, mark)


def skip_aware(obj: Any, optim_wrapper: Any) -> Any:
    """Make an LR scheduler or EMA model advance only on optimizer steps really taken.

    Each ``step()`` (schedulers) or ``update_parameters(model)`` (EMA models) on the
    returned proxy reaches ``obj`` only when ``optim_wrapper`` took at least one
    optimizer step since the proxy last advanced; otherwise it does nothing. The
    count lives on the wrapper (``steps_taken``), on the host: no device sync. (In
    mmcv's or MMEngine's runner, where hooks step them, take the option
    ``skip_aware_hooks=True`` of the optimizer hook or wrapper instead.)

    Args:
        obj: Anything with ``step()`` (``torch.optim.lr_scheduler.*``, MMEngine
            param schedulers) or ``update_parameters()`` (``AveragedModel``,
            MMEngine EMA models).
        optim_wrapper: An :class:`~fp16utils.OptimWrapper` or
            :class:`~fp16utils.AmpOptimWrapper` (also an
            :class:`~fp16utils.OptimWrapperDict` entry), or a 0.x hook
            (:class:`~fp16utils.Fp16OptimizerHook`): whatever takes the steps.

    Returns:
        A :class:`SkipAware` proxy: use it in place of ``obj``.

    Raises:
        TypeError: ``obj`` has neither method, or ``optim_wrapper`` does not count
            its steps (a dict, a plain optimizer, another library's wrapper).
        ValueError: ``obj`` is already skip-aware, or is the wrapper itself.

    Example:
        >>> import torch
        >>> from fp16utils import OptimWrapper
        >>> p = torch.nn.Parameter(torch.ones(1))
        >>> wrapper = OptimWrapper(torch.optim.SGD([p], lr=1.0))
        >>> sched = skip_aware(torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5), wrapper)
        >>> sched.step()  # no optimizer step yet: the scheduler stays
        >>> wrapper.update_params(p.sum()).stepped
        True
        >>> sched.step(); sched.last_epoch, sched.get_last_lr()
        (1, [0.5])
    """
    if isinstance(obj, SkipAware):
        raise ValueError('skip_aware(): this object is already skip-aware; wrap the plain '
                         'scheduler or EMA model once.')
    if not any(callable(getattr(obj, name, None)) for name in _ADVANCING):
        raise TypeError(
            f'skip_aware() follows an LR scheduler (with step()) or an EMA model (with '
            f'update_parameters()); {type(obj).__name__} has neither.')
    counted = getattr(optim_wrapper, 'steps_taken', None)
    if isinstance(counted, bool) or not isinstance(counted, int):
        hint = ("pass one entry, e.g. optim_wrapper['generator']"
                if hasattr(optim_wrapper, 'optim_wrappers') else
                'pass an fp16utils OptimWrapper / AmpOptimWrapper or a 0.x fp16 hook')
        raise TypeError(
            f'skip_aware() needs the optimizer wrapper that takes the steps (it counts '
            f'them in steps_taken), got {type(optim_wrapper).__name__}; {hint}.')
    if obj is optim_wrapper:
        raise ValueError('skip_aware(obj, optim_wrapper): obj is the wrapper itself; pass the '
                         'scheduler or EMA model that follows it.')
    return SkipAware(obj, optim_wrapper)
