"""Where the numbers the scalers take stop working, and the scale arithmetic.

A scale must be at most ``2**127`` and have a finite float32 reciprocal (above about
``2**-128``); ``GradScaler`` takes its growth interval as an int64 and keeps its
tracker in an int32. A dynamic scale moves between :data:`MIN_LOSS_SCALE` and
:data:`MAX_LOSS_SCALE`, in Python floats (mmcv) or in float32 (``GradScaler``).
"""

from __future__ import annotations

import math
import struct
from typing import Any

__all__ = ['F32_RECIPROCAL_LIMIT', 'MAX_GROWTH_INTERVAL', 'MAX_GROWTH_TRACKER', 'MAX_LOSS_SCALE',
           'MAX_SCALE', 'MIN_LOSS_SCALE', 'SCALE_RANGE', 'grad_scaler_bounds_error',
           'grow_scale', 'positive_finite', 'real_number', 'shrink_scale', 'to_float32',
           'usable_scale']

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
    """``value`` rounded to float32 (round to nearest even; inf past the float32 range)."""
    try:
        return struct.unpack('f', struct.pack('f', value))[0]
    except OverflowError:
        return math.copysign(math.inf, value)


def grow_scale(scale: float, factor: float, float32: bool = False) -> float:
    """``scale * factor``, at most :data:`MAX_LOSS_SCALE` (``float32``: as GradScaler grows it)."""
    if not float32:
        return min(scale * factor, MAX_LOSS_SCALE)
    kept = to_float32(scale)
    grown = to_float32(kept * factor)
    return min(grown if math.isfinite(grown) else kept, MAX_LOSS_SCALE)


def shrink_scale(scale: float, backed_off: float, floor: float) -> float:
    """The scale after an overflow: ``backed_off``, not below ``floor``, never above ``scale``."""
    return max(backed_off, min(floor, scale))


def real_number(value: Any) -> Any:
    """``value`` as a Python int or float (numpy scalars, 0-d tensors; not a bool), else None."""
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


def positive_finite(value: Any) -> bool:
    """Whether ``value`` is a finite number > 0 (a numpy scalar too, as mmcv takes it)."""
    number = real_number(value)
    return number is not None and math.isfinite(number) and number > 0


def usable_scale(value: Any) -> bool:
    """Whether ``value`` is a loss scale that works: in range, its float32 reciprocal finite."""
    value = real_number(value)
    if value is None:
        return False
    if not (math.isfinite(value) and 0 < value <= MAX_SCALE):
        return False
    rounded = to_float32(float(value))
    return (rounded > 0 and 1.0 / value < F32_RECIPROCAL_LIMIT
            and 1.0 / rounded < F32_RECIPROCAL_LIMIT)


def grad_scaler_bounds_error(owner: str, interval: Any, tracker: Any = 0) -> str:
    """Why ``GradScaler`` cannot take ``growth_interval`` / ``_growth_tracker``, or ''."""
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
