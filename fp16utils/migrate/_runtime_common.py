"""The state one runtime-keys conversion shares: new keys, their places, the problem lines."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Optional

from .errors import short_repr

__all__ = ['DOC', 'RuntimeState', 'short']

#: The page every runtime problem line points at.
DOC = 'docs/migration/runtime.md'

#: The order new keys take when several go to the same place.
NEW_KEY_ORDER = (
    'model', 'train_cfg', 'val_cfg', 'test_cfg', 'default_hooks', 'log_processor', 'visualizer',
    'custom_hooks', 'env_cfg', 'model_wrapper_cfg', 'load_from', 'resume', 'randomness',
    'experiment_name',
)


def short(value: Any, limit: int = 90) -> str:
    """``value`` on one line for a problem line, cut to ``limit`` characters."""
    return short_repr(value, limit)


class RuntimeState:
    """One pass over ``out``: the keys it leaves out, the keys it writes and where."""

    def __init__(self, out: dict[str, Any], problems: list[str], notes: list[str],
                 test_fp16: bool, codebase: Optional[str]) -> None:
        self.out = out
        self.problems = problems
        self.notes = notes
        self.test_fp16 = test_fp16
        self.codebase = codebase
        self.drop: set[str] = set()  # 0.x keys left out of the result
        self.new: dict[str, Any] = {}  # 1.x keys written, by name
        self.anchor: dict[str, str] = {}  # 1.x key -> the 0.x key whose place it takes
        # The 0.x runner counted iterations: mmcv's IterBasedRunner made by_epoch=False
        # the default of the checkpoint and logger hooks.
        self.iter_based = codebase in ('mmedit', 'mmgen')
        self.legacy = False  # the config has 0.x runtime keys

    def has(self, key: str) -> bool:
        """Whether the 0.x config has ``key``."""
        return key in self.out

    def problem(self, text: str, section: str) -> None:
        """Record a problem line ending with the docs section it belongs to."""
        self.problems.append(f'{text}; see {DOC}#{section}')

    def note(self, text: str, section: str) -> None:
        """Record a note ending with the docs section it belongs to."""
        self.notes.append(f'{text}; see {DOC}#{section}')

    def leave_out(self, *keys: str) -> None:
        """Leave these 0.x keys out of the result."""
        self.drop.update(k for k in keys if k in self.out)

    def put(self, key: str, value: Any, sources: tuple[str, ...]) -> None:
        """Write the 1.x ``key`` where the first of ``sources`` (0.x keys) was.

        A key the config already has keeps its place; dict values are merged into it,
        its own entries winning (a conflict is a problem line).
        """
        if key in self.new:
            self._merge(key, self.new[key], value)
            return
        if key in self.out and key not in self.drop:
            self._merge(key, self.out[key], value)
            return
        self.new[key] = value
        present = [s for s in self.out if s in sources]
        self.anchor[key] = present[0] if present else ''

    def _merge(self, key: str, have: Any, value: Any) -> None:
        """Merge ``value`` into the dict ``have`` already under ``key``."""
        if isinstance(have, dict) and isinstance(value, Mapping):
            for name, item in value.items():
                if name not in have:
                    have[name] = item
                elif have[name] != item and not (
                        isinstance(have[name], dict) and isinstance(item, Mapping)
                        and all(have[name].get(k, v) == v for k, v in item.items())):
                    self.problem(
                        f'{key}.{name}: the config already sets {short(have[name])}, the 0.x keys '
                        f'give {short(item)}; the value already there was kept; reconcile the two',
                        'keys-already-in-1x-form')
                elif isinstance(have[name], dict) and isinstance(item, Mapping):
                    for k, v in item.items():
                        have[name].setdefault(k, v)
        elif have != value:
            self.problem(
                f'{key}: the config already sets {short(have)}, the 0.x keys give {short(value)}; '
                'the value already there was kept; reconcile the two',
                'keys-already-in-1x-form')

    def result(self) -> dict[str, Any]:
        """The converted config: the new keys in the places of the 0.x keys they replace."""
        at: dict[str, list[str]] = {}
        for key in sorted(self.new, key=_order):
            at.setdefault(self.anchor[key], []).append(key)
        result: dict[str, Any] = {}
        for key, val in self.out.items():
            for new in at.pop(key, []):
                result[new] = self.new[new]
            if key not in self.drop and key not in result:
                result[key] = val
        for keys in at.values():
            for new in keys:
                result[new] = self.new[new]
        return result


def _order(key: str) -> int:
    """Where ``key`` sorts among new keys sharing a place."""
    return NEW_KEY_ORDER.index(key) if key in NEW_KEY_ORDER else len(NEW_KEY_ORDER)
