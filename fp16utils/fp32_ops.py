"""``fp32_function``: run a function or an autograd Function in float32, on any device.

For operators without a half kernel (compiled extensions, deformable convolution,
RoIAlign, ...): the low-precision arguments become float32 and the call runs with
autocast off, through the argument-casting core of :mod:`fp16utils.decorators`.
"""

from __future__ import annotations

import functools
import inspect
from collections import abc
from typing import Any, Callable, Optional, TypeVar, Union, overload

import torch
from torch import nn

from ._torch import dtypes
from .cast import MAX_DEPTH, _cast
from .decorators import fp32_plan, run_fp32

__all__ = ['fp32_function']

F = TypeVar('F', bound=Callable[..., Any])
CastOutput = Union[bool, torch.dtype, str, None]

_FLOAT = (torch.float32,)
_LOW = dtypes.LOW_PRECISION


def _call_all(fn: Any, *args: Any, **kwargs: Any) -> Any:
    """The signature the shared plan is made from: every argument after the function."""


_PLAN = fp32_plan(_call_all)


def _call(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``fn(*args, **kwargs)``: the function in the owner slot of :func:`run_fp32`."""
    return fn(*args, **kwargs)


def _low_dtype(obj: Any, depth: int = 0) -> Optional[torch.dtype]:
    """The dtype of the first float16/bfloat16 tensor in ``obj`` (containers searched)."""
    if isinstance(obj, torch.Tensor):
        return obj.dtype if obj.dtype in _LOW else None
    if depth >= MAX_DEPTH or isinstance(obj, (str, bytes, range, abc.Iterator)):
        return None
    if isinstance(obj, abc.Mapping):
        obj = obj.values()
    elif not isinstance(obj, (abc.Sequence, abc.Set)):
        return None
    for item in obj:
        found = _low_dtype(item, depth + 1)
        if found is not None:
            return found
    return None


def _check_target(fn: Any) -> None:
    """Refuse, when wrapping, what cannot be called as a float32 function."""
    if isinstance(fn, (staticmethod, classmethod)):
        raise TypeError(
            f'fp32_function got a {type(fn).__name__} object; put @{type(fn).__name__} '
            'above @fp32_function (it wraps the function inside), as with '
            'torch.amp.custom_fwd.')
    if isinstance(fn, type) and issubclass(fn, torch.autograd.Function):
        raise TypeError(
            f'fp32_function got the autograd Function class {fn.__qualname__}; wrap its '
            f'apply (fp32_function({fn.__name__}.apply)) or decorate its forward and '
            'backward (below @staticmethod).')
    if isinstance(fn, nn.Module):
        raise TypeError(
            f'fp32_function got the module {type(fn).__name__}, whose parameters it '
            'would not convert; use keep_fp32(model, ...) or fp32_modules=[...] to run '
            'a module in float32 (see docs/troubleshooting/no-half-kernel.md).')
    if not callable(fn):
        raise TypeError(
            f'fp32_function(fn): fn must be a function, a method or an autograd '
            f"Function's apply, got {type(fn).__name__} ({fn!r}).")
    if (inspect.iscoroutinefunction(fn) or inspect.isgeneratorfunction(fn)
            or inspect.isasyncgenfunction(fn)):
        raise TypeError(
            f'fp32_function cannot wrap {getattr(fn, "__qualname__", fn)}: it is a '
            'generator or async function, whose body would run after the wrapper has '
            'returned (outside float32). Wrap a function that returns the result.')


def _out_dtype(cast_output: CastOutput) -> Union[bool, torch.dtype]:
    """``cast_output`` checked: False, True (the inputs' dtype) or a low-precision dtype."""
    if cast_output is None or cast_output is False or cast_output is True:
        return bool(cast_output)
    try:
        return dtypes.resolve_dtype(cast_output)
    except ValueError as err:
        raise ValueError(f'fp32_function(cast_output=...): {err} Or pass True for the '
                         "dtype of the function's low-precision inputs.") from None


@overload
def fp32_function(fn: F, *, cast_output: CastOutput = ...) -> F: ...


@overload
def fp32_function(fn: None = ..., *, cast_output: CastOutput = ...
                  ) -> Callable[[F], F]: ...


def fp32_function(fn: Optional[Callable[..., Any]] = None, *,
                  cast_output: CastOutput = False) -> Any:
    """Run ``fn`` in float32: low-precision arguments cast, autocast off, on any device.

    For operators without a float16/bfloat16 kernel. Every float16 and bfloat16
    tensor among the arguments (also inside lists, tuples and dicts, as
    :func:`cast_tensor_type` finds them) becomes float32, and ``fn`` runs with
    autocast disabled on the device of the first cast tensor. It works with
    ``torch.autocast`` (native backend) and with a half model (legacy backend,
    no autocast), where ``torch.amp.custom_fwd(cast_inputs=torch.float32)``
    casts only inside autocast and is CUDA-only before torch 2.4. Named like
    :func:`force_fp32` and :func:`keep_fp32`, which do the same for methods
    and modules. Gradients reach the inputs in their own dtype.

    Use it on a function (``fp32_function(torchvision.ops.roi_align)``), on an
    autograd Function's ``apply``, or below ``@staticmethod`` on the ``forward``
    (and ``backward``) of an autograd Function.

    Args:
        fn: The function; None gives a decorator (``@fp32_function(...)``).
        cast_output: False: outputs stay as ``fn`` returns them. True: float32
            outputs go back to the dtype of the first low-precision input (none:
            unchanged). A dtype (``torch.float16``, ``'bf16'``): float32 outputs
            become that dtype. Integer outputs (``nms`` indices) never change.

    Returns:
        The wrapped function (``functools.wraps`` keeps its name), or a
        decorator when ``fn`` is None.

    Raises:
        TypeError: ``fn`` is not callable, is an autograd Function class (wrap
            its ``apply``), an ``nn.Module`` (use :func:`keep_fp32`), a
            staticmethod object, or a generator or async function.
        ValueError: ``cast_output`` is not a bool, float16 or bfloat16.

    Example:
        >>> import torch
        >>> @fp32_function(cast_output=True)
        ... def op(x):
        ...     assert x.dtype == torch.float32
        ...     return x * 2
        >>> op(torch.ones(2, dtype=torch.float16)).dtype
        torch.float16
    """
    out = _out_dtype(cast_output)
    if fn is None:
        return functools.partial(fp32_function, cast_output=cast_output)
    _check_target(fn)

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        output = run_fp32(_PLAN, _call, (fn, *args), kwargs)
        if out is False:
            return output
        low = out if out is not True else _low_dtype((args, kwargs))
        return output if low is None else _cast(output, _FLOAT, low, None)

    _hide_wrapped(wrapper, fn)
    return wrapper


def _hide_wrapped(wrapper: Callable[..., Any], fn: Callable[..., Any]) -> None:
    """Keep ``fn``'s signature but drop ``__wrapped__``, which TorchScript would compile instead."""
    del wrapper.__wrapped__  # type: ignore[attr-defined]
    try:
        wrapper.__signature__ = inspect.signature(fn)  # type: ignore[attr-defined]
    except (TypeError, ValueError):  # a builtin without one: (*args, **kwargs)
        pass
