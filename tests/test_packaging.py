"""The packaging promises: README's commands, CI, dependencies, the public API."""

from __future__ import annotations

import ast
import importlib
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

import fp16utils

ROOT = Path(__file__).resolve().parents[1]


#: The test command, as README.md gives it and .ci/run runs it.
TEST_COMMAND = 'pip install -e ".[test]" && python -m pytest -q'


def readme_commands() -> list[str]:
    """The bash blocks of README.md, each as one string."""
    text = ROOT.joinpath('README.md').read_text()
    return [block.strip() for block in re.findall(r'```bash\n(.+?)```', text, re.S)]


def test_readme_gives_the_install_the_demo_and_the_test_command():
    commands = readme_commands()
    assert 'pip install -e .' in [line for c in commands for line in c.splitlines()]
    assert any(re.fullmatch(r'fp16utils demo( --steps \d+)?', c) for c in commands), commands
    assert TEST_COMMAND in commands


def test_ci_runs_exactly_the_readme_test_command_after_torch():
    lines = [ln.strip() for ln in ROOT.joinpath('.ci', 'run').read_text().splitlines()
             if ln.strip() and not ln.lstrip().startswith('#')]
    assert TEST_COMMAND in readme_commands()
    assert TEST_COMMAND in lines
    torch_line = next(i for i, ln in enumerate(lines) if 'torch==2.13.0' in ln)
    assert torch_line < lines.index(TEST_COMMAND)
    assert 'set -euo pipefail' in lines


#: Where PyTorch serves its CPU-only wheels.
CPU_INDEX = 'https://download.pytorch.org/whl/cpu'
#: How README.md says to build the site.
DOCS_COMMAND = 'pip install -e ".[docs]" && mkdocs build --strict'


def readme_section(title: str) -> str:
    """The text of README.md's ``## title`` section."""
    text = ROOT.joinpath('README.md').read_text()
    return re.search(rf'^## {re.escape(title)}\n(.*?)(?=^## |\Z)', text, re.M | re.S).group(1)


def test_readme_install_puts_the_cpu_only_torch_before_the_project():
    install = [line.split('#')[0].strip() for block in re.findall(
        r'```bash\n(.+?)```', readme_section('Install'), re.S) for line in block.splitlines()]
    torch_cpu = f'pip install torch --index-url {CPU_INDEX}'
    assert torch_cpu in install and 'pip install -e .' in install, install
    assert install.index(torch_cpu) < install.index('pip install -e .')
    # The install page gives the same index for its pinned CPU build.
    page = ROOT.joinpath('docs', 'getting-started', 'install.md').read_text()
    assert re.search(rf'^pip install torch==[0-9.]+ --index-url {re.escape(CPU_INDEX)}$',
                     page, re.M)


def test_readme_says_why_the_quick_start_uses_bfloat16_without_promising_speed():
    text = ' '.join(readme_section('In short').split('```python')[0].split())
    assert 'runs fast' not in text, text
    assert 'needs no loss scaling' in text and 'slower than float32' in text, text


def _docs_tier_pins() -> dict:
    """The PINS of .ci/docs: name (lower case) -> version."""
    script = ROOT.joinpath('.ci', 'docs').read_text()
    pins = re.search(r'^PINS=\((.*?)\)$', script, re.M | re.S).group(1).split()
    return {p.split('==')[0].lower(): p.split('==')[1] for p in pins}


def test_the_docs_extra_pins_what_the_docs_tier_installs():
    extra = _setup_keyword('extras_require')['docs']
    pinned = dict(r.lower().split('==') for r in extra)
    assert all('==' in r for r in extra), extra
    assert {'mkdocs', 'mkdocs-material', 'mkdocstrings', 'mkdocstrings-python'} <= set(pinned)
    # A formatter: with separate_signature, mkdocstrings formats long signatures with it.
    assert {'ruff', 'black'} & set(pinned), extra
    assert re.search(r'^\s+separate_signature: true$',
                     ROOT.joinpath('mkdocs.yml').read_text(), re.M)
    tier = _docs_tier_pins()
    assert {name: tier.get(name) for name in pinned} == pinned


def test_readme_and_the_install_page_give_the_docs_command():
    assert f'`{DOCS_COMMAND}`' in readme_section('Development')
    page = ROOT.joinpath('docs', 'getting-started', 'install.md').read_text()
    assert 'pip install -e ".[docs]"' in page and '`mkdocs build --strict`' in page


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
    assert 'fp16utils=fp16utils.tools.cli:main' in ast.literal_eval(kw['entry_points'])[
        'console_scripts']


def test_package_is_typed_and_versioned():
    assert ROOT.joinpath('fp16utils', 'py.typed').is_file()
    assert re.fullmatch(r'\d+\.\d+\.\d+', fp16utils.__version__)
    assert '## [Unreleased]' in ROOT.joinpath('CHANGELOG.md').read_text()


def newest_release(changelog: str) -> str:
    """The version of the first release heading, ``## [X.Y.Z] - YYYY-MM-DD``."""
    releases = re.findall(r'^## \[(\d+\.\d+\.\d+)\] - \d{4}-\d{2}-\d{2}$', changelog, re.M)
    assert releases, 'CHANGELOG.md has no release heading "## [X.Y.Z] - YYYY-MM-DD"'
    return releases[0]


def test_the_version_is_the_newest_release_of_the_changelog_everywhere():
    changelog = ROOT.joinpath('CHANGELOG.md').read_text()
    newest = newest_release(changelog)
    assert changelog.index('## [Unreleased]') < changelog.index(f'## [{newest}]')
    assert fp16utils.__version__ == newest
    # setup.py reads the version from the package: the distribution has the same one.
    done = subprocess.run([sys.executable, 'setup.py', '--version'], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().splitlines()[-1] == newest
    # pyproject.toml declares no version of its own (or the same one).
    declared = re.findall(r'^version\s*=\s*["\']([^"\']+)["\']',
                          ROOT.joinpath('pyproject.toml').read_text(), re.M)
    assert set(declared) <= {newest}
    cli = subprocess.run([sys.executable, '-m', 'fp16utils', '--version'], cwd=str(ROOT),
                         capture_output=True, text=True, timeout=120)
    assert cli.stdout.strip() == f'fp16utils {newest}'


@pytest.mark.parametrize('text, newest', [
    ('## [Unreleased]\n\n## [0.2.0] - 2027-01-02\n\n## [0.1.0] - 2026-11-25\n', '0.2.0'),
    ('## [Unreleased]\n### Added\n- x\n\n## [1.0.0] - 2026-11-25\n', '1.0.0')])
def test_newest_release_is_the_first_heading(text, newest):
    assert newest_release(text) == newest


def test_a_changelog_without_a_release_is_caught():
    with pytest.raises(AssertionError, match='no release heading'):
        newest_release('## [Unreleased]\n\n## 0.1.0\n')


def test_public_api_is_all_exported_and_documented():
    assert len(set(fp16utils.__all__)) == len(fp16utils.__all__)
    for name in fp16utils.__all__:
        obj = getattr(fp16utils, name)
        if callable(obj):
            assert obj.__doc__ and obj.__doc__.strip(), name
            assert 'Example' in obj.__doc__ or '>>>' in obj.__doc__, name


def fresh_python(code: str) -> str:
    """Run ``code`` in a new interpreter (this checkout first on the path); its stdout."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get('PYTHONPATH')])]))
    proc = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return proc.stdout


def test_import_fp16utils_is_lazy_and_the_api_resolves_on_access():
    out = fresh_python(
        'import sys, fp16utils\n'
        'print(fp16utils.__file__)\n'
        'print(sorted(m for m in sys.modules if "torch" in m or "numpy" in m))\n'
        'print(set(fp16utils.__all__) <= set(dir(fp16utils)))\n'
        'from fp16utils import scan, convert_config\n'
        'print("torch" in sys.modules)\n'
        'print(fp16utils.TORCH_VERSION == __import__("torch").__version__)\n')
    path, before, listed, torch_after_migrate, version = out.splitlines()
    assert Path(path) == ROOT / 'fp16utils' / '__init__.py'
    assert before == '[]'
    assert listed == 'True'
    assert torch_after_migrate == 'False'
    assert version == 'True'


def test_lazy_exports_match_all_and_the_type_checking_imports():
    exports = fp16utils._EXPORTS
    assert set(exports) == set(fp16utils.__all__) - {'__version__'}
    for name, module in exports.items():
        defined = getattr(importlib.import_module(f'fp16utils.{module}'), name)
        assert getattr(fp16utils, name) is defined, name
        namespace: dict[str, object] = {}
        exec(f'from fp16utils import {name} as imported', namespace)
        assert namespace['imported'] is defined, name
    # What type checkers see (the `if TYPE_CHECKING:` imports) is the same mapping.
    tree = ast.parse(ROOT.joinpath('fp16utils', '__init__.py').read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If)
                 and getattr(n.test, 'id', '') == 'TYPE_CHECKING')
    seen = {a.name: node.module for node in block.body if isinstance(node, ast.ImportFrom)
            for a in node.names}
    assert seen == exports


def test_submodules_stay_reachable_as_attributes_and_unknown_names_fail():
    assert fp16utils.migrate is importlib.import_module('fp16utils.migrate')
    with pytest.raises(AttributeError, match="fp16utils' has no attribute 'nope'"):
        fp16utils.nope  # noqa: B018
    assert not hasattr(fp16utils, 'cli_main')


# ----------------------------------------------------------------- layering

#: The layers of the package, lowest first. A module may import from a lower layer and
#: from inside its own package (``optim/``, ``engine/``, ...), never from its own layer or a
#: higher one; inside a package, :func:`cycles` keeps the imports acyclic. A module or
#: package on disk but not here fails the test.
LAYERS: list[set[str]] = [
    {'_args'},
    {'_torch'},
    {'precision'},
    {'cast'},
    {'_cast_plan'},
    {'decorators'},
    {'fp32_modules', 'fp32_ops'},
    {'wrap'},
    {'scaler', 'records'},
    {'debug'},
    {'engine'},
    {'optim'},
    {'hooks'},
    {'evaluation'},
    {'skip_proxy'},
    {'mmcv', 'mmengine'},
    {'migrate'},
    {'tools'},
    {'__main__'},
]
RANK = {name: i for i, layer in enumerate(LAYERS) for name in layer}
#: Names a module may take from the package's ``__init__`` (defined there, importing
#: nothing); anything else comes from the module that defines it.
PACKAGE_NAMES = {'__version__'}


def package_modules(package: Path) -> dict[str, Path]:
    """Every module of ``package`` on disk, subpackages included: dotted name -> file."""
    modules = {}
    for path in sorted(package.rglob('*.py')):
        parts = path.relative_to(package.parent).with_suffix('').parts
        modules['.'.join(parts[:-1] if parts[-1] == '__init__' else parts)] = path
    return modules


def imports_of(name: str, path: Path) -> Iterator[tuple[int, str, str]]:
    """(line, module, imported name or '') for everything a module imports, in any form.

    ``import a.b`` gives ``('a.b', '')``, ``from a import b`` gives ``('a', 'b')``;
    relative imports are resolved against the module's package. Imports inside
    functions, classes and ``if TYPE_CHECKING:`` blocks count too.
    """
    package = name if path.name == '__init__.py' else name.rpartition('.')[0]
    for node in ast.walk(ast.parse(path.read_text(encoding='utf-8'), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name, ''
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ''
            if node.level:
                parts = package.split('.')
                assert node.level <= len(parts), f'{path}:{node.lineno}: import beyond the top'
                base = '.'.join([*parts[: len(parts) - node.level + 1], *filter(None, [base])])
            for alias in node.names:
                yield node.lineno, base, '' if alias.name == '*' else alias.name


def is_stdlib(module: str) -> bool:
    top = module.partition('.')[0]
    return top in sys.stdlib_module_names or top == '__future__'


def stdlib_only(name: str, path: Path, allowed: frozenset = frozenset()) -> bool:
    return all(is_stdlib(module) or module in allowed or module.startswith(
        tuple(f'{a}.' for a in allowed)) for _, module, _ in imports_of(name, path))


def stdlib_shared(top: str, modules: dict[str, Path]) -> set[str]:
    """``{'_args'}`` when every module of the argument rules imports the standard library
    and the rules only (so ``migrate`` may use them without torch), else nothing."""
    rules = {n: p for n, p in modules.items() if n == f'{top}._args'
             or n.startswith(f'{top}._args.')}
    if rules and all(stdlib_only(n, p, frozenset({f'{top}._args'})) for n, p in rules.items()):
        return {'_args'}
    return set()


def module_graph(package: Path) -> dict[str, set[str]]:
    """Module -> the package's modules it imports (lazy imports included).

    ``from .x import y`` is an edge to ``x``, or to ``x.y`` where that is a module;
    ``from . import y`` to the submodule ``y``, or to the package ``__init__``. The top
    ``__init__`` only re-exports (lazily): its own imports are not edges.
    """
    modules = package_modules(package)
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        if name == package.name:
            graph[name] = set()
            continue
        edges = set()
        for _, module, imported in imports_of(name, path):
            if f'{module}.{imported}' in modules:
                edges.add(f'{module}.{imported}')
            elif module in modules:
                edges.add(module)
        graph[name] = edges - {name}
    return graph


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Every import cycle of ``graph`` once, as the list of its modules (Tarjan's SCCs)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def layering_errors(package: Path) -> list[str]:
    """Every import inside ``package`` that breaks the layering, one line each."""
    top = package.name
    modules = package_modules(package)
    migrate_may_import = {'migrate'} | stdlib_shared(top, modules)
    on_disk = {m.split('.')[1] for m in modules if m != top}
    errors = []
    for name, path in modules.items():
        if name == top:
            continue  # __init__ re-exports everything
        layer = name.split('.')[1]
        where = path.relative_to(package.parent)
        if layer not in RANK:
            errors.append(f'{where}: module {layer!r} has no layer: give it a rank in LAYERS')
            continue
        for line, module, imported in imports_of(name, path):
            if module.partition('.')[0] != top:
                continue
            at = f'{where}:{line}: {module}' + (f' ({imported})' if imported else '')
            if module == top:  # import fp16utils / from fp16utils import x / from . import x
                if imported in RANK or imported in on_disk:
                    target_layer = imported
                elif imported in PACKAGE_NAMES:
                    continue
                else:
                    errors.append(f'{at}: import it from the module that defines it, not '
                                  f'from the package (only {sorted(PACKAGE_NAMES)} come from '
                                  'there)')
                    continue
            else:
                target_layer = module.split('.')[1]
            if target_layer == layer:
                continue  # inside a package: cycles() checks these
            if target_layer not in RANK:
                errors.append(f'{at}: module {target_layer!r} has no layer: give it a rank')
            elif target_layer == 'tools' and layer != '__main__':
                errors.append(f'{at}: nothing imports tools (only __main__ runs the command)')
            elif layer == 'migrate' and target_layer not in migrate_may_import:
                errors.append(f'{at}: migrate imports the standard library and itself only')
            elif RANK[target_layer] >= RANK[layer]:
                errors.append(f'{at}: imports upward ({layer} is not above {target_layer})')
    return errors


def test_modules_import_only_downward():
    """_args <- _torch <- precision <- cast <- _cast_plan <- decorators <- fp32_modules <- wrap
    <- scaler/records <- debug <- engine <- optim <- hooks <- skip_proxy <- mmcv/mmengine
    <- migrate <- tools <- __main__."""
    errors = layering_errors(ROOT / 'fp16utils')
    assert not errors, '\n'.join(errors)


def test_no_import_cycle_inside_or_across_packages():
    assert cycles(module_graph(ROOT / 'fp16utils')) == []


def test_no_module_hides_an_import_behind_a_module_getattr():
    """A module-level ``__getattr__`` outside a package ``__init__`` hides an import cycle."""
    found = [str(p.relative_to(ROOT)) for p in ROOT.joinpath('fp16utils').rglob('*.py')
             if p.name != '__init__.py' and any(
                 isinstance(n, ast.FunctionDef) and n.name == '__getattr__'
                 for n in ast.parse(p.read_text()).body)]
    assert found == []


@pytest.mark.parametrize('files, cycle', [
    ({'optim/__init__.py': '', 'optim/amp.py': 'def f():\n    from .builder import g',
      'optim/builder.py': 'from .amp import A'},
     ['fp16utils.optim.amp', 'fp16utils.optim.builder']),
    ({'engine/__init__.py': 'from .driver import D', 'engine/driver.py': 'from ..engine import X'},
     ['fp16utils.engine', 'fp16utils.engine.driver']),
    ({'engine/__init__.py': '', 'engine/a.py': 'from . import b', 'engine/b.py': 'from . import c',
      'engine/c.py': 'import fp16utils.engine.a'},
     ['fp16utils.engine.a', 'fp16utils.engine.b', 'fp16utils.engine.c']),
])
def test_cycle_check_sees_inside_a_package(tmp_path, files, cycle):
    package = make_package(tmp_path, {'__init__.py': '', **files})
    assert cycles(module_graph(package)) == [cycle]


def test_training_styles_use_no_private_name_of_a_lower_module():
    """The wrappers and the hooks are thin users of the engine's public API.

    They may take module objects (``from .._torch import versions``) and the names of the
    argument rules (``_args``), but no ``_private`` name from any module outside their
    own package.
    """
    package = ROOT / 'fp16utils'
    errors = []
    for name, path in package_modules(package).items():
        layer = name.split('.')[1] if '.' in name else ''
        if layer not in ('optim', 'hooks', 'engine'):
            continue
        for line, module, imported in imports_of(name, path):
            parts = module.split('.')
            if parts[0] != 'fp16utils' or len(parts) < 2 or parts[1] == layer:
                continue
            if imported.startswith('_') and parts[1] != '_args':
                errors.append(f'{path.relative_to(ROOT)}:{line}: {module}.{imported}')
    assert not errors, '\n'.join(errors)


def make_package(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        root.joinpath('fp16utils', name).parent.mkdir(parents=True, exist_ok=True)
        root.joinpath('fp16utils', name).write_text(text)
    return root / 'fp16utils'


@pytest.mark.parametrize('files, needle', [
    ({'cast.py': 'import fp16utils.scaler'}, 'cast.py:1: fp16utils.scaler: imports upward'),
    ({'cast.py': 'from fp16utils.wrap import x'}, 'cast.py:1: fp16utils.wrap (x): imports upward'),
    ({'cast.py': 'def f():\n    from .scaler import y'}, 'cast.py:2: fp16utils.scaler (y)'),
    ({'cast.py': 'from . import hooks'}, 'cast.py:1: fp16utils (hooks): imports upward'),
    ({'decorators.py': 'from .wrap import z'}, 'decorators.py:1: fp16utils.wrap (z): imports up'),
    ({'optim/__init__.py': '', 'optim/step.py': 'from ..hooks.optimizer import H'},
     'optim/step.py:1: fp16utils.hooks.optimizer (H): imports up'),
    ({'engine/__init__.py': '', 'engine/a.py': 'from ..optim.amp import A'},
     'engine/a.py:1: fp16utils.optim.amp (A): imports upward (engine is not above optim)'),
    ({'migrate/__init__.py': '', 'migrate/a.py': 'from .._torch import versions'},
     'migrate/a.py:1: fp16utils._torch (versions): migrate imports the standard'),
    ({'migrate/__init__.py': 'from .._args.spec import parse', '_args/__init__.py': '',
      '_args/spec.py': 'import torch'},
     'migrate/__init__.py:1: fp16utils._args.spec (parse): migrate imports the standard library'),
    ({'debug.py': 'from .tools.cli import main', 'tools/__init__.py': ''},
     'nothing imports tools'),
    ({'hooks/__init__.py': 'from .. import auto_fp16'},
     'import it from the module that defines it'),
    ({'hooks/base.py': 'import fp16utils'}, 'import it from the module that defines it'),
    ({'shiny.py': ''}, "module 'shiny' has no layer: give it a rank"),
    ({'extras/__init__.py': ''}, "module 'extras' has no layer"),
    ({'hooks/base.py': 'from ..shiny import x'}, "module 'shiny' has no layer"),
])
def test_layering_check_catches(tmp_path, files, needle):
    package = make_package(tmp_path, {'__init__.py': 'from .hooks import *',
                                      'hooks/__init__.py': '', 'scaler.py': '', 'wrap.py': '',
                                      **files})
    errors = layering_errors(package)
    assert any(needle in e for e in errors), errors


def test_layering_check_allows_downward_and_internal_imports(tmp_path):
    package = make_package(tmp_path, {
        '__init__.py': 'from .tools.cli import main\nfrom .hooks import H',
        '__main__.py': 'from .tools.cli import main',
        'tools/__init__.py': '',
        'tools/cli.py': 'from .. import __version__\nfrom .._torch import versions\n'
                        'def f():\n    from ..migrate import scan',
        'hooks/__init__.py': 'from .optimizer import H',
        'hooks/optimizer.py': 'import fp16utils.optim.step\nfrom ..engine import Engine',
        'optim/__init__.py': 'from .step import S\nfrom . import step',
        'optim/step.py': 'from ..scaler import L\nfrom fp16utils.optim import other',
        'optim/other.py': '',
        'migrate/__init__.py': 'from .scan import scan\nimport os, ast',
        'migrate/scan.py': 'from ._source import x\nfrom .._args.spec import parse',
        '_args/__init__.py': '',
        '_args/spec.py': 'import math\nfrom .numbers import as_whole',
        '_args/numbers.py': 'import math',
    })
    assert layering_errors(package) == []
    assert cycles(module_graph(package)) == []


def test_migrate_imports_the_standard_library_and_itself_only():
    modules = package_modules(ROOT / 'fp16utils')
    allowed = ('fp16utils.migrate',) + tuple(
        f'fp16utils.{name}' for name in sorted(stdlib_shared('fp16utils', modules)))
    found = [(name, line, module, imported)
             for name, path in modules.items() if name.startswith('fp16utils.migrate')
             for line, module, imported in imports_of(name, path)
             if not is_stdlib(module)
             and not any(f'{module}.{imported}'.startswith(f'{a}.') for a in allowed)]
    assert len([n for n in modules if n.startswith('fp16utils.migrate')]) > 1
    assert found == []


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
    # No network: skip (.ci/_tier.sh's tier_skip exits 0), not fail.
    assert 'replaced torch' in compat and '. .ci/_tier.sh' in compat
    skip = re.search(r'^tier_skip\(\) \{\n(.*?)\n\}', ROOT.joinpath('.ci', '_tier.sh').read_text(),
                     re.M | re.S).group(1)
    assert 'exit 0' in skip
    matrix = ROOT.joinpath('.ci', 'matrix').read_text()
    versions = re.search(r'versions=\(([0-9. ]+)\)', matrix).group(1).split()
    assert versions[0] == oldest and '2.13.0' in versions
