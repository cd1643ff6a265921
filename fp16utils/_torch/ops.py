"""Tensor operations that torch keeps private, each behind a named helper with a fallback.

Grouping tensors by device and dtype, the ``_foreach`` kernels, flattening a
bucket of gradients, a sparse tensor's stored values, the fused overflow
check. Each helper says what it relies on and what it does where torch
lacks it.

Example:
    >>> grads = [torch.ones(2), torch.full((1,), 4.0)]
    >>> foreach_div_(grads, 2.0); [g.tolist() for g in grads]
    [[0.5, 0.5], [2.0]]
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Sequence

import torch

__all__ = ['flatten_dense_tensors', 'foreach_div_', 'foreach_zero_', 'local_tensor',
           'fused_non_finite_check', 'group_by_device_and_dtype', 'sparse_values',
           'unflatten_dense_tensors']

# torch._C._group_tensors_by_device_and_dtype (private, torch >= 2.1): one C++ pass.
_c_group = getattr(torch._C, '_group_tensors_by_device_and_dtype', None)
_C_GROUP_NAMES_DTYPES = _c_group is not None and isinstance(
    next(iter(_c_group([[torch.ones(1)]], False)))[1], str)
_foreach_zero = getattr(torch, '_foreach_zero_', None)
_foreach_div = getattr(torch, '_foreach_div_', None)
#: The fused check-and-unscale kernel's name (torch >= 1.6, private); read at each call.
_FUSED_CHECK = '_amp_foreach_non_finite_check_and_unscale_'


def group_by_device_and_dtype(
        tensors: Sequence[torch.Tensor]) -> list[tuple[Any, list[torch.Tensor]]]:
    """Group tensors by (device, dtype) for foreach kernels (one C++ pass).

    Relies on torch's private ``torch._C._group_tensors_by_device_and_dtype``
    (torch >= 2.1); where it is missing, a dict built in Python.

    Args:
        tensors: Dense tensors.

    Returns:
        ``((device, dtype), tensors)`` pairs.

    Example:
        >>> groups = group_by_device_and_dtype([torch.ones(1), torch.ones(2)])
        >>> [(key[1], len(ts)) for key, ts in groups]
        [(torch.float32, 2)]
    """
    if not tensors:
        return []
    if _c_group is not None:
        grouped = _c_group([list(tensors)], False)
        if _C_GROUP_NAMES_DTYPES:  # some torch keys the groups by the dtype's name
            return [((key[0], getattr(torch, key[1])), value[0][0])
                    for key, value in grouped.items()]
        return [(key, value[0][0]) for key, value in grouped.items()]
    groups: dict[tuple[Any, Any], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.items())


def foreach_zero_(tensors: Sequence[torch.Tensor]) -> None:
    """Zero every tensor in place: the private ``torch._foreach_zero_``, else ``zero_`` each.

    Example:
        >>> t = [torch.ones(2)]
        >>> foreach_zero_(t); t[0].tolist()
        [0.0, 0.0]
    """
    if _foreach_zero is not None:
        _foreach_zero(tensors)
        return
    for t in tensors:
        t.zero_()


def foreach_div_(tensors: Sequence[torch.Tensor], divisor: float) -> None:
    """Divide every tensor in place: torch's private ``torch._foreach_div_``, else ``div_`` each.

    Example:
        >>> t = [torch.full((1,), 3.0)]
        >>> foreach_div_(t, 3.0); t[0].item()
        1.0
    """
    if _foreach_div is not None:
        _foreach_div(tensors, divisor)
        return
    for t in tensors:
        t.div_(divisor)


def flatten_dense_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors concatenated into one flat tensor (a bucket for one all-reduce).

    Relies on torch's private ``torch._utils._flatten_dense_tensors`` (which
    uses the C++ flatten); where it is missing, ``torch.cat`` of the flattened
    tensors, which gives the same result.

    Example:
        >>> flatten_dense_tensors([torch.ones(2, 2), torch.zeros(1)]).tolist()
        [1.0, 1.0, 1.0, 1.0, 0.0]
    """
    flatten = getattr(torch._utils, '_flatten_dense_tensors', None)
    if flatten is not None:
        return flatten(tensors)
    return torch.cat([t.contiguous().view(-1) for t in tensors])


def unflatten_dense_tensors(flat: torch.Tensor, tensors: Sequence[torch.Tensor]
                            ) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``tensors``: the inverse of :func:`flatten_dense_tensors`.

    Relies on torch's private ``torch._utils._unflatten_dense_tensors``;
    where it is missing, slices of ``flat`` reshaped.

    Example:
        >>> ts = [torch.zeros(2), torch.zeros(1, 1)]
        >>> [t.shape for t in unflatten_dense_tensors(torch.arange(3.0), ts)]
        [torch.Size([2]), torch.Size([1, 1])]
    """
    unflatten = getattr(torch._utils, '_unflatten_dense_tensors', None)
    if unflatten is not None:
        return list(unflatten(flat, tensors))
    out, offset = [], 0
    for t in tensors:
        n = t.numel()
        out.append(flat.narrow(0, offset, n).view_as(t))
        offset += n
    return out


def sparse_values(tensor: torch.Tensor) -> torch.Tensor:
    """The stored values of a sparse COO tensor, as a dense tensor that shares its memory.

    Relies on the private ``Tensor._values()`` (the public ``values()`` needs a
    coalesced tensor, and coalescing copies); where it is missing,
    ``coalesce().values()`` (a copy: writes to it do not reach ``tensor``).

    Example:
        >>> s = torch.tensor([1.0, 0.0, 5.0]).to_sparse()
        >>> sparse_values(s).tolist()
        [1.0, 5.0]
    """
    values = getattr(tensor, '_values', None)
    if values is not None:
        return values()
    return tensor.coalesce().values()


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's part of a distributed tensor (FSDP2's DTensor), else ``tensor``.

    A DTensor's ``to_local()`` is a view of its local shard, so an in-place
    check-and-unscale of it changes the DTensor; checking the shards, then
    agreeing across ranks, avoids DTensor replicating the one-element flag
    tensors of the fused kernel (and the warning it gives for that).

    Example:
        >>> t = torch.ones(2)
        >>> local_tensor(t) is t
        True
    """
    to_local = getattr(type(tensor), 'to_local', None)
    return tensor if to_local is None else to_local(tensor)


def fused_non_finite_check() -> Optional[Callable[..., Any]]:
    """torch's fused check-and-unscale kernel, or None where torch lacks it.

    ``torch._amp_foreach_non_finite_check_and_unscale_(tensors, found_inf,
    inv_scale)`` is private (what GradScaler uses); it is looked up at each
    call, so a caller falls back to one ``isfinite`` per tensor where it is
    missing (or removed, as tests do).

    Example:
        >>> fused_non_finite_check() is None or callable(fused_non_finite_check())
        True
    """
    return getattr(torch, _FUSED_CHECK, None)
