"""Averaging gradients over processes for the 0.x hooks (mmcv's ``allreduce_grads``)."""

from __future__ import annotations

from typing import Any, List, Optional

import torch
import torch.distributed as dist

from .._torch import compat, ops

__all__ = ['allreduce_grads', 'world_size']


def world_size() -> int:
    """The number of processes of the default process group (1 without one)."""
    if dist.is_available() and dist.is_initialized():
        return dist.get_world_size()
    return 1


def _buckets(tensors: List[torch.Tensor], bucket_size_mb: float) -> List[List[torch.Tensor]]:
    """Group ``tensors`` by device and dtype, split into buckets of at most ``bucket_size_mb``."""
    buckets: List[List[torch.Tensor]] = []
    limit = bucket_size_mb * 1024 * 1024 if bucket_size_mb > 0 else None
    for _, group in ops.group_by_device_and_dtype(tensors):
        if limit is None:
            buckets.append(group)
            continue
        bucket: List[torch.Tensor] = []
        size = 0
        for tensor in group:
            nbytes = tensor.numel() * tensor.element_size()
            if bucket and size + nbytes > limit:
                buckets.append(bucket)
                bucket, size = [], 0
            bucket.append(tensor)
            size += nbytes
        if bucket:
            buckets.append(bucket)
    return buckets


def allreduce_grads(params: List[Any], coalesce: bool = True, bucket_size_mb: float = -1,
                    size: Optional[int] = None) -> None:
    """Average the gradients of ``params`` that require one over ``size`` processes (None:
    :func:`world_size`), in buckets of ``bucket_size_mb`` (<= 0: one per device and dtype)
    with ``coalesce``; a gradient only some ranks have is reduced with zeros elsewhere."""
    count = world_size() if size is None else size
    if count <= 1:
        return
    params = [p for p in params if p.requires_grad]
    if not params:
        return
    # Every rank must reduce the same buffers, or the collectives disagree (gloo
    # aborts, nccl hangs): a parameter without a gradient here joins with zeros.
    # Which ranks had a gradient travels in the first bucket (one flag per
    # parameter, no extra collective), so a parameter that no rank has a
    # gradient for gets None back, as in a single process.
    missing = [p for p in params if p.grad is None]
    for p in missing:
        p.grad = torch.zeros_like(p, memory_format=torch.preserve_format)
    grads = [p.grad for p in params]
    missing_ids = {id(p) for p in missing}
    present = [id(p) not in missing_ids for p in params] if missing else None
    if coalesce:
        buckets = _buckets(grads, bucket_size_mb)
        first = buckets[0][0]
        flags = torch.tensor(present or [True] * len(params), dtype=first.dtype,
                             device=first.device)
        buckets[0] = [*buckets[0], flags]
        for bucket in buckets:
            flat = ops.flatten_dense_tensors(bucket)
            dist.all_reduce(flat)
            flat.div_(count)
            compat.foreach_copy_(bucket, list(ops.unflatten_dense_tensors(flat, bucket)))
    else:
        flags = torch.tensor(present or [True] * len(params), dtype=torch.float32,
                             device=params[0].device)
        ops.foreach_div_(grads, float(count))
        for grad in grads:
            dist.all_reduce(grad)
        dist.all_reduce(flags)
    if missing:  # read the flags (one sync) only when this rank lacked a gradient
        for p, holders in zip(params, flags.tolist()):
            if holders == 0:
                p.grad = None
