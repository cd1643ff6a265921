"""The forward contexts of :meth:`AmpOptimWrapper.optim_context` besides autocast: the
legacy backend's input and output casts, the overflow guard's watch, and a pair of
contexts entered as one."""

from __future__ import annotations

import contextlib
import sys
from typing import Any, Tuple

import torch
from torch import nn

from .._torch import compat
from ..cast import cast_tensor_type
from ..engine import OverflowGuard

__all__ = ['CastIO', 'Guarded', 'TwoContexts']


class TwoContexts:
    """Enter ``outer`` then ``inner``, exit in reverse: a two-item ExitStack, cheaper."""

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
    """Attach an armed overflow guard's watchers to ``model``; they stay on until the backward."""

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
    """While open, cast ``model``'s float32 inputs to ``dtype`` and its outputs back to float32."""

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
