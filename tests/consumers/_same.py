"""Structural equality for the differential tier: same types, dtypes, devices and values.

Example:
    >>> import torch
    >>> same([torch.ones(1), 'a'], [torch.ones(1), 'a'])
    True
    >>> same((torch.ones(1),), (torch.ones(1).half(),))
    False
"""

from __future__ import annotations

import collections
from collections import abc
from typing import Any, Optional

import numpy as np
import torch


def _key(obj: Any) -> str:
    """An order-free description of a set element."""
    if isinstance(obj, torch.Tensor):
        return f'tensor {obj.dtype} {obj.device} {obj.tolist()}'
    return f'{type(obj).__qualname__} {obj!r}'


def difference(a: Any, b: Any, where: str = 'result') -> Optional[str]:
    """Where and how ``a`` and ``b`` differ (None: they are the same).

    Tensors: type, dtype, device, shape and values (NaN equal to NaN); arrays:
    dtype and values; containers: their type, and their items in order (sets:
    their items as a multiset; deques: also maxlen); anything else: ``is`` or ``==``.

    Example:
        >>> import torch
        >>> difference({'x': torch.ones(1)}, {'x': torch.zeros(1)})
        "result['x']: values tensor([1.]) != tensor([0.])"
    """
    if type(a) is not type(b):
        return f'{where}: type {type(a).__qualname__} != {type(b).__qualname__}'
    if isinstance(a, torch.Tensor):
        if (a.dtype, a.device, a.shape) != (b.dtype, b.device, b.shape):
            return f'{where}: {a.dtype} {a.device} {tuple(a.shape)} != ' \
                   f'{b.dtype} {b.device} {tuple(b.shape)}'
        if a.device.type != 'meta' and not torch.equal(a.nan_to_num(), b.nan_to_num()):
            return f'{where}: values {a} != {b}'
        return None
    if isinstance(a, np.ndarray):
        return None if a.dtype == b.dtype and np.array_equal(a, b) else f'{where}: arrays'
    if isinstance(a, abc.Mapping):
        if list(a) != list(b):
            return f'{where}: keys {list(a)} != {list(b)}'
        for key in a:
            found = difference(a[key], b[key], f'{where}[{key!r}]')
            if found:
                return found
        if isinstance(a, collections.defaultdict) and a.default_factory != b.default_factory:
            return f'{where}: default_factory'
        return None
    if isinstance(a, abc.Set):
        keys_a, keys_b = sorted(map(_key, a)), sorted(map(_key, b))
        return None if keys_a == keys_b else f'{where}: {keys_a} != {keys_b}'
    if isinstance(a, (list, tuple, collections.deque)) and not isinstance(a, (str, bytes)):
        if isinstance(a, collections.deque) and a.maxlen != b.maxlen:
            return f'{where}: maxlen {a.maxlen} != {b.maxlen}'
        if len(a) != len(b):
            return f'{where}: length {len(a)} != {len(b)}'
        for i, (x, y) in enumerate(zip(a, b)):
            found = difference(x, y, f'{where}[{i}]')
            if found:
                return found
        return None
    if a is b:
        return None
    try:
        equal = bool(a == b)
    except Exception:  # noqa: BLE001 - no equality: only identity counts
        equal = False
    return None if equal else f'{where}: {a!r} != {b!r}'


def same(a: Any, b: Any) -> bool:
    """:func:`difference` found nothing."""
    return difference(a, b) is None
