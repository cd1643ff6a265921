"""``keep_fp32``: run chosen submodules in float32, named by configuration."""

from __future__ import annotations

import fnmatch
from typing import Any, Callable, Iterable, List, Mapping, Optional, Sequence, Union

import torch
from torch import nn

from ._torch import dtypes
from .cast import _cast
from .decorators import fp32_plan, run_fp32, undecorated

__all__ = ['Fp32Modules', 'check_fp32_modules', 'keep_fp32', 'keep_named', 'kept_fp32',
           'match_modules']

#: What ``modules`` may hold: qualified-name patterns, module classes, class names.
Fp32Modules = Union[str, type, Sequence[Union[str, type]], None]

_FLOAT = (torch.float32,)


def _call_all(self: Any, *args: Any, **kwargs: Any) -> Any:
    """The signature the shared plan is made from: every argument after the owner."""


_PLAN = fp32_plan(_call_all)


class _Fp32Forward:
    """A module's forward run as ``@force_fp32`` runs a method; picklable, deep-copied with it."""

    def __init__(self, owner: nn.Module, func: Optional[Callable[..., Any]],
                 inner: Optional[Callable[..., Any]], out_dtype: Optional[torch.dtype]) -> None:
        self.owner = owner
        self.func = func
        self.inner = inner
        self.out_dtype = out_dtype

    def _target(self, owner: nn.Module, *args: Any, **kwargs: Any) -> Any:
        if self.func is not None:
            return self.func(owner, *args, **kwargs)
        return self.inner(*args, **kwargs)  # type: ignore[misc]

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        output = run_fp32(_PLAN, self._target, (self.owner, *args), kwargs)
        if self.out_dtype is not None:
            output = _cast(output, _FLOAT, self.out_dtype, None)
        return output

    def __repr__(self) -> str:
        target = self.func if self.func is not None else self.inner
        return f'fp32_forward({getattr(target, "__qualname__", target)})'


def _class_names(module: nn.Module) -> List[str]:
    """The names of the module's classes along its MRO, ``nn.Module`` and above left out."""
    names = []
    for cls in type(module).__mro__:
        if cls is nn.Module:
            break
        names.append(cls.__name__)
    return names


def check_fp32_modules(modules: Fp32Modules, where: str = 'keep_fp32'
                       ) -> List[Union[str, type]]:
    """Check the form of a ``modules``/``fp32_modules`` value (no model needed); as a list."""
    if modules is None:
        return []
    if isinstance(modules, (str, type)):
        modules = [modules]
    if not isinstance(modules, Iterable) or isinstance(modules, (Mapping, bytes, nn.Module)):
        raise TypeError(
            f'{where}: modules must be a name pattern, an nn.Module class, a class name, or a '
            f'list of them, got {type(modules).__name__} ({modules!r}).')
    entries = list(modules)
    for entry in entries:
        if isinstance(entry, str):
            if not entry:
                raise ValueError(
                    f"{where}: an empty pattern matches nothing; name the modules, e.g. "
                    "'roi_head.*', 'backbone.layer1.0.bn1' or 'LayerNorm'.")
        elif not (isinstance(entry, type) and issubclass(entry, nn.Module)):
            raise TypeError(
                f'{where}: each entry must be a qualified-name pattern (str), an nn.Module '
                f'subclass or a class name; got {entry!r} ({type(entry).__name__}).')
    return entries


def match_modules(model: nn.Module, modules: Fp32Modules,
                  where: str = 'keep_fp32') -> List[str]:
    """Qualified names (``named_modules`` order) of the submodules that ``modules`` names."""
    if not isinstance(model, nn.Module):
        raise TypeError(f'{where}: model must be an nn.Module, got {type(model).__name__}.')
    entries = check_fp32_modules(modules, where)
    named = list(model.named_modules())
    found: dict = {}
    for entry in entries:
        hits = [name for name, module in named if _matches(entry, name, module)]
        if not hits:
            raise ValueError(_no_match(entry, named, where))
        found.update(dict.fromkeys(hits))
    return [name for name, _ in named if name in found]


def _matches(entry: Union[str, type], name: str, module: nn.Module) -> bool:
    """Whether a pattern, class or class name names this module."""
    if isinstance(entry, type):
        return isinstance(module, entry)
    return fnmatch.fnmatchcase(name, entry) or entry in _class_names(module)


def _no_match(entry: Union[str, type], named: list, where: str) -> str:
    """The message for an entry that matches no module."""
    names = [n for n, _ in named if n][:6]
    classes = sorted({type(m).__name__ for _, m in named})[:6]
    what = entry.__name__ if isinstance(entry, type) else repr(entry)
    return (f'{where}: {what} matches no module of the model (a typo would silently keep '
            f'nothing in float32); its modules include {names} and its classes {classes}; '
            "name modules by qualified-name pattern ('roi_head.*'), class or class name.")


def keep_fp32(model: nn.Module, modules: Fp32Modules,
              out_dtype: Union[torch.dtype, str, None] = None) -> nn.Module:
    """Run the named submodules of ``model`` in float32, whatever autocast says.

    Each matched forward runs as a ``@force_fp32`` method would: half inputs
    cast to float32, autocast off, the output left in float32. Applying it
    twice changes nothing more; ``state_dict`` keys, ``copy.deepcopy`` and
    pickling are unaffected.

    Args:
        model: The model, changed in place.
        modules: ``fnmatch`` patterns on the qualified names
            (``'roi_head.*'``), ``nn.Module`` classes or class names
            (``'DeformConv2d'``), or a list of them.
        out_dtype: For a half model (the legacy backend): the matched
            modules go back to float32 and their outputs are cast to this
            dtype. None: parameters untouched, outputs float32.

    Returns:
        ``model`` itself.

    Raises:
        ValueError: An entry matches no module; nothing is changed.
        TypeError: An entry is not a string or ``nn.Module`` class.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = keep_fp32(nn.Sequential(nn.Linear(2, 2)), '0')
        >>> with torch.autocast('cpu', dtype=torch.bfloat16):
        ...     model(torch.ones(1, 2).bfloat16()).dtype
        torch.float32
    """
    low = None if out_dtype is None else dtypes.resolve_dtype(out_dtype)
    return keep_named(model, match_modules(model, modules), low)


def keep_named(model: nn.Module, names: List[str], low: Optional[torch.dtype]) -> nn.Module:
    """:func:`keep_fp32` on qualified names already matched (``''``: ``model`` itself)."""
    for name in names:
        module = model.get_submodule(name) if name else model
        if low is not None:
            module.float()
        current = module.__dict__.get('forward')
        if isinstance(current, _Fp32Forward):
            current.out_dtype = low
            continue
        if current is None:
            func: Optional[Callable[..., Any]] = undecorated(type(module).forward)
            inner = None
        elif getattr(current, '__self__', None) is module:  # a bound method set on it
            func, inner = undecorated(current.__func__), None
        else:
            func, inner = None, current
        module.forward = _Fp32Forward(module, func, inner, low)
    return model


def kept_fp32(model: nn.Module) -> List[str]:
    """The qualified names of the modules of ``model`` that :func:`keep_fp32` runs in float32.

    Args:
        model: The model.

    Returns:
        The names, in ``named_modules`` order.

    Example:
        >>> from torch import nn
        >>> kept_fp32(keep_fp32(nn.Sequential(nn.Linear(2, 2), nn.ReLU()), nn.ReLU))
        ['1']
    """
    return [name for name, module in model.named_modules()
            if isinstance(module.__dict__.get('forward'), _Fp32Forward)]
