"""A model's device type, the model inside a DataParallel/DDP, weak cache references."""

from __future__ import annotations

import weakref
from typing import Any, Iterator, Optional, Tuple

import torch
import torch.nn.modules.batchnorm as _batchnorm
import torch.nn.modules.instancenorm as _instancenorm
from torch import nn

from .tracing import is_compiling as _is_compiling

__all__ = ['BatchNormBase', 'InstanceNormBase', 'TensorPath', 'has_no_sync',
           'module_device_type', 'unwrap_model']

#: The base class of every BatchNorm layer (``BatchNorm1d/2d/3d``, ``SyncBatchNorm``,
#: lazy ones): torch's private ``_BatchNorm``.
BatchNormBase: type = _batchnorm._BatchNorm
#: The base class of every InstanceNorm layer: torch's private ``_InstanceNorm``.
InstanceNormBase: type = _instancenorm._InstanceNorm

def _dead() -> None:
    return None


class CacheRef(weakref.ref):
    """A ``weakref.ref`` for a cache: pickled or deep-copied, it comes back as None."""

    __slots__ = ()

    def __reduce__(self) -> Any:
        return _dead, ()

    def __deepcopy__(self, memo: Any) -> None:
        return None


#: The wrappers that :func:`unwrap_model` looks through (one level).
PARALLEL_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)
_MISSING = object()


class TensorPath:
    """Where a model's first tensor lives, held weakly: the cache of :func:`module_device_type`."""

    def __init__(self) -> None:
        self.model: Optional[CacheRef] = None
        self.owner: Optional[CacheRef] = None
        self.name = ''

    def lookup(self, model: nn.Module) -> Optional[torch.Tensor]:
        """The tensor this path leads to inside ``model`` (None: not cached, or gone)."""
        ref = self.model
        if ref is None or ref() is not model:
            return None
        owner = self.owner() if self.owner is not None else None
        if owner is None:
            return None
        return own_tensor(owner, self.name)

    def remember(self, model: nn.Module, owner: nn.Module, name: str) -> None:
        """Keep the path to ``owner``'s tensor ``name`` inside ``model``."""
        self.model = CacheRef(model)
        self.owner = CacheRef(owner)
        self.name = name


def own_tensor(module: nn.Module, name: str) -> Optional[torch.Tensor]:
    """``module``'s own parameter (else buffer) called ``name``, or None: one private dict read."""
    params = getattr(module, '_parameters', _MISSING)
    buffers = getattr(module, '_buffers', _MISSING)
    if params is _MISSING or buffers is _MISSING:
        found = dict(module.named_parameters(recurse=False))
        found.update((k, v) for k, v in module.named_buffers(recurse=False) if k not in found)
        return found.get(name)
    tensor = params.get(name)
    return buffers.get(name) if tensor is None else tensor


def _first_tensor(model: nn.Module) -> Iterator[Tuple[nn.Module, str, torch.Tensor]]:
    """(owner, name, tensor) of the first parameter, else the first buffer, of ``model``."""
    for module in model.modules():
        for name, tensor in module.named_parameters(recurse=False):
            yield module, name, tensor
            return
    for module in model.modules():
        for name, tensor in module.named_buffers(recurse=False):
            yield module, name, tensor
            return


def module_device_type(model: Any, default: Optional[str] = 'cpu', *,
                       cache: Optional[TensorPath] = None) -> Optional[str]:
    """The device type of ``model``'s first parameter, else buffer, else ``default``."""
    if not isinstance(model, nn.Module):
        return default
    if cache is None:
        for tensor in model.parameters():
            return tensor.device.type
        for tensor in model.buffers():
            return tensor.device.type
        return default
    compiling = _is_compiling()
    if not compiling:
        tensor = cache.lookup(model)
        if tensor is not None:
            return tensor.device.type
    for owner, name, tensor in _first_tensor(model):
        if not compiling:
            cache.remember(model, owner, name)
        return tensor.device.type
    return default


def unwrap_model(model: Any, *, any_wrapper: bool = False) -> Any:
    """The model inside DataParallel/DDP (``any_wrapper``: any ``module``), else ``model``."""
    if any_wrapper:
        return getattr(model, 'module', model)
    return model.module if isinstance(model, PARALLEL_WRAPPERS) else model


def has_no_sync(model: Any) -> bool:
    """``hasattr(model, 'no_sync')``, without nn.Module's slow ``__getattr__`` miss."""
    cls = type(model)
    if getattr(cls, 'no_sync', None) is not None:
        return True
    if getattr(cls, '__getattr__', None) is nn.Module.__getattr__:
        return 'no_sync' in model.__dict__
    return hasattr(model, 'no_sync')
