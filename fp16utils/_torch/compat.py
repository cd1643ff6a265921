"""Keyword-aware forward hooks (torch >= 2.0), foreach copies and clipping on torch 1.13 too."""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import torch


def forward_pre_hook_takes_kwargs() -> bool:
    """Whether ``register_forward_pre_hook`` takes ``with_kwargs``."""
    return _PRE_HOOK_KWARGS


class _ForwardPatch:
    """A forward pre-hook that sees keyword arguments: the forward wrapped until ``remove()``."""

    __slots__ = ('module', 'previous')

    def __init__(self, module: torch.nn.Module,
                 hook: Callable[[Any, tuple, dict], Any]) -> None:
        self.module = module
        self.previous = module.__dict__.get('forward')
        inner = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            result = hook(module, args, kwargs)
            if result is not None:
                args, kwargs = result
            return inner(*args, **kwargs)

        module.forward = forward  # type: ignore[method-assign]

    def remove(self) -> None:
        module = self.module
        if self.previous is None:
            module.__dict__.pop('forward', None)
        else:
            module.forward = self.previous  # type: ignore[method-assign]


def register_forward_pre_hook_with_kwargs(
        module: torch.nn.Module, hook: Callable[[Any, tuple, dict], Any]) -> Any:
    """``module.register_forward_pre_hook(hook, with_kwargs=True)``, else a wrapped forward."""
    if _PRE_HOOK_KWARGS:
        return module.register_forward_pre_hook(hook, with_kwargs=True)
    return _ForwardPatch(module, hook)


def register_forward_hook_with_kwargs(
        module: torch.nn.Module, hook: Callable[[Any, tuple, Any, Any], Any]) -> Any:
    """``module.register_forward_hook(hook, with_kwargs=True)``; torch 1.13 passes kwargs=None."""
    if _HOOK_KWARGS:
        return module.register_forward_hook(hook, with_kwargs=True)
    return module.register_forward_hook(lambda m, a, o: hook(m, a, None, o))


def foreach_copy_(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for all i, one fused kernel where torch has it."""
    if _foreach_copy is not None:
        _foreach_copy(dst, src)
        return
    for d, s in zip(dst, src):
        d.copy_(s)


def clip_grad_norm_(parameters: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_`` without ``foreach`` where torch lacks it."""
    return _clip_norm(parameters, **_known(kwargs, _CLIP_NORM_ARGS))


def clip_grad_value_(parameters: Any, **kwargs: Any) -> None:
    """``torch.nn.utils.clip_grad_value_`` without ``foreach`` where torch lacks it."""
    _clip_value(parameters, **_known(kwargs, _CLIP_VALUE_ARGS))


def _known(kwargs: dict, accepted: frozenset) -> dict:
    if 'foreach' in kwargs and 'foreach' not in accepted:
        kwargs = {k: v for k, v in kwargs.items() if k != 'foreach'}
    return kwargs


def _parameter_names(func: Callable[..., Any]) -> frozenset:
    try:
        return frozenset(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return frozenset()


_foreach_copy = getattr(torch, '_foreach_copy_', None)
_clip_norm = torch.nn.utils.clip_grad_norm_
_clip_value = torch.nn.utils.clip_grad_value_
_CLIP_NORM_ARGS = _parameter_names(_clip_norm)
_CLIP_VALUE_ARGS = _parameter_names(_clip_value)
_PRE_HOOK_KWARGS = 'with_kwargs' in _parameter_names(torch.nn.Module.register_forward_pre_hook)
_HOOK_KWARGS = 'with_kwargs' in _parameter_names(torch.nn.Module.register_forward_hook)
