"""Weak references that survive ``pickle``, ``torch.save`` and ``copy.deepcopy`` of their owner.

A plain ``weakref.ref`` cannot be pickled, so an object holding one cannot be
saved whole (``torch.save(wrapper)``). :class:`CacheRef` is what this package
keeps weakly (caches): a copy comes back dead, so the owner recomputes what it
had cached, and a copy never keeps the original alive or drags it into the
pickle.

Example:
    >>> import pickle
    >>> from torch import nn
    >>> model = nn.Linear(1, 1)
    >>> ref = CacheRef(model)
    >>> ref() is model, pickle.loads(pickle.dumps(ref)) is None
    (True, True)
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ['CacheRef']


def _dead() -> None:
    """What a pickled or deep-copied :class:`CacheRef` comes back as: nothing."""
    return None


class CacheRef(weakref.ref):
    """A ``weakref.ref`` for a cache: pickled or deep-copied, it comes back as None.

    Example:
        >>> import copy
        >>> from torch import nn
        >>> m = nn.Linear(1, 1)
        >>> copy.deepcopy({'ref': CacheRef(m)})
        {'ref': None}
    """

    __slots__ = ()

    def __reduce__(self) -> Any:
        return _dead, ()

    def __deepcopy__(self, memo: Any) -> None:
        return None
