"""Every 0.x config of the five releases, read and converted once per test session."""

from __future__ import annotations

import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Dict, List, Optional

from _wheels import OLD, configs_dir, iter_configs

from fp16utils.migrate import load_config, migrate_config
from fp16utils.migrate.errors import CommandError

#: The one reading failure that is the release's, not ours: a ``_base_`` it does not ship.
MISSING_BASE = re.compile(r': _base_ file (?P<base>.+) does not exist$')


@dataclass
class Converted:
    """One 0.x config: what it read as and what ``migrate_config`` made of it."""

    codebase: str
    path: Path
    rel: str  # relative to the release's configs folder, with '/'
    old: Optional[Dict[str, Any]] = None
    report: Any = None  # MigrationReport with plugin=True
    missing_base: Optional[str] = None  # the _base_ file the release lacks
    error: Optional[str] = None  # anything else that went wrong (a test fails on it)
    upstream_form: Optional[Dict[str, Any]] = None  # plugin=False, MMEngine's own names
    extra: Dict[str, Any] = field(default_factory=dict)


_CACHE: Dict[str, List[Converted]] = {}


def converted(base: Path, codebase: str) -> List[Converted]:
    """The configs of one 0.x release, converted with ``plugin=True`` (cached)."""
    if codebase in _CACHE:
        return _CACHE[codebase]
    root = configs_dir(base, OLD[codebase])
    records = []
    for path in iter_configs(root):
        record = Converted(codebase, path, path.relative_to(root).as_posix())
        records.append(record)
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')  # _deprecation_ notices: read as mmcv reads them
            try:
                record.old = load_config(path)
            except CommandError as err:
                found = MISSING_BASE.search(str(err))
                if found and not Path(found['base']).exists():
                    record.missing_base = found['base']
                else:
                    record.error = f'load_config: {type(err).__name__}: {err}'
                continue
            except Exception as err:  # noqa: BLE001 - every failure is reported by the test
                record.error = f'load_config: {type(err).__name__}: {err}'
                continue
            try:
                record.report = migrate_config(record.old, plugin=True, path=path)
                record.upstream_form = migrate_config(record.old, path=path).config
            except Exception as err:  # noqa: BLE001 - as above
                record.error = f'migrate_config: {type(err).__name__}: {err}'
    _CACHE[codebase] = records
    return records
