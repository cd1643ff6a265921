"""Weak references that survive ``pickle``, ``torch.save`` and ``copy.deepcopy`` of their owner.

Plain ``weakref.ref`` and ``weakref.WeakSet`` objects cannot be pickled, so an
object holding one cannot be saved whole (``torch.save(wrapper)``). The two
classes here are what this package keeps weakly: caches and "already done"
marks. A copy comes back empty (the set) or dead (the reference), so the owner
recomputes what it had cached, and a copy never keeps the originals alive or
drags them into the pickle.

Example:
    >>> import copy, pickle
    >>> from torch import nn
    >>> model = nn.Linear(1, 1)
    >>> done = CopiedEmptyWeakSet([model])
    >>> model in done, len(pickle.loads(pickle.dumps(done))), len(copy.deepcopy(done))
    (True, 0, 0)
    >>> ref = CacheRef(model)
    >>> ref() is model, pickle.loads(pickle.dumps(ref)) is None
    (True, True)
"""

from __future__ import annotations

import weakref
from typing import Any

__all__ = ['CacheRef', 'CopiedEmptyWeakSet']


def _dead() -> None:
    """What a pickled or deep-copied :class:`CacheRef` comes back as: nothing."""
    return None


class CopiedEmptyWeakSet(weakref.WeakSet):
    """A ``WeakSet`` that pickles and deep-copies as an empty set of its class.

    Example:
        >>> import copy
        >>> type(copy.deepcopy(CopiedEmptyWeakSet())).__name__
        'CopiedEmptyWeakSet'
    """

    def __reduce__(self) -> Any:
        return type(self), ()


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
