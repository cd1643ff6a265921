"""One forward of the precision doctor, watched module by module.

A :class:`Tracer` puts a forward pre-hook and a forward hook on every module. In
the float32 reference run it keeps a float32 copy of every module call's inputs and
outputs; in a low-precision run it compares each call with the reference call of
the same module and number as it happens, and keeps the stack of the modules whose
forward was entered and not left: when the forward raises, its top is the module
that raised.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any, Dict, List, Optional, Tuple

import torch
from torch import nn

from .._torch import compat
from .overflow import _finite_flags, _iter_tensors

__all__ = ['CallRecord', 'Tracer', 'relative_error']

_Key = Tuple[str, int]  # (module name, call number from 1)
_Tensors = List[Tuple[str, torch.Tensor]]


def relative_error(low: torch.Tensor, ref: torch.Tensor) -> Optional[float]:
    """``||low - ref|| / ||ref||`` (L2 over all entries, in float32); None if shapes differ.

    Both are divided by ``max|ref|`` first, so that float32's range is never exceeded;
    a reference of zeros gives ``||low||`` relative to 1.
    """
    if low.shape != ref.shape:
        return None
    with torch.no_grad():
        a = low.detach().to(torch.float32).reshape(-1)
        b = ref.detach().to(device=a.device, dtype=torch.float32).reshape(-1)
        if b.numel() == 0:
            return 0.0
        scale = b.abs().amax().clamp_min(torch.finfo(torch.float32).tiny)
        diff = torch.linalg.vector_norm((a - b) / scale)
        norm = torch.linalg.vector_norm(b / scale)
        num, den = torch.stack([diff, norm]).tolist()
    if den == 0.0:
        return num
    return num / den


def _max_error(low: _Tensors, ref: Optional[_Tensors]) -> Optional[float]:
    """The largest relative error over the tensors paired by their place (None: none paired)."""
    if not ref:
        return None
    reference = dict(ref)
    errors = [e for path, t in low if path in reference
              for e in [relative_error(t, reference[path])] if e is not None]
    return max(errors) if errors else None


def _float_tensors(obj: Any) -> _Tensors:
    """The floating-point tensors inside ``obj`` with their places (complex left out)."""
    return [(p, t) for p, t in _iter_tensors(obj) if t.is_floating_point()]


@dataclasses.dataclass
class CallRecord:
    """What one call of one module did in a low-precision run."""

    name: str
    call: int
    module_type: str
    inputs_finite: bool = True
    outputs_finite: bool = True
    input_error: Optional[float] = None
    error: Optional[float] = None
    dtype: Optional[torch.dtype] = None
    nonfinite: str = ''
    reference_finite: bool = True
    reference_max: Optional[float] = None


class Tracer:
    """The hooks of one run; ``reference`` is the :class:`Tracer` of the float32 run (or None)."""

    def __init__(self, reference: Optional[Tracer] = None) -> None:
        self.reference = reference
        self.stack: List[Tuple[str, str]] = []  # (name, class) entered and not left
        self.calls: Dict[str, int] = {}
        self.inputs: Dict[_Key, _Tensors] = {}
        self.outputs: Dict[_Key, _Tensors] = {}
        self.records: List[CallRecord] = []
        self._open: Dict[str, List[CallRecord]] = {}
        self._open_calls: Dict[str, List[int]] = {}
        self._handles: List[Any] = []

    def attach(self, model: nn.Module) -> Tracer:
        """Hook every module of ``model`` that takes Python hooks; returns itself."""
        for name, module in model.named_modules():
            if isinstance(module, torch.jit.ScriptModule):
                continue
            self._handles.append(compat.register_forward_pre_hook_with_kwargs(
                module, self._pre_hook(name)))
            self._handles.append(compat.register_forward_hook_with_kwargs(
                module, self._post_hook(name)))
        return self

    def detach(self) -> None:
        """Remove every hook (the model stays as it was)."""
        handles, self._handles = self._handles, []
        for handle in reversed(handles):
            handle.remove()

    def _pre_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any) -> None:
            call = self.calls[name] = self.calls.get(name, 0) + 1
            self.stack.append((name, type(module).__name__))
            self._open_calls.setdefault(name, []).append(call)
            tensors = _float_tensors((args, kwargs or {}))
            if self.reference is None:
                self.inputs[(name, call)] = [(p, t.detach().float().clone()) for p, t in tensors]
                return
            record = CallRecord(name, call, type(module).__name__)
            record.inputs_finite = all(_finite_flags([t for _, t in tensors]))
            record.input_error = _max_error(tensors, self.reference.inputs.get((name, call)))
            self._open.setdefault(name, []).append(record)
        return hook

    def _post_hook(self, name: str) -> Any:
        def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
            while self.stack and self.stack.pop()[0] != name:
                pass  # a child that raised and was caught inside this forward
            opened = self._open_calls.get(name)
            call = opened.pop() if opened else self.calls.get(name, 0)
            tensors = _float_tensors(output)
            if self.reference is None:
                self.outputs[(name, call)] = [(p, t.detach().float().clone())
                                              for p, t in tensors]
                return
            pending = self._open.get(name)
            if not pending:
                return
            record = pending.pop()
            self._finish(record, tensors)
            self.records.append(record)
        return hook

    def _finish(self, record: CallRecord, tensors: _Tensors) -> None:
        """Fill in what the call's outputs say, against the reference call."""
        flags = _finite_flags([t for _, t in tensors])
        record.outputs_finite = all(flags)
        record.dtype = tensors[0][1].dtype if tensors else None
        ref = self.reference.outputs.get((record.name, record.call)) if self.reference else None
        if ref:
            ref_flags = _finite_flags([t for _, t in ref])
            record.reference_finite = all(ref_flags)
            with torch.no_grad():
                peaks = [float(t.abs().amax()) for _, t in ref if t.numel()]
            record.reference_max = max(peaks) if peaks else None
        if not record.outputs_finite:
            bad = [t for (_, t), ok in zip(tensors, flags) if not ok]
            num_inf = sum(int(torch.isinf(t).sum()) for t in bad)
            num_nan = sum(int(torch.isnan(t).sum()) for t in bad)
            total = sum(t.numel() for _, t in tensors)
            parts = [f'{n} {what}' for n, what in ((num_inf, 'inf'), (num_nan, 'nan')) if n]
            record.nonfinite = f'{", ".join(parts)} of {total}'
        elif ref is not None:
            record.error = _max_error(tensors, ref)

    @property
    def raised_in(self) -> Optional[Tuple[str, str]]:
        """(name, class) of the innermost module entered and not left: the one that raised."""
        return self.stack[-1] if self.stack else None


def finite_number(value: Optional[float]) -> Optional[float]:
    """``value`` where it is a finite number, else None (for JSON)."""
    return value if value is not None and math.isfinite(value) else None
