"""Checks of saved state against what it is loaded into (before anything changes), and an
optimizer load that rolls back."""

from __future__ import annotations

from typing import Any, Callable, List, Mapping, Optional, Tuple

import torch

__all__ = ['PENDING_KEY', 'check_optimizer_state', 'check_tensors', 'load_optimizer_state',
           'read_pending_window', 'snapshot_optimizer']

_Tensor = torch.Tensor
_TORCH_LOAD = torch.optim.Optimizer.load_state_dict


def check_optimizer_state(optimizer: Any, state: Any, owner: str) -> None:
    """Raise when ``state`` does not fit ``optimizer``'s param groups (torch's format only)."""
    if getattr(type(optimizer), 'load_state_dict', None) is not _TORCH_LOAD:
        return
    where = f'{owner}: the saved optimizer state'
    hint = 'load a state saved from the same model and optimizer configuration.'
    if not isinstance(state, Mapping) or not isinstance(state.get('state'), Mapping) or (
            not isinstance(state.get('param_groups'), (list, tuple))):
        keys = sorted(state, key=str) if isinstance(state, Mapping) else type(state).__name__
        raise ValueError(f"{where} must be a dict with 'state' (a dict) and 'param_groups' "
                         f'(a list), as optimizer.state_dict() writes it; got {keys}.')
    saved = state['param_groups']
    groups = optimizer.param_groups
    if len(saved) != len(groups):
        raise ValueError(f'{where} has {len(saved)} param groups, this optimizer '
                         f'{len(groups)}; {hint}')
    ids = set()
    for index, (old, new) in enumerate(zip(saved, groups)):
        params = old.get('params') if isinstance(old, Mapping) else None
        if not isinstance(params, (list, tuple)):
            raise ValueError(f"{where}: param group {index} must be a dict with a 'params' "
                             f'list, got {old!r}.')
        if len(params) != len(new['params']):
            raise ValueError(f'{where}: param group {index} holds {len(params)} parameters, '
                             f"this optimizer's {len(new['params'])}; {hint}")
        ids.update(params)
    if len(ids) != sum(len(g['params']) for g in groups):
        raise ValueError(f'{where} lists a parameter index twice; {hint}')
    for key, value in state['state'].items():
        if key not in ids or not isinstance(value, Mapping):
            raise ValueError(f'{where} has state for parameter index {key!r}, which its '
                             'param groups do not list (or which is not a dict); ' + hint)


def snapshot_optimizer(optimizer: Any) -> Callable[[], None]:
    """A callable that puts ``optimizer``'s attributes back (torch's load replaces them)."""
    attrs = getattr(optimizer, '__dict__', None)
    saved = None if attrs is None else dict(attrs)

    def undo() -> None:
        if saved is not None:
            attrs.clear()
            attrs.update(saved)

    return undo


def load_optimizer_state(optimizer: Any, state: Mapping[str, Any]) -> None:
    """``optimizer.load_state_dict(state)``, rolled back when it raises halfway."""
    undo = snapshot_optimizer(optimizer)
    try:
        optimizer.load_state_dict(state)
    except BaseException:
        undo()
        raise


def check_tensors(tensors: Any, params: List[_Tensor], what: str, owner: str,
                  allow_none: bool) -> List[Optional[_Tensor]]:
    """Check saved tensors against ``params`` (count, shape, floating dtype); return a list."""
    hint = 'load a state saved from the same model and optimizer.'
    if not isinstance(tensors, (list, tuple)):
        raise ValueError(f'{owner}: the saved {what} must be a list of tensors, got '
                         f'{type(tensors).__name__}; {hint}')
    if len(tensors) != len(params):
        raise ValueError(f'{owner}: the saved {what} ({len(tensors)} tensors) do not match '
                         f'the {len(params)} parameters here; {hint}')
    for index, (t, p) in enumerate(zip(tensors, params)):
        if t is None and allow_none:
            continue
        if not isinstance(t, torch.Tensor) or not t.is_floating_point() or (
                t.shape != p.shape) or t.is_meta:
            got = (f'{t.dtype} {tuple(t.shape)} on {t.device}' if isinstance(t, torch.Tensor)
                   else repr(t))
            raise ValueError(f'{owner}: the saved {what} [{index}] is {got}, expected a '
                             f'floating-point tensor of shape {tuple(p.shape)} with data; '
                             f'{hint}')
    return list(tensors)


#: The key of a saved pending window's count: the iterations done when it was saved.
PENDING_KEY = 'iter'
#: Read in place of ``'iter'`` too (same meaning).
_OLD_PENDING_KEY = 'inner_count'


def read_pending_window(pending: Any, where: str, owner: str) -> Tuple[int, Any]:
    """``(iterations done, gradients)`` of a saved ``{'iter': ..., 'grads': [...]}`` (or
    ``'inner_count'`` for ``'iter'``), checked; the gradients are checked when loaded."""
    count = None
    if isinstance(pending, Mapping) and 'grads' in pending:
        keys = [key for key in (PENDING_KEY, _OLD_PENDING_KEY) if key in pending]
        if len(keys) == 1:
            count = pending[keys[0]]
    if not (isinstance(count, int) and not isinstance(count, bool) and count >= 0):
        raise ValueError(f"{owner}: {where} must be a dict {{'{PENDING_KEY}': an int >= 0 (the "
                         f"iterations done), 'grads': a list}} ('{_OLD_PENDING_KEY}' in place "
                         f"of '{PENDING_KEY}' is read too); got {pending!r}. Save it again, or "
                         'load the checkpoint without it.')
    return count, pending['grads']
