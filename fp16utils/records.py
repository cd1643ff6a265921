"""The record of one tensor found non-finite (inf or nan), and the report of ``find_overflow``."""

from __future__ import annotations

import dataclasses
import threading
from typing import Any, Dict, List, Optional, Tuple

import torch

__all__ = ['NonFiniteRecord', 'OverflowReport', 'dtype_name']

#: Name shown for the model itself (``''`` in ``named_modules``).
ROOT_NAME = '<root>'

_FP16_MAX = float(torch.finfo(torch.float16).max)


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``'float16'``."""
    return str(dtype).replace('torch.', '')


@dataclasses.dataclass(frozen=True)
class NonFiniteRecord:
    """One tensor that held inf or nan.

    Attributes:
        kind: ``'forward-output'`` (a module's output), ``'backward-grad'`` (the
            gradient with respect to a module's output), ``'param-grad'`` (a
            parameter's ``.grad`` after the block), ``'grad'`` or ``'value'`` (from
            :func:`nonfinite_summary`).
        name: Qualified module or parameter name (``'<root>'`` for the model).
        dtype: The tensor's dtype.
        shape: The tensor's shape.
        max_abs: Largest magnitude among its finite entries (None: none was
            finite); close to 65504 in float16 points at an overflow.
        num_inf: How many entries were +inf or -inf.
        num_nan: How many entries were nan.
        numel: How many entries the tensor had.
        path: Where the tensor sat inside the module's output: ``''``, ``'[0]'``,
            ``"['logits']"``, ``'.field'``.
        module_type: Class name of the module (empty for parameters).
        call: For module records, which call of that module in the block (from 1).
        inputs_finite: For forward records, whether every floating-point input of
            that call was finite (False: the values were bad before it ran).

    Example:
        >>> from fp16utils import nonfinite_summary
        >>> [r.problem for r in nonfinite_summary([torch.tensor([1.0, float('inf')])])]
        ['1 inf of 2']
    """

    kind: str
    name: str
    dtype: torch.dtype
    shape: Tuple[int, ...]
    max_abs: Optional[float]
    num_inf: int
    num_nan: int
    numel: int
    path: str = ''
    module_type: str = ''
    call: int = 0
    inputs_finite: Optional[bool] = None

    @property
    def has_inf(self) -> bool:
        """True when the tensor held at least one inf."""
        return self.num_inf > 0

    @property
    def has_nan(self) -> bool:
        """True when the tensor held at least one nan."""
        return self.num_nan > 0

    @property
    def problem(self) -> str:
        """Short description, e.g. ``'3 inf of 8'`` or ``'2 inf, 1 nan of 8'``."""
        parts = []
        if self.num_inf:
            parts.append(f'{self.num_inf} inf')
        if self.num_nan:
            parts.append(f'{self.num_nan} nan')
        return f'{", ".join(parts) or "non-finite"} of {self.numel}'

    @property
    def where(self) -> str:
        """The name with the output path, e.g. ``"head['logits']"``."""
        return f'{self.name}{self.path}'

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable dict (dtype as its name, e.g. ``'float16'``)."""
        out = dataclasses.asdict(self)
        out['dtype'] = dtype_name(self.dtype)
        out['shape'] = list(self.shape)
        out['has_inf'] = self.has_inf
        out['has_nan'] = self.has_nan
        return out


class OverflowReport:
    """What :func:`fp16utils.find_overflow` saw; filled in while its block runs.

    Attributes:
        forward: The first non-finite module output, in execution order (or None).
        backward: The first non-finite gradient with respect to a module output,
            in backward order (or None).
        parameters: Parameters whose ``.grad`` was non-finite when the block ended.
        checked_outputs: How many module calls had their outputs checked.
        checked_grads: How many output gradients were checked in backward.
        checked_params: How many parameter gradients were checked on exit.
        nonfinite_outputs: How many module calls produced a non-finite output.
        nonfinite_grads: How many output gradients were non-finite.
        unwatched: The TorchScript submodules (they take no hooks): their outputs
            and output gradients were not checked.

    Example:
        >>> report = OverflowReport()
        >>> report.ok, report.first_module
        (True, None)
    """

    def __init__(self) -> None:
        self.forward: Optional[NonFiniteRecord] = None
        self.backward: Optional[NonFiniteRecord] = None
        self.parameters: List[NonFiniteRecord] = []
        self.checked_outputs = 0
        self.checked_grads = 0
        self.checked_params = 0
        self.nonfinite_outputs = 0
        self.nonfinite_grads = 0
        self.unwatched: List[str] = []
        self._lock = threading.Lock()

    @property
    def ok(self) -> bool:
        """True when no non-finite value was found anywhere."""
        return (self.forward is None and self.backward is None and not self.parameters)

    @property
    def first_module(self) -> Optional[str]:
        """The first module whose output (else output gradient) went bad, or None."""
        if self.forward is not None:
            return self.forward.name
        if self.backward is not None:
            return self.backward.name
        return None

    @property
    def records(self) -> List[NonFiniteRecord]:
        """The forward record, the backward record, then the parameter records."""
        return [r for r in (self.forward, self.backward) if r is not None] + list(
            self.parameters)

    def to_dict(self) -> Dict[str, Any]:
        """A JSON-serialisable summary."""
        return {
            'ok': self.ok,
            'first_module': self.first_module,
            'forward': None if self.forward is None else self.forward.to_dict(),
            'backward': None if self.backward is None else self.backward.to_dict(),
            'parameters': [p.to_dict() for p in self.parameters],
            'checked_outputs': self.checked_outputs,
            'checked_grads': self.checked_grads,
            'checked_params': self.checked_params,
            'nonfinite_outputs': self.nonfinite_outputs,
            'nonfinite_grads': self.nonfinite_grads,
            'unwatched': list(self.unwatched),
        }

    def suggest(self) -> Optional[str]:
        """The ``fp32_modules`` entry that would have kept the first bad module in float32.

        Returns:
            Its qualified name (``'*'`` for the model itself), or None when clean.
        """
        first = self.first_module
        if first is None:
            return None
        return '*' if first == ROOT_NAME else first

    def hints(self) -> List[str]:
        """Suggestions that follow from what was found (may be empty)."""
        out = []
        fwd, bwd = self.forward, self.backward
        entry = self.suggest()
        if entry is not None and entry != '*':
            out.append(
                f'to run {entry!r} in float32 under autocast, pass fp32_modules=[{entry!r}] '
                'to AmpOptimWrapper (or wrap_fp16_model, or keep_fp32(model, '
                f'[{entry!r}])).')
        if fwd is not None and fwd.inputs_finite is False:
            out.append(
                f'the inputs of {fwd.where!r} were already non-finite: the values went '
                'bad before it ran, in the data or in code that is not a submodule '
                "(a functional op in the parent's forward).")
        if fwd is not None and fwd.dtype == torch.float16 and fwd.has_inf:
            out.append(
                f'float16 cannot hold magnitudes above {_FP16_MAX:g}; run {fwd.name!r} '
                'in float32 (@force_fp32, or torch.autocast(..., enabled=False) around '
                'it), scale its inputs down, or train in bfloat16.')
        if self.unwatched:
            out.append(f'TorchScript modules take no hooks and were not watched '
                       f'({", ".join(self.unwatched[:5])}): the values may have gone bad '
                       'inside one of them; run the eager model to find the module.')
        if fwd is None and bwd is not None and bwd.dtype == torch.float16:
            out.append(
                'gradients overflowed float16 in backward: with a dynamic loss scale '
                'an occasional overflow is expected (the step is skipped and the scale '
                'lowered); if it happens every step, lower the initial loss scale.')
        return out

    def _unwatched_note(self) -> str:
        shown = ', '.join(self.unwatched[:5]) + (', ...' if len(self.unwatched) > 5 else '')
        return f'; {len(self.unwatched)} TorchScript module(s) not watched: {shown}' * bool(
            self.unwatched)

    def __str__(self) -> str:
        if self.ok:
            return (f'find_overflow: no non-finite values found (checked '
                    f'{self.checked_outputs} module outputs, {self.checked_grads} output '
                    f'gradients, {self.checked_params} parameter gradients)'
                    f'{self._unwatched_note()}')
        first = self.first_module
        title = 'find_overflow: non-finite values found'
        if first is not None:
            kind = 'forward-output' if self.forward is not None else 'backward-grad'
            title += f'; first module: {first!r} ({kind})'
        header = ('where', 'module/parameter', 'dtype', 'shape', 'max |value|', 'problem')
        rows = [header] + [
            (r.kind, r.where, dtype_name(r.dtype), str(tuple(r.shape)),
             '-' if r.max_abs is None else f'{r.max_abs:.4g}', r.problem)
            for r in self.records]
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = [title]
        for i, row in enumerate(rows):
            lines.append('  '.join(c.ljust(w) for c, w in zip(row, widths)).rstrip())
            if i == 0:
                lines.append('  '.join('-' * w for w in widths))
        lines.append(
            f'checked {self.checked_outputs} module calls ({self.nonfinite_outputs} with '
            f'non-finite outputs), {self.checked_grads} output gradients '
            f'({self.nonfinite_grads} non-finite), {self.checked_params} parameter '
            f'gradients ({len(self.parameters)} non-finite); only the first module of '
            f'each kind is listed{self._unwatched_note()}')
        lines.extend(f'hint: {h}' for h in self.hints())
        return '\n'.join(lines)

    def __repr__(self) -> str:
        return (f'OverflowReport(ok={self.ok}, first_module={self.first_module!r}, '
                f'parameters={[p.name for p in self.parameters]})')
