"""A model's device type, and the model inside a DataParallel / DistributedDataParallel.

The one place that answers both, for the decorators, ``wrap_fp16_model``, the
optimizer wrappers, the builders and the MMEngine plug-in.

Example:
    >>> import torch
    >>> from torch import nn
    >>> module_device_type(nn.Linear(1, 1)), module_device_type(nn.ReLU())
    ('cpu', 'cpu')
    >>> inner = nn.Linear(1, 1)
    >>> unwrap_model(nn.DataParallel(inner)) is inner
    True
"""

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
#: lazy ones): torch's private ``torch.nn.modules.batchnorm._BatchNorm``; where it is
#: missing, ``BatchNorm1d``'s own base class.
BatchNormBase: type = getattr(_batchnorm, '_BatchNorm', nn.BatchNorm1d.__mro__[1])
#: The base class of every InstanceNorm layer: torch's private
#: ``torch.nn.modules.instancenorm._InstanceNorm``; else ``InstanceNorm1d``'s base class.
InstanceNormBase: type = getattr(_instancenorm, '_InstanceNorm', nn.InstanceNorm1d.__mro__[1])

def _dead() -> None:
    return None


class CacheRef(weakref.ref):
    """A ``weakref.ref`` for a cache: pickled or deep-copied, it comes back as None.

    A plain ``weakref.ref`` cannot be pickled; a copy of this one comes back dead,
    so its owner recomputes what it had cached and never drags the original along.
    """

    __slots__ = ()

    def __reduce__(self) -> Any:
        return _dead, ()

    def __deepcopy__(self, memo: Any) -> None:
        return None


#: The wrappers that :func:`unwrap_model` looks through (one level).
PARALLEL_WRAPPERS = (nn.DataParallel, nn.parallel.DistributedDataParallel)
_MISSING = object()


class TensorPath:
    """Where a model's first tensor lives (weakly): a cache for :func:`module_device_type`.

    Holds the model, the submodule that owns the tensor and its name, never
    the tensor, so ``model.to(...)``, parameters replaced by
    ``load_state_dict(..., assign=True)`` and swapped modules are seen. Pickled
    or deep-copied, it comes back empty (see :class:`CacheRef`).

    Example:
        >>> from torch import nn
        >>> path, model = TensorPath(), nn.Linear(1, 1)
        >>> module_device_type(model, cache=path), path.name
        ('cpu', 'weight')
    """

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
    """``module``'s own parameter (else buffer) called ``name``; None if it has none.

    Reads ``nn.Module``'s private ``_parameters`` / ``_buffers`` dicts (one
    dict read, no ``__getattr__`` miss); where a module lacks them, its
    ``named_parameters`` / ``named_buffers`` (``recurse=False``).

    Example:
        >>> from torch import nn
        >>> own_tensor(nn.BatchNorm1d(2), 'running_mean').tolist()
        [0.0, 0.0]
    """
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
    """The device type of a module's first parameter, else of its first buffer.

    The first in ``model.parameters()`` / ``model.buffers()`` order; a meta
    tensor gives ``'meta'``.

    Args:
        model: An ``nn.Module`` (anything else gives ``default``).
        default: What a module without parameters or buffers gives.
        cache: A :class:`TensorPath` that keeps the way to that tensor, so later
            calls with the same model read one tensor instead of walking the
            modules (not used inside a ``torch.compile`` trace: dynamo cannot
            trace weak references everywhere, and the graph keeps the answer).

    Returns:
        ``'cpu'``, ``'cuda'``, ``'meta'``, ...; ``default`` when there is no tensor.

    Example:
        >>> from torch import nn
        >>> module_device_type(nn.Linear(1, 1, device='meta'))
        'meta'
        >>> module_device_type(nn.ReLU(), None) is None
        True
    """
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
    """The model inside a DataParallel / DistributedDataParallel (one level), else ``model``.

    Args:
        model: A model, wrapped or not.
        any_wrapper: Also look through anything else that has a ``module``
            attribute (MMEngine's model wrappers, ``MMDistributedDataParallel``
            and the like, as MMEngine's optimizer constructors see them).

    Returns:
        ``model.module`` for a wrapper, else ``model`` itself.

    Example:
        >>> from torch import nn
        >>> net = nn.Linear(1, 1)
        >>> unwrap_model(net) is net, unwrap_model(nn.DataParallel(net)) is net
        (True, True)
    """
    if any_wrapper:
        return getattr(model, 'module', model)
    return model.module if isinstance(model, PARALLEL_WRAPPERS) else model


def has_no_sync(model: Any) -> bool:
    """``hasattr(model, 'no_sync')``, without nn.Module's slow ``__getattr__`` miss.

    A class that defines ``no_sync`` (DDP, FSDP, mmcv's wrappers) answers at once; a
    module whose ``__getattr__`` is nn.Module's own can only add parameters, buffers and
    submodules there, none of which is a ``no_sync`` method, so it has none.

    Example:
        >>> from torch import nn
        >>> has_no_sync(nn.Linear(1, 1))
        False
    """
    cls = type(model)
    if getattr(cls, 'no_sync', None) is not None:
        return True
    if getattr(cls, '__getattr__', None) is nn.Module.__getattr__:
        return 'no_sync' in model.__dict__
    return hasattr(model, 'no_sync')
