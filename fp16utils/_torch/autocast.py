"""Entering autocast on one device type, and reading its state, on any torch.

``torch.autocast(device_type=...)`` from torch 1.10, per-device state calls
from torch 2.4, ``torch.cuda.amp.autocast`` (CUDA float16 only) on torch 1.6 -
1.9; without native AMP the contexts do nothing. Which (device, dtype) pairs
autocast accepts is probed once (:func:`autocast_supports`).

Example:
    >>> with autocast_for('cpu', torch.bfloat16):
    ...     autocast_state('cpu')
    (True, torch.bfloat16)
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, ContextManager

import torch

from . import versions as _versions
from .probes import _cached_probe, device_present, known_answer
from .tracing import is_compiling as _is_compiling
from .tracing import is_scripting as _is_scripting
from .tracing import torch_function_mode_active as _torch_function_mode
from .versions import _native_cache, has_native_amp

__all__ = ['any_autocast_enabled', 'autocast_available', 'autocast_for', 'autocast_state',
           'autocast_supports', 'call_autocast']

# Feature flags (what the installed torch has, whatever TORCH_VERSION says). Tests patch them.
_HAS_DEVICE_AUTOCAST = hasattr(torch, 'autocast')  # torch >= 1.10
_HAS_DEVICE_AUTOCAST_STATE = hasattr(torch, 'get_autocast_dtype')  # torch >= 2.4
# torch >= 2.0: one C call answers "autocast on anywhere?" (private, see any_autocast_enabled).
_any_autocast = getattr(torch._C, '_is_any_autocast_enabled', None)
# Bound once: call_autocast's eager path runs per decorated call (the per-device
# functions exist from torch 2.4, the only torch that takes that path).
_is_autocast_enabled = torch.is_autocast_enabled
_get_autocast_dtype = getattr(torch, 'get_autocast_dtype', None)
_set_autocast_enabled = torch.set_autocast_enabled
_set_autocast_dtype = getattr(torch, 'set_autocast_dtype', None)
_increment_nesting = getattr(torch, 'autocast_increment_nesting', None)
_decrement_nesting = getattr(torch, 'autocast_decrement_nesting', None)


def autocast_state(device_type: str) -> tuple[bool, torch.dtype | None]:
    """Tell whether autocast is on for a device type, and in which dtype.

    Works with the per-device API of torch >= 2.4 and with the older
    ``is_autocast_enabled()`` / ``is_autocast_cpu_enabled()`` functions.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ...

    Returns:
        ``(enabled, dtype)``; ``(False, None)`` where torch cannot tell.

    Example:
        >>> with autocast_for('cpu', torch.bfloat16):
        ...     autocast_state('cpu')
        (True, torch.bfloat16)
    """
    if _HAS_DEVICE_AUTOCAST_STATE:  # per-device state calls
        try:
            return (torch.is_autocast_enabled(device_type),
                    torch.get_autocast_dtype(device_type))
        except RuntimeError:  # a device type without autocast ('meta'): never on
            return False, None
    if device_type == 'cuda':
        get_dtype = getattr(torch, 'get_autocast_gpu_dtype', None)
        return (torch.is_autocast_enabled(),
                get_dtype() if get_dtype is not None else torch.float16)
    # One pair of functions per device: is_autocast_cpu_enabled/get_autocast_cpu_dtype, ...
    is_enabled = getattr(torch, f'is_autocast_{device_type}_enabled', None)
    get_dtype = getattr(torch, f'get_autocast_{device_type}_dtype', None)
    if is_enabled is not None and get_dtype is not None:
        return bool(is_enabled()), get_dtype()
    return False, None


def any_autocast_enabled() -> bool:
    """Whether autocast is on for any device type (one C call on current torch).

    The cheap first question of ``@force_fp32``'s flag-off path; dynamo traces it.
    Relies on torch's private ``torch._C._is_any_autocast_enabled`` (torch >=
    2.0); where it is missing, asks :func:`autocast_state` for the CPU and CUDA.

    Example:
        >>> any_autocast_enabled()
        False
        >>> with autocast_for('cpu', torch.bfloat16):
        ...     any_autocast_enabled()
        True
    """
    if _any_autocast is not None:
        return bool(_any_autocast())
    return autocast_state('cpu')[0] or autocast_state('cuda')[0]


def _restore_autocast_state(device_type: str, state: tuple[bool, Any]) -> None:
    """Undo a half-entered autocast (an entry that raised after changing the state)."""
    if autocast_state(device_type) == state or state[1] is None:
        return
    enabled, dtype = state
    if _HAS_DEVICE_AUTOCAST_STATE:
        torch.set_autocast_enabled(device_type, enabled)
        torch.set_autocast_dtype(device_type, dtype)
    elif device_type == 'cuda':
        torch.set_autocast_enabled(enabled)
    else:
        set_enabled = getattr(torch, f'set_autocast_{device_type}_enabled', None)
        set_dtype = getattr(torch, f'set_autocast_{device_type}_dtype', None)
        if set_enabled is not None:
            set_enabled(enabled)
        if set_dtype is not None:
            set_dtype(dtype)


def _context_enabled(ctx: Any) -> bool:
    """Whether a ``torch.autocast`` object kept itself on when it was built.

    Relies on the private ``_enabled`` attribute that ``torch.autocast`` sets
    False (with a warning) for a (device, dtype) pair it does not support; True
    where the attribute is absent (the state read inside the context decides).
    """
    return bool(getattr(ctx, '_enabled', True))


def autocast_supports(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.autocast`` accepts ``dtype`` on the device (tried once).

    torch.autocast itself validates the pair: it warns and turns itself off
    (some versions raise on entry) when the pair is not supported; either
    answer is kept, so the fast path never repeats that work.

    Example:
        >>> autocast_supports('cpu', torch.bfloat16)
        True
    """
    ok = known_answer('autocast', device_type, dtype)  # the per-call fast path
    if ok is not None:
        return ok

    def probe() -> bool:
        if not device_present(device_type):
            return False
        if not _HAS_DEVICE_AUTOCAST:  # only torch.cuda.amp.autocast (float16)
            return device_type == 'cuda' and dtype == torch.float16
        ctx = torch.autocast(device_type=device_type, dtype=dtype)
        if not _context_enabled(ctx):
            return False
        before = autocast_state(device_type)
        try:
            with ctx:
                inside = autocast_state(device_type)
        finally:
            _restore_autocast_state(device_type, before)
        return inside[1] in (None, dtype)
    return _cached_probe('autocast', device_type, dtype, probe)


def autocast_available(device_type: str) -> bool:
    """Whether torch has autocast for this device type at all (tried once).

    ``'meta'`` has none: tensors there are cast by dtype and run without autocast.

    Example:
        >>> autocast_available('cpu'), autocast_available('meta')
        (True, False)
    """
    def probe() -> bool:
        if not _HAS_DEVICE_AUTOCAST:
            return device_type == 'cuda'
        is_available = getattr(torch.amp, 'is_autocast_available', None)  # torch >= 2.4
        if is_available is not None:
            return bool(is_available(device_type))
        torch.autocast(device_type=device_type, enabled=False)  # older torch raises
        return True
    return _cached_probe('autocast-device', device_type, None, probe)


def autocast_for(device_type: str, dtype: torch.dtype | None = None,
                 enabled: bool = True, cache_enabled: bool | None = None
                 ) -> ContextManager[Any]:
    """Return the autocast context for one device type.

    Uses ``torch.autocast(device_type=...)``; on a torch without native AMP it
    returns a no-op context.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ``'mps'``, ``'xpu'``, ``'npu'``, ...
        dtype: The low-precision dtype; None keeps torch's default for the device.
        enabled: False gives a context that disables autocast on that device.
        cache_enabled: ``torch.autocast``'s weight-cast cache inside the context
            (None: torch's default, on). False avoids pytorch#105211 (a weight
            cast under ``no_grad`` reused by a later forward that needs its
            gradient). Ignored by torch < 1.10's CUDA-only autocast.

    Returns:
        A context manager.

    Example:
        >>> with autocast_for('cpu', torch.bfloat16):
        ...     y = torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        >>> y.dtype
        torch.bfloat16
    """
    if not has_native_amp():
        return contextlib.nullcontext()
    if not _HAS_DEVICE_AUTOCAST:  # torch 1.6 - 1.9: CUDA float16 autocast only
        if device_type == 'cuda':
            return torch.cuda.amp.autocast(enabled=enabled)
        return contextlib.nullcontext()
    if device_type not in ('cpu', 'cuda'):
        ok = known_answer('autocast-device', device_type, None)
        if ok is None and not _is_compiling():
            ok = autocast_available(device_type)
        if ok is False:  # a device type without autocast ('meta'): nothing to switch
            return contextlib.nullcontext()
    if dtype is not None:
        ok = known_answer('autocast', device_type, dtype)
        if ok is None and not _is_compiling():  # in a trace, torch.autocast decides
            ok = autocast_supports(device_type, dtype)
        if ok is False:
            # torch.autocast warns for such a pair (older torch raises on entry); off is
            # what it would give, and the dtype of a disabled autocast does not matter.
            return torch.autocast(device_type=device_type, enabled=False)
    extra = {} if cache_enabled is None else {'cache_enabled': cache_enabled}
    if dtype is None:
        return torch.autocast(device_type=device_type, enabled=enabled, **extra)
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled, **extra)


def call_autocast(device_type: str, dtype: torch.dtype | None, enabled: bool,
                  func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``func(*args, **kwargs)`` inside autocast on one device type.

    Equivalent to ``with torch.autocast(device_type, dtype, enabled=enabled):
    func(...)``, with the same state changes on entry and exit (enabled flag,
    dtype, nesting count, cast cache), but without building a context object
    per call. While torch.compile traces, under a torch-function mode (as
    torch.export uses) or when TorchScript compiles, ``torch.autocast`` itself
    is used so those tools see it. On a torch without native AMP the function
    is simply called.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ...
        dtype: The low-precision dtype (None: keep the device's current one).
        enabled: True to turn autocast on, False to turn it off.
        func: What to call.
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        What ``func`` returns.

    Example:
        >>> a = torch.ones(2, 2)
        >>> call_autocast('cpu', torch.bfloat16, True, torch.mm, a, a).dtype
        torch.bfloat16
    """
    if not (_native_cache.get(_versions.TORCH_VERSION) or has_native_amp()):
        return func(*args, **kwargs)
    # torch < 2.4 has no per-device autocast state setters: use the context.
    if (not _HAS_DEVICE_AUTOCAST_STATE or _is_compiling() or _torch_function_mode()
            or _is_scripting()):
        with autocast_for(device_type, dtype, enabled):
            return func(*args, **kwargs)
    try:
        prev_enabled = _is_autocast_enabled(device_type)
        prev_dtype = _get_autocast_dtype(device_type)
    except RuntimeError:  # a device type without autocast ('meta'): nothing to switch
        prev_enabled = None
    if prev_enabled is None:  # (called outside the except: no chained context)
        return func(*args, **kwargs)
    if enabled and not autocast_supports(device_type, dtype or prev_dtype):
        enabled = False
    _set_autocast_enabled(device_type, enabled)
    if dtype is not None:
        _set_autocast_dtype(device_type, dtype)
    _increment_nesting()
    try:
        return func(*args, **kwargs)
    finally:
        if _decrement_nesting() == 0:
            torch.clear_autocast_cache()
        _set_autocast_enabled(device_type, prev_enabled)
        _set_autocast_dtype(device_type, prev_dtype)
