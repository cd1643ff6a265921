"""The precision doctor: which modules must stay in float32, found by running the model.

:func:`diagnose_precision` runs a copy of the model in float32 (the reference), then
copies in the low-precision dtype, module by module, keeping in float32 each module
that raises, overflows or drifts, until the model runs clean or nothing more can be
done; the last run, with the suggested ``fp32_modules``, is the verification.
"""

from __future__ import annotations

import contextlib
import copy
import math
from collections import abc
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import torch
from torch import nn

from .._torch import autocast, dtypes, models
from ..cast import cast_tensor_type
from ..fp32_modules import Fp32Modules, check_fp32_modules, keep_fp32, match_modules
from ..records import ROOT_NAME
from ..wrap import wrap_fp16_model
from ._findings import Run, flagged, grad_problems, inside, one_line, raised, remedy
from ._report import PrecisionReport
from ._trace import Tracer, finite_number
from .overflow import find_overflow

__all__ = ['DEFAULT_TOLERANCE', 'diagnose_precision', 'form_loss']

#: The largest relative error (L2, against float32) a module's output may have.
DEFAULT_TOLERANCE = 0.05


def _check_args(model: Any, backend: str, tolerance: Any, loss_fn: Any) -> None:
    """Refuse what the doctor cannot run, before anything runs."""
    if not isinstance(model, nn.Module):
        raise TypeError(f'diagnose_precision() examines an nn.Module, got '
                        f'{type(model).__name__}; pass the model (or a factory\'s result).')
    if backend not in ('native', 'legacy'):
        raise ValueError(f"diagnose_precision(backend={backend!r}): use 'native' (autocast) "
                         "or 'legacy' (a half model).")
    if (isinstance(tolerance, bool) or not isinstance(tolerance, (int, float))
            or not math.isfinite(tolerance) or tolerance <= 0):
        raise ValueError(f'diagnose_precision(tolerance={tolerance!r}): a relative error > 0, '
                         f'e.g. {DEFAULT_TOLERANCE}.')
    if loss_fn is not None and not callable(loss_fn):
        raise TypeError(f'diagnose_precision(loss_fn={loss_fn!r}): a function of the '
                        "model's output that returns the loss, or None.")
    if not any(p.is_floating_point() for p in model.parameters()):
        raise ValueError(
            f'diagnose_precision(): {type(model).__name__} has no floating-point parameters, '
            'so low precision has nothing to train and fp32_modules nothing to keep; '
            'pass the model whose weights you train.')


def _device_type(model: nn.Module, inputs: Any) -> str:
    """The device type of the first floating-point input, else of the model."""
    found = next((t for t in _tensors(inputs) if t.is_floating_point()), None)
    if found is not None:
        return found.device.type
    return models.module_device_type(model) or 'cpu'


def _tensors(obj: Any, depth: int = 0) -> Iterator[torch.Tensor]:
    """Every tensor inside nested lists, tuples and dicts."""
    if isinstance(obj, torch.Tensor):
        yield obj
    elif depth < 16 and isinstance(obj, abc.Mapping):
        for value in obj.values():
            yield from _tensors(value, depth + 1)
    elif depth < 16 and isinstance(obj, (list, tuple)):
        for value in obj:
            yield from _tensors(value, depth + 1)


@contextlib.contextmanager
def _seeded(device_type: str, seed: int) -> Iterator[None]:
    """The same random numbers in every run; the caller's generators are left as they were."""
    devices = [torch.cuda.current_device()] if device_type == 'cuda' else []
    with torch.random.fork_rng(devices=devices):
        torch.manual_seed(seed)
        yield


def form_loss(output: Any, loss_fn: Optional[Callable[[Any], Any]]
              ) -> Tuple[Optional[torch.Tensor], str]:
    """The loss to run backward from, or None with the reason.

    ``loss_fn(output)`` when given; a scalar output itself; for a dict (OpenMMLab
    models in train mode) the sum of the means of the entries whose key contains
    ``'loss'`` (a list entry: the sum of its items' means), as mmdet's ``_parse_losses``.
    """
    if loss_fn is not None:
        output = loss_fn(output)
    if isinstance(output, torch.Tensor) and output.is_floating_point() and output.numel() == 1:
        return output.float().sum(), 'ran'
    if isinstance(output, abc.Mapping):
        terms = []
        for key, value in output.items():
            if 'loss' not in str(key):
                continue
            items = value if isinstance(value, (list, tuple)) else [value]
            terms.extend(t.float().mean() for t in items
                         if isinstance(t, torch.Tensor) and t.is_floating_point())
        if terms:
            return torch.stack(terms).sum(), 'ran'
        return None, "not run: the output dict has no entry whose key contains 'loss'"
    return None, ('not run: the output is neither a scalar nor a dict of losses; pass '
                  'loss_fn= to form one')


def _fp16_flags(model: nn.Module, value: bool) -> bool:
    """Set ``fp16_enabled`` on the modules that have it; whether any has."""
    found = False
    for module in model.modules():
        if hasattr(module, 'fp16_enabled'):
            module.fp16_enabled = value
            found = True
    return found


def _reference(model: nn.Module, inputs: tuple, kwargs: dict, loss_fn: Any,
               device_type: str, seed: int) -> Tuple[Tracer, Optional[str]]:
    """The float32 run on a copy: its tracer, and why it failed (None: it did not)."""
    ref = copy.deepcopy(model).float()
    _fp16_flags(ref, False)
    args = cast_tensor_type(cast_tensor_type(inputs, torch.float16, torch.float32),
                            torch.bfloat16, torch.float32)
    kw = cast_tensor_type(cast_tensor_type(kwargs, torch.float16, torch.float32),
                          torch.bfloat16, torch.float32)
    tracer = Tracer().attach(ref)
    try:
        with _seeded(device_type, seed):
            output = ref(*args, **kw)
            if loss_fn is not None:
                loss_fn(output)
    except Exception as err:  # noqa: BLE001 - reported: the model fails in float32
        return tracer, one_line(err)
    finally:
        tracer.detach()
    for (name, _), tensors in tracer.outputs.items():
        if not all(bool(torch.isfinite(t).all()) for _, t in tensors):
            return tracer, (f'{name or ROOT_NAME!r} ({type(ref.get_submodule(name)).__name__})'
                            ' outputs inf or nan in float32 already')
    return tracer, None


def _low_run(model: nn.Module, reference: Tracer, kept: List[str], low: torch.dtype,
             backend: str, inputs: tuple, kwargs: dict, loss_fn: Any, device_type: str,
             seed: int) -> Run:
    """One low-precision run on a fresh copy, ``kept`` in float32, forward then backward."""
    run = Run(list(kept))
    work = copy.deepcopy(model)
    casts_itself = hasattr(work, 'fp16_enabled')  # its @auto_fp16 forward casts its inputs
    if backend == 'legacy':  # as the legacy wrappers and hooks convert the model
        _fp16_flags(work, False)
        wrap_fp16_model(work, dtype=low, backend=backend, fp32_modules=kept or None)
    elif kept:  # as AmpOptimWrapper(fp32_modules=...): autocast, the flags left as given
        keep_fp32(work, kept)
    args, kw = inputs, kwargs
    if backend == 'legacy' and not casts_itself:  # half inputs, as a half model takes
        args = cast_tensor_type(inputs, torch.float32, low)
        kw = cast_tensor_type(kwargs, torch.float32, low)
    enter = (torch.autocast(device_type, dtype=low) if backend == 'native'
             else contextlib.nullcontext())
    tracer = Tracer(reference).attach(work)
    with _seeded(device_type, seed), find_overflow(work, check_outputs=False) as overflow:
        run.overflow = overflow
        try:
            with enter:
                output = work(*args, **kw)
        except Exception as err:  # noqa: BLE001 - the finding: which module raised
            run.error, run.raised_in = err, tracer.raised_in
            return run
        finally:
            tracer.detach()
            run.records = tracer.records
        try:
            with enter:
                loss, run.backward = form_loss(output, loss_fn)
        except Exception as err:  # noqa: BLE001 - reported as the loss's problem
            run.error, run.where, run.backward = err, 'loss', 'not run: the loss failed'
            return run
        if loss is not None:
            try:
                loss.backward()
            except Exception as err:  # noqa: BLE001 - reported, with no module to keep
                run.error, run.where, run.backward = err, 'backward', 'raised'
    return run


def _entries(model: nn.Module, kept: List[str], given: List[Any]) -> List[str]:
    """The ``fp32_modules`` to suggest: the given entries, then the names found (none
    inside another), a class name instead where it names exactly the modules found of
    that class (two or more)."""
    shown = [e.__name__ if isinstance(e, type) else str(e) for e in given]
    covered = set(match_modules(model, given)) if given else set()
    found = [n for n in kept if n not in covered
             and not any(o != n and inside(n, {o}) for o in kept)]
    by_class: Dict[str, List[str]] = {}
    for name in found:
        by_class.setdefault(type(model.get_submodule(name)).__name__, []).append(name)
    for cls, members in by_class.items():
        if len(members) > 1 and match_modules(model, [cls]) == [
                n for n, _ in model.named_modules() if n in members]:
            found = [n for n in found if n not in members] + [cls]
    return shown + found


def diagnose_precision(model: nn.Module, *inputs: Any, dtype: Any = 'float16',
                       backend: str = 'native', loss_fn: Optional[Callable[[Any], Any]] = None,
                       tolerance: float = DEFAULT_TOLERANCE, fp32_modules: Fp32Modules = None,
                       seed: int = 0, **kwargs: Any) -> PrecisionReport:
    """Find the modules that must stay in float32 for ``model`` to run in low precision.

    Runs a copy of the model in float32 (the reference), then copies in ``dtype``
    (``native``: under ``torch.autocast`` on the inputs' device, as
    :class:`~fp16utils.AmpOptimWrapper` runs it; ``legacy``: a half model from
    ``wrap_fp16_model(backend='legacy')``, with half inputs unless the model itself
    has ``fp16_enabled``: its ``@auto_fp16`` forward casts what it declares). Every
    module call is compared with the same call in float32. A module is reported
    when its forward raises (the innermost module entered and not left), when it
    outputs inf or nan from finite inputs, or when it drifts: the relative error of
    its output, ``||low - fp32|| / ||fp32||`` over all its floating-point outputs,
    exceeds ``tolerance`` and is more than 4 times its inputs' (it lost the
    precision itself). Each reported module is kept in float32 and the model run
    again, until a run adds nothing; that last run, forward and backward (a loss
    from ``loss_fn(output)``, a scalar output, or the ``'loss'`` entries of a dict),
    verifies the suggested ``fp32_modules``. The model and the caller's random state
    are left unchanged; every run starts from the same seed.

    Args:
        model: The float32 model (train or eval mode: as given).
        *inputs: Its forward's positional arguments.
        dtype: ``'float16'`` or ``'bfloat16'`` (or the torch dtype).
        backend: ``'native'`` or ``'legacy'``.
        loss_fn: Makes the loss from the output (None: see above).
        tolerance: The largest relative error a module's output may have.
        fp32_modules: Modules already kept in float32 (as ``keep_fp32`` takes them).
        seed: The seed every run starts from (dropout draws the same masks).
        **kwargs: Its forward's keyword arguments.

    Returns:
        A :class:`PrecisionReport`: ``str()`` is the table, the fix and the verdict.

    Raises:
        TypeError: ``model`` is not a module, or ``loss_fn`` not callable.
        ValueError: A bad ``dtype``, ``backend`` or ``tolerance``; a model without
            floating-point parameters; ``dtype`` cannot run on the device.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Scatter(nn.Module):  # adds into a float32 buffer: no mixed dtypes
        ...     def forward(self, x):
        ...         return torch.zeros(2, 4).index_add_(0, torch.arange(2), x)
        >>> model = nn.Sequential(nn.Linear(4, 4), Scatter())
        >>> report = diagnose_precision(model, torch.ones(2, 4), dtype='bfloat16')
        >>> report.fp32_modules, report.verified
        (['1'], True)
    """
    _check_args(model, backend, tolerance, loss_fn)
    low = dtypes.resolve_dtype(dtype)
    given = check_fp32_modules(fp32_modules, 'diagnose_precision(fp32_modules=...)')
    kept = match_modules(model, given, 'diagnose_precision(fp32_modules=...)') if given else []
    device_type = _device_type(model, (inputs, kwargs))
    if backend == 'native' and not autocast.autocast_supports(device_type, low):
        raise ValueError(f'diagnose_precision(): torch.autocast cannot run {low} on '
                         f"{device_type}; try backend='legacy' or the other dtype.")
    report = PrecisionReport(low, backend, float(tolerance))
    reference, failed = _reference(model, inputs, kwargs, loss_fn, device_type, seed)
    if failed is not None:
        report.float32_error, report.verified = failed, False
        return report
    args = (model, reference)
    rest = (low, backend, inputs, kwargs, loss_fn, device_type, seed)
    run = _low_run(*args, kept, *rest)
    report.runs = 1
    _search(report, run, given, lambda kept: _low_run(*args, kept, *rest),
            sum(1 for _ in model.modules()) + 1, model)
    return report


def _search(report: PrecisionReport, run: Run, given: List[Any],
            again: Callable[[List[str]], Run], limit: int, model: nn.Module) -> None:
    """Keep what each run names in float32 and run again, until a run names nothing new."""
    low, kept = report.dtype, list(run.kept)
    seen: Set[Tuple[str, str]] = set()

    def module_type(name: str) -> str:
        return type(model.get_submodule(name)).__name__

    while True:
        found = [raised(run, report.runs)] if run.error is not None else (
            flagged(run, low, report.tolerance, report.runs)
            + grad_problems(run, report.runs))
        add: List[str] = []
        for problem in found:
            problem, entry, why = remedy(problem, run, module_type, low)
            if (problem.name, problem.kind) not in seen:
                seen.add((problem.name, problem.kind))
                report.problems.append(problem)
            if entry is not None and entry not in add:
                add.append(entry)
            if why is not None and why not in report.unfixable:
                report.unfixable.append(why)
        if not add or report.runs >= limit:
            break
        # An entry replaces those inside it (a nested kept module would cast its output
        # back to the half dtype inside the float32 one).
        kept = [k for k in kept if not any(k != a and inside(k, {a}) for a in add)] + add
        run = again(kept)
        report.runs += 1
    if run.kept != kept:  # stopped before running the last additions: verify them
        run = again(kept)
        report.runs += 1
    _verdict(report, run, _entries(model, kept, given))


def _verdict(report: PrecisionReport, run: Run, entries: List[str]) -> None:
    """Fill in the suggestion and what the last run (the verification) showed."""
    report.fp32_modules = entries
    report.backward = run.backward
    errors = [r.error for r in run.records if r.error is not None]
    report.max_error = finite_number(max(errors)) if errors else None
    root = next((r for r in run.records if r.name == ''), None)
    report.output_error = finite_number(root.error) if root is not None else None
    report.verified = (
        run.error is None and not flagged(run, report.dtype, report.tolerance, 0)
        and not grad_problems(run, 0) and (report.output_error or 0.0) <= report.tolerance
        and all(r.outputs_finite for r in run.records if r.reference_finite))
