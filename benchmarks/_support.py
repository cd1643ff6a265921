"""What the benchmarks need from torch, checked before anything is measured."""

from __future__ import annotations

from typing import Optional

import torch

from fp16utils import _torch


def cannot_measure(device_type: str, dtype: torch.dtype, grad_scaler: bool = False
                   ) -> Optional[str]:
    """Why this torch cannot run the hand-written reference here (None: it can).

    The references are what a user writes by hand: ``torch.autocast`` in ``dtype``
    on the device and, with ``grad_scaler``, ``torch.amp.GradScaler(device)``.

    Example:
        >>> cannot_measure('cpu', torch.bfloat16) is None
        True
    """
    name = str(dtype).replace('torch.', '')
    version = torch.__version__
    if not _torch.caps.kernels_support(device_type, dtype):
        return f'torch {version} has no {name} matrix kernels on {device_type}'
    if not _torch.autocast.autocast_supports(device_type, dtype):
        return f'torch {version} has no {name} autocast on {device_type}'
    if grad_scaler and getattr(getattr(torch, 'amp', None), 'GradScaler', None) is None:
        return f'torch {version} has no torch.amp.GradScaler(device) (torch 2.3 and newer)'
    return None
