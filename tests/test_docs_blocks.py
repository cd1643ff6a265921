"""Every code block of README.md and of every page under docs/ runs as it is written.

The rules, as a reader meets the pages:

- A ``python`` block without prompts is a script: it runs on its own, in a fresh
  namespace, in an empty working folder (what a user gets who pastes that one block).
- ``python`` blocks with ``>>>`` prompts are one interpreter session per page: they run
  in page order in one namespace, and their printed output is compared (doctest, with
  ELLIPSIS and NORMALIZE_WHITESPACE).
- A ``python`` block titled with a file of examples/ (```` ```python
  title="examples/x.py" ````) shows that script inline, so that the page reads the same
  in the repository as on the site: its text must be the file's, byte for byte, and it
  is not run here (tests/test_examples.py runs the file, with its arguments). No page
  pulls an example in with a snippet include (``--8<--``): only docs/changelog.md
  includes a file, CHANGELOG.md.
- ``bash`` / ``console`` / ``shell`` blocks run their commands (``$ `` prompts are
  stripped; ``pip install`` lines are not run: installing is tested in
  tests/test_packaging.py) from the root of the checkout, with ``fp16utils`` meaning
  ``python -m fp16utils``.
- Blocks of other languages (``text``, ``yaml``, ``toml``, ...) show output or data;
  they are not run.
- A block preceded by ``<!-- not run: REASON -->`` is reported as skipped with REASON
  (for commands that need a GPU or a cluster); ``tests/test_docs_blocks.py`` caps how
  many there may be.
- A block that imports mmcv, mmdet, mmseg or mmengine (or ``fp16utils.mmengine``) is
  skipped where that package is not installed: it runs in the tier that installs it
  (.ci/consumers, .ci/mmengine). A block that trains in float16 is skipped, naming the
  missing capability, where this torch cannot train float16 on the CPU (the rule of the
  root conftest.py for doctests). A shell block that runs a benchmark is skipped where
  the benchmark says it cannot measure (benchmarks/_support.py: no float16 kernels, no
  ``torch.amp.GradScaler``).
"""

from __future__ import annotations

import contextlib
import difflib
import doctest
import io
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from importlib.util import find_spec, module_from_spec, spec_from_file_location
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGES = [ROOT / 'README.md'] + sorted((ROOT / 'docs').rglob('*.md'))
#: At most this many blocks may be marked "not run" across all pages.
MAX_NOT_RUN = 6

_FENCE = re.compile(
    r'^(?P<indent>[ \t]*)(?P<fence>```+|~~~+)[ \t]*(?P<lang>[\w+-]*)(?P<info>[^\n]*)\n'
    r'(?P<body>.*?)^(?P=indent)(?P=fence)[ \t]*$', re.M | re.S)
_NOT_RUN = re.compile(r'<!--\s*not run:\s*(?P<why>.+?)\s*-->\s*$')
_SNIPPET = re.compile(r'^\s*-+8<-+\s+"(?P<path>[^"]+)"\s*$')
_SNIPPET_LINE = re.compile(r'^\s*-+8<-+', re.M)
#: The one page that may include a file through a snippet: the changelog.
SNIPPET_PAGES = {ROOT / 'docs' / 'changelog.md'}
_TITLE = re.compile(r'\btitle="(?P<path>[^"]+)"')
_NEEDS = re.compile(r'^\s*(?:import|from)\s+(mmcv|mmdet|mmseg|mmengine|fp16utils\.mmengine)\b',
                    re.M)
_SHELL = {'bash', 'sh', 'shell', 'console'}
_PYTHON = {'python', 'py', 'pycon'}


@dataclass
class Block:
    page: Path
    line: int
    lang: str
    body: str
    not_run: str | None
    info: str = ''

    @property
    def where(self) -> str:
        return f'{self.page.relative_to(ROOT)}:{self.line}'

    @property
    def example(self) -> str | None:
        """The examples/ file a titled ``python`` block shows (None: not an example)."""
        title = _TITLE.search(self.info)
        if self.lang in _PYTHON and title and title.group('path').startswith('examples/'):
            return title.group('path')
        return None


def blocks_of(page: Path) -> list:
    text = page.read_text()
    found = []
    for match in _FENCE.finditer(text):
        indent = match.group('indent')
        body = '\n'.join(line[len(indent):] if line.startswith(indent) else line
                         for line in match.group('body').splitlines()) + '\n'
        before = text[:match.start()].rstrip('\n').rsplit('\n', 1)[-1]
        not_run = _NOT_RUN.search(before)
        found.append(Block(page, text.count('\n', 0, match.start()) + 1,
                           match.group('lang').lower(), body,
                           not_run.group('why') if not_run else None, match.group('info')))
    return found


ALL = [block for page in PAGES for block in blocks_of(page)]


def _missing_package(body: str) -> str | None:
    for name in _NEEDS.findall(body):
        top = 'mmengine' if name == 'fp16utils.mmengine' else name
        spec = find_spec(top)
        if spec is None or spec.origin is None:
            return f'{top} is not installed here (its tier runs this block)'
    return None


def _root_conftest():
    """The checkout's own conftest.py (tests/ has one of the same module name)."""
    spec = spec_from_file_location('_fp16utils_root_conftest', ROOT / 'conftest.py')
    module = module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_ROOT_CONFTEST = _root_conftest()


def _float16_lacks(body: str) -> str | None:
    if _ROOT_CONFTEST._TRAINS.search(body) and 'bfloat16' not in body:
        why = _ROOT_CONFTEST._cpu_float16_lacks()
        if why is not None:
            return f'the block trains in float16: {why}'
    return None


_BENCH = re.compile(r'(?:\bfp16utils bench |\bbenchmarks/)(?P<name>\w+)(?:\.py)?(?P<args>[^\n]*)')


def _benchmark_lacks(body: str) -> str | None:
    """Why a benchmark the block runs cannot measure on this torch's CPU (its own check)."""
    import torch

    spec = spec_from_file_location('_fp16utils_bench_support', ROOT / 'benchmarks' / '_support.py')
    support = module_from_spec(spec)
    spec.loader.exec_module(support)
    for match in _BENCH.finditer(body):
        if '--help' in match.group('args'):
            continue  # the help needs nothing
        dtype = re.search(r'--dtype[ =](\w+)', match.group('args'))
        why = support.cannot_measure('cpu', getattr(torch, dtype.group(1) if dtype else 'float16'),
                                     grad_scaler=match.group('name') == 'train_step')
        if why:
            name = match.group('name')
            return f'the block runs benchmarks/{name}.py, which cannot measure here: {why}'
    return None


def _skip_reason(block: Block) -> str | None:
    if block.not_run:
        return f'{block.where}: not run: {block.not_run}'
    return (_missing_package(block.body) or _float16_lacks(block.body)
            or (_benchmark_lacks(block.body) if block.lang in _SHELL else None))


def _script_id(block: Block) -> str:
    return block.where


SCRIPTS = [b for b in ALL if b.lang in _PYTHON and '>>>' not in b.body
           and not _SNIPPET.match(b.body.strip()) and not b.example]
EXAMPLES = [b for b in ALL if b.example]
SHELLS = [b for b in ALL if b.lang in _SHELL and not _SNIPPET.match(b.body.strip())]
SESSIONS = sorted({b.page for b in ALL if b.lang in _PYTHON and '>>>' in b.body})


@pytest.mark.parametrize('block', SCRIPTS, ids=_script_id)
def test_python_block_runs_on_its_own(block, tmp_path, monkeypatch):
    why = _skip_reason(block)
    if why:
        pytest.skip(why)
    monkeypatch.chdir(tmp_path)
    namespace = {'__name__': '__main__'}
    with contextlib.redirect_stdout(io.StringIO()):
        exec(compile(block.body, block.where, 'exec'), namespace)


@pytest.mark.parametrize('page', SESSIONS, ids=lambda p: str(p.relative_to(ROOT)))
def test_prompt_blocks_of_a_page_run_as_one_session(page, tmp_path, monkeypatch):
    blocks = [b for b in blocks_of(page) if b.lang in _PYTHON and '>>>' in b.body]
    for block in blocks:
        why = _skip_reason(block)
        if why:
            pytest.skip(why)
    monkeypatch.chdir(tmp_path)
    parser = doctest.DocTestParser()
    examples = []
    for block in blocks:
        examples += parser.get_examples(block.body)
    test = doctest.DocTest(examples, {'__name__': '__main__'}, str(page.relative_to(ROOT)),
                           str(page), 0, None)
    runner = doctest.DocTestRunner(
        optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    out = io.StringIO()
    runner.run(test, out=out.write)
    assert runner.failures == 0, out.getvalue()
    assert runner.tries == len(examples) > 0


def example_drift(block: Block) -> str | None:
    """How an inlined example differs from its file (None: it is the file, and is run)."""
    path = ROOT / block.example
    if not path.is_file():
        return f'{block.where} shows {block.example}, which does not exist'
    runner = (ROOT / 'tests' / 'test_examples.py').read_text()
    if path.name not in runner:
        return f'{block.where} shows {block.example}, which tests/test_examples.py does not run'
    text = path.read_text()
    if block.body != text:
        diff = difflib.unified_diff(text.splitlines(), block.body.splitlines(),
                                    block.example, f'{block.where} (the page)', lineterm='')
        return (f'{block.where}: the block differs from {block.example}; copy the file '
                'into the page again:\n' + '\n'.join(list(diff)[:60]))
    return None


@pytest.mark.parametrize('block', EXAMPLES, ids=_script_id)
def test_an_inlined_example_is_its_file_as_the_suite_runs_it(block):
    drift = example_drift(block)
    assert drift is None, drift


def test_every_example_is_shown_inline_on_a_page():
    shown = {b.example for b in EXAMPLES}
    files = {f'examples/{p.name}' for p in (ROOT / 'examples').glob('*.py')}
    assert files and files <= shown, f'not shown on any page: {sorted(files - shown)}'


def test_no_page_includes_a_file_through_a_snippet():
    """A snippet include shows as its marker line where markdown is read as it is."""
    found = [f'{page.relative_to(ROOT)}:{text.count(chr(10), 0, m.start()) + 1}'
             for page in PAGES if page not in SNIPPET_PAGES
             for text in [page.read_text()] for m in _SNIPPET_LINE.finditer(text)]
    assert not found, f'snippet includes (inline the code instead): {found}'


def test_the_drift_check_names_the_changed_line(tmp_path):
    page = tmp_path / 'page.md'
    text = (ROOT / 'examples' / 'quickstart.py').read_text()
    page.write_text(f'```python title="examples/quickstart.py"\n{text}```\n')
    (same,) = blocks_of(page)
    same.page = ROOT / 'docs' / 'page.md'  # where() is relative to the checkout
    assert same.example == 'examples/quickstart.py' and example_drift(same) is None
    same.body = same.body.replace('lr=0.5', 'lr=0.1')
    drift = example_drift(same)
    assert drift and '-    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)' in drift
    assert '+    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)' in drift


def _commands(body: str) -> list:
    commands, pending = [], ''
    for raw in body.splitlines():
        line = raw.rstrip()
        if line.startswith('$ '):
            line = line[2:]
        elif not pending and (not line or line.startswith('#') or raw.startswith(' ')):
            continue  # output lines of a console block, comments, blank lines
        line = pending + line
        if line.endswith('\\'):
            pending = line[:-1] + ' '
            continue
        pending = ''
        if re.match(r'^(python -m )?pip3? install\b', line) or line.startswith('cd '):
            continue
        commands.append(line)
    return commands


@pytest.mark.parametrize('block', SHELLS, ids=_script_id)
def test_shell_block_runs(block, tmp_path):
    why = _skip_reason(block)
    if why:
        pytest.skip(why)
    commands = _commands(block.body)
    if not commands:
        pytest.skip(f'{block.where}: only installs or changes folders')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]),
        FP16UTILS_DOCS_TMP=str(tmp_path))
    script = 'set -e\nfp16utils() { "$PY" -m fp16utils "$@"; }\npython() { "$PY" "$@"; }\n'
    script += '\n'.join(commands) + '\n'
    env['PY'] = sys.executable
    done = subprocess.run(['bash', '-c', script], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, (
        f'{block.where}: exit {done.returncode}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}')


def test_few_blocks_are_marked_not_run():
    marked = [b.where for b in ALL if b.not_run]
    assert len(marked) <= MAX_NOT_RUN, f'{len(marked)} blocks are not run: {marked}'


def test_every_page_is_in_the_site_navigation():
    nav = (ROOT / 'mkdocs.yml').read_text()
    for page in PAGES[1:]:
        name = str(page.relative_to(ROOT / 'docs'))
        assert name in nav, f'docs/{name} is not in mkdocs.yml nav'
