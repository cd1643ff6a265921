"""Ranks agree on every skip: one MAX all-reduce of one flag per step.

When the gradients one rank checks can differ from another rank's (a fault
after DDP's all-reduce, sharded gradients under FSDP, tensor parallelism), a
local decision lets one rank skip a step that another takes, and the replicas
silently diverge. Every engine therefore passes its skip flag through
:func:`reducer` before the one device sync of the step.

The setting (``agree_across_ranks`` of the wrappers, hooks and engines) is:

- ``None`` (default): agree whenever torch.distributed is initialised with a
  world size > 1;
- ``True``: the same, stated explicitly;
- ``False``: every rank decides alone (ranks that do not train one model);
- a process group: agree within that group (when it has more than one rank).

Errors decided from one rank's gradients travel in the same flag: a rank whose
overflow guard must raise adds :data:`VETO` to it (:func:`with_veto`), so every
rank raises at the same step instead of one rank leaving the collective.

Deadlock rule: while ranks agree, every rank of the group must call the step
the same number of times (the flag is a collective), as with DDP itself.

Example:
    >>> import torch
    >>> reducer(None) is None  # torch.distributed not initialised: decide alone
    True
    >>> check_setting(False, 'example')
    False
"""

from __future__ import annotations

import functools
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch

__all__ = ['Reducer', 'VETO', 'agree_flag', 'agree_found', 'check_setting', 'reducer',
           'with_veto']

_Tensor = torch.Tensor
#: Turns a local skip flag (a float tensor, > 0: skip) into the agreed one.
Reducer = Callable[[_Tensor], _Tensor]
#: Added to a rank's skip flag when that rank must raise at this step (the overflow
#: guard's ``action='raise'``): the agreed flag, at least this, makes every rank raise.
#: Larger than any sum of per-device found-inf flags.
VETO = 2.0**20


def _is_group(value: Any) -> bool:
    dist = torch.distributed
    group_type = getattr(dist, 'ProcessGroup', None) if dist.is_available() else None
    return group_type is not None and isinstance(value, group_type)


def check_setting(value: Any, owner: str) -> Any:
    """Return ``value`` when it is a valid ``agree_across_ranks``; else raise TypeError.

    Example:
        >>> check_setting(None, 'example') is None
        True
    """
    if value is None or isinstance(value, bool) or _is_group(value):
        return value
    raise TypeError(f'{owner}: agree_across_ranks must be None (agree when the world size is '
                    '> 1), True, False (each rank decides alone) or a process group, got '
                    f'{value!r}.')


def reducer(setting: Any) -> Optional[Reducer]:
    """The all-reduce to apply to a skip flag now, or None when this rank decides alone.

    Args:
        setting: None, True, False or a process group (see the module docstring).

    Returns:
        A callable taking the local flag and returning the agreed one, or None
        when ``setting`` is False, torch.distributed is not initialised or the
        group has a single rank.

    Example:
        >>> reducer(False) is None
        True
    """
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
    """MAX all-reduce of one float flag over ``group``: skip if any rank skips.

    Args:
        flag: A one-element tensor, nonzero where this rank found inf/nan.
        group: The process group (None: the default group).

    Returns:
        The agreed flag, a float32 tensor of the same shape on the same device.

    Example:
        >>> callable(agree_flag)  # it needs an initialised process group to run
        True
    """
    flag = flag.detach().to(torch.float32, copy=True)
    torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX, group=group)
    return flag


def with_veto(reduce: Reducer, veto: bool) -> Tuple[Reducer, List[_Tensor]]:
    """``reduce`` with this rank's veto folded into the flag; also the list of agreed flags.

    The same one all-reduce: a rank that must raise adds :data:`VETO` to its
    flag, and every rank reads from the agreed flag whether one did (only when
    the flag is set, so a clean step costs no extra read).

    Example:
        >>> reduce, seen = with_veto(lambda f: f, veto=True)
        >>> reduce(torch.zeros(1)).item() >= VETO, len(seen)
        (True, 1)
    """
    seen: List[_Tensor] = []

    def agree(flag: _Tensor) -> _Tensor:
        agreed = reduce(flag + VETO if veto else flag)
        seen.append(agreed)
        return agreed

    return agree, seen


def agree_found(found: Dict[Any, _Tensor], device_type: str, reduce: Reducer
                ) -> Dict[Any, _Tensor]:
    """Agree on GradScaler's per-device found-inf flags, writing the result back in place.

    Every flag of ``found`` (the dict the GradScaler reads in ``step`` and
    ``update``) takes the agreed value, so fused optimizers that skip inside
    their kernel and the scale update both see the decision of all ranks. A
    rank with no gradient still takes part, so the collective always matches.

    Returns:
        ``found``, which gets the agreed flag as its one entry when it was empty
        (a rank with no gradient: the GradScaler's update then backs off too).

    Example:
        >>> flags = {'cpu': torch.tensor([0.0])}
        >>> agree_found(flags, 'cpu', lambda f: f + 1)['cpu'].tolist()
        [1.0]
    """
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
