"""Whether dynamo, TorchScript or a torch-function mode is tracing the running code."""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ['is_compiling', 'is_scripting', 'torch_function_mode_active']


def _never() -> bool:
    return False


# Bound once, not wrapped: the decorators' eager path asks these per call.
#: Whether dynamo is tracing: ``torch.compiler.is_compiling`` (torch >= 2.3), else the
#: private ``torch._utils.is_compiling`` (importing ``torch._dynamo`` would cost seconds),
#: else always False (no torch.compile).
is_compiling: Callable[[], bool] = getattr(
    getattr(torch, 'compiler', None), 'is_compiling', None) or getattr(
    torch._utils, 'is_compiling', None) or _never
#: Whether a torch-function mode is on (as ``torch.export`` uses while it traces); private.
torch_function_mode_active: Callable[[], bool] = torch._C._is_torch_function_mode_enabled
#: Whether TorchScript is compiling the calling code.
is_scripting: Callable[[], bool] = torch.jit.is_scripting
