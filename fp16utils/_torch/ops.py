"""Tensor operations that torch keeps private, each behind a named helper."""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch

__all__ = ['flatten_dense_tensors', 'foreach_div_', 'foreach_zero_', 'local_tensor',
           'fused_non_finite_check', 'group_by_device_and_dtype', 'sparse_values',
           'unflatten_dense_tensors']

# torch._C._group_tensors_by_device_and_dtype (private, torch >= 2.1): one C++ pass.
_c_group = getattr(torch._C, '_group_tensors_by_device_and_dtype', None)
_C_GROUP_NAMES_DTYPES = _c_group is not None and isinstance(
    next(iter(_c_group([[torch.ones(1)]], False)))[1], str)
#: The fused check-and-unscale kernel's name (private); read at each call.
_FUSED_CHECK = '_amp_foreach_non_finite_check_and_unscale_'


def group_by_device_and_dtype(
        tensors: Sequence[torch.Tensor]) -> list[tuple[Any, list[torch.Tensor]]]:
    """``((device, dtype), tensors)`` pairs, in one C++ pass where torch has it (>= 2.1)."""
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
    """Zero every tensor in place (the private ``torch._foreach_zero_``)."""
    torch._foreach_zero_(tensors)


def foreach_div_(tensors: Sequence[torch.Tensor], divisor: float) -> None:
    """Divide every tensor in place (the private ``torch._foreach_div_``)."""
    torch._foreach_div_(tensors, divisor)


def flatten_dense_tensors(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """The tensors concatenated into one flat tensor (a bucket for one all-reduce)."""
    return torch._utils._flatten_dense_tensors(tensors)


def unflatten_dense_tensors(flat: torch.Tensor, tensors: Sequence[torch.Tensor]
                            ) -> list[torch.Tensor]:
    """Views of ``flat`` shaped like ``tensors``: the inverse of :func:`flatten_dense_tensors`."""
    return list(torch._utils._unflatten_dense_tensors(flat, tensors))


def sparse_values(tensor: torch.Tensor) -> torch.Tensor:
    """A sparse COO tensor's stored values, sharing its memory (``values()`` would coalesce)."""
    return tensor._values()


def local_tensor(tensor: torch.Tensor) -> torch.Tensor:
    """This rank's shard of a DTensor (a view: in-place changes reach it), else ``tensor``."""
    to_local = getattr(type(tensor), 'to_local', None)
    return tensor if to_local is None else to_local(tensor)


def fused_non_finite_check() -> Callable[..., Any]:
    """torch's private fused check-and-unscale kernel, looked up at each call (tests replace it)."""
    return getattr(torch, _FUSED_CHECK)
