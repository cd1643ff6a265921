"""Whether torch is tracing or compiling the code that runs now (dynamo, TorchScript, modes).

Each question reads torch's private state where no public call answers it;
each helper says what it relies on and what it answers where that is missing.

Example:
    >>> from fp16utils._torch.tracing import is_compiling, is_scripting
    >>> is_compiling(), is_scripting(), torch_function_mode_active()
    (False, False, False)
"""

from __future__ import annotations

from typing import Callable

import torch

__all__ = ['is_compiling', 'is_scripting', 'torch_function_mode_active']


def _never() -> bool:
    return False


# Bound once, not wrapped: the decorators' eager path asks these per call.
#: Whether dynamo is tracing: ``torch.compiler.is_compiling`` (torch >= 2.3), else
#: torch's private ``torch._utils.is_compiling`` (which dynamo answers True while it
#: traces; importing ``torch._dynamo`` instead would cost seconds), else always False
#: (a torch without torch.compile).
is_compiling: Callable[[], bool] = getattr(
    getattr(torch, 'compiler', None), 'is_compiling', None) or getattr(
    torch._utils, 'is_compiling', None) or _never
#: Whether a torch-function mode is on (as ``torch.export`` uses while it traces). Relies
#: on torch's private ``torch._C._is_torch_function_mode_enabled``; always False where
#: torch lacks it (no such modes there).
torch_function_mode_active: Callable[[], bool] = getattr(
    torch._C, '_is_torch_function_mode_enabled', None) or _never
#: Whether TorchScript is compiling the calling code: ``torch.jit.is_scripting`` (public;
#: always False where torch has no TorchScript).
is_scripting: Callable[[], bool] = getattr(
    getattr(torch, 'jit', None), 'is_scripting', None) or _never
