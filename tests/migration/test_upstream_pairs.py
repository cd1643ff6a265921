"""Our conversion of each 0.x config against upstream's own 1.x config of the same model.

Pairs come from ``_pairing`` (the checkpoint both configs name in their metafiles, else the
file name with ``-`` read as ``_``): mmdet 2.28.2 -> mmdet 3.3.0, mmsegmentation 0.30.0 ->
1.2.2, mmcls 0.25.0 -> mmpretrain 1.2.0, mmedit 0.16.1 and mmgen 0.7.3 -> mmagic 1.2.0.
Upstream's config is read with MMEngine's ``Config.fromfile`` (its ``custom_imports`` not
imported: the codebases are not installed); ours is ``migrate_config(cfg, path=...)``
with MMEngine's own names (no plug-in). ``optim_wrapper``, ``param_scheduler``,
``train_cfg``, ``val_cfg`` and ``test_cfg`` are compared leaf by leaf. Every difference
must be explained by a row of the table in docs/migration/upstream.md, and every row
must explain at least one difference (a row that explains none is stale).
"""

from __future__ import annotations

from pathlib import Path
from typing import Dict, List, Tuple

from _converted import Converted, converted
from _differences import Difference, differences, explain, plain, read_table, summary
from _wheels import NEW, OLD, configs_dir, iter_configs, require

BASE = require()  # skips the module where the tier's packages are missing

from _pairing import Pair, pair_configs  # noqa: E402  (PyYAML, which the tier has)
from mmengine.config import Config  # noqa: E402

PAGE = Path(__file__).resolve().parents[2] / 'docs' / 'migration' / 'upstream.md'
KEYS = ('optim_wrapper', 'param_scheduler', 'train_cfg', 'val_cfg', 'test_cfg')
_UPSTREAM: Dict[str, Dict] = {}


def _upstream(path: Path) -> Dict:
    key = str(path)
    if key not in _UPSTREAM:
        cfg = Config.fromfile(key, import_custom_modules=False)
        _UPSTREAM[key] = plain(cfg._cfg_dict.to_dict())
    return _UPSTREAM[key]


def _pairs(codebase: str) -> Tuple[Dict[str, Pair], Path, Path]:
    old_root = configs_dir(BASE, OLD[codebase])
    new_root = configs_dir(BASE, NEW[codebase])
    olds = [p.relative_to(old_root).as_posix() for p in iter_configs(old_root)]
    news = [p.relative_to(new_root).as_posix() for p in iter_configs(new_root)]
    return pair_configs(old_root, olds, new_root, news), old_root, new_root


def _all_differences() -> Tuple[List[Difference], Dict[str, Dict[str, int]], List[str]]:
    diffs: List[Difference] = []
    counts: Dict[str, Dict[str, int]] = {}
    unreadable: List[str] = []
    for codebase in OLD:
        pairs, _, new_root = _pairs(codebase)
        records: Dict[str, Converted] = {r.rel: r for r in converted(BASE, codebase)}
        count = dict(paired=0, unpaired=0, ambiguous=0, equal=0, compared=0,
                     missing_base=0, upstream_unreadable=0)
        for rel, pair in pairs.items():
            if pair.new is None:
                count['ambiguous' if pair.rule == 'ambiguous' else 'unpaired'] += 1
                continue
            count['paired'] += 1
            record = records[rel]
            if record.upstream_form is None:  # a _base_ the release lacks (test_convert_all)
                count['missing_base'] += 1
                continue
            try:
                theirs = _upstream(new_root / pair.new)
            except Exception as err:  # noqa: BLE001 - counted and shown by the test
                count['upstream_unreadable'] += 1
                unreadable.append(f'{NEW[codebase].name} {pair.new}: {type(err).__name__}: {err}')
                continue
            count['compared'] += 1
            found = differences(codebase, rel, record.upstream_form, theirs, KEYS, record.old)
            count['equal'] += not found
            diffs.extend(found)
        counts[codebase] = count
    return diffs, counts, unreadable


def test_every_difference_from_upstream_is_explained_by_the_table() -> None:
    rows = read_table(PAGE)
    assert rows, f'{PAGE} has no ## Differences table'
    diffs, counts, unreadable = _all_differences()
    for codebase, count in counts.items():
        print(f'{OLD[codebase].name} -> {NEW[codebase].name}: {count}')
    assert not unreadable, 'upstream configs MMEngine cannot read:\n' + '\n'.join(unreadable)
    unexplained = explain(diffs, rows)
    for row in rows:
        print(f'row line {row.line}: {row.matched} difference(s)')
    assert not unexplained, (
        f'{len(unexplained)} of {len(diffs)} difference(s) from upstream that no row of '
        f'{PAGE.name} explains:\n{summary(unexplained)}')
    stale = [f'line {r.line}: {r.key} ({r.reason})' for r in rows if not r.matched]
    assert not stale, f'rows of {PAGE.name} that explain no difference (stale): {stale}'


def test_pairs_are_found_for_most_configs() -> None:
    """The pairing finds upstream's conversion for most configs (counts in the docs page)."""
    least = {'mmdet': 500, 'mmseg': 550, 'mmcls': 180, 'mmedit': 50, 'mmgen': 30}
    for codebase in OLD:
        pairs, old_root, new_root = _pairs(codebase)
        paired = [p for p in pairs.values() if p.new is not None]
        assert len(paired) >= least[codebase], (codebase, len(paired))
        for pair in paired:
            assert (old_root / pair.old).is_file() and (new_root / pair.new).is_file()
        news = [p.new for p in paired]
        assert len(news) - len(set(news)) < len(news) // 4, 'most pairs are one to one'
