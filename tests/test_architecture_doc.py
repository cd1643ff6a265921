"""The architecture page (docs/design/architecture.md) matches the package: every module
its table names exists, and every module of the package is named there."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / 'docs' / 'design' / 'architecture.md'
PACKAGE = ROOT / 'fp16utils'
#: Packages whose every submodule the table names in its row.
DESCRIBED_PACKAGES = ('_torch', 'engine', 'optim')


def _rows() -> list:
    text = PAGE.read_text()
    table = text.split('\n| layer | modules | what it owns |\n', 1)[1].split('\n\n', 1)[0]
    rows = [line for line in table.splitlines() if line.startswith('| ')]
    rows = [r for r in rows if not r.startswith('|---')]
    assert len(rows) >= 10
    return [[cell.strip() for cell in row.strip('|').split('|')] for row in rows]


def _top_level() -> set:
    names = {p.stem for p in PACKAGE.glob('*.py')} | {
        p.name for p in PACKAGE.iterdir() if (p / '__init__.py').is_file()}
    return names - {'__init__', '__main__'}


def _named(cell: str) -> list:
    return [name.rstrip('/') for name in re.findall(r'`([A-Za-z_][\w]*/?)`', cell)]


def test_every_module_the_table_names_exists():
    for layer, modules, _ in _rows():
        for name in _named(modules):
            assert (PACKAGE / f'{name}.py').is_file() or (PACKAGE / name / '__init__.py'
                                                          ).is_file(), (layer, name)


def test_every_module_of_the_package_has_a_row():
    named = {name for _, modules, _ in _rows() for name in _named(modules)}
    assert sorted(_top_level() - named) == []


@pytest.mark.parametrize('package', DESCRIBED_PACKAGES)
def test_every_submodule_of_a_described_package_is_named_in_its_row(package):
    row = next(r for r in _rows() if f'`{package}/`' in r[1])
    described = set(re.findall(r'`(\w+)`', row[2]))
    submodules = {p.stem for p in (PACKAGE / package).glob('*.py')} - {'__init__'}
    assert sorted(submodules - described) == []


def test_no_module_of_the_package_reaches_500_lines():
    """Small modules, one concept each: a file that grows past the limit is split."""
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob('*.py')
            if (n := len(p.read_text(encoding='utf-8').splitlines())) >= 500}
    assert long == {}
