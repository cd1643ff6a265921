"""``auto_fp16`` and ``force_fp32``: the 0.x decorators, on any device and dtype.

Both decorators share one argument-casting core (:class:`CastPlan`): the
decorated function's signature is read once, when the decorator is applied,
and each call only walks the arguments that were named.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from fp16utils import auto_fp16, force_fp32
    >>> class Head(nn.Module):
    ...     fp16_enabled = True
    ...     @auto_fp16(apply_to=('x',), dtype=torch.bfloat16)
    ...     def forward(self, x):
    ...         return x * 2
    ...     @force_fp32()
    ...     def loss(self, pred):
    ...         return pred.sum()
    >>> head = Head()
    >>> y = head(torch.ones(2))
    >>> y.dtype, head.loss(y).dtype
    (torch.bfloat16, torch.float32)
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Mapping, Optional, Sequence, TypeVar, Union

import torch
from torch import nn

from ._cast_plan import CastPlan, cast_positional
from ._torch import autocast, dtypes, models, versions
from .cast import _cast, _device_type

__all__ = ['auto_fp16', 'force_fp32']

F = TypeVar('F', bound=Callable[..., Any])

_MISSING = object()
_NO_DICT: dict = {}
_FLOAT = (torch.float32,)
_LOW = (torch.float16, torch.bfloat16)


def _instance_attr(obj: Any, name: str, default: Any) -> Any:
    """Read an attribute without the cost of ``nn.Module.__getattr__`` misses."""
    value = getattr(obj, '__dict__', _NO_DICT).get(name, _MISSING)
    if value is not _MISSING:
        return value
    value = getattr(type(obj), name, _MISSING)
    if value is _MISSING:
        return default
    if hasattr(value, '__get__'):  # a property or other descriptor
        return getattr(obj, name, default)
    return value


#: Device type of a module's first parameter or buffer ('cpu' if none); bound once.
_module_device_type = models.module_device_type


def _check_decorator_args(decorator: str, apply_to: Any, flag_name: str, flag: Any,
                          supported_types: Any) -> tuple:
    """Check the decorator's own arguments; return ``supported_types`` as a tuple."""
    if callable(apply_to) and not isinstance(apply_to, type):
        raise TypeError(
            f'@{decorator} was applied without parentheses (it got '
            f'{getattr(apply_to, "__qualname__", apply_to)!r} as apply_to); write '
            f'@{decorator}() or @{decorator}(apply_to=(...)).')
    if not isinstance(flag, (bool, int)) and flag is not None:
        raise TypeError(f'@{decorator}({flag_name}=...) takes True or False (an int or None '
                        f'is read as its truth value), got {flag!r}.')
    types = supported_types if isinstance(supported_types, tuple) else (supported_types,)
    if not types or not all(isinstance(t, type) for t in types):
        raise TypeError(
            f'@{decorator}(supported_types=...) takes a class or a tuple of classes, '
            f'got {supported_types!r}.')
    return types


def _find_device_type(args: tuple, kwargs: dict, seen: Sequence[str]) -> str:
    """Device type of the first cast tensor, else of any tensor argument, else the module."""
    if seen:
        return seen[0]
    for value in (*args[1:], *kwargs.values()):
        if isinstance(value, torch.Tensor):
            return _device_type(value)
    return _module_device_type(args[0])


def _owner_dtype(owner: Any) -> torch.dtype:
    """The low-precision dtype an instance asks for (``fp16_dtype``, else float16)."""
    value = _instance_attr(owner, 'fp16_dtype', None)
    try:
        return dtypes.resolve_dtype(value)
    except ValueError as err:
        raise ValueError(f'{type(owner).__name__}.fp16_dtype: {err}') from None


def _uses_autocast(module: Any) -> bool:
    flag = _instance_attr(module, '_fp16_autocast', None)
    if flag is None:
        return versions.default_backend() == 'native'
    return bool(flag)


def _check_owner(args: tuple, supported_types: tuple, decorator: str,
                 func: Callable[..., Any]) -> None:
    if not args or not isinstance(args[0], supported_types):
        got = (f'{type(args[0]).__name__} as its first argument' if args
               else 'no arguments')
        names = ', '.join(t.__name__ for t in supported_types)
        raise TypeError(
            f'@{decorator} can only decorate methods of {names}; '
            f'{func.__qualname__} was called with {got}.')


def _switched(func: F, supported_types: tuple, decorator: str,
              run: Callable[[Any, Mapping[str, Any], tuple, dict], Any],
              idle: Optional[Callable[[tuple, dict], Any]] = None) -> F:
    """Wrap ``func`` so that ``run(owner, owner.__dict__, args, kwargs)`` replaces it
    when the owner (the first argument) has a true ``fp16_enabled``; else ``func``
    runs (or ``idle(args, kwargs)``, when given).

    The check is inline, so the disabled path costs next to nothing.
    """

    @functools.wraps(func)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            owner = args[0]
            state = owner.__dict__
            enabled = state.get('fp16_enabled', _MISSING)
        except (IndexError, AttributeError):
            owner = args[0] if args else None
            state = _NO_DICT
            enabled = _MISSING
        if not isinstance(owner, supported_types):
            _check_owner(args, supported_types, decorator, func)
        if enabled is _MISSING:
            enabled = _instance_attr(owner, 'fp16_enabled', False)
        try:
            off = not enabled
        except Exception as err:  # noqa: BLE001 - e.g. a tensor of several values
            raise TypeError(
                f'{type(owner).__name__}.fp16_enabled must be True or False, got '
                f'{enabled!r}, which has no truth value ({err}).') from None
        if off:
            if idle is None:
                return func(*args, **kwargs)
            return idle(args, kwargs)
        return run(owner, state, args, kwargs)

    wrapper._fp16utils_decorated = True  # type: ignore[attr-defined]
    return wrapper  # type: ignore[return-value]


def fp32_plan(func: Callable[..., Any]) -> CastPlan:
    """The cast plan of :func:`run_fp32` for ``func``: every argument after the first.

    Example:
        >>> fp32_plan(lambda self, x: x).all_args
        True
    """
    return CastPlan(func, None, 'force_fp32')


def run_fp32(plan: CastPlan, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Call ``func`` as ``@force_fp32`` does: half arguments to float32, autocast off.

    The core that :func:`force_fp32` and :func:`fp16utils.fp32_modules.keep_fp32` share:
    the float16/bfloat16 arguments ``plan`` names become float32 and, where
    autocast is on for their device, ``func`` runs with it turned off. The
    output is returned as it is.

    Args:
        plan: From :func:`fp32_plan` (or the decorator's own plan).
        func: The function; ``args[0]`` is its owner (``self``).
        args: Positional arguments, the owner first.
        kwargs: Keyword arguments.

    Returns:
        What ``func`` returns.

    Example:
        >>> f = lambda self, x: x
        >>> run_fp32(fp32_plan(f), f, (None, torch.ones(1).half()), {}).dtype
        torch.float32
    """
    if plan.all_args and not kwargs:
        args, device_type = cast_positional(args, _LOW, torch.float32)
    else:
        seen: list = []
        args, kwargs = plan.cast(args, kwargs, _LOW, torch.float32, seen)
        device_type = seen[0] if seen else None
    if device_type is None:
        device_type = _find_device_type(args, kwargs, ())
    if versions.has_native_amp() and autocast.autocast_state(device_type)[0]:
        return autocast.call_autocast(device_type, None, False, func, *args, **kwargs)
    return func(*args, **kwargs)


def undecorated(func: Callable[..., Any]) -> Callable[..., Any]:
    """``func`` without the :func:`auto_fp16` / :func:`force_fp32` layers on top of it.

    Only this package's decorators are peeled off (any other decorator stays).

    Example:
        >>> def f(self, x):
        ...     return x
        >>> undecorated(auto_fp16()(force_fp32()(f))) is f
        True
    """
    while getattr(func, '_fp16utils_decorated', False):
        func = func.__wrapped__  # type: ignore[attr-defined]
    return func


def auto_fp16(apply_to: Optional[Iterable[str]] = None, out_fp32: bool = False,
              supported_types: tuple = (nn.Module,),
              dtype: Union[torch.dtype, str, None] = None) -> Callable[[F], F]:
    """Run a method in low precision when its owner has ``fp16_enabled`` set.

    When the instance (the first argument) has a true ``fp16_enabled``
    attribute, the named float32 arguments (all of them when ``apply_to`` is
    None) are cast to the low-precision dtype and the method runs inside
    ``torch.autocast`` on the device of those tensors (CPU included). Without
    the flag the method runs untouched.

    Args:
        apply_to: Names of the arguments to cast; None casts them all. Names
            are checked against the signature when the decorator is applied.
        out_fp32: Cast low-precision outputs back to float32.
        supported_types: Classes whose methods may be decorated; a call with
            any other first argument is a TypeError.
        dtype: ``torch.float16``, ``torch.bfloat16`` (or their names); None
            means the instance's ``fp16_dtype`` attribute, else float16.

    Returns:
        The decorator.

    Raises:
        ValueError: When ``apply_to`` names an argument the function lacks.
        TypeError: When an argument has the wrong type (``apply_to`` not names,
            ``supported_types`` not classes), the decorator is used without
            parentheses, or it is applied to a staticmethod, classmethod,
            property, generator or async function.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Net(nn.Module):
        ...     def __init__(self):
        ...         super().__init__()
        ...         self.fp16_enabled = True
        ...     @auto_fp16(out_fp32=True)
        ...     def forward(self, x):
        ...         return x
        >>> Net()(torch.ones(1)).dtype
        torch.float32
    """
    supported_types = _check_decorator_args('auto_fp16', apply_to, 'out_fp32', out_fp32,
                                            supported_types)
    fixed_dtype = None if dtype is None else dtypes.resolve_dtype(dtype)

    def decorator(func: F) -> F:
        plan = CastPlan(func, apply_to, 'auto_fp16')
        positional = plan.all_args  # no kwargs in a call: the fast positional cast

        def run(owner: Any, state: Mapping[str, Any], args: tuple, kwargs: dict) -> Any:
            # What wrap_fp16_model records on the instance is read straight from
            # its __dict__; class attributes, properties and names take the long way.
            low = fixed_dtype or state.get('fp16_dtype')
            if low not in _LOW:
                low = _owner_dtype(owner)
            if positional and not kwargs:
                args, device_type = cast_positional(args, _FLOAT, low)
            else:
                seen: list = []
                args, kwargs = plan.cast(args, kwargs, _FLOAT, low, seen)
                device_type = seen[0] if seen else None
            native = state.get('_fp16_autocast')
            if native is None:
                native = _uses_autocast(owner)
            if native:
                if device_type is None:
                    device_type = _find_device_type(args, kwargs, ())
                # Already on in that dtype (a nested call): run as is. The one-call
                # question first: most calls come from outside any autocast.
                if autocast.any_autocast_enabled() and (
                        autocast.autocast_state(device_type) == (True, low)):
                    output = func(*args, **kwargs)
                else:
                    output = autocast.call_autocast(device_type, low, True, func,
                                                  *args, **kwargs)
            else:
                output = func(*args, **kwargs)
            if out_fp32:
                output = _cast(output, (low,), torch.float32, None)
            return output

        return _switched(func, supported_types, 'auto_fp16', run)

    return decorator


def force_fp32(apply_to: Optional[Iterable[str]] = None, out_fp16: bool = False,
               supported_types: tuple = (nn.Module,)) -> Callable[[F], F]:
    """Run a method in float32 when its owner has ``fp16_enabled`` set, or under autocast.

    The mirror image of :func:`auto_fp16`: the named float16 and bfloat16
    arguments become float32 and the method runs with autocast disabled on
    their device. It acts when the owner has a true ``fp16_enabled`` (the 0.x
    style), and also, without the flag, whenever autocast is on for the
    device of the arguments (the 1.x style: a whole forward under
    ``optim_context`` or ``torch.autocast``), so that a loss stays float32
    once a codebase drops its flags. Otherwise the method runs untouched, as
    mmcv's does. Without the flag, ``out_fp16`` casts back to the autocast
    dtype.

    Args:
        apply_to: Names of the arguments to cast; None casts them all.
        out_fp16: Cast float32 outputs back to the low-precision dtype (the
            instance's ``fp16_dtype``, else float16).
        supported_types: Classes whose methods may be decorated.

    Returns:
        A decorator for methods of ``supported_types``.

    Raises:
        ValueError: At decoration, when ``apply_to`` names a missing argument.
        TypeError: At decoration, for arguments of the wrong type, or a
            function it cannot run (see :func:`auto_fp16`).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Head(nn.Module):
        ...     fp16_enabled = True
        ...     @force_fp32(apply_to=('pred',))
        ...     def loss(self, pred, target):
        ...         return (pred - target).abs().mean()
        >>> Head().loss(torch.ones(2).half(), torch.zeros(2)).dtype
        torch.float32
    """
    supported_types = _check_decorator_args('force_fp32', apply_to, 'out_fp16', out_fp16,
                                            supported_types)

    def decorator(func: F) -> F:
        plan = CastPlan(func, apply_to, 'force_fp32')

        def run(owner: Any, state: Mapping[str, Any], args: tuple, kwargs: dict) -> Any:
            output = run_fp32(plan, func, args, kwargs)
            if out_fp16:
                low = _owner_dtype(owner)
                output = _cast(output, _FLOAT, low, None)
            return output

        def idle(args: tuple, kwargs: dict) -> Any:
            # No fp16_enabled flag: float32 all the same where autocast is on for the
            # arguments' device (a 1.x whole-forward autocast), else untouched.
            if not autocast.any_autocast_enabled():
                return func(*args, **kwargs)
            enabled, low = autocast.autocast_state(_find_device_type(args, kwargs, ()))
            if not enabled:
                return func(*args, **kwargs)
            output = run_fp32(plan, func, args, kwargs)
            if out_fp16:
                output = _cast(output, _FLOAT, low if low in _LOW else torch.float16, None)
            return output

        return _switched(func, supported_types, 'force_fp32', run, idle)

    return decorator
