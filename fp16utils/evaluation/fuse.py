"""Conv-BN fusion that keeps a half model half: :func:`keeping_weight_dtypes`."""

from __future__ import annotations

import functools
from typing import Any, Callable

import torch
from torch import nn

__all__ = ['keeping_weight_dtypes']


def keeping_weight_dtypes(fuse: Callable[..., nn.Module]) -> Callable[..., nn.Module]:
    """Wrap a conv-BN fusing function (mmcv's ``fuse_conv_bn``) so that layers keep their dtype.

    Fusing a half convolution with the float32 BatchNorm that the legacy backend keeps
    gives float32 weights (half times float32), which the half input then refuses
    (``Input type (Half) and bias type (float) should be the same``). The wrapped
    function puts each module whose weight changed dtype back in its old one; a
    float32 model is left exactly as ``fuse`` leaves it.

    Args:
        fuse: ``fuse(module, ...) -> module``.

    Returns:
        The wrapped function.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> def fuse(model):  # stands in for mmcv.cnn.fuse_conv_bn
        ...     model[0].weight = nn.Parameter(model[0].weight * model[1].weight.view(-1, 1))
        ...     model[1] = nn.Identity()
        ...     return model
        >>> model = nn.Sequential(nn.Linear(2, 2).half(), nn.BatchNorm1d(2))
        >>> keeping_weight_dtypes(fuse)(model)[0].weight.dtype
        torch.float16
    """
    @functools.wraps(fuse)
    def fuse_keeping_weight_dtypes(module: nn.Module, *args: Any, **kwargs: Any) -> nn.Module:
        before = {id(m): m.weight.dtype for m in module.modules()
                  if isinstance(getattr(m, 'weight', None), torch.Tensor)}
        fused = fuse(module, *args, **kwargs)
        for m in fused.modules() if isinstance(fused, nn.Module) else ():
            weight, old = getattr(m, 'weight', None), before.get(id(m))
            if isinstance(weight, torch.Tensor) and old is not None and weight.dtype != old:
                m.to(old)
        return fused

    return fuse_keeping_weight_dtypes
