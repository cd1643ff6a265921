"""Turn a float32 model into a mixed-precision one: flags, half weights, float32 norms."""

from __future__ import annotations

from typing import Any, Callable, List, Optional, Tuple, Union

import torch
from torch import nn

from ._torch import caps, dtypes, models
from ._torch.models import BatchNormBase as _BatchNorm
from .cast import _cast
from .fp32_modules import Fp32Modules, keep_named, kept_fp32, match_modules

__all__ = ['patch_forward_method', 'patch_norm_fp32', 'wrap_fp16_model']


class _PatchedForward:
    """A forward that casts its arguments (and output); picklable, deep-copied with its module."""

    def __init__(self, func: Callable[..., Any], src_type: torch.dtype,
                 dst_type: torch.dtype, convert_output: bool) -> None:
        owner = getattr(func, '__self__', None)
        if isinstance(owner, nn.Module):
            self.owner: Optional[nn.Module] = owner
            self.func: Callable[..., Any] = func.__func__  # type: ignore[attr-defined]
        else:
            self.owner = None
            self.func = func
        self.src_type = src_type
        self.dst_type = dst_type
        self.convert_output = convert_output

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        src, dst = (self.src_type,), self.dst_type
        args = _cast(args, src, dst, None)
        kwargs = _cast(kwargs, src, dst, None)
        if self.owner is None:
            output = self.func(*args, **kwargs)
        else:
            output = self.func(self.owner, *args, **kwargs)
        if self.convert_output:
            output = _cast(output, (dst,), self.src_type, None)
        return output

    def __repr__(self) -> str:
        return (f'patched_forward({getattr(self.func, "__qualname__", self.func)}, '
                f'{self.src_type} -> {self.dst_type})')


def patch_forward_method(func: Callable[..., Any], src_type: torch.dtype,
                         dst_type: torch.dtype,
                         convert_output: bool = True) -> Callable[..., Any]:
    """Wrap a forward so that its ``src_type`` inputs become ``dst_type``.

    Args:
        func: The original forward (usually a bound ``module.forward``).
        src_type: Dtype of the input tensors to convert.
        dst_type: Dtype to convert them to.
        convert_output: Convert ``dst_type`` outputs back to ``src_type``.

    Returns:
        The patched forward (it survives ``copy.deepcopy`` and pickling).

    Raises:
        TypeError: ``func`` is not callable, or a dtype not a float dtype.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> gn = nn.GroupNorm(1, 2)
        >>> gn.forward = patch_forward_method(gn.forward, torch.half, torch.float)
        >>> gn(torch.ones(1, 2, 3).half()).dtype
        torch.float16
    """
    if not callable(func):
        raise TypeError(f'patch_forward_method() takes a callable forward, got {func!r}.')
    for name, value in (('src_type', src_type), ('dst_type', dst_type)):
        if not (isinstance(value, torch.dtype) and value.is_floating_point):
            raise TypeError(
                f'patch_forward_method() takes floating-point torch dtypes, got '
                f'{name}={value!r}; pass e.g. torch.float16 and torch.float32.')
    return _PatchedForward(func, src_type, dst_type, convert_output)


def patch_norm_fp32(module: nn.Module, dtype: Union[torch.dtype, str] = torch.float16
                    ) -> nn.Module:
    """Put the BatchNorm and GroupNorm layers of a low-precision model back in float32.

    GroupNorm's forward also converts ``dtype`` inputs to float32 and its
    output back. Applying it twice is harmless.

    Args:
        module: The (half) model.
        dtype: The model's low-precision dtype (float16 or bfloat16).

    Returns:
        ``module`` itself.

    Raises:
        TypeError: ``module`` is not a module, or holds TorchScript norms.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> m = patch_norm_fp32(nn.Sequential(nn.GroupNorm(1, 2)).half())
        >>> m[0].weight.dtype
        torch.float32
    """
    if not isinstance(module, nn.Module):
        raise TypeError(f'patch_norm_fp32() takes an nn.Module, got {type(module).__name__}.')
    low = dtypes.resolve_dtype(dtype)
    _refuse_scripted(module, 'patch_norm_fp32()')
    _patch_norms(module, low)
    return module


def _norm_names() -> set:
    """Class names of the norms kept in float32 (what a scripted copy calls itself)."""
    names, todo = {'GroupNorm'}, [_BatchNorm]
    while todo:
        cls = todo.pop()
        names.add(cls.__name__)
        todo.extend(cls.__subclasses__())
    return names


def _refuse_scripted(model: nn.Module, what: str) -> None:
    """Refuse a model with a scripted norm (it can neither go float32 nor take a forward)."""
    norms = _norm_names()
    scripted = next((name or '<root>' for name, m in model.named_modules()
                     if isinstance(m, torch.jit.ScriptModule)
                     and getattr(m, 'original_name', None) in norms), None)
    if scripted is not None:
        raise TypeError(
            f'{what} cannot keep the TorchScript norm {scripted!r} in float32 (a '
            'scripted module takes no patched forward); nothing was changed. Convert '
            "the model before scripting it, or use backend='native', which only sets "
            'flags.')


def _patch_norms(module: nn.Module, low: torch.dtype) -> None:
    """:func:`patch_norm_fp32` without its checks."""
    if isinstance(module, (_BatchNorm, nn.GroupNorm)):
        module.float()
        if isinstance(module, nn.GroupNorm):
            patched = module.__dict__.get('forward')
            if isinstance(patched, _PatchedForward):
                patched.src_type = low  # patched again for another dtype
            else:
                module.forward = patch_forward_method(module.forward, low, torch.float32)
    for child in module.children():
        _patch_norms(child, low)


def wrap_fp16_model(model: nn.Module, dtype: Union[torch.dtype, str, None] = None,
                    backend: Optional[str] = None,
                    fp32_modules: Fp32Modules = None) -> nn.Module:
    """Prepare a float32 model for mixed-precision training.

    Sets ``fp16_enabled = True`` on every submodule that has the attribute;
    the legacy backend first converts the model to ``dtype`` and its norms
    back to float32 (:func:`patch_norm_fp32`). Modules kept in float32
    (``fp32_modules``, or :func:`keep_fp32` before) are left out of both: their
    float32 values stay bit for bit and their flags stay off.

    Args:
        model: A float32 model.
        dtype: float16 (default) or bfloat16, recorded as ``fp16_dtype`` on
            the flagged modules (one that has an ``fp16_dtype`` keeps it unless
            ``dtype`` is given).
        backend: ``'native'``, ``'legacy'`` or None: native, unless autocast
            cannot run ``dtype`` (or the model's norms in it) on the model's
            device.
        fp32_modules: Modules to run in float32 (see :func:`keep_fp32`).

    Returns:
        ``model`` itself, modified in place.

    Raises:
        ValueError: torch cannot run ``dtype`` (on ``backend``) on the model's
            device, or an ``fp32_modules`` entry matches no module.
        TypeError: ``model`` is not a module, or the legacy backend meets
            TorchScript norms.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> class Net(nn.Linear):
        ...     fp16_enabled = False
        >>> wrap_fp16_model(Net(2, 2), dtype=torch.bfloat16).fp16_enabled
        True
    """
    if not isinstance(model, nn.Module):
        raise TypeError(
            f'wrap_fp16_model() takes an nn.Module, got {type(model).__name__}.')
    low = dtypes.resolve_dtype(dtype)
    # None falls back to 'legacy' where autocast cannot run low (or this model's norms) there.
    backend = caps.backend_for(backend, models.module_device_type(model), low, model)
    names = match_modules(model, fp32_modules, 'wrap_fp16_model(fp32_modules=...)')
    names += [name for name in kept_fp32(model) if name not in names]  # keep_fp32 before
    kept = [model.get_submodule(name) if name else model for name in names]
    if backend == 'legacy':
        _refuse_scripted(model, "wrap_fp16_model(backend='legacy')")
        originals = _float32_tensors(kept)  # the kept modules' values, never rounded
        model.to(low)
        _patch_norms(model, low)
    # keep_named: a model kept in float32 itself (kept_fp32 names it '') is kept again.
    keep_named(model, names, low if backend == 'legacy' else None)
    if backend == 'legacy':
        _restore(originals)
    inside = {id(sub) for module in kept for sub in module.modules()}  # kept: no half
    for module in model.modules():
        if hasattr(module, 'fp16_enabled') and id(module) not in inside:
            # The flag goes last: a call in another thread meanwhile runs either
            # in float32 or with the dtype and backend already in place.
            module._fp16_autocast = backend == 'native'
            if dtype is not None or not hasattr(module, 'fp16_dtype'):
                module.fp16_dtype = low
            module.fp16_enabled = True
    return model


def _float32_tensors(modules: List[nn.Module]) -> List[Tuple[nn.Module, str, torch.Tensor]]:
    """(owner, name, tensor) for each float32 parameter and buffer of ``modules``."""
    found = []
    for module in modules:
        for owner in module.modules():
            named = [*owner.named_parameters(recurse=False), *owner.named_buffers(recurse=False)]
            found += [(owner, name, t.data) for name, t in named if t.dtype == torch.float32]
    return found


def _restore(saved: List[Tuple[nn.Module, str, torch.Tensor]]) -> None:
    """Put back what :func:`_float32_tensors` took (a parameter keeps its object)."""
    for owner, name, tensor in saved:
        current = getattr(owner, name)
        if isinstance(current, nn.Parameter):
            current.data = tensor
        else:
            setattr(owner, name, tensor)  # a registered buffer: replaced in place
