"""The forward contexts of :meth:`AmpOptimWrapper.optim_context` (besides autocast itself).

:class:`CastIO` is the legacy backend's forward (float32 inputs to half,
half outputs back to float32), :class:`Guarded` watches an armed overflow
guard's forward, and :class:`Both` enters two contexts as one.

Example:
    >>> import contextlib
    >>> import torch
    >>> model = torch.nn.Linear(2, 2).to(torch.bfloat16)
    >>> with Both(contextlib.nullcontext(), CastIO(model, torch.bfloat16)):
    ...     out = model(torch.ones(1, 2))
    >>> out.dtype
    torch.float32
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Tuple

import torch
from torch import nn

from .._torch import compat
from ..cast import cast_tensor_type
from ..engine import OverflowGuard

__all__ = ['Both', 'CastIO', 'Guarded']


class Both:
    """Enter ``outer`` then ``inner``; exit in reverse (a two-item ExitStack, cheaper).

    An exception entering ``inner`` exits ``outer``; what ``inner`` suppresses
    on exit, ``outer`` does not see.

    Example:
        >>> import contextlib
        >>> with Both(contextlib.nullcontext(), contextlib.suppress(KeyError)):
        ...     raise KeyError('suppressed by the inner context')
    """

    __slots__ = ('outer', 'inner')

    def __init__(self, outer: contextlib.AbstractContextManager,
                 inner: contextlib.AbstractContextManager) -> None:
        self.outer = outer
        self.inner = inner

    def __enter__(self) -> None:
        self.outer.__enter__()
        try:
            self.inner.__enter__()
        except BaseException:
            if not self.outer.__exit__(*sys.exc_info()):
                raise

    def __exit__(self, *exc: Any) -> bool:
        try:
            suppressed = bool(self.inner.__exit__(*exc))
        except BaseException:
            if not self.outer.__exit__(*sys.exc_info()):
                raise
            return True
        if suppressed:
            exc = (None, None, None)
        return bool(self.outer.__exit__(*exc)) or suppressed


class Guarded:
    """Attach an armed overflow guard's watchers; they stay on until the backward.

    Args:
        guard: The wrapper's :class:`~fp16utils.engine.OverflowGuard`.
        model: The model whose forward is watched.
    """

    __slots__ = ('guard', 'model')

    def __init__(self, guard: OverflowGuard, model: nn.Module) -> None:
        self.guard = guard
        self.model = model

    def __enter__(self) -> None:
        self.guard.watch(self.model)

    def __exit__(self, *exc: Any) -> None:
        if exc[0] is not None:
            self.guard.stop(*exc)  # the forward failed: no backward will come


class CastIO:
    """Cast ``model``'s float32 inputs to ``dtype`` and its ``dtype`` outputs to float32.

    Forward hooks on ``model`` while the context is open (removed on exit).

    Args:
        model: The half model (legacy backend).
        dtype: Its dtype, float16 or bfloat16.

    Example:
        >>> model = torch.nn.Linear(2, 2).to(torch.bfloat16)
        >>> with CastIO(model, torch.bfloat16):
        ...     out = model(torch.ones(1, 2))
        ...     hooked = len(model._forward_hooks)
        >>> out.dtype, hooked, len(model._forward_hooks)
        (torch.float32, 1, 0)
    """

    __slots__ = ('model', 'dtype', 'handles')

    def __init__(self, model: nn.Module, dtype: torch.dtype) -> None:
        self.model = model
        self.dtype = dtype
        self.handles: Tuple[Any, ...] = ()

    def _pre(self, module: nn.Module, args: tuple, kwargs: dict) -> Tuple[tuple, dict]:
        return (cast_tensor_type(args, torch.float32, self.dtype),
                cast_tensor_type(kwargs, torch.float32, self.dtype))

    def _post(self, module: nn.Module, args: tuple, output: Any) -> Any:
        return cast_tensor_type(output, self.dtype, torch.float32)

    def __enter__(self) -> None:
        self.handles = (compat.register_forward_pre_hook_with_kwargs(self.model, self._pre),
                        self.model.register_forward_hook(self._post))

    def __exit__(self, *exc: Any) -> None:
        for handle in self.handles:
            handle.remove()
        self.handles = ()
