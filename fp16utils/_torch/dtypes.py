"""The low-precision dtypes: their names, and which of them needs loss scaling.

Example:
    >>> resolve_dtype('bf16'), needs_loss_scaling(torch.float16)
    (torch.bfloat16, True)
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ['needs_loss_scaling', 'resolve_dtype']

#: The low-precision dtypes fp16utils trains in.
_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Their short names, as messages and tables show them.
_LOW_NAMES = {torch.float16: 'float16', torch.bfloat16: 'bfloat16'}
_DTYPE_NAMES = {
    'float16': torch.float16,
    'fp16': torch.float16,
    'half': torch.float16,
    'bfloat16': torch.bfloat16,
    'bf16': torch.bfloat16,
}


def resolve_dtype(dtype: Any, default: torch.dtype = torch.float16) -> torch.dtype:
    """Normalise a low-precision dtype given as a torch dtype or a name.

    Args:
        dtype: ``torch.float16``, ``torch.bfloat16``, one of the names
            ``'float16' 'fp16' 'half' 'bfloat16' 'bf16'``, or None.
        default: Returned when ``dtype`` is None.

    Returns:
        ``torch.float16`` or ``torch.bfloat16``.

    Raises:
        ValueError: For any other dtype.

    Example:
        >>> resolve_dtype('bf16')
        torch.bfloat16
    """
    if dtype is None:
        return default
    if isinstance(dtype, str):
        key = dtype.lower().replace('torch.', '')
        if key in _DTYPE_NAMES:
            return _DTYPE_NAMES[key]
    elif dtype in _LOW_PRECISION:
        return dtype
    raise ValueError(
        f'Unsupported low-precision dtype {dtype!r}; expected torch.float16 or '
        "torch.bfloat16 (or the names 'float16' / 'bfloat16').")


def needs_loss_scaling(dtype: torch.dtype) -> bool:
    """Whether gradients in ``dtype`` need loss scaling (only float16 does).

    Example:
        >>> needs_loss_scaling(torch.bfloat16)
        False
    """
    return dtype == torch.float16
