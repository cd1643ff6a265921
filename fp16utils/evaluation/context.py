"""The context an evaluation runs its forwards in: :func:`eval_precision`, :class:`EvalPrecision`.

Autocast on the model's device (native), or, for a model that ``wrap_fp16_model(...,
backend='legacy')`` made half, its float32 inputs cast to the half dtype with autocast
off; the modules named in ``fp32_modules`` run in float32 while it is open.
"""

from __future__ import annotations

import contextlib
from typing import Any, Iterator, List, Optional, Union

import torch
from torch import nn

from .._torch import autocast, dtypes, models, versions
from ..fp32_modules import Fp32Modules, check_fp32_modules, keep_fp32, kept_fp32, match_modules
from ..optim.contexts import CastIO
from ..precision import auto_dtype, is_auto

__all__ = ['EvalPrecision', 'eval_precision']

_MISSING = object()
_FULL = (torch.float32, torch.float64)


def _low_dtype_of(model: nn.Module) -> Optional[torch.dtype]:
    """The low-precision dtype of the model's parameters outside kept modules, if any."""
    kept = {id(sub) for name in kept_fp32(model)
            for sub in (model.get_submodule(name) if name else model).modules()}
    for module in model.modules():
        if id(module) in kept:
            continue
        for param in module.parameters(recurse=False):
            if param.dtype in dtypes.LOW_PRECISION:
                return param.dtype
    return None


def _default_dtype(device_type: str, where: str) -> torch.dtype:
    """float16 where autocast runs it on the device, else bfloat16 (MMEngine's CPU choice)."""
    for low in dtypes.LOW_PRECISION:
        if autocast.autocast_supports(device_type, low):
            return low
    raise ValueError(
        f'{where}: autocast on {device_type!r} runs neither float16 nor bfloat16 with torch '
        f'{torch.__version__}; evaluate in float32 (no half precision), or convert the model '
        "with wrap_fp16_model(model, backend='legacy') and evaluate it half.")


class EvalPrecision:
    """How an evaluation runs a model's forwards: its dtype, backend and float32 modules.

    Made by :func:`eval_precision`, which checks everything first. :meth:`kept`
    keeps ``fp32_modules`` in float32 while it is open (those that were kept already
    stay kept after it); :meth:`forward` is the context of one forward: autocast
    (``'native'``) or the half model's input and output casts with autocast off
    (``'legacy'``). Entering the object enters both.

    Attributes:
        model: The model (a DataParallel/DDP wrapper is looked through for the names).
        dtype: The dtype the forwards run in (float32/float64: autocast off).
        backend: ``'native'`` or ``'legacy'``.
        fp32_modules: The modules kept in float32 while :meth:`kept` is open.
        device_type: Where autocast is switched (the model's first parameter's device).

    Example:
        >>> import torch
        >>> from torch import nn
        >>> precision = eval_precision(nn.Linear(2, 2), 'bfloat16')
        >>> precision.dtype, precision.backend, precision.device_type
        (torch.bfloat16, 'native', 'cpu')
    """

    def __init__(self, model: nn.Module, dtype: torch.dtype, backend: str,
                 fp32_modules: Fp32Modules, device_type: str) -> None:
        self.model = model
        self.dtype = dtype
        self.backend = backend
        self.fp32_modules = fp32_modules
        self.device_type = device_type
        self._stack: List[contextlib.ExitStack] = []

    def __repr__(self) -> str:
        return (f'EvalPrecision(dtype={self.dtype}, backend={self.backend!r}, '
                f'fp32_modules={self.fp32_modules!r}, device_type={self.device_type!r})')

    @contextlib.contextmanager
    def kept(self) -> Iterator[None]:
        """Keep ``fp32_modules`` in float32 while open; put back the forwards it replaced."""
        inner = models.unwrap_model(self.model)
        if self.fp32_modules is None:
            yield
            return
        already = set(kept_fp32(inner))
        names = [n for n in match_modules(inner, self.fp32_modules, 'fp32_modules')
                 if n not in already]
        saved = [(m, m.__dict__.get('forward', _MISSING))
                 for m in (inner.get_submodule(n) if n else inner for n in names)]
        if names:
            keep_fp32(inner, names)
        try:
            yield
        finally:
            for module, forward in saved:
                if forward is _MISSING:
                    module.__dict__.pop('forward', None)
                else:
                    module.__dict__['forward'] = forward

    def forward(self) -> contextlib.AbstractContextManager:
        """The context of one forward (a new one per call)."""
        if self.backend == 'legacy':
            stack = contextlib.ExitStack()
            stack.enter_context(autocast.autocast_for(self.device_type, enabled=False))
            stack.enter_context(CastIO(self.model, self.dtype))
            return stack
        if self.dtype in _FULL:
            return autocast.autocast_for(self.device_type, enabled=False)
        return autocast.autocast_for(self.device_type, self.dtype)

    def __enter__(self) -> EvalPrecision:
        stack = contextlib.ExitStack()
        stack.enter_context(self.kept())
        stack.enter_context(self.forward())
        self._stack.append(stack)
        return self

    def __exit__(self, *exc: Any) -> Optional[bool]:
        return self._stack.pop().__exit__(*exc)


def eval_precision(model: nn.Module, dtype: Union[torch.dtype, str, None] = None, *,
                   backend: Optional[str] = None,
                   fp32_modules: Fp32Modules = None) -> EvalPrecision:
    """The context to evaluate ``model`` in half precision (checked now, applied on entry).

    A model with half parameters (``wrap_fp16_model(model, backend='legacy')``) has
    its float32 inputs cast to its dtype and its outputs cast back to float32, autocast
    off. Any other model runs under autocast on its device; modules it keeps in
    float32 (``keep_fp32``, ``fp32_modules`` of its optimizer wrapper) and
    ``@force_fp32`` methods still run in float32. A 0.x model prepared with
    ``wrap_fp16_model`` needs no context: its ``@auto_fp16`` methods cast themselves.

    Args:
        model: The model (eval mode is left to the caller).
        dtype: float16, bfloat16, ``'auto'`` (the device's native one), float32 /
            float64 (autocast off), or None: the half model's dtype, else float16
            where autocast runs it on the model's device, else bfloat16.
        backend: ``'native'`` (autocast), ``'legacy'`` (the model is half), or None:
            legacy when the model holds half parameters outside its kept modules.
        fp32_modules: Submodules run in float32 while the context is open, as
            :func:`fp16utils.keep_fp32` takes them; on a half model they must have
            been kept when it was converted.

    Returns:
        An :class:`EvalPrecision`, to be entered (``with``) around the forwards.

    Raises:
        ValueError: autocast on the model's device cannot run ``dtype``; a legacy
            model of another dtype, or a float32 model asked for ``'legacy'``; an
            ``fp32_modules`` entry matching no module, or a half module.
        TypeError: ``model`` is not a module, or an ``fp32_modules`` entry of the
            wrong type.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 2)).eval()
        >>> with torch.no_grad(), eval_precision(model, 'bfloat16', fp32_modules=['1']):
        ...     hidden = model[0](torch.ones(1, 4))
        ...     out = model[1](hidden)
        >>> hidden.dtype, out.dtype
        (torch.bfloat16, torch.float32)
    """
    where = 'eval_precision()'
    if not isinstance(model, nn.Module):
        raise TypeError(f'{where} takes an nn.Module, got {type(model).__name__}.')
    device_type = models.module_device_type(model)
    check_fp32_modules(fp32_modules, f'{where}: fp32_modules')
    inner = models.unwrap_model(model)
    match_modules(inner, fp32_modules, f'{where}: fp32_modules')
    half = _low_dtype_of(inner)
    chosen = versions.resolve_backend(backend) if backend is not None else (
        'legacy' if half is not None else 'native')
    if chosen == 'legacy':
        return EvalPrecision(model, _legacy_dtype(inner, half, dtype, fp32_modules, where),
                             'legacy', fp32_modules, device_type)
    low = _native_dtype(dtype, device_type, where)
    return EvalPrecision(model, low, 'native', fp32_modules, device_type)


def _native_dtype(dtype: Any, device_type: str, where: str) -> torch.dtype:
    if is_auto(dtype):
        low, _ = auto_dtype(device_type)
        return low
    if dtype is None:
        return _default_dtype(device_type, where)
    low = dtypes.resolve_dtype(dtype, full_precision=True)
    if low in dtypes.LOW_PRECISION and not autocast.autocast_supports(device_type, low):
        other = next(d for d in dtypes.LOW_PRECISION if d != low)
        hint = (f"dtype='{dtypes.LOW_NAMES[other]}'"
                if autocast.autocast_supports(device_type, other) else 'float32')
        raise ValueError(
            f'{where}: autocast on {device_type!r} cannot run {dtypes.LOW_NAMES[low]} with '
            f'torch {torch.__version__}; evaluate with {hint}, or convert the model with '
            f"wrap_fp16_model(model, '{dtypes.LOW_NAMES[low]}', backend='legacy') first.")
    return low


def _legacy_dtype(inner: nn.Module, half: Optional[torch.dtype], dtype: Any,
                  fp32_modules: Fp32Modules, where: str) -> torch.dtype:
    if half is None:
        raise ValueError(
            f"{where}: backend='legacy' evaluates a half model, and this one has no half "
            "parameters; convert it first (wrap_fp16_model(model, backend='legacy')) or "
            "use backend='native'.")
    if dtype is not None and not is_auto(dtype) and dtypes.resolve_dtype(
            dtype, full_precision=True) != half:
        raise ValueError(
            f'{where}: the model is {dtypes.LOW_NAMES[half]} (converted by the legacy '
            f'backend), so it evaluates in {dtypes.LOW_NAMES[half]}, not {dtype!r}; drop '
            'dtype, or evaluate a float32 copy of the model.')
    kept = set(kept_fp32(inner))
    loose = [n for n in match_modules(inner, fp32_modules, f'{where}: fp32_modules')
             if n not in kept and _low_dtype_of(inner.get_submodule(n) if n else inner)]
    if loose:
        raise ValueError(
            f'{where}: {loose} hold {dtypes.LOW_NAMES[half]} weights: a half model keeps '
            'modules in float32 when it is converted (wrap_fp16_model(model, '
            "backend='legacy', fp32_modules=[...])), not at evaluation.")
    return half
