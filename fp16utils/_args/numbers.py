"""Whole numbers as mmcv takes them: an int, or a float with no fraction (``2.0``).

A growth window with a fraction is refused, saying what mmcv would do with it
(``2.5`` grows every 5 clean iterations there).
"""

from __future__ import annotations

import math
import numbers
from fractions import Fraction
from typing import Any, Optional

__all__ = ['as_whole', 'check_window', 'window_note']

#: Beyond this period, a fractional window is said to grow "practically never".
_LONGEST_SHOWN = 10**9


def as_whole(value: Any) -> Optional[int]:
    """``value`` as an int when it is whole (an integral, or a float such as ``2.0``; no bool)."""
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def window_note(value: Any) -> str:
    """What mmcv's ``LossScaler`` would do with a positive window that has a fraction, or ''."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or (
            not math.isfinite(value)) or value <= 0 or as_whole(value) is not None:
        return ''
    # k % w == 0 for a whole k exactly when k is a multiple of w's numerator in lowest terms.
    period = Fraction(float(value)).numerator
    when = (f'every {period} clean iteration{"s" if period > 1 else ""}'
            if period <= _LONGEST_SHOWN else 'practically never')
    return f"; mmcv's LossScaler would grow the scale {when} with it, not every {value!r}"


def check_window(value: Any, owner: str, name: str) -> int:
    """A growth window (``scale_window``, ``growth_interval``) as an int >= 1, else ValueError."""
    whole = as_whole(value)
    if whole is None or whole < 1:
        note = window_note(value)
        advice = '; give the whole number of clean iterations you mean' if note else ''
        raise ValueError(f'{owner}: {name} must be a whole number >= 1 (an int, or a float such '
                         f'as 1000.0), got {value!r}{note}{advice}.')
    return whole
