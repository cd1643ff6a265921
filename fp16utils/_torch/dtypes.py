"""The low-precision dtypes, their names, and which of them needs loss scaling."""

from __future__ import annotations

from typing import Any

import torch

__all__ = ['LOW_NAMES', 'LOW_PRECISION', 'needs_loss_scaling', 'resolve_dtype']

#: The low-precision dtypes fp16utils trains in.
LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Their short names, as messages and tables show them.
LOW_NAMES = {torch.float16: 'float16', torch.bfloat16: 'bfloat16'}
_DTYPE_NAMES = {
    'float16': torch.float16,
    'fp16': torch.float16,
    'half': torch.float16,
    'bfloat16': torch.bfloat16,
    'bf16': torch.bfloat16,
}
#: What ``resolve_dtype(..., full_precision=True)`` takes besides them.
_FULL_NAMES = {'float32': torch.float32, 'float64': torch.float64}


def resolve_dtype(dtype: Any, default: torch.dtype = torch.float16,
                  full_precision: bool = False) -> torch.dtype:
    """A dtype or its name (``'bf16'``): low precision, or also float32/64 if ``full_precision``."""
    if dtype is None:
        return default
    if isinstance(dtype, str):
        key = dtype.lower().replace('torch.', '')
        if key in _DTYPE_NAMES:
            return _DTYPE_NAMES[key]
        if full_precision and key in _FULL_NAMES:
            return _FULL_NAMES[key]
    elif dtype in LOW_PRECISION or (full_precision and dtype in _FULL_NAMES.values()):
        return dtype
    raise ValueError(
        f'Unsupported low-precision dtype {dtype!r}; expected torch.float16 or '
        "torch.bfloat16 (or the names 'float16' / 'bfloat16').")


def needs_loss_scaling(dtype: torch.dtype) -> bool:
    """Whether gradients in ``dtype`` need loss scaling (only float16 does)."""
    return dtype == torch.float16
