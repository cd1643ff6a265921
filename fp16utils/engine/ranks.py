"""Ranks agree on every skip: one MAX all-reduce of one flag per step (see
docs/design/distributed.md); ``agree_across_ranks`` is None (when the world size is > 1),
True, False or a process group."""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = ['Reducer', 'VETO', 'agree_flag', 'agree_found', 'check_setting', 'reducer',
           'with_veto']

_Tensor = torch.Tensor
#: Turns a local skip flag (a float tensor, > 0: skip) into the agreed one.
Reducer = Callable[[_Tensor], _Tensor]
#: Added to the flag of a rank that must raise at this step (its overflow guard's error):
#: an agreed flag of at least this makes every rank raise. Above any found-inf sum.
VETO = 2.0**20


def _is_group(value: Any) -> bool:
    dist = torch.distributed
    group_type = getattr(dist, 'ProcessGroup', None) if dist.is_available() else None
    return group_type is not None and isinstance(value, group_type)


def check_setting(value: Any, owner: str) -> Any:
    """Return ``value`` when it is a valid ``agree_across_ranks``; else raise TypeError."""
    if value is None or isinstance(value, bool) or _is_group(value):
        return value
    raise TypeError(f'{owner}: agree_across_ranks must be None (agree when the world size is '
                    '> 1), True, False (each rank decides alone) or a process group, got '
                    f'{value!r}.')


def reducer(setting: Any) -> Optional[Reducer]:
    """The all-reduce to apply to a skip flag now; None when this rank decides alone
    (``setting`` False, torch.distributed not initialised, or a single rank)."""
    if setting is False:
        return None
    dist = torch.distributed
    if not (dist.is_available() and dist.is_initialized()):
        return None
    group = None if setting is None or setting is True else setting
    if dist.get_world_size(group) < 2:
        return None
    return functools.partial(agree_flag, group=group)


def agree_flag(flag: _Tensor, group: Any = None) -> _Tensor:
    """MAX all-reduce of a one-element flag over ``group``, as a new float32 tensor."""
    flag = flag.detach().to(torch.float32, copy=True)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
    return flag


def with_veto(reduce: Reducer, veto: bool) -> Tuple[Reducer, List[_Tensor]]:
    """``reduce`` with this rank's veto (:data:`VETO`) added to its flag, and the list that
    collects the agreed flags (read only when set: a clean step costs no extra read)."""
    seen: List[_Tensor] = []

    def agree(flag: _Tensor) -> _Tensor:
        agreed = reduce(flag + VETO if veto else flag)
        seen.append(agreed)
        return agreed

    return agree, seen


def agree_found(found: Dict[Any, _Tensor], device_type: str, reduce: Reducer
                ) -> Dict[Any, _Tensor]:
    """Write the agreed flag into every GradScaler found-inf flag (fused kernels and the
    update read them); a rank with none takes part too, and gets it as the one entry."""
    if found:
        flag = torch.stack([v.reshape(()).float() for v in found.values()]).amax().reshape(1)
    else:
        flag = torch.zeros(1, device=device_type)
    agreed = reduce(flag)
    if not found:
        found[agreed.device] = agreed
        return found
    for value in found.values():
        value.copy_(agreed.to(value.device, non_blocking=True).reshape(value.shape))
    return found
