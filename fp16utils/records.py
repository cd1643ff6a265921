"""The record of one tensor found non-finite (inf or nan), shared by the diagnostics.

Example:
    >>> import torch
    >>> record = NonFiniteRecord(kind='param-grad', name='fc.weight', dtype=torch.float16,
    ...                          shape=(2, 2), max_abs=None, num_inf=1, num_nan=0, numel=4)
    >>> record.has_inf, record.to_dict()['dtype']
    (True, 'float16')
"""

from __future__ import annotations

import dataclasses
from typing import Any, Dict, Optional, Tuple

import torch

__all__ = ['NonFiniteRecord', 'dtype_name']


def dtype_name(dtype: torch.dtype) -> str:
    """``torch.float16`` -> ``'float16'``.

    Example:
        >>> dtype_name(torch.bfloat16)
        'bfloat16'
    """
    return str(dtype).replace('torch.', '')


@dataclasses.dataclass(frozen=True)
class NonFiniteRecord:
    """One tensor that held inf or nan.

    Attributes:
        kind: ``'forward-output'`` (a module's output in the forward pass),
            ``'backward-grad'`` (the gradient with respect to a module's
            output), ``'param-grad'`` (a parameter's ``.grad`` after the
            block), ``'grad'`` or ``'value'`` (from :func:`nonfinite_summary`).
        name: Qualified module or parameter name (``'<root>'`` for the model).
        dtype: The tensor's dtype.
        shape: The tensor's shape.
        max_abs: Largest magnitude among its finite entries; None when no
            entry was finite. Close to 65504 in float16 points at an overflow.
        num_inf: How many entries were +inf or -inf.
        num_nan: How many entries were nan.
        numel: How many entries the tensor had.
        path: Where the tensor sat inside the module's output: ``''`` for the
            output itself, ``'[0]'``, ``"['logits']"``, ``'.field'``.
        module_type: Class name of the module (empty for parameters).
        call: For module records, which call of that module in the block it
            was (1 for the first); 0 otherwise.
        inputs_finite: For forward records, whether every floating-point
            input of that call was finite (False means the values were bad
            before this module ran; an in-place module sees its own output
            as its input); None when not checked.

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
        """A JSON-serialisable dict (dtype as its name, e.g. ``'float16'``).

        Example:
            >>> from fp16utils import nonfinite_summary
            >>> rec = nonfinite_summary([torch.tensor([1.0, float('inf')])])[0]
            >>> rec.to_dict()['dtype'], rec.to_dict()['num_inf']
            ('float32', 1)
        """
        out = dataclasses.asdict(self)
        out['dtype'] = dtype_name(self.dtype)
        out['shape'] = list(self.shape)
        out['has_inf'] = self.has_inf
        out['has_nan'] = self.has_nan
        return out


