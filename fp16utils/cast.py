"""Recursive, container-preserving dtype casting of tensors.

Example:
    >>> import torch
    >>> from fp16utils import cast_tensor_type
    >>> out = cast_tensor_type({'x': torch.ones(2), 'n': 3}, torch.float32, torch.float16)
    >>> out['x'].dtype, out['n']
    (torch.float16, 3)
"""

from __future__ import annotations

import collections
from collections import abc
from typing import Any, Collection, Optional

import numpy as np
import torch
from torch import nn

__all__ = ['cast_tensor_type']

_Tensor = torch.Tensor
# Leaves returned unchanged without looking inside (strings and bytes are
# iterable, arrays would be rebuilt element by element, ranges and iterators
# would be consumed).
_ATOMS = (str, bytes, bytearray, memoryview, np.ndarray, range, nn.Module,
          abc.Iterator)


def _device_type(tensor: torch.Tensor) -> str:
    """``tensor.device.type``, without building a device object in the common cases."""
    if tensor.is_cpu:
        return 'cpu'
    if tensor.is_cuda:
        return 'cuda'
    return tensor.device.type


# Tensor.half() and friends parse their arguments faster than Tensor.to(dtype).
_CONVERT = {
    torch.float16: _Tensor.half,
    torch.bfloat16: _Tensor.bfloat16,
    torch.float32: _Tensor.float,
    torch.float64: _Tensor.double,
}


def _convert(tensor: torch.Tensor, dst: torch.dtype) -> torch.Tensor:
    method = _CONVERT.get(dst)
    return tensor.to(dst) if method is None else method(tensor)


def _cast(obj: Any, src: Collection[torch.dtype], dst: torch.dtype,
          seen: Optional[list]) -> Any:
    """Cast every tensor of dtype in ``src`` inside ``obj`` to ``dst``.

    Returns ``obj`` itself when nothing inside it changed. When ``seen`` is
    given (an empty list), the device type of the first tensor converted is
    appended to it.
    """
    if isinstance(obj, _Tensor):
        if obj.dtype in src:
            if seen is not None and not seen:
                seen.append(_device_type(obj))
            return _convert(obj, dst)
        return obj
    if obj is None or isinstance(obj, (int, float, bool, complex)):
        return obj
    if isinstance(obj, _ATOMS):
        return obj
    if isinstance(obj, abc.Mapping):
        return _cast_mapping(obj, src, dst, seen)
    if isinstance(obj, (abc.Sequence, abc.Set, collections.deque)):
        return _cast_collection(obj, src, dst, seen)
    return obj


def _cast_mapping(obj: abc.Mapping, src: Collection[torch.dtype], dst: torch.dtype,
                  seen: Optional[list]) -> Any:
    items = [(k, v, _cast(v, src, dst, seen)) for k, v in obj.items()]
    if all(new is old for _, old, new in items):
        return obj
    pairs = [(k, new) for k, _, new in items]
    if isinstance(obj, collections.defaultdict):
        out: Any = type(obj)(obj.default_factory)
        out.update(pairs)
        return out
    try:
        # Built from a dict, as mmcv does (MappingProxyType and Mapping classes
        # that wrap the object they are given need one, not a list of pairs).
        return type(obj)(dict(pairs))
    except TypeError:
        # A mapping type that cannot be built from pairs: keep it as it is
        # rather than change its type.
        return obj


def _cast_collection(obj: Any, src: Collection[torch.dtype], dst: torch.dtype,
                     seen: Optional[list]) -> Any:
    old = list(obj)
    new = [_cast(v, src, dst, seen) for v in old]
    if all(n is o for n, o in zip(new, old)):
        return obj
    cls = type(obj)
    if cls is list:
        return new
    if cls is tuple:
        return tuple(new)
    if isinstance(obj, tuple) and hasattr(obj, '_fields'):  # namedtuple
        return cls(*new)
    if isinstance(obj, collections.deque):
        return cls(new, obj.maxlen)
    try:
        return cls(new)
    except TypeError:
        return obj


def cast_tensor_type(inputs: Any, src_type: Optional[torch.dtype] = None,
                     dst_type: Optional[torch.dtype] = None) -> Any:
    """Recursively convert tensors of dtype ``src_type`` inside ``inputs`` to ``dst_type``.

    Only tensors whose dtype equals ``src_type`` change (an int tensor stays
    int). Modules, strings, bytes, numpy arrays, ranges, iterators and
    generators are returned as they are (nothing is consumed). Mappings,
    lists, tuples, namedtuples, sets, deques, OrderedDicts and defaultdicts are
    rebuilt with the same type (a defaultdict keeps its factory). Anything else
    is returned as is. When nothing needs casting, the very same object comes
    back.

    Args:
        inputs: Anything: a tensor, a container of tensors, or another object.
        src_type: The dtype to convert from.
        dst_type: The dtype to convert to.

    Returns:
        ``inputs`` with its matching tensors converted.

    Example:
        >>> import torch
        >>> x = (torch.ones(1), torch.ones(1, dtype=torch.int64))
        >>> [t.dtype for t in cast_tensor_type(x, torch.float32, torch.float16)]
        [torch.float16, torch.int64]
    """
    if src_type is None or dst_type is None or src_type == dst_type:
        return inputs
    return _cast(inputs, (src_type,), dst_type, None)
