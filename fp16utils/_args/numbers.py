"""Whole numbers as mmcv takes them: an int, or a float with no fraction (``2.0``).

mmcv's ``LossScaler`` keeps ``scale_window`` as given and grows the scale when
``(cur_iter - last_overflow_iter) % scale_window == 0``, so ``scale_window=2.0``
works there exactly as ``2`` does, and checkpoints written with it hold the float.
A window with a fraction does not do what it says: with ``2.5`` the remainder is 0
only every 5 iterations (with ``0.1``, whose float is not exactly a tenth,
practically never). Such a value is refused here, with what mmcv would have done.
Standard library only (the config migration uses it without torch).

Example:
    >>> as_whole(2.0), as_whole(3), as_whole(2.5), as_whole(True)
    (2, 3, None, None)
    >>> check_window(1000.0, 'LossScaler', 'scale_window')
    1000
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
    """``value`` as an int when it is a whole number, else None.

    A whole number is an int (or any integral number, such as ``numpy.int64``)
    or a finite real number without a fraction (``2.0``). A bool is not.

    Example:
        >>> as_whole(7.0), as_whole(-1), as_whole(float('inf')), as_whole('3')
        (7, -1, None, None)
    """
    if isinstance(value, bool):
        return None
    if isinstance(value, numbers.Integral):
        return int(value)
    if isinstance(value, numbers.Real) and math.isfinite(value) and float(value).is_integer():
        return int(value)
    return None


def window_note(value: Any) -> str:
    """For a positive window with a fraction: what mmcv's ``LossScaler`` would do with it.

    ``k % w == 0`` holds for a whole ``k`` exactly when ``k`` is a multiple of
    the numerator of ``w`` in lowest terms (floats are binary fractions), so
    that numerator is how often mmcv would grow the scale. Empty otherwise.

    Example:
        >>> window_note(2.5)
        "; mmcv's LossScaler would grow the scale every 5 clean iterations with it, not every 2.5"
        >>> window_note(3)
        ''
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or (
            not math.isfinite(value)) or value <= 0 or as_whole(value) is not None:
        return ''
    period = Fraction(float(value)).numerator
    when = (f'every {period} clean iteration{"s" if period > 1 else ""}'
            if period <= _LONGEST_SHOWN else 'practically never')
    return f"; mmcv's LossScaler would grow the scale {when} with it, not every {value!r}"


def check_window(value: Any, owner: str, name: str) -> int:
    """Return a growth window (``scale_window`` / ``growth_interval``) as an int >= 1, or raise.

    Args:
        value: An int, or a float without a fraction (what mmcv accepts and means).
        owner: Who checks it, for the message.
        name: The argument's name, for the message.

    Returns:
        The window as an int.

    Raises:
        ValueError: Not a whole number >= 1 (the message says what mmcv would
            do with a fractional window).

    Example:
        >>> try:
        ...     check_window(2.5, 'LossScaler', 'scale_window')
        ... except ValueError as err:
        ...     print(str(err)[:54], '...', 'every 5 clean iterations' in str(err))
        LossScaler: scale_window must be a whole number >= 1 ... True
    """
    whole = as_whole(value)
    if whole is None or whole < 1:
        note = window_note(value)
        advice = '; give the whole number of clean iterations you mean' if note else ''
        raise ValueError(f'{owner}: {name} must be a whole number >= 1 (an int, or a float such '
                         f'as 1000.0), got {value!r}{note}{advice}.')
    return whole
