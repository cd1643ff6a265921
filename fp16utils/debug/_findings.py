"""What a low-precision run of the precision doctor says: which modules to name, and why.

A run that raised names the innermost module entered and not left; a run that did
not names the innermost modules that made inf or nan from finite inputs, or whose
output drifted from float32 (see :func:`flagged`); a backward that left non-finite
gradients is reported without a module to keep.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import traceback
from typing import Callable, Dict, List, Optional, Set, Tuple

import torch

from .._torch import dtypes
from ..records import ROOT_NAME
from ._report import PrecisionProblem
from ._trace import CallRecord, finite_number
from .overflow import OverflowReport

__all__ = ['GROWTH', 'Run', 'flagged', 'grad_problems', 'inside', 'one_line', 'raised', 'remedy']

#: A module drifts only when its output's error is also this many times its inputs'.
GROWTH = 4.0
#: Words of torch's messages about a dtype mismatch or a missing half kernel.
_DTYPE_WORDS = re.compile(r'Half|BFloat16|float16|bfloat16|scalar type|dtype|same type|'
                          r'should be the same', re.I)


@dataclasses.dataclass
class Run:
    """One low-precision run: what raised, what each module call did, the backward."""

    kept: List[str]
    records: List[CallRecord] = dataclasses.field(default_factory=list)
    error: Optional[BaseException] = None
    raised_in: Optional[Tuple[str, str]] = None
    where: str = 'forward'
    backward: str = 'not run'
    overflow: Optional[OverflowReport] = None


def one_line(err: BaseException) -> str:
    """``Type: message``, the message's first line, at most 200 characters."""
    text = str(err).strip().splitlines()[0] if str(err).strip() else ''
    text = text if len(text) <= 200 else text[:197] + '...'
    return f'{type(err).__name__}: {text}'


def inside(name: str, names: Set[str]) -> bool:
    """Whether the module ``name`` is one of ``names`` or inside one of them."""
    return any(name == n or n == '' or name.startswith(n + '.') for n in names)


def flagged(run: Run, low: torch.dtype, tol: float, number: int) -> List[PrecisionProblem]:
    """The innermost modules that overflowed or drifted in a run that did not raise.

    A module drifts when its output's error exceeds ``tol`` and :data:`GROWTH` times
    the error it was given: its inputs', and for a container its submodules' outputs'.
    Where none does but the model's output exceeds ``tol`` (the error grew over
    several modules), the module with the largest jump (output error over input
    error, its output error above ``tol / GROWTH``) is named.
    """
    found: Dict[str, PrecisionProblem] = {}
    worst: Dict[str, float] = {}
    counts: Dict[str, int] = {}
    hits: Dict[str, List[int]] = {}
    for r in run.records:
        counts[r.name] = counts.get(r.name, 0) + 1
        if r.error is not None:
            worst[r.name] = max(worst.get(r.name, 0.0), r.error)
    for r in run.records:
        if not (r.inputs_finite and r.reference_finite):
            continue
        problem = None
        if not r.outputs_finite:
            problem = _nonfinite(r, low, number)
        else:
            given = max([r.input_error or 0.0] + [e for n, e in worst.items()
                                                   if n != r.name and inside(n, {r.name})])
            if r.error is not None and r.error > tol and r.error > GROWTH * given:
                problem = _drift(r, tol, number, '')
        if problem is not None:
            hits.setdefault(r.name, []).append(r.call)
            found.setdefault(r.name, problem)  # the first failing call describes it
    if not found and worst.get('', 0.0) > tol:
        jumps = [r for r in run.records if r.name and r.error is not None
                 and r.error > tol / GROWTH and r.inputs_finite and r.reference_finite]
        if jumps:
            r = max(jumps, key=lambda c: c.error / max(c.input_error or 0.0, 1e-12))
            hits[r.name] = [r.call]
            found[r.name] = _drift(r, tol, number, f"; the largest jump on the way to the "
                                                   f"model's output error {worst['']:.3g}")
    names = set(found)
    return [_with_calls(p, hits.get(name, []), counts.get(name, 1))
            for name, p in found.items()
            if not any(other != name and inside(other, {name}) for other in names)]


def _with_calls(p: PrecisionProblem, calls: List[int], count: int) -> PrecisionProblem:
    """``p`` saying which calls failed, for a module the forward called more than once."""
    if count <= 1:
        return p
    calls = calls or [1]
    shown = ', '.join(map(str, calls[:8])) + (', ...' if len(calls) > 8 else '')
    which = 'call' if len(calls) == 1 else 'calls'
    return dataclasses.replace(p, calls=tuple(calls), call_count=count,
                               detail=f'{p.detail} ({which} {shown} of {count})')


def _nonfinite(r: CallRecord, low: torch.dtype, number: int) -> PrecisionProblem:
    """The problem of a call that made inf or nan out of finite inputs."""
    peak = '' if r.reference_max is None else f'; largest |float32 output| {r.reference_max:.3g}'
    limit = (' (float16 holds at most 65504)' if low == torch.float16
             and r.reference_max is not None and r.reference_max > 65504 else '')
    return PrecisionProblem(
        r.name or ROOT_NAME, r.module_type, 'nonfinite',
        f'{r.nonfinite} in its {_name(r.dtype)} output from finite inputs{peak}{limit}',
        r.name or None, number, dtype=_name(r.dtype))


def _name(dtype: Optional[torch.dtype]) -> Optional[str]:
    """``torch.float16`` -> ``'float16'``."""
    return None if dtype is None else str(dtype).replace('torch.', '')


def _drift(r: CallRecord, tol: float, number: int, note: str) -> PrecisionProblem:
    """The problem of a call whose output drifted from float32."""
    shown = '0' if not r.input_error else f'{r.input_error:.2g}'
    return PrecisionProblem(
        r.name or ROOT_NAME, r.module_type, 'drift',
        f'relative error {r.error:.3g} (its inputs {shown}), tolerance {tol:g}{note}',
        r.name or None, number, finite_number(r.error), finite_number(r.input_error),
        _name(r.dtype))


def grad_problems(run: Run, number: int) -> List[PrecisionProblem]:
    """What the backward left non-finite (no module to keep: the fix is not automatic)."""
    report = run.overflow
    if report is None or run.backward != 'ran' or (report.backward is None
                                                  and not report.parameters):
        return []
    if not all(r.outputs_finite for r in run.records if r.reference_finite):
        return []  # what the forward's inf or nan leaves: reported there
    names = [p.name for p in report.parameters]
    shown = ', '.join(names[:3]) + (', ...' if len(names) > 3 else '')
    where = report.backward
    detail = (f'{where.problem} in the gradient of its output; ' if where else '') + (
        f'{len(names)} parameter gradient(s) non-finite ({shown})' if names else
        'no parameter gradient non-finite')
    return [PrecisionProblem(where.name if where else '<backward>',
                             where.module_type if where else '', 'grad-nonfinite',
                             detail, None, number)]


def raised(run: Run, number: int) -> PrecisionProblem:
    """The problem of a run that raised: the innermost module entered and not left."""
    err = run.error
    kind = 'dtype-error' if _DTYPE_WORDS.search(str(err)) else 'error'
    if run.where != 'forward':
        name = '<loss_fn>' if run.where == 'loss' else '<backward>'
        return PrecisionProblem(name, '', kind, one_line(err) + source_line(err), None,
                                number)
    name, cls = run.raised_in or ('', '')
    detail = one_line(err) + ('' if name else source_line(err))
    return PrecisionProblem(name or ROOT_NAME, cls, kind, detail, name or None, number)


#: Frames in these folders are torch's or this package's, never the user's op.
_NOT_USER = tuple(os.path.dirname(os.path.abspath(m.__file__)) + os.sep
                  for m in (torch, sys.modules[__name__.split('.')[0]]))


def source_line(err: Optional[BaseException]) -> str:
    """`` (at FILE:LINE: CODE)``: the innermost frame of the user's code that raised, or ''."""
    if err is None:
        return ''
    frames = [f for f in traceback.extract_tb(err.__traceback__)
              if not os.path.abspath(f.filename).startswith(_NOT_USER)]
    if not frames:
        return ''
    frame = frames[-1]
    code = (frame.line or '').strip()
    code = code if len(code) <= 80 else code[:77] + '...'
    return f' (at {os.path.basename(frame.filename)}:{frame.lineno}' + (
        f': {code})' if code else ')')


def remedy(p: PrecisionProblem, run: Run, module_type: Callable[[str], str],
           low: torch.dtype) -> Tuple[PrecisionProblem, Optional[str], Optional[str]]:
    """(the problem as reported, the entry to keep in float32, why nothing can be done).

    A module kept in float32 whose output still overflows (the legacy backend casts it
    back to the half dtype) passes the problem to the module around it.
    """
    if p.kind == 'grad-nonfinite':
        return p, None, None  # no module can be named with confidence: reported only
    entry, shown = p.fp32_entry, dtypes.LOW_NAMES.get(low, str(low))
    if entry is None:
        if p.name in ('<loss_fn>', '<backward>'):
            return p, None, (f'the {p.name[1:-1]} raises in {shown} ({p.detail}) where no '
                             'module can be named; run that op in float32 (@force_fp32 on '
                             'the loss, or the op in a module of its own)')
        return p, None, (f"{p.shown_kind} in the model's own forward, outside any submodule"
                         f"{source_line(run.error)}; run that op in float32: wrap the function "
                         'with fp16utils.fp32_function, put it in a submodule, or decorate '
                         'the method with @force_fp32')
    holder = min((k for k in run.kept if inside(entry, {k})),
                 key=lambda k: k.count('.') + bool(k), default=None)  # the outermost
    if holder is None:
        return p, entry, None
    parent = holder.rpartition('.')[0]
    if p.kind == 'nonfinite' and p.dtype == 'float32':
        return p, None, (f'{p.name!r} makes inf or nan in float32 from finite inputs under '
                         f'{shown}, so keeping it in float32 does not help; look at what '
                         'it computes from the low-precision modules before it')
    if p.kind == 'nonfinite' and parent:
        return dataclasses.replace(
            p, name=parent, module_type=module_type(parent), fp32_entry=parent,
            detail=f'{holder!r} runs in float32, but its output overflows when cast back '
                   f"to {shown} ({p.detail.split(' in its')[0]})"), parent, None
    if p.kind == 'nonfinite':
        return p, None, (f'{holder!r} runs in float32, but its output overflows when cast '
                         f'back to {shown}; scale it down or train in bfloat16')
    return p, None, (f'{p.name} ({p.shown_kind}) with its module in float32: {p.detail}; '
                     'this does not come from low precision')
