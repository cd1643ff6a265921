"""Differences between our conversion and upstream's, and the table in the docs that explains them.

A config is compared leaf by leaf (``optim_wrapper.optimizer.lr``,
``param_scheduler[1].milestones``); a key one side lacks compares with :data:`ABSENT`.
Tuples and lists are the same value. docs/migration/upstream.md holds one table under
``## Differences``, one row per kind of difference::

    | Codebase | Configs | Key | Ours | Upstream | Reason |
    | mmdet | `*` | `optim_wrapper.loss_scale` | `512.0` | `'dynamic'` | upstream ... |

``Codebase``: a 0.x codebase or ``*``; ``Configs`` and ``Key``: patterns on the 0.x
config's path under ``configs/`` and on the leaf's key, where ``*`` stands for any text
and everything else for itself (``param_scheduler[*].end``); ``Ours`` and
``Upstream``: a Python literal, ``*`` (any value), ``absent``, or ``= EXPRESSION`` over
the other side's value and the 0.x config (``= upstream + 1``,
``= old['runner']['max_iters']``). A lone scheduler dict is compared as a
one-item list (MMEngine reads ``param_scheduler=dict(...)`` as ``[dict(...)]``).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, Iterator, List, Optional, Tuple


class _Absent:
    def __repr__(self) -> str:
        return 'absent'


ABSENT: Any = _Absent()
ANY: Any = object()


@dataclass(frozen=True)
class Relative:
    """A cell ``= EXPRESSION``: true of a value that the expression gives.

    The expression sees the other column's value (``upstream`` or ``ours``) and the 0.x
    config (``old``); an expression that fails does not explain the difference.
    """

    text: str
    side: str = 'ours'  # the column it stands in

    def holds(self, value: Any, other: Any, old: Any) -> bool:
        if value is ABSENT:
            return False
        name = 'upstream' if self.side == 'ours' else 'ours'
        names = {'old': old} if other is ABSENT else {name: other, 'old': old}
        try:
            wanted = eval(self.text, {'__builtins__': {}}, names)  # noqa: S307
        except Exception:  # noqa: BLE001 - the expression does not apply to this value
            return False
        return same(wanted, value)


@dataclass(frozen=True)
class Difference:
    """One leaf that differs in one pair."""

    codebase: str
    config: str  # the 0.x config, relative to configs/
    key: str
    ours: Any
    upstream: Any
    old: Any = field(default=None, compare=False, repr=False)  # the 0.x config


@dataclass
class Row:
    """One row of the table: which differences it explains, and why."""

    line: int
    codebase: str
    configs: str
    key: str
    ours: Any
    upstream: Any
    reason: str
    matched: int = 0

    def explains(self, diff: Difference) -> bool:
        return (self.codebase in ('*', diff.codebase)
                and matches(self.configs, diff.config)
                and matches(self.key, diff.key)
                and _fits(self.ours, diff.ours, diff.upstream, diff.old)
                and _fits(self.upstream, diff.upstream, diff.ours, diff.old))


def matches(pattern: str, text: str) -> bool:
    """``*`` is any text (``/``, ``.``, ``[`` included); every other character is itself."""
    regex = '.*'.join(re.escape(part) for part in pattern.split('*'))
    return re.fullmatch(regex, text) is not None


def _fits(cell: Any, value: Any, other: Any, old: Any) -> bool:
    """Does one side's ``value`` fit the row's ``cell`` (``other``: the other side's)?"""
    if cell is ANY:
        return True
    if isinstance(cell, Relative):
        return cell.holds(value, other, old)
    return same(cell, value)


def plain(value: Any) -> Any:
    """Tuples as lists, mappings as dicts (recursively): the form values are compared in."""
    if isinstance(value, dict) or hasattr(value, 'items') and not isinstance(value, type):
        return {k: plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(v) for v in value]
    return value


def same(a: Any, b: Any) -> bool:
    """Equal by value (``1 == 1.0``; a bool is not a number here)."""
    if a is ABSENT or b is ABSENT:
        return a is b
    if isinstance(a, bool) or isinstance(b, bool):
        return type(a) is type(b) and a == b
    return plain(a) == plain(b)


def leaves(value: Any, key: str) -> Iterator[Tuple[str, Any]]:
    """``(key, value)`` for every leaf below ``key`` (an empty dict or list is a leaf)."""
    if isinstance(value, dict) and value:
        for k, v in value.items():
            yield from leaves(v, f'{key}.{k}')
    elif isinstance(value, list) and value:
        for i, v in enumerate(value):
            yield from leaves(v, f'{key}[{i}]')
    else:
        yield key, value


def differences(codebase: str, config: str, ours: Dict[str, Any], upstream: Dict[str, Any],
                keys: Tuple[str, ...], old: Any = None) -> List[Difference]:
    """Every leaf under ``keys`` where ``ours`` and ``upstream`` differ (``old``: the 0.x)."""
    out = []
    for top in keys:
        mine = dict(leaves(_listed(top, plain(ours[top])), top)) if top in ours else {}
        theirs = (dict(leaves(_listed(top, plain(upstream[top])), top))
                  if top in upstream else {})
        for key in list(mine) + [k for k in theirs if k not in mine]:
            a, b = mine.get(key, ABSENT), theirs.get(key, ABSENT)
            if _emptied(key, a, theirs) or _emptied(key, b, mine):
                continue  # {} on one side, entries under it on the other: those differ
            if not same(a, b):
                out.append(Difference(codebase, config, key, a, b, old))
    return out


def _emptied(key: str, value: Any, other: Dict[str, Any]) -> bool:
    """``key`` is an empty dict on one side and has entries on the ``other`` (its leaves).

    ``val_cfg={}`` against ``val_cfg=dict(fp16=True)`` is one difference, at
    ``val_cfg.fp16``; the leaf ``val_cfg`` itself does not differ.
    """
    return value == {} and any(k.startswith(key + '.') for k in other)


def _listed(top: str, value: Any) -> Any:
    """``param_scheduler=dict(type=...)`` as the one-item list MMEngine makes of it."""
    if top == 'param_scheduler' and isinstance(value, dict) and 'type' in value:
        return [value]
    return value


def _cell(text: str) -> str:
    text = text.strip()
    return text[1:-1] if len(text) >= 2 and text[0] == text[-1] == '`' else text


def _value(text: str, where: str, side: str) -> Any:
    if text == '*':
        return ANY
    if text.startswith('='):
        return Relative(text[1:].strip(), side)
    if text == 'absent':
        return ABSENT
    try:
        return ast.literal_eval(text)
    except (ValueError, SyntaxError) as err:
        raise ValueError(f'{where}: {text!r} is not a Python literal, * or absent') from err


def read_table(page: Path) -> List[Row]:
    """The rows of the ``## Differences`` table of ``page``."""
    rows: List[Row] = []
    inside = False
    for number, line in enumerate(page.read_text(encoding='utf-8').splitlines(), 1):
        if line.startswith('## '):
            inside = line.strip() == '## Differences'
            continue
        if not inside or not line.startswith('|'):
            continue
        cells = [c.strip() for c in re.split(r'(?<!\\)\|', line.strip())[1:-1]]
        if len(cells) != 6:
            raise ValueError(f'{page}:{number}: a row of the table needs 6 cells, has {len(cells)}')
        if cells[0] == 'Codebase' or set(cells[0]) <= set('-: '):
            continue
        codebase, configs, key, ours, theirs, reason = (
            _cell(c.replace('\\|', '|')) for c in cells)
        where = f'{page.name}:{number}'
        rows.append(Row(number, codebase, configs, key, _value(ours, where, 'ours'),
                        _value(theirs, where, 'upstream'), reason))
    return rows


def explain(diffs: List[Difference], rows: List[Row]) -> List[Difference]:
    """Match each difference to the first row that explains it; those none explains."""
    unexplained = []
    for diff in diffs:
        row: Optional[Row] = next((r for r in rows if r.explains(diff)), None)
        if row is None:
            unexplained.append(diff)
        else:
            row.matched += 1
    return unexplained


def summary(diffs: List[Difference], limit: int = 40) -> str:
    """Unexplained differences grouped by codebase, key and values, with an example each."""
    groups: Dict[Tuple[str, str, str, str], List[str]] = {}
    for d in diffs:
        key = re.sub(r'\[\d+\]', '[*]', d.key)
        groups.setdefault((d.codebase, key, repr(d.ours), repr(d.upstream)), []).append(d.config)
    lines = [f'{len(configs):4d} x {cb} {key}: ours {ours} | upstream {theirs}  (e.g. {configs[0]})'
             for (cb, key, ours, theirs), configs in
             sorted(groups.items(), key=lambda kv: -len(kv[1]))]
    more = f'\n... and {len(lines) - limit} more kinds' if len(lines) > limit else ''
    return '\n'.join(lines[:limit]) + more
