"""The answers a ``torch.compile`` trace reads, decided before any trace runs.

The default backend, native AMP and CPU autocast per dtype are decided at import and
by :func:`refresh`; a model's device where the wrappers, hooks and ``wrap_fp16_model``
are built. A trace that meets an unasked pair lets ``torch.autocast`` decide.
"""

from __future__ import annotations

import torch

from .autocast import autocast_supports
from .dtypes import LOW_PRECISION
from .probes import known_answer
from .versions import _decide_default, forget, has_native_amp

__all__ = ['decide', 'decided', 'refresh', 'warm_at_import', 'warm_device']

#: Device modules whose runtime, once initialised, is cheap to ask about.
_RUNTIMES = ('cuda', 'xpu', 'mtia')


def decide() -> None:
    """Decide native AMP and the default backend (a bad environment raises where it is asked)."""
    has_native_amp()
    try:
        _decide_default()
    except ValueError:
        pass


def refresh() -> None:
    """Decide again what depends on ``versions.TORCH_VERSION`` and the environment (probes kept)."""
    forget()
    decide()


def decided(device_type: str, dtype: torch.dtype) -> bool:
    """Whether autocast's support of ``dtype`` on the device is already known."""
    return known_answer('autocast', device_type, dtype) is not None


def warm_device(device_type: str) -> None:
    """Probe autocast for float16 and bfloat16 on one device type (once each)."""
    for dtype in LOW_PRECISION:
        autocast_supports(device_type, dtype)


def warm_at_import() -> None:
    """Decide the backend and CPU autocast eagerly; probe runtimes already up (start none)."""
    decide()
    warm_device('cpu')
    for name in _RUNTIMES:
        is_initialized = getattr(getattr(torch, name, None), 'is_initialized', None)
        try:
            if is_initialized is not None and is_initialized():
                warm_device(name)
        except Exception:  # noqa: BLE001 - a runtime that cannot say: leave it to first use
            pass


warm_at_import()  # what a torch.compile trace reads is decided before any trace runs
