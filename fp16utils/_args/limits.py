"""Where the numbers the scalers take stop working: float32 reciprocals and torch's integers.

A loss scale is used twice: the loss is multiplied by it, and the gradients
by its reciprocal, in float32 (``GradScaler`` keeps the scale as a float32
tensor and unscales by ``float32(1 / scale)``; the legacy backend by
``float32(1 / scale)`` too). A scale whose float32 reciprocal is inf turns every
gradient into inf or nan while the overflow check, run in the same pass, may
still pass, so such a scale cannot work: the smallest scale that works is just
above ``2**-128`` (a float32 denormal), and anything from ``2**-126`` up is
comfortably inside.

``GradScaler`` hands ``growth_interval`` to its update kernel as a C++
``int64`` and keeps its growth tracker in an ``int32`` tensor: a larger
interval fails at the first scale update (after the weights changed), a larger
tracker when it is loaded. mmcv's ``LossScaler`` (the legacy backend) counts in
Python and has neither bound.

Inside those bounds a dynamic scale moves between a floor (:data:`MIN_LOSS_SCALE`)
and a ceiling (:data:`MAX_LOSS_SCALE`): :func:`grow_scale` and :func:`shrink_scale`,
in Python floats as mmcv's ``LossScaler`` computes, or in float32 as ``GradScaler``'s
update kernel does.

Stdlib only (the config migration reads it without torch).

Example:
    >>> usable_scale(512.0), usable_scale(1e-40), usable_scale(2.0 ** -126)
    (True, False, True)
    >>> MAX_GROWTH_INTERVAL == 2 ** 63 - 1
    True
"""

from __future__ import annotations

import math
import struct
from typing import Any

__all__ = ['F32_RECIPROCAL_LIMIT', 'MAX_GROWTH_INTERVAL', 'MAX_GROWTH_TRACKER', 'MAX_LOSS_SCALE',
           'MAX_SCALE', 'MIN_LOSS_SCALE', 'SCALE_RANGE', 'grad_scaler_bounds_error',
           'grow_scale', 'real_number', 'shrink_scale', 'to_float32', 'usable_scale']

#: The largest loss scale (the largest power of two a float32 holds).
MAX_SCALE = 2.0**127
#: No loss scale grows beyond this (:data:`MAX_SCALE`): a float32 loss times a larger
#: scale, or GradScaler's float32 scale tensor, is inf.
MAX_LOSS_SCALE = MAX_SCALE
#: A dynamic loss scale never backs off below this (nor below its initial value),
#: as mmcv's LossScaler never goes below 1.
MIN_LOSS_SCALE = 1.0
#: A double at or above this rounds to inf in float32 (the float32 maximum plus half an ulp).
F32_RECIPROCAL_LIMIT = 2.0**128 - 2.0**103
#: ``GradScaler.update`` passes ``growth_interval`` to torch as a C++ int64.
MAX_GROWTH_INTERVAL = 2**63 - 1
#: ``GradScaler`` keeps its growth tracker in an int32 tensor.
MAX_GROWTH_TRACKER = 2**31 - 1
#: How the messages state the range of a usable scale.
SCALE_RANGE = ('a finite number > 0 and <= 2**127 whose float32 reciprocal is finite (so '
               'above 2**-128, about 2.94e-39)')


def to_float32(value: float) -> float:
    """``value`` rounded to float32 (round to nearest even; inf past the float32 range).

    Example:
        >>> to_float32(0.1) == 0.1, to_float32(1e39)
        (False, inf)
    """
    try:
        return struct.unpack('f', struct.pack('f', value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def grow_scale(scale: float, factor: float, float32: bool = False) -> float:
    """``scale * factor``, never beyond :data:`MAX_LOSS_SCALE`.

    Args:
        scale: The scale now.
        factor: The growth factor.
        float32: Grow as ``GradScaler``'s update kernel grows its float32 scale
            tensor: ``float32(float32(scale) * factor)``, and ``scale`` kept
            where that is inf. False: in Python floats (mmcv's ``LossScaler``).

    Example:
        >>> grow_scale(2.0**127, 2.0) == MAX_LOSS_SCALE, grow_scale(3.0, 1.1, float32=True)
        (True, 3.299999952316284)
    """
    if not float32:
        return min(scale * factor, MAX_LOSS_SCALE)
    kept = to_float32(scale)
    grown = to_float32(kept * factor)
    return min(grown if math.isfinite(grown) else kept, MAX_LOSS_SCALE)


def shrink_scale(scale: float, backed_off: float, floor: float) -> float:
    """The scale after an overflow: ``backed_off``, not below ``floor``, never above ``scale``.

    An overflow never raises the scale: a scale already below the floor stays.

    Example:
        >>> shrink_scale(8.0, 4.0, 1.0), shrink_scale(1.0, 0.5, 1.0), shrink_scale(0.5, 0.25, 1.0)
        (4.0, 1.0, 0.5)
    """
    return max(backed_off, min(floor, scale))


def real_number(value: Any) -> Any:
    """``value`` as a Python int or float when it is a real number, else None.

    Numbers that mmcv's ``LossScaler`` and ``GradScaler`` take as they come
    count too: numpy scalars and 0-d tensors (``.item()``). A bool is not a number.

    Example:
        >>> real_number(2), real_number('2'), real_number(True)
        (2, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, (int, float)):
        return value
    if getattr(value, 'ndim', None) == 0 and callable(getattr(value, 'item', None)):
        try:
            item = value.item()
        except (TypeError, ValueError, RuntimeError):
            return None
        if isinstance(item, (int, float)) and not isinstance(item, bool):
            return item
    return None


def usable_scale(value: Any) -> bool:
    """Whether ``value`` is a loss scale that works: a number (not a bool) in range.

    In range: ``0 < value <= 2**127``, and the float32 reciprocal finite both of
    ``value`` and of ``value`` rounded to float32 (``GradScaler`` rounds the
    scale first, the legacy backend does not). A numpy scalar or a 0-d tensor
    holding such a number is one too (``float()`` takes it).

    Example:
        >>> usable_scale(2.0 ** 127), usable_scale(2.0 ** 128), usable_scale(True)
        (True, False, False)
    """
    value = real_number(value)
    if value is None:
        return False
    if not (math.isfinite(value) and 0 < value <= MAX_SCALE):
        return False
    rounded = to_float32(float(value))
    return (rounded > 0 and 1.0 / value < F32_RECIPROCAL_LIMIT
            and 1.0 / rounded < F32_RECIPROCAL_LIMIT)


def grad_scaler_bounds_error(owner: str, interval: Any, tracker: Any = 0) -> str:
    """Why ``GradScaler`` cannot take ``growth_interval`` / ``_growth_tracker``, or ''.

    Example:
        >>> grad_scaler_bounds_error('example', 2000)
        ''
        >>> 'int64' in grad_scaler_bounds_error('example', 2 ** 64)
        True
    """
    if interval > MAX_GROWTH_INTERVAL:
        return (f'{owner}: growth_interval (scale_window) {interval!r} is larger than '
                f'2**63 - 1 = {MAX_GROWTH_INTERVAL}, which torch.amp.GradScaler passes to its '
                'update kernel as an int64: the first scale update would fail after the '
                'weights changed. Use a smaller interval (a scale that never grows: a static '
                "loss_scale, or mode='static'), or backend='legacy', whose LossScaler counts "
                'in Python.')
    if tracker > MAX_GROWTH_TRACKER:
        return (f'{owner}: the growth tracker {tracker!r} is larger than 2**31 - 1 = '
                f'{MAX_GROWTH_TRACKER}, the most torch.amp.GradScaler keeps (an int32 '
                'tensor). Load this state on the legacy backend, or reset its counters.')
    return ''
