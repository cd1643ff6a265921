"""What the precision doctor found: the rows (`PrecisionProblem`) and the `PrecisionReport`."""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, List, Optional, Sequence, Tuple

import torch

from ..records import ROOT_NAME, dtype_name

__all__ = ['PrecisionProblem', 'PrecisionReport']

#: What each problem kind is called in the table.
_SHOWN = {'dtype-error': 'dtype error', 'error': 'error', 'nonfinite': 'inf/nan',
          'drift': 'drift', 'grad-nonfinite': 'grad inf/nan', 'backward-error': 'error'}


@dataclasses.dataclass(frozen=True)
class PrecisionProblem:
    """One module that fails, overflows or drifts in low precision.

    Attributes:
        name: The module's qualified name (``'<root>'``: the model's own forward,
            ``'<backward>'``: the backward pass, no module known).
        module_type: The module's class name.
        kind: ``'dtype-error'`` (its forward raised a dtype mismatch or a missing
            half kernel), ``'error'`` (it raised something else only in low
            precision), ``'nonfinite'`` (inf or nan out of finite inputs),
            ``'drift'`` (relative error above the tolerance, and more than 4 times
            its inputs'), ``'grad-nonfinite'`` (the gradient with respect to its
            output held inf or nan) or ``'backward-error'``.
        detail: One line: the error message, the inf/nan counts or the errors.
        fp32_entry: The ``fp32_modules`` entry that keeps it in float32, or None
            where none can (the model's own forward, a backward error).
        found_in_run: Which low-precision run found it (1: the first).
        error: The relative error of its output against float32 (None: not measured).
        input_error: The relative error of its inputs (None: not measured).
        dtype: The dtype of its output (``'float16'``, ...; None: it raised).
        calls: For a module the forward called more than once (a head shared by
            the levels of a feature pyramid): the calls that failed, from 1.
        call_count: How many times the forward called the module.

    Example:
        >>> p = PrecisionProblem('head', 'Linear', 'drift', 'relative error 0.3', 'head')
        >>> p.shown_kind
        'drift'
    """

    name: str
    module_type: str
    kind: str
    detail: str
    fp32_entry: Optional[str] = None
    found_in_run: int = 1
    error: Optional[float] = None
    input_error: Optional[float] = None
    dtype: Optional[str] = None
    calls: Tuple[int, ...] = ()
    call_count: int = 1

    @property
    def shown_kind(self) -> str:
        """The kind as the table shows it (``'inf/nan'``, ``'dtype error'``, ...)."""
        return _SHOWN.get(self.kind, self.kind)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dict."""
        return {**dataclasses.asdict(self), 'calls': list(self.calls)}


@dataclasses.dataclass
class PrecisionReport:
    """What :func:`fp16utils.diagnose_precision` found, and the fix it checked.

    Attributes:
        dtype: The low-precision dtype tried.
        backend: ``'native'`` (autocast) or ``'legacy'`` (a half model).
        tolerance: The largest relative error a module's output may have.
        problems: Every module that failed, overflowed or drifted, in the order
            the runs found them.
        fp32_modules: The suggested ``fp32_modules`` (qualified names; a class
            name where every module of that class is listed).
        verified: Whether the last run, with ``fp32_modules`` in float32, was
            clean: no error, finite outputs and gradients, no module drifting,
            the model's output within the tolerance.
        runs: How many low-precision runs were made (the last one verifies).
        float32_error: Why the float32 reference run failed (None: it passed);
            nothing else is judged then.
        backward: What the backward of the last run did: ``'ran'``, or why not.
        output_error: The relative error of the model's output in the last run.
        max_error: The largest relative error of any module output in the last run.
        unfixable: Why what is left cannot be fixed with ``fp32_modules``.
        notes: What else applying the fix takes (e.g. ``fp16_enabled`` modules
            inside a kept module, for 0.x's ``Fp16OptimizerHook``).

    Example:
        >>> import torch
        >>> report = PrecisionReport(torch.float16, 'native', 0.05)
        >>> report.ok, report.fp32_modules
        (True, [])
    """

    dtype: torch.dtype
    backend: str
    tolerance: float
    problems: List[PrecisionProblem] = dataclasses.field(default_factory=list)
    fp32_modules: List[str] = dataclasses.field(default_factory=list)
    verified: bool = True
    runs: int = 0
    float32_error: Optional[str] = None
    backward: str = 'not run'
    output_error: Optional[float] = None
    max_error: Optional[float] = None
    unfixable: List[str] = dataclasses.field(default_factory=list)
    notes: List[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        """True when the model ran clean in low precision without any module kept in float32."""
        return self.float32_error is None and not self.problems and self.verified

    def config_1x(self) -> str:
        """The 1.x (MMEngine-style) config line that applies :attr:`fp32_modules`."""
        backend = ", backend='legacy'" if self.backend == 'legacy' else ''
        return (f"optim_wrapper = dict(type='AmpOptimWrapper', dtype='{dtype_name(self.dtype)}'"
                f'{backend}, fp32_modules={self.fp32_modules!r}, optimizer=...)')

    def code_0x(self) -> str:
        """The line a 0.x training script adds after building the model."""
        if self.backend == 'legacy':
            return (f"wrap_fp16_model(model, dtype='{dtype_name(self.dtype)}', "
                    f"backend='legacy', fp32_modules={self.fp32_modules!r})")
        return f'keep_fp32(model, {self.fp32_modules!r})'

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dict of everything the report holds."""
        return {
            'ok': self.ok, 'dtype': dtype_name(self.dtype), 'backend': self.backend,
            'tolerance': self.tolerance, 'float32_error': self.float32_error,
            'problems': [p.to_dict() for p in self.problems],
            'fp32_modules': list(self.fp32_modules),
            'config_1x': self.config_1x() if self.fp32_modules else None,
            'code_0x': self.code_0x() if self.fp32_modules else None,
            'verified': self.verified, 'runs': self.runs, 'backward': self.backward,
            'output_error': self.output_error, 'max_error': self.max_error,
            'unfixable': list(self.unfixable), 'notes': list(self.notes),
        }

    def __str__(self) -> str:
        low = dtype_name(self.dtype)
        head = (f'precision doctor: {low}, {self.backend} backend, tolerance '
                f'{self.tolerance:g} (relative error against float32)')
        if self.float32_error is not None:
            return (f'{head}\nthe model fails in float32: {self.float32_error}\nfix that '
                    'first: low precision is judged against a float32 run that works.')
        lines = [head]
        if self.problems:
            lines.extend(_table(('module', 'class', 'problem', 'detail'), [
                (p.name, p.module_type, p.shown_kind, p.detail) for p in self.problems]))
        else:
            lines.append(f'no module fails, overflows or drifts in {low}.')
        lines.extend(self._fix_lines(low))
        return '\n'.join(lines)

    def _fix_lines(self, low: str) -> List[str]:
        """The suggested fix and the verdict of the last run, as lines."""
        lines = []
        if self.fp32_modules:
            lines.append(f'fix: keep these modules in float32: fp32_modules = '
                         f'{self.fp32_modules!r}')
            lines.append(f'  1.x config: {self.config_1x()}')
            lines.append(f'  0.x script: {self.code_0x()}  # after building the model')
        lines.extend(f'note: {note}' for note in self.notes)
        lines.extend(f'cannot fix: {why}' for why in self.unfixable)
        errors = (f'output error {_num(self.output_error)}, largest module error '
                  f'{_num(self.max_error)}')
        kept = ' with these modules in float32' if self.fp32_modules else ''
        if self.verified:
            lines.append(f'verified: the model runs clean in {low}{kept} (forward and '
                         f'backward {self.backward}; {errors}; {self.runs} run(s)).')
        else:
            lines.append(f'not verified: the model does not run clean in {low}{kept} '
                         f'(backward {self.backward}; {errors}; {self.runs} run(s)).')
        return lines


def _num(value: Optional[float]) -> str:
    """A relative error as the table shows it."""
    return '-' if value is None else f'{value:.3g}'


def _table(header: Sequence[str], rows: Sequence[Sequence[str]]) -> List[str]:
    """Left-aligned columns under a dashed rule; the last column is never padded."""
    rows = [header, *rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header) - 1)]
    lines = []
    for i, row in enumerate(rows):
        cells = [c.ljust(w) for c, w in zip(row, widths)] + [row[-1]]
        lines.append('  '.join(cells).rstrip())
        if i == 0:
            lines.append('  '.join(['-' * w for w in widths] + ['-' * len(header[-1])]))
    return lines


def root_shown(name: str) -> str:
    """``''`` (the model in ``named_modules``) as ``'<root>'``."""
    return name or ROOT_NAME
