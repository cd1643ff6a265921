"""The packaging promises: README's commands, CI, dependencies, the public API."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import fp16utils

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    quick = ROOT.joinpath('README.md').read_text().split('## Quick start', 1)[1]
    quick = quick.split('\n## ', 1)[0]
    return re.findall(r'```bash\n(.+?)\n```', quick)


def test_readme_quick_start_has_the_two_commands():
    install_and_run, install_and_test = readme_commands()[:2]
    assert install_and_run == 'pip install -e . && fp16utils demo'
    assert '.[test]' in install_and_test and 'pytest' in install_and_test


def test_ci_runs_exactly_the_readme_test_command_after_torch():
    lines = [ln.strip() for ln in ROOT.joinpath('.ci', 'run').read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith('#')]
    test_command = readme_commands()[1]
    assert test_command in lines
    torch_line = next(i for i, ln in enumerate(lines) if 'torch==2.13.0' in ln)
    assert torch_line < lines.index(test_command)
    assert 'set -euo pipefail' in lines


def test_runtime_dependencies_are_torch_numpy_packaging_only():
    tree = ast.parse(ROOT.joinpath('setup.py').read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, 'id', '') == 'setup')
    kw = {k.arg: k.value for k in call.keywords}
    requires = ast.literal_eval(kw['install_requires'])
    assert sorted(re.split(r'[<>=!~ ]', r, maxsplit=1)[0] for r in requires) == [
        'numpy', 'packaging', 'torch']
    torch_req = next(r for r in requires if r.startswith('torch'))
    from packaging.specifiers import SpecifierSet
    spec = SpecifierSet(torch_req[len('torch'):])
    # From the oldest supported torch (the compat tier's) to any newer one.
    assert {'1.13.0', '1.13.1', '2.0.1', '2.13.0', '2.14.1', '3.0.0'} <= set(
        spec.filter(['1.12.1', '1.13.0', '1.13.1', '2.0.1', '2.13.0', '2.14.1', '3.0.0']))
    assert '1.12.1' not in spec
    extras = ast.literal_eval(kw['extras_require'])
    assert {'pytest', 'hypothesis'} <= {re.split(r'[<>=]', r)[0] for r in extras['test']}
    assert 'fp16utils=fp16utils.cli:main' in ast.literal_eval(kw['entry_points'])[
        'console_scripts']


def test_package_is_typed_and_versioned():
    assert ROOT.joinpath('fp16utils', 'py.typed').is_file()
    assert re.fullmatch(r'\d+\.\d+\.\d+', fp16utils.__version__)
    assert '## [Unreleased]' in ROOT.joinpath('CHANGELOG.md').read_text()


def test_public_api_is_all_exported_and_documented():
    assert len(set(fp16utils.__all__)) == len(fp16utils.__all__)
    for name in fp16utils.__all__:
        obj = getattr(fp16utils, name)
        if callable(obj):
            assert obj.__doc__ and obj.__doc__.strip(), name
            assert 'Example' in obj.__doc__ or '>>>' in obj.__doc__, name


def test_modules_import_only_downward():
    """_torch <- cast <- decorators/wrap <- scaler <- optim <- hooks <- migrate/debug <- cli."""
    order = ['_torch', 'cast', 'decorators', 'wrap', 'scaler', 'optim', 'hooks', 'migrate',
             'debug', 'demo', 'cli']
    rank = {name: i for i, name in enumerate(order)}
    rank.update(decorators=2, wrap=2, migrate=7, debug=7)
    for name in order:
        tree = ast.parse(ROOT.joinpath('fp16utils', f'{name}.py').read_text())
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom) and node.level == 1:
                target = (node.module or '').split('.')[0]
                if target and target in rank:
                    assert rank[target] < rank[name] or target == name, (name, target)
                    assert target != 'cli', name


def _setup_keyword(name):
    tree = ast.parse(ROOT.joinpath('setup.py').read_text())
    call = next(n for n in ast.walk(tree) if isinstance(n, ast.Call)
                and getattr(n.func, 'id', '') == 'setup')
    return ast.literal_eval(next(k.value for k in call.keywords if k.arg == name))


def test_the_code_parses_as_the_oldest_declared_python():
    oldest = tuple(int(p) for p in _setup_keyword('python_requires').lstrip('>=').split('.'))
    assert oldest == (3, 8)
    for path in sorted(ROOT.joinpath('fp16utils').rglob('*.py')) + [ROOT / 'setup.py']:
        ast.parse(path.read_text(), str(path), feature_version=oldest)


def test_compat_tier_runs_the_oldest_supported_torch_and_checks_pip_keeps_it():
    compat = ROOT.joinpath('.ci', 'compat').read_text()
    oldest = re.search(r'^version=\$\{1:-([0-9.]+)\}$', compat, re.M).group(1)
    torch_req = next(r for r in _setup_keyword('install_requires') if r.startswith('torch'))
    assert torch_req.split('#')[0].strip() == f'torch>={oldest.rsplit(".", 1)[0]}'
    assert 'pip install --disable-pip-version-check -e ".[test]"' in compat
    assert 'replaced torch' in compat and 'exit 0' in compat  # no network: skip, not fail
    matrix = ROOT.joinpath('.ci', 'matrix').read_text()
    versions = re.search(r'versions=\(([0-9. ]+)\)', matrix).group(1).split()
    assert versions[0] == oldest and '2.13.0' in versions
