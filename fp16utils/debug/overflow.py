"""Overflow diagnostics: which module or parameter went non-finite first.

:func:`find_overflow` watches a model for one block (a forward and backward pass);
:func:`nonfinite_summary` describes the tensors that hold inf or nan.
"""

from __future__ import annotations

import contextlib
import warnings
from collections import abc
from typing import Any, Dict, Iterable, Iterator, List, Tuple, Union

import torch
from torch import nn

from .._torch import compat
from ..records import ROOT_NAME, NonFiniteRecord, OverflowReport

__all__ = ['NonFiniteRecord', 'OverflowReport', 'find_overflow', 'nonfinite_summary']

_MAX_DEPTH = 16  # how deep to look inside nested output containers


def _checkable(t: Any) -> bool:
    """A float or complex tensor whose values can be read (meta tensors have none)."""
    return (isinstance(t, torch.Tensor) and (t.is_floating_point() or t.is_complex())
            and t.device.type != 'meta')


def _values(t: torch.Tensor) -> torch.Tensor:
    """A checkable tensor's stored values as a dense tensor ``isfinite`` takes (8-bit: widened)."""
    values = t.detach()
    if values.is_nested:
        parts = [part.reshape(-1) for part in values.unbind()]
        values = torch.cat(parts) if parts else torch.zeros(0, device=t.device)
    elif values.layout == torch.sparse_coo:
        values = values.coalesce().values()
    elif values.layout != torch.strided:
        try:
            values = values.values()  # compressed sparse layouts
        except (RuntimeError, NotImplementedError):
            values = values.to_dense()
    if values.is_floating_point() and values.element_size() == 1:
        values = values.float()
    return values


def _iter_tensors(obj: Any, path: str = '', depth: int = 0
                  ) -> Iterator[Tuple[str, torch.Tensor]]:
    """Yield ``(path, tensor)`` for every float tensor inside ``obj``."""
    if isinstance(obj, torch.Tensor):
        if _checkable(obj):
            yield path, obj
        return
    if depth >= _MAX_DEPTH or isinstance(obj, (str, bytes)):
        return
    if isinstance(obj, abc.Mapping):
        for key, value in obj.items():
            yield from _iter_tensors(value, f'{path}[{key!r}]', depth + 1)
    elif isinstance(obj, tuple) and hasattr(obj, '_fields'):
        for key, value in zip(obj._fields, obj):
            yield from _iter_tensors(value, f'{path}.{key}', depth + 1)
    elif isinstance(obj, (list, tuple)):
        for i, value in enumerate(obj):
            yield from _iter_tensors(value, f'{path}[{i}]', depth + 1)


def _finite_flags(tensors: List[torch.Tensor]) -> List[bool]:
    """Whether each tensor is all-finite, with one device read per device."""
    if not tensors:
        return []
    with torch.no_grad():
        by_device: Dict[torch.device, List[int]] = {}
        for i, t in enumerate(tensors):
            by_device.setdefault(t.device, []).append(i)
        flags = [True] * len(tensors)
        for idx in by_device.values():
            stacked = torch.stack([torch.isfinite(_values(tensors[i])).all() for i in idx])
            for i, flag in zip(idx, stacked.tolist()):
                flags[i] = bool(flag)
    return flags


def _describe_tensor(t: torch.Tensor, **fields: Any) -> NonFiniteRecord:
    """Build the record of a tensor known to hold a non-finite value."""
    with torch.no_grad():
        values = _values(t)
        nested = t.is_nested
        dtype = t.dtype
        shape = tuple(values.shape) if nested else tuple(t.shape)
        numel = values.numel() if nested else t.numel()
        if values.is_complex():  # judged on the real and imaginary parts
            values = torch.view_as_real(values)
        finite = torch.isfinite(values)
        # float32 at least (half has no exact max for every reduction), float64 kept.
        mag = values.abs().to(torch.promote_types(values.dtype, torch.float32))
        # Only called for tensors holding a non-finite value, so numel > 0.
        max_abs = torch.where(finite, mag, torch.zeros_like(mag)).amax()
        num_inf, num_nan, any_finite = torch.stack([
            torch.isinf(values).sum(), torch.isnan(values).sum(),
            finite.any().long()]).tolist()
        top = max_abs.item()
    return NonFiniteRecord(dtype=dtype, shape=shape, numel=numel,
                           max_abs=float(top) if any_finite else None,
                           num_inf=int(num_inf), num_nan=int(num_nan), **fields)


_Named = Union[torch.Tensor, Tuple[str, torch.Tensor]]


def _check_flag(value: Any, owner: str, name: str) -> None:
    if not isinstance(value, bool):
        raise TypeError(f'{owner}({name}=...) takes True or False, got {value!r}.')


def _named_tensors(tensors: Any) -> Iterator[Tuple[str, torch.Tensor]]:
    """``(name, tensor)`` for every tensor that :func:`nonfinite_summary` is given."""
    if isinstance(tensors, nn.Module):
        yield from tensors.named_parameters()
        return
    if isinstance(tensors, torch.Tensor):
        items: Iterable[Any] = [tensors]
    elif isinstance(tensors, abc.Mapping):
        items = ((str(key), value) for key, value in tensors.items())
    elif isinstance(tensors, abc.Iterable) and not isinstance(tensors, (str, bytes)):
        items = tensors
    else:
        raise TypeError(
            'nonfinite_summary() takes a module, a tensor, a mapping of names to tensors '
            f'or an iterable of tensors or (name, tensor) pairs; got '
            f'{type(tensors).__name__}.')
    for i, item in enumerate(items):
        if (isinstance(item, tuple) and len(item) == 2
                and not isinstance(item[0], torch.Tensor)):
            name, value = str(item[0]), item[1]
        else:
            name, value = str(i), item
        if isinstance(value, torch.Tensor):
            yield name, value
        else:  # a container of tensors: named by where they sit in it
            for path, tensor in _iter_tensors(value):
                yield f'{name}{path}', tensor


def nonfinite_summary(tensors: Union[nn.Module, abc.Mapping, Iterable[_Named]], *,
                      grads: bool = False) -> List[NonFiniteRecord]:
    """Describe the tensors (or their gradients) that hold inf or nan.

    Args:
        tensors: A module (its named parameters), one tensor, a mapping of names
            to tensors, an iterable of ``(name, tensor)`` pairs, or of tensors
            (named ``'0'``, ``'1'``, ...); tensors nested in lists, tuples and dicts
            are named by their place (``'0[1]'``). Sparse and nested tensors are
            judged on their stored values; other objects, integer and meta tensors
            are skipped.
        grads: Judge each tensor's ``.grad`` (tensors without one are skipped).

    Returns:
        One :class:`NonFiniteRecord` per non-finite tensor, in input order.

    Raises:
        TypeError: ``tensors`` is none of the above, or ``grads`` is not a bool.

    Example:
        >>> import torch
        >>> bad = nonfinite_summary({'a': torch.ones(2), 'b': torch.tensor([float('nan')])})
        >>> [(r.name, r.num_nan) for r in bad]
        [('b', 1)]
    """
    _check_flag(grads, 'nonfinite_summary', 'grads')
    kind = 'grad' if grads else 'value'
    if isinstance(tensors, nn.Module):
        kind = 'param-grad' if grads else 'value'
    named: List[Tuple[str, torch.Tensor]] = []
    for name, tensor in _named_tensors(tensors):
        if grads:
            tensor = tensor.grad
        if _checkable(tensor):
            named.append((name, tensor))
    flags = _finite_flags([t for _, t in named])
    return [_describe_tensor(t, kind=kind, name=name)
            for (name, t), ok in zip(named, flags) if not ok]


class _Watcher:
    """The hooks of one :func:`find_overflow` block."""

    def __init__(self, report: OverflowReport, check_outputs: bool,
                 check_grads: bool) -> None:
        self.report = report
        self.check_outputs = check_outputs
        self.check_grads = check_grads
        self.handles: List[Any] = []
        self.calls: Dict[str, int] = {}
        self.active = True
        # Set under the report's lock by the hook that records the first
        # forward (backward) event, so concurrent hooks cannot both record.
        self.claimed_forward = False
        self.claimed_backward = False

    def forward_hook(self, name: str, module: nn.Module, args: Any, kwargs: Any,
                     output: Any) -> None:
        if not self.active:
            return
        report = self.report
        with report._lock:
            call = self.calls[name] = self.calls.get(name, 0) + 1
        tensors = list(_iter_tensors(output))
        if self.check_grads and torch.is_grad_enabled():
            for path, t in tensors:
                if t.requires_grad:
                    self.handles.append(t.register_hook(
                        self._grad_hook(name, type(module).__name__, path, call)))
        if not self.check_outputs or not tensors:
            return
        flags = _finite_flags([t for _, t in tensors])
        with report._lock:
            report.checked_outputs += 1
            if all(flags):
                return
            report.nonfinite_outputs += 1
            if self.claimed_forward:
                return
            self.claimed_forward = True
        path, bad = next(pt for pt, ok in zip(tensors, flags) if not ok)
        inputs = [t for _, t in _iter_tensors((args, kwargs or {}))]
        report.forward = _describe_tensor(
            bad, kind='forward-output', name=name, path=path,
            module_type=type(module).__name__, call=call,
            inputs_finite=all(_finite_flags(inputs)))

    def _grad_hook(self, name: str, module_type: str, path: str, call: int) -> Any:
        def hook(grad: torch.Tensor) -> None:
            if not self.active or not _checkable(grad):
                return
            finite = _finite_flags([grad])[0]
            report = self.report
            with report._lock:
                report.checked_grads += 1
                if finite:
                    return
                report.nonfinite_grads += 1
                if self.claimed_backward:
                    return
                self.claimed_backward = True
            report.backward = _describe_tensor(
                grad, kind='backward-grad', name=name, path=path,
                module_type=module_type, call=call)
        return hook

    def attach(self, model: nn.Module) -> None:
        inside_scripted: set = set()
        for qualname, module in model.named_modules():
            name = qualname or ROOT_NAME
            if isinstance(module, torch.jit.ScriptModule):
                # Scripted modules take no Python hooks; their children are scripted too.
                if id(module) not in inside_scripted:
                    self.report.unwatched.append(name)
                    inside_scripted.update(id(m) for m in module.modules())
                continue
            handle = compat.register_forward_hook_with_kwargs(
                module, _bind(self.forward_hook, name))
            self.handles.append(handle)

    def detach(self) -> None:
        self.active = False
        handles, self.handles = self.handles, []
        for handle in handles:
            handle.remove()


def _bind(method: Any, name: str) -> Any:
    def hook(module: nn.Module, args: Any, kwargs: Any, output: Any) -> None:
        method(name, module, args, kwargs, output)
    return hook


@contextlib.contextmanager
def find_overflow(model: nn.Module, *, check_grads: bool = True,
                  check_outputs: bool = True) -> Iterator[OverflowReport]:
    """Find the first module and the parameters that produce inf or nan.

    Inside the block every submodule's outputs (inside tuples, lists, dicts and
    namedtuples too) are checked, and so is the gradient with respect to each output
    in backward (tensor hooks: a full backward hook fails under a later in-place op);
    on exit every hook is removed, also when the block raises, and the parameters
    with a non-finite ``.grad`` are listed. A debugging tool: each checked tensor
    costs a device sync. Run it on the eager model, for the step that goes wrong,
    with gradients zeroed beforehand.

    Args:
        model: The model to watch (all of ``model.named_modules()``).
        check_grads: Check output gradients in backward and parameter gradients on exit.
        check_outputs: Check module outputs in forward.

    Yields:
        An :class:`OverflowReport`, filled in as the block runs.

    Raises:
        TypeError: ``model`` is not an ``nn.Module``, or a flag is not a bool.

    Warns:
        UserWarning: Naming the TorchScript submodules, which take no hooks
            (``report.unwatched`` lists them).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Blowup(nn.Module):
        ...     def forward(self, x):
        ...         return x / 0
        >>> model = nn.Sequential(nn.Linear(2, 2), Blowup(), nn.Linear(2, 1))
        >>> with find_overflow(model) as report:
        ...     model(torch.ones(1, 2)).sum().backward()
        >>> report.first_module, report.ok
        ('1', False)
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f'find_overflow() watches an nn.Module, got {type(model).__name__}; pass '
            'the model (or the submodule) whose forward and backward you run in the '
            'block.')
    _check_flag(check_grads, 'find_overflow', 'check_grads')
    _check_flag(check_outputs, 'find_overflow', 'check_outputs')
    report = OverflowReport()
    watcher = _Watcher(report, check_outputs, check_grads)
    raised = True
    try:
        watcher.attach(model)
        if report.unwatched:
            warnings.warn(
                f'find_overflow() cannot watch TorchScript modules (they take no Python '
                f'hooks): {", ".join(report.unwatched)}; their outputs and output '
                'gradients are not checked. Run the eager model to find the module.',
                UserWarning, stacklevel=3)
        yield report
        raised = False
    finally:
        watcher.detach()
        if check_grads:
            try:
                report.checked_params = sum(
                    p.grad is not None for p in model.parameters())
                report.parameters = nonfinite_summary(model, grads=True)
            except Exception:
                if not raised:
                    raise
                # Never hide the exception that is already propagating.

