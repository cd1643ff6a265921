"""The architecture page (docs/design/architecture.md) matches the package: every module
its table names exists, and every module of the package is named there; and the package
stays readable: small modules, few loose at the top, docstrings a quarter of the lines."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / 'docs' / 'design' / 'architecture.md'
PACKAGE = ROOT / 'fp16utils'
#: Packages whose every submodule the table names in its row.
DESCRIBED_PACKAGES = ('_torch', '_args', 'engine', 'optim', 'hooks', 'tools')


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


#: The most lines a module may have; one that grows past it is split by concept.
MAX_LINES = 400
#: The most modules loose at the package's top level (``__init__``/``__main__`` included).
MAX_TOP_LEVEL = 15
#: The largest share of the package's lines that docstrings may take.
MAX_DOCSTRING_SHARE = 0.25


def test_no_module_of_the_package_exceeds_the_line_limit():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob('*.py')
            if (n := len(p.read_text(encoding='utf-8').splitlines())) > MAX_LINES}
    assert long == {}


def test_few_modules_are_loose_at_the_top_level():
    loose = sorted(p.name for p in PACKAGE.glob('*.py'))
    assert len(loose) <= MAX_TOP_LEVEL, loose


def docstring_lines(source: str) -> int:
    """How many lines of ``source`` are docstrings (module, class and function)."""
    lines = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return len(lines)


def test_docstring_lines_count_docstrings_only():
    source = '"""Module.\n\nMore."""\nx = """not a docstring"""\n\n\ndef f():\n    """One."""\n'
    assert docstring_lines(source) == 4


def test_docstrings_are_at_most_a_quarter_of_the_package():
    total = docs = 0
    for path in PACKAGE.rglob('*.py'):
        source = path.read_text(encoding='utf-8')
        total += len(source.splitlines())
        docs += docstring_lines(source)
    assert docs <= MAX_DOCSTRING_SHARE * total, f'{docs} of {total} lines ({docs / total:.0%})'


def _drawn_layers() -> list:
    """The layers the page's drawing names, top first: each line's leading names."""
    drawing = PAGE.read_text().split('```text\n', 1)[1].split('```', 1)[0]
    layers = []
    for line in drawing.splitlines():
        names = re.match(r'\s*([\w/]+(?:, [\w/]+)*)', line).group(1)
        layers.append({name.rstrip('/') for name in names.split(', ')})
    return layers


def test_the_drawing_shows_the_layers_the_layering_test_enforces():
    from test_packaging import LAYERS

    assert _drawn_layers() == LAYERS[::-1]
