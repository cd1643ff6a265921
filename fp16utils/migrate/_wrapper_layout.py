"""The shape of a 1.x ``optim_wrapper``: one wrapper, or one entry per submodule."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

__all__ = ['wrapper_entries', 'wrapper_layout']


def wrapper_layout(wrapper: Mapping[str, Any]) -> str:
    """'multi' for a MultiOptimWrapperConstructor style optim_wrapper, else 'single'."""
    if wrapper.get('constructor') == 'MultiOptimWrapperConstructor':
        return 'multi'
    if 'optimizer' not in wrapper and 'type' not in wrapper:
        subs = [v for k, v in wrapper.items() if k not in ('constructor', 'paramwise_cfg')]
        if subs and all(isinstance(v, Mapping) and 'optimizer' in v for v in subs):
            return 'multi'
    return 'single'


def wrapper_entries(
    wrapper: dict[str, Any], layout: Optional[str]
) -> list[tuple[str, dict[str, Any]]]:
    """(dotted name, wrapper dict) for a single wrapper or each entry of a multi one."""
    if layout == 'multi':
        return [
            (f'optim_wrapper.{name}', entry)
            for name, entry in wrapper.items()
            if name not in ('constructor', 'paramwise_cfg') and isinstance(entry, dict)
        ]
    return [('optim_wrapper', wrapper)]
