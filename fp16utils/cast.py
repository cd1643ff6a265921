"""Recursive, container-preserving dtype casting of tensors (mmcv's ``cast_tensor_type``)."""

from __future__ import annotations

import collections
from collections import abc
from typing import Any, Callable, Collection, Optional

import numpy as np
import torch
from torch import nn

from ._torch.tracing import is_compiling as _is_compiling

__all__ = ['MAX_DEPTH', 'cast_tensor_type']

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


def _convert(tensor: torch.Tensor, dst: Any) -> torch.Tensor:
    method = _CONVERT.get(dst)
    if method is not None:
        return method(tensor)
    if type(dst) is _To:
        return dst(tensor)
    return tensor.to(dst)


class _To:
    """A ``dst_type`` that is not a torch dtype, given to ``Tensor.to`` as mmcv gives it."""

    __slots__ = ('arg', 'src')

    def __init__(self, arg: Any, src: torch.dtype) -> None:
        self.arg = arg
        self.src = src

    def __call__(self, tensor: torch.Tensor) -> torch.Tensor:
        try:
            return tensor.to(self.arg)
        except (TypeError, RuntimeError) as err:
            if isinstance(err, RuntimeError) and 'device string' not in str(err):
                raise  # a real failure of the move (no such device, out of memory)
            named = getattr(torch, self.arg, None) if isinstance(self.arg, str) else None
            todo = (f'pass the dtype torch.{self.arg}, not the string {self.arg!r}'
                    if isinstance(named, torch.dtype) else 'pass a torch dtype, e.g. torch.float16')
            reason = str(err).splitlines()[0].split(', but expected')[0].rstrip(':')
            raise TypeError(
                f'cast_tensor_type() converts the tensors of dtype {self.src} with '
                f'Tensor.to(dst_type), which refused dst_type={self.arg!r} ({reason}); '
                f'nothing was cast. dst_type must be a torch dtype (or a device or a '
                f'tensor, which Tensor.to also takes): {todo}.') from None


#: How many containers deep :func:`cast_tensor_type` looks before refusing (far
#: more than any real input; well inside Python's recursion limit).
MAX_DEPTH = 100

# Container types rebuilt without a check: their constructors are known to keep the items.
_KNOWN = frozenset({dict, list, tuple, set, frozenset, collections.OrderedDict,
                    collections.defaultdict, collections.deque})


class _Walk:
    """The containers open on the current path, for cycle and depth checks."""

    __slots__ = ('open', 'cycles', 'traced')

    def __init__(self) -> None:
        self.open: list = []      # id() of each container being walked, outermost first
        self.cycles: set = set()  # id() of the containers that an inner item refers back to
        # Inside a dynamo trace containers are counted, not named (dynamo cannot take
        # the id() of a list or tuple everywhere); a cycle there ends at MAX_DEPTH.
        self.traced = _is_compiling()


def _cast(obj: Any, src: Collection[torch.dtype], dst: torch.dtype,
          seen: Optional[list], walk: Optional[_Walk] = None) -> Any:
    """``obj`` with its ``src`` tensors cast to ``dst`` (itself if none); ``seen`` gets a device."""
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
        rebuild: Any = _cast_mapping
    elif isinstance(obj, (abc.Sequence, abc.Set, collections.deque)):
        rebuild = _cast_collection
    else:
        return obj
    if walk is None:
        walk = _Walk()
    key = 0 if walk.traced else id(obj)  # (no object has id 0)
    if key and key in walk.open:  # a container that holds itself: its items are cast above
        walk.cycles.add(key)
        return obj
    if len(walk.open) >= MAX_DEPTH:
        raise ValueError(
            f'cast_tensor_type() got containers nested more than {MAX_DEPTH} deep; '
            'nothing was cast. Flatten the input, or cast the inner part separately.')
    walk.open.append(key)
    out = rebuild(obj, src, dst, seen, walk)  # on an error the walk is dropped with it
    walk.open.pop()
    if key in walk.cycles and out is not obj:  # (cycles first: dynamo traces it)
        raise ValueError(
            f'cast_tensor_type() got a {type(obj).__name__} that contains itself and '
            'holds tensors to cast; a copy with cast tensors cannot keep the cycle, '
            'and nothing was cast. Break the cycle, or cast the tensors before '
            'building it.')
    return out


def _rebuilt(obj: Any, build: Callable[[], Any], items: Optional[list]) -> Any:
    """``build()``, or a TypeError naming the class if it fails or loses ``items``."""
    cls = type(obj)
    try:
        out = build()
    except TypeError as err:
        why = f'its constructor refused the cast items ({err})'
    else:
        if items is None or cls in _KNOWN or type(out) is cls and _keeps(out, items):
            return out
        why = ('the object it built does not hold the cast items' if type(out) is cls
               else f'its constructor built a {type(out).__name__}')
    how = ('a dict of the items' if isinstance(obj, abc.Mapping)
           else 'the list of the items')
    raise TypeError(
        f'cast_tensor_type() cannot rebuild a {cls.__module__}.{cls.__qualname__} with its '
        f'tensors cast: {why}; nothing was cast. Containers are rebuilt as mmcv does, '
        f'{cls.__name__}({how}): give the class a constructor that takes that, or pass a '
        f'dict or list instead.') from None


def _keeps(out: Any, items: list) -> bool:
    """Whether a rebuilt container holds ``items`` (in order; a set in any order)."""
    try:
        if isinstance(out, abc.Mapping):
            return len(out) == len(items) and all(_kept(out[k], v) for k, v in items)
        got = list(out)
        if len(got) != len(items):
            return False
        if isinstance(out, abc.Set):
            return {id(x) for x in got} == {id(x) for x in items}
        return all(_kept(a, b) for a, b in zip(got, items))
    except Exception:  # noqa: BLE001 - a container that cannot be read back: not kept
        return False


def _kept(got: Any, want: Any) -> bool:
    """``got`` is ``want``, or an equal copy of it (a tensor: same dtype, shape, device)."""
    if got is want:
        return True
    if isinstance(want, _Tensor):
        return (isinstance(got, _Tensor) and got.dtype == want.dtype
                and got.shape == want.shape and got.device == want.device)
    return not isinstance(want, (abc.Mapping, abc.Sequence, abc.Set)) and bool(got == want)


def _cast_mapping(obj: abc.Mapping, src: Collection[torch.dtype], dst: torch.dtype,
                  seen: Optional[list], walk: _Walk) -> Any:
    items = [(k, v, _cast(v, src, dst, seen, walk)) for k, v in obj.items()]
    if all(new is old for _, old, new in items):
        return obj
    pairs = [(k, new) for k, _, new in items]
    if isinstance(obj, collections.defaultdict):
        out: Any = type(obj)(obj.default_factory)
        out.update(pairs)
        return out
    # Built from a dict, as mmcv does (MappingProxyType and Mapping classes that wrap
    # the object they are given need one, not a list of pairs).
    return _rebuilt(obj, lambda: type(obj)(dict(pairs)), pairs)


def _cast_collection(obj: Any, src: Collection[torch.dtype], dst: torch.dtype,
                     seen: Optional[list], walk: _Walk) -> Any:
    old = list(obj)
    new = [_cast(v, src, dst, seen, walk) for v in old]
    if all(n is o for n, o in zip(new, old)):
        return obj
    cls = type(obj)
    if cls is list:
        return new
    if cls is tuple:
        return tuple(new)
    if isinstance(obj, tuple) and hasattr(obj, '_fields'):  # namedtuple
        return _rebuilt(obj, lambda: cls(*new), None)  # fields kept by position
    if isinstance(obj, collections.deque):
        return _rebuilt(obj, lambda: cls(new, obj.maxlen), new)
    return _rebuilt(obj, lambda: cls(new), new)


def cast_tensor_type(inputs: Any, src_type: Any = None, dst_type: Any = None) -> Any:
    """Recursively convert tensors of dtype ``src_type`` inside ``inputs`` to ``dst_type``.

    Only tensors of ``src_type`` change; modules, strings, numpy arrays, ranges
    and iterators come back as they are, containers are rebuilt with their own
    type, and the very same object comes back when nothing needs casting.

    Args:
        inputs: A tensor, a container of tensors, or anything else.
        src_type: The dtype to convert from (anything else matches no tensor).
        dst_type: The dtype to convert to (None: no conversion; anything else
            that ``Tensor.to`` takes is passed to it, as mmcv does).

    Returns:
        ``inputs`` with its matching tensors converted.

    Raises:
        TypeError: ``Tensor.to`` refuses ``dst_type``, or a container that
            holds a tensor to convert cannot be rebuilt; nothing is cast.
        ValueError: A container that holds itself and a tensor to convert, or
            nesting deeper than ``MAX_DEPTH``; nothing is cast.

    Example:
        >>> import torch
        >>> x = (torch.ones(1), torch.ones(1, dtype=torch.int64))
        >>> [t.dtype for t in cast_tensor_type(x, torch.float32, torch.float16)]
        [torch.float16, torch.int64]
    """
    if dst_type is None or not isinstance(src_type, torch.dtype):
        return inputs
    if isinstance(dst_type, torch.dtype):
        if dst_type == src_type:
            return inputs
        return _cast(inputs, (src_type,), dst_type, None)
    return _cast(inputs, (src_type,), _To(dst_type, src_type), None)
