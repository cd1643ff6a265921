"""Where the OpenMMLab releases are: the unpacked archives under FP16UTILS_WHEELS_DIR.

``.ci/migration`` downloads the releases (``pip download --no-deps``) and unpacks each
archive into a folder named after it (``mmdet-2.28.2-py3-none-any/``, ``mmgen-0.7.3/``);
the tests only read their config files, nothing of them is imported. Without the
variable the tests skip, saying so; with it, a release that is not there is an error.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib.util import find_spec
from pathlib import Path
from typing import Iterator, Optional

import pytest

ENV = 'FP16UTILS_WHEELS_DIR'


@dataclass(frozen=True)
class Release:
    """One release: its distribution name, version, package folder and 0.x codebase."""

    dist: str
    version: str
    package: str
    codebase: str  # the 0.x codebase whose configs it holds (mmagic: two of them)

    @property
    def name(self) -> str:
        return f'{self.dist}-{self.version}'


#: The 0.x releases whose configs are converted, by codebase.
OLD = {
    'mmdet': Release('mmdet', '2.28.2', 'mmdet', 'mmdet'),
    'mmseg': Release('mmsegmentation', '0.30.0', 'mmseg', 'mmseg'),
    'mmcls': Release('mmcls', '0.25.0', 'mmcls', 'mmcls'),
    'mmedit': Release('mmedit', '0.16.1', 'mmedit', 'mmedit'),
    'mmgen': Release('mmgen', '0.7.3', 'mmgen', 'mmgen'),
}
#: Each 0.x codebase's 1.x successor (mmagic took over mmedit and mmgen).
NEW = {
    'mmdet': Release('mmdet', '3.3.0', 'mmdet', 'mmdet'),
    'mmseg': Release('mmsegmentation', '1.2.2', 'mmseg', 'mmseg'),
    'mmcls': Release('mmpretrain', '1.2.0', 'mmpretrain', 'mmcls'),
    'mmedit': Release('mmagic', '1.2.0', 'mmagic', 'mmedit'),
    'mmgen': Release('mmagic', '1.2.0', 'mmagic', 'mmgen'),
}


def wheels_dir() -> Optional[Path]:
    """The folder FP16UTILS_WHEELS_DIR names, or None when it is not set."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def require() -> Path:
    """The releases' folder; skips the calling test module without mmengine or the folder."""
    spec = find_spec('mmengine')
    if spec is None or spec.origin is None:  # absent, or only tests/mmengine (a namespace)
        pytest.skip('mmengine is not installed: run .ci/migration for this tier',
                    allow_module_level=True)
    base = wheels_dir()
    if base is None:
        pytest.skip(f'{ENV} is not set: .ci/migration downloads the OpenMMLab releases and '
                    'sets it', allow_module_level=True)
    if not base.is_dir():
        raise FileNotFoundError(f'{ENV}={base} is not a folder')
    return base


def release_root(base: Path, release: Release) -> Path:
    """The unpacked archive of ``release`` under ``base`` (one folder per archive)."""
    found = sorted(p for p in base.glob(f'{release.dist}-{release.version}*') if p.is_dir())
    if not found:
        raise FileNotFoundError(
            f'{ENV}={base} has no folder {release.dist}-{release.version}*: run .ci/migration, '
            'which downloads and unpacks the releases there')
    return found[0]


def configs_dir(base: Path, release: Release) -> Path:
    """The ``configs`` folder a release ships (``PKG/.mim/configs``, or ``configs/``)."""
    root = release_root(base, release)
    for candidate in (root / release.package / '.mim' / 'configs', root / 'configs'):
        if candidate.is_dir():
            return candidate
    raise FileNotFoundError(f'{root} holds no configs folder ({release.package}/.mim/configs '
                            'or configs/)')


def is_base(path: Path, root: Path) -> bool:
    """A ``_base_`` file (a part other configs inherit from, not a config of its own)."""
    return '_base_' in path.relative_to(root).parts


def iter_configs(root: Path) -> Iterator[Path]:
    """Every config of a release that is not a ``_base_`` file, in a stable order."""
    for path in sorted(root.rglob('*.py')):
        if not is_base(path, root) and path.name != '__init__.py':
            yield path
