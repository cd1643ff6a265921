"""Overflow diagnostics and the precision doctor.

:func:`find_overflow` watches one forward and backward for the first inf or nan
(:mod:`.overflow`); :func:`diagnose_precision` finds every module that fails,
overflows or drifts in low precision and the ``fp32_modules`` that fix them
(:mod:`.doctor`, its report in :mod:`._report`, the per-module watching in
:mod:`._trace`).
"""

from ..records import NonFiniteRecord, OverflowReport
from ._report import PrecisionProblem, PrecisionReport
from .doctor import diagnose_precision
from .overflow import find_overflow, nonfinite_summary

__all__ = ['NonFiniteRecord', 'OverflowReport', 'PrecisionProblem', 'PrecisionReport',
           'diagnose_precision', 'find_overflow', 'nonfinite_summary']
