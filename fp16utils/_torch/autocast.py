"""Entering autocast on one device type and reading its state, on torch 1.13 to the newest.

Which (device, dtype) pairs autocast accepts is probed once (:func:`autocast_supports`);
without native AMP (a simulated old torch) the contexts do nothing.
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

# Feature flag (what the installed torch has, whatever TORCH_VERSION says). Tests patch it.
_HAS_DEVICE_AUTOCAST_STATE = hasattr(torch, 'get_autocast_dtype')  # torch >= 2.4
# torch >= 2.0: one C call answers "autocast on anywhere?" (private, see any_autocast_enabled).
_any_autocast = getattr(torch._C, '_is_any_autocast_enabled', None)
# Bound once: call_autocast's eager path runs per decorated call (the per-device
# functions exist from torch 2.4, the only torch that takes that path).
_is_autocast_enabled = torch.is_autocast_enabled
_get_autocast_dtype = getattr(torch, 'get_autocast_dtype', None)
_set_autocast_enabled = torch.set_autocast_enabled
_set_autocast_dtype = getattr(torch, 'set_autocast_dtype', None)
_increment_nesting = torch.autocast_increment_nesting
_decrement_nesting = torch.autocast_decrement_nesting


def autocast_state(device_type: str) -> tuple[bool, torch.dtype | None]:
    """``(enabled, dtype)`` of autocast on a device type; ``(False, None)`` where unknown."""
    if _HAS_DEVICE_AUTOCAST_STATE:  # per-device state calls
        try:
            return (torch.is_autocast_enabled(device_type),
                    torch.get_autocast_dtype(device_type))
        except RuntimeError:  # a device type without autocast ('meta'): never on
            return False, None
    if device_type == 'cuda':
        return torch.is_autocast_enabled(), torch.get_autocast_gpu_dtype()
    # One pair of functions per device: is_autocast_cpu_enabled/get_autocast_cpu_dtype, ...
    is_enabled = getattr(torch, f'is_autocast_{device_type}_enabled', None)
    get_dtype = getattr(torch, f'get_autocast_{device_type}_dtype', None)
    if is_enabled is not None and get_dtype is not None:
        return bool(is_enabled()), get_dtype()
    return False, None


def any_autocast_enabled() -> bool:
    """Whether autocast is on for any device type (one private C call on torch >= 2.0)."""
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
    """Whether a ``torch.autocast`` kept itself on (private ``_enabled``; off for a bad pair)."""
    return bool(ctx._enabled)


def autocast_supports(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.autocast`` accepts ``dtype`` on the device (tried once, answer kept)."""
    ok = known_answer('autocast', device_type, dtype)  # the per-call fast path
    if ok is not None:
        return ok

    def probe() -> bool:
        if not device_present(device_type):
            return False
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
    """Whether torch has autocast for this device type at all (tried once; ``'meta'`` has none)."""
    def probe() -> bool:
        is_available = getattr(torch.amp, 'is_autocast_available', None)  # torch >= 2.4
        if is_available is not None:
            return bool(is_available(device_type))
        torch.autocast(device_type=device_type, enabled=False)  # raises where there is none
        return True
    return _cached_probe('autocast-device', device_type, None, probe)


def autocast_for(device_type: str, dtype: torch.dtype | None = None,
                 enabled: bool = True, cache_enabled: bool | None = None
                 ) -> ContextManager[Any]:
    """``torch.autocast`` on one device (off for a pair it does not take; no-op without AMP)."""
    if not has_native_amp():
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
            # torch.autocast warns for such a pair (some versions raise on entry); off is
            # what it would give, and the dtype of a disabled autocast does not matter.
            return torch.autocast(device_type=device_type, enabled=False)
    # cache_enabled=False avoids pytorch#105211 (a cast under no_grad reused with grad).
    extra = {} if cache_enabled is None else {'cache_enabled': cache_enabled}
    if dtype is None:
        return torch.autocast(device_type=device_type, enabled=enabled, **extra)
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled, **extra)


def call_autocast(device_type: str, dtype: torch.dtype | None, enabled: bool,
                  func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)`` inside autocast, without a context object on the eager path."""
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
