"""The answers a ``torch.compile`` trace reads, decided before any trace runs.

Dynamo cannot trace a capability probe (it enters an autocast and silences
torch's warnings) nor should a trace read the environment, so the decorators'
per-call questions are answered eagerly: the default backend and native AMP
when :mod:`fp16utils._torch` is imported (and by ``refresh()``), autocast per
dtype on the CPU (and on devices whose runtime is already up) at import, and
on a model's device where :func:`fp16utils.wrap_fp16_model`, ``keep_fp32``,
the optimizer wrappers and the hooks are built. A trace that still meets a
pair nobody asked about lets ``torch.autocast`` decide, and keeps nothing.

Example:
    >>> import torch
    >>> from fp16utils._torch import decisions as warm
    >>> warm.warm_device('cpu')
    >>> warm.decided('cpu', torch.bfloat16)
    True
"""

from __future__ import annotations

import torch

from .autocast import autocast_supports
from .dtypes import _LOW_PRECISION
from .probes import known_answer
from .versions import _decide_default, forget, has_native_amp

__all__ = ['decide', 'decided', 'refresh', 'warm_at_import', 'warm_device']

#: Device modules whose runtime, once initialised, is cheap to ask about.
_RUNTIMES = ('cuda', 'xpu', 'mtia')


def decide() -> None:
    """Decide native AMP and the default backend now (the environment is read here).

    An environment that names no backend is kept as the error that
    ``default_backend()`` raises where it is asked.

    Example:
        >>> decide()
    """
    has_native_amp()
    try:
        _decide_default()
    except ValueError:
        pass


def refresh() -> None:
    """Decide again what depends on ``TORCH_VERSION`` and the environment.

    Call it after patching either (``fp16utils._torch.versions.TORCH_VERSION``,
    ``FP16UTILS_BACKEND``); it reads them now (eagerly, so that a
    ``torch.compile`` trace never has to). The capability probes describe the
    installed torch and are kept.

    Example:
        >>> refresh()
    """
    forget()
    decide()


def decided(device_type: str, dtype: torch.dtype) -> bool:
    """Whether autocast's support of ``dtype`` on the device is already known.

    Example:
        >>> decided('cpu', torch.float16)
        True
    """
    return known_answer('autocast', device_type, dtype) is not None


def warm_device(device_type: str) -> None:
    """Probe autocast for float16 and bfloat16 on one device type (once each).

    Entering and leaving an autocast per dtype: microseconds, no kernel runs.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ...

    Example:
        >>> warm_device('cpu')
    """
    for dtype in _LOW_PRECISION:
        autocast_supports(device_type, dtype)


def warm_at_import() -> None:
    """Decide the backend, native AMP and the CPU's autocast support now.

    A device runtime that is already initialised (CUDA after the model was
    moved there, say) is probed too; none is initialised here (a CUDA context
    costs memory and seconds, and a forked worker could not use it).

    Example:
        >>> warm_at_import()
    """
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
