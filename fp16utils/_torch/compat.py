"""Stand-ins for what older torch lacks: keyword-aware forward hooks and pre-hooks,
foreach copies, clipping without ``foreach``.

Example:
    >>> import torch
    >>> from fp16utils._torch.compat import foreach_copy_
    >>> dst = [torch.zeros(2)]
    >>> foreach_copy_(dst, [torch.ones(2)])
    >>> dst[0].tolist()
    [1.0, 1.0]
"""

from __future__ import annotations

import inspect
from typing import Any, Callable, Sequence

import torch


def forward_pre_hook_takes_kwargs() -> bool:
    """Whether ``register_forward_pre_hook`` takes ``with_kwargs`` (keyword arguments).

    Example:
        >>> isinstance(forward_pre_hook_takes_kwargs(), bool)
        True
    """
    return _PRE_HOOK_KWARGS


class _ForwardPatch:
    """A forward pre-hook that sees keyword arguments, where torch has none such.

    The module's forward is wrapped by an instance attribute (what ``nn.Module``
    calls), and :meth:`remove` puts back what was there.
    """

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
    """``module.register_forward_pre_hook(hook, with_kwargs=True)`` on any torch.

    Where torch lacks ``with_kwargs`` the module's forward is wrapped instead
    (undone by the handle's ``remove()``).

    Args:
        module: The module.
        hook: ``hook(module, args, kwargs)`` returning None or ``(args, kwargs)``.

    Returns:
        A handle with ``remove()``.

    Example:
        >>> m = torch.nn.Identity()
        >>> h = register_forward_pre_hook_with_kwargs(m, lambda mod, a, k: ((a[0] * 2,), k))
        >>> m(torch.ones(1)).item()
        2.0
        >>> h.remove(); m(torch.ones(1)).item()
        1.0
    """
    if _PRE_HOOK_KWARGS:
        return module.register_forward_pre_hook(hook, with_kwargs=True)
    return _ForwardPatch(module, hook)


def register_forward_hook_with_kwargs(
        module: torch.nn.Module, hook: Callable[[Any, tuple, Any, Any], Any]) -> Any:
    """``module.register_forward_hook(hook, with_kwargs=True)`` on any torch.

    Where torch lacks ``with_kwargs`` (torch < 2.0) the hook is registered
    without it and is called with ``kwargs=None``.

    Args:
        module: The module.
        hook: ``hook(module, args, kwargs, output)``.

    Returns:
        A handle with ``remove()``.

    Example:
        >>> seen = []
        >>> m = torch.nn.Identity()
        >>> h = register_forward_hook_with_kwargs(m, lambda mod, a, k, o: seen.append(o.item()))
        >>> _ = m(torch.ones(1)); h.remove(); _ = m(torch.ones(1)); seen
        [1.0]
    """
    if _HOOK_KWARGS:
        return module.register_forward_hook(hook, with_kwargs=True)
    return module.register_forward_hook(lambda m, a, o: hook(m, a, None, o))


def foreach_copy_(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for all i, one fused kernel where torch has it.

    Example:
        >>> a = [torch.zeros(2)]
        >>> foreach_copy_(a, [torch.ones(2)]); a[0].tolist()
        [1.0, 1.0]
    """
    if _foreach_copy is not None:
        _foreach_copy(dst, src)
        return
    for d, s in zip(dst, src):
        d.copy_(s)


def clip_grad_norm_(parameters: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``, leaving out arguments this torch lacks.

    ``foreach`` (a speed hint) is dropped where the function does not take it.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.ones(4)
        >>> float(clip_grad_norm_([p], max_norm=1.0, foreach=None))
        2.0
    """
    return _clip_norm(parameters, **_known(kwargs, _CLIP_NORM_ARGS))


def clip_grad_value_(parameters: Any, **kwargs: Any) -> None:
    """``torch.nn.utils.clip_grad_value_``, leaving out arguments this torch lacks.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(1)); p.grad = torch.full((1,), 5.0)
        >>> clip_grad_value_([p], clip_value=1.0, foreach=None); p.grad.item()
        1.0
    """
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
