"""The once-per-process probe cache (never filled inside a dynamo trace); devices present."""

from __future__ import annotations

import warnings
from typing import Any, Callable, Optional

import torch

from .state import dispatch_mode_active as _dispatch_mode_active
from .tracing import is_compiling as _is_compiling

__all__ = ['device_present']

_disable_current_modes = getattr(torch.utils._python_dispatch, '_disable_current_modes', None)

#: (kind, device type, dtype or class) -> what the probe answered. Tests fill it in.
_probe_cache: dict[tuple[str, str, Any], bool] = {}


def known_answer(kind: str, device_type: str, dtype: Any) -> Optional[bool]:
    """What the probe of this key answered, or None when it has not run."""
    # The only reader: torch 2.4's dynamo fails when a trace reaches one dict via two modules.
    return _probe_cache.get((kind, device_type, dtype))


def _run_probe(probe: Callable[[], bool]) -> bool:
    """``probe()``, warnings silenced; an exception means False."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        try:
            return bool(probe())
        except Exception:  # noqa: BLE001 - whatever torch raises means "cannot"
            return False


def _cached_probe(kind: str, device_type: str, dtype: Any,
                  probe: Callable[[], bool]) -> bool:
    """``probe()`` once per key, never inside a trace; under a dispatch mode, on real tensors."""
    key = (kind, device_type, dtype)
    ok = _probe_cache.get(key)
    if ok is None:
        if _is_compiling():  # never probe inside a trace: "cannot", and nothing kept
            return False
        if _dispatch_mode_active():
            if _disable_current_modes is None:  # cannot step outside: nothing kept
                return False
            with _disable_current_modes():
                ok = _run_probe(probe)
        else:
            ok = _run_probe(probe)
        _probe_cache[key] = ok
    return ok


def device_present(device_type: str) -> bool:
    """Whether a device of this type is usable here (``'cpu'`` always is)."""
    if device_type in ('cpu', 'meta'):
        return True
    if device_type == 'cuda':
        return torch.cuda.is_available()
    if device_type == 'mps':
        return torch.backends.mps.is_available()
    module = getattr(torch, device_type, None)
    is_available = getattr(module, 'is_available', None)
    if is_available is None:
        return False
    try:
        return bool(is_available())
    except Exception:  # noqa: BLE001
        return False
