"""``auto_fp16`` and ``force_fp32``: the 0.x decorators, on any device and dtype."""

from __future__ import annotations

import functools
from typing import Any, Callable, Iterable, Optional, Sequence, TypeVar, Union

import torch
from torch import nn

from ._cast_plan import CastPlan, cast_positional
from ._torch import autocast, dtypes, models, versions
from .cast import _cast, _device_type

__all__ = ['auto_fp16', 'force_fp32']

F = TypeVar('F', bound=Callable[..., Any])

_MISSING = object()
_ASK = object()  # a class attribute read on every call (a property, a dtype name)
_NO_DICT: dict = {}
_FLOAT = (torch.float32,)
_LOW = dtypes.LOW_PRECISION

#: Device type of a module's first parameter or buffer ('cpu' if none); bound once.
_module_device_type = models.module_device_type


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


def _owner_error(args: tuple, supported_types: tuple, decorator: str,
                 func: Callable[..., Any]) -> TypeError:
    """The error for a call whose first argument is not of ``supported_types``."""
    got = f'{type(args[0]).__name__} as its first argument' if args else 'no arguments'
    names = ', '.join(t.__name__ for t in supported_types)
    return TypeError(f'@{decorator} can only decorate methods of {names}; '
                     f'{func.__qualname__} was called with {got}.')


def _enabled(owner: Any, flag: Any) -> bool:
    """``bool(flag)`` for an ``fp16_enabled`` that is not a bool; a TypeError naming it."""
    try:
        return bool(flag)
    except Exception as err:  # noqa: BLE001 - e.g. a tensor of several values
        raise TypeError(
            f'{type(owner).__name__}.fp16_enabled must be True or False, got '
            f'{flag!r}, which has no truth value ({err}).') from None


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


def _uses_autocast(owner: Any) -> bool:
    """Whether the owner runs under autocast: ``_fp16_autocast``, else the default backend."""
    flag = _instance_attr(owner, '_fp16_autocast', None)
    if flag is None:
        return versions.default_backend() == 'native'
    return bool(flag)


def _class_settings(cls: type, classes: dict) -> tuple:
    """Keep in ``classes`` and return ``(dtype, _fp16_autocast)`` as ``cls`` gives them."""
    low = getattr(cls, 'fp16_dtype', None)
    low = torch.float16 if low is None else low if low in _LOW else _ASK
    flag = getattr(cls, '_fp16_autocast', None)
    classes[cls] = low, flag if flag is None or flag is True or flag is False else _ASK
    return classes[cls]


def fp32_plan(func: Callable[..., Any]) -> CastPlan:
    """The cast plan of :func:`run_fp32` for ``func``: every argument after the first."""
    return CastPlan(func, None, 'force_fp32')


def run_fp32(plan: CastPlan, func: Callable[..., Any], args: tuple, kwargs: dict) -> Any:
    """Call ``func`` as ``@force_fp32`` does: half arguments to float32, autocast off."""
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
    """``func`` without this package's decorators on top of it (others stay)."""
    while getattr(func, '_fp16utils_decorated', False):
        func = func.__wrapped__  # type: ignore[attr-defined]
    return func


def auto_fp16(apply_to: Optional[Iterable[str]] = None, out_fp32: bool = False,
              supported_types: tuple = (nn.Module,),
              dtype: Union[torch.dtype, str, None] = None) -> Callable[[F], F]:
    """Run a method in low precision when its owner has a true ``fp16_enabled``.

    The named float32 arguments are cast to the low-precision dtype and the
    method runs inside ``torch.autocast`` on their device; without the flag it
    runs untouched.

    Args:
        apply_to: Names of the arguments to cast; None casts them all.
        out_fp32: Cast low-precision outputs back to float32.
        supported_types: Classes whose methods may be decorated; a call with
            any other first argument is a TypeError.
        dtype: ``torch.float16`` or ``torch.bfloat16`` (or their names); None
            means the instance's ``fp16_dtype``, else float16. A class-level
            ``fp16_dtype`` is read at the class's first enabled call; set a later
            change on the instance.

    Returns:
        The decorator.

    Raises:
        ValueError: ``apply_to`` names an argument the function lacks, or
            ``dtype`` is not float16 or bfloat16.
        TypeError: An argument of the wrong type, no parentheses, or a
            function it cannot run (a staticmethod, generator, ...).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Net(nn.Module):
        ...     fp16_enabled = True
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
        classes: dict = {}  # class -> _class_settings(class)

        def run(owner: Any, args: tuple, kwargs: dict) -> Any:
            # What wrap_fp16_model sets on the instance is read on every call. What the
            # class says (a flag set by hand) is kept per class in ``classes`` at its
            # first call: a class attribute reassigned later is not seen. The default
            # backend is asked on every call, so refresh() is honoured.
            state = getattr(owner, '__dict__', _NO_DICT)
            low = fixed_dtype or state.get('fp16_dtype', _MISSING)
            native = state.get('_fp16_autocast', _MISSING)
            if native is _MISSING:
                known = classes.get(type(owner)) or _class_settings(type(owner), classes)
                native = known[1]
                if low is _MISSING:
                    low = known[0]
            if native is None:
                native = versions.default_backend() == 'native'
            elif native is _ASK:
                native = _uses_autocast(owner)
            if low not in _LOW:  # a name, a property, None or a wrong value
                low = _owner_dtype(owner)
            if positional and not kwargs:
                args, device_type = cast_positional(args, _FLOAT, low)
            else:
                seen: list = []
                args, kwargs = plan.cast(args, kwargs, _FLOAT, low, seen)
                device_type = seen[0] if seen else None
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

        # The disabled path stays in this small frame (it costs what mmcv's does).
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                owner = args[0]
            except IndexError:
                raise _owner_error(args, supported_types, 'auto_fp16', func) from None
            if not isinstance(owner, supported_types):
                raise _owner_error(args, supported_types, 'auto_fp16', func)
            flag = getattr(owner, 'fp16_enabled', False)  # as mmcv reads it
            if flag is False or (flag is not True and not _enabled(owner, flag)):
                return func(*args, **kwargs)
            return run(owner, args, kwargs)

        wrapper._fp16utils_decorated = True  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator


def force_fp32(apply_to: Optional[Iterable[str]] = None, out_fp16: bool = False,
               supported_types: tuple = (nn.Module,)) -> Callable[[F], F]:
    """Run a method in float32 when its owner has ``fp16_enabled`` set, or under autocast.

    The named half arguments become float32 and the method runs with autocast
    off. Without the flag it does so only where autocast is on, so that a loss
    stays float32 once a codebase drops its flags.

    Args:
        apply_to: Names of the arguments to cast; None casts them all.
        out_fp16: Cast float32 outputs back to the low-precision dtype (the
            instance's ``fp16_dtype``, else float16; the autocast dtype
            without the flag).
        supported_types: Classes whose methods may be decorated.

    Returns:
        The decorator.

    Raises:
        ValueError: ``apply_to`` names an argument the function lacks.
        TypeError: As for :func:`auto_fp16`.

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

        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                owner = args[0]
            except IndexError:
                raise _owner_error(args, supported_types, 'force_fp32', func) from None
            if not isinstance(owner, supported_types):
                raise _owner_error(args, supported_types, 'force_fp32', func)
            # Read without nn.Module.__getattr__'s costly miss: modules moved to 1.x
            # style have no flag, and their losses call this on every step.
            flag = getattr(owner, '__dict__', _NO_DICT).get('fp16_enabled', _MISSING)
            if flag is _MISSING:
                flag = _instance_attr(owner, 'fp16_enabled', False)
            if flag is True or (flag is not False and _enabled(owner, flag)):
                output = run_fp32(plan, func, args, kwargs)
                return _cast(output, _FLOAT, _owner_dtype(owner), None) if out_fp16 else output
            # No flag: float32 all the same where autocast is on for the arguments'
            # device (a 1.x whole-forward autocast), else untouched.
            if not autocast.any_autocast_enabled():
                return func(*args, **kwargs)
            enabled, low = autocast.autocast_state(_find_device_type(args, kwargs, ()))
            if not enabled:
                return func(*args, **kwargs)
            output = run_fp32(plan, func, args, kwargs)
            if out_fp16:
                output = _cast(output, _FLOAT, low if low in _LOW else torch.float16, None)
            return output

        wrapper._fp16utils_decorated = True  # type: ignore[attr-defined]
        return wrapper  # type: ignore[return-value]

    return decorator
