"""docs/reference/supported-torch.md's table, and `.ci/matrix --write`, which writes it.

The table is made by .ci/_matrix_table.py from what .ci/compat prints (its
``SKIPPED [N] path:line: reason`` lines and its last line, ``compat-result: VERSION
PASSED SKIPPED FAILED ERRORS [NOTE]``). These tests feed it canned output, and run
.ci/matrix itself in a copy of .ci/ whose compat prints canned output: no pytest run
and no virtual environment is made.
"""

from __future__ import annotations

import importlib.util
import os
import re
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PAGE = ROOT / 'docs' / 'reference' / 'supported-torch.md'


def _writer():
    spec = importlib.util.spec_from_file_location('_matrix_table',
                                                  ROOT / '.ci' / '_matrix_table.py')
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


M = _writer()

RUN_113 = textwrap.dedent('''\
    compat: reusing /cache/venv-1.13.1 (torch 1.13.1)
    ........s..s
    SKIPPED [20] tests/test_resume.py:131: torch has no float16 matrix kernels on cpu here
    SKIPPED [2] tests/test_cuda.py:49: needs a CUDA device; none is visible to torch here
    SKIPPED [8] tests/test_resume.py:47: torch has no float16 matrix kernels on cpu here
    SKIPPED [1] fp16utils/optim/amp.py:12: torch has no float16 matrix kernels on cpu here
    SKIPPED [1] tests/test_cuda.py:61: needs a CUDA device; none is visible to torch here
    2000 passed, 32 skipped in 79.66s (0:01:19)
    compat-result: 1.13.1 2000 32 0 0
    ''')
RUN_213 = textwrap.dedent('''\
    SKIPPED [9] tests/test_cuda.py:49: needs a CUDA device | or two
    2400 passed, 9 skipped, 1 failed in 70s
    compat-result: 2.13.0 2400 9 1 0
    ''')
RUN_REPLACED = 'compat-result: 2.0.1 0 0 0 0 torch-replaced\n'


def test_the_skips_before_a_result_are_that_runs_summed_per_reason():
    rows = M.parse((RUN_113 + RUN_213).splitlines())
    assert [r.version for r in rows] == ['1.13.1', '2.13.0']
    assert rows[0].reasons == {'torch has no float16 matrix kernels on cpu here': 29,
                               'needs a CUDA device; none is visible to torch here': 3}
    assert (rows[1].passed, rows[1].skipped, rows[1].failed) == ('2400', '9', '1')
    assert M.because(rows[0]) == ('torch has no float16 matrix kernels on cpu here (29); '
                                  'needs a CUDA device; none is visible to torch here (3)')
    assert M.because(rows[1]) == 'needs a CUDA device \\| or two (9)'  # no stray column
    assert M.markdown_text('no torch._foreach_copy_ <x> *a* `b` [c]') == (
        'no torch.\\_foreach\\_copy\\_ &lt;x> \\*a\\* \\`b\\` \\[c\\]')


def test_reasons_that_only_name_another_place_count_as_one():
    log = textwrap.dedent('''\
        SKIPPED [1] tests/test_docs_blocks.py:228: README.md:18: only installs or changes folders
        SKIPPED [2] tests/test_docs_blocks.py:228: d/i.md:15: only installs or changes folders
        SKIPPED [1] tests/test_a.py:3: torch.compile does not run here: No module named 'x'
        compat-result: 2.13.0 5 4 0 0
        ''')
    row, = M.parse(log.splitlines())
    assert row.reasons == {'only installs or changes folders': 3,
                           "torch.compile does not run here: No module named 'x'": 1}


def test_a_run_without_its_tests_shows_its_note_and_a_rerun_replaces_a_row():
    rows = M.parse((RUN_REPLACED + RUN_113 + 'compat-result: 2.0.1 5 0 0 0\n').splitlines())
    assert [r.version for r in rows] == ['1.13.1', '2.0.1']
    assert rows[1].passed == '5' and M.because(rows[1]) == ''
    assert M.because(M.parse([RUN_REPLACED])[0]) == 'torch-replaced'


def test_the_table_has_the_header_and_one_row_per_version():
    text = M.table(M.parse((RUN_113 + RUN_213).splitlines()))
    lines = text.splitlines()
    assert '\n'.join(lines[:2]) == M.HEADER
    assert lines[2] == ('| 1.13.1 | 2000 | 32 | 0 | 0 | torch has no float16 matrix kernels on '
                        'cpu here (29); needs a CUDA device; none is visible to torch here (3) |')
    assert lines[3].startswith('| 2.13.0 | 2400 | 9 | 1 | 0 | ')
    with pytest.raises(ValueError, match='no compat-result line'):
        M.table(M.parse(['nothing here']))
    with pytest.raises(ValueError, match='not a compat-result line'):
        M.parse(['compat-result: 1.13.1 5'])


def test_writing_replaces_only_what_stands_between_the_markers():
    page = f'# Title\n\nbefore\n\n{M.BEGIN}\n\nold table\n\n{M.END}\n\nafter\n'
    new = M.replace_table(page, '| t |\n|---|\n')
    assert new == f'# Title\n\nbefore\n\n{M.BEGIN}\n\n| t |\n|---|\n\n{M.END}\n\nafter\n'
    assert M.replace_table(new, '| t |\n|---|\n') == new  # writing twice changes nothing
    for broken in ('no markers', f'{M.END}\n{M.BEGIN}', f'{M.BEGIN}\n{M.BEGIN}\n{M.END}'):
        with pytest.raises(ValueError, match='exactly one'):
            M.replace_table(broken, '| t |\n')


def test_the_page_holds_one_table_in_the_writers_format_between_the_markers():
    text = PAGE.read_text()
    assert text.count(M.BEGIN) == 1 and text.count(M.END) == 1
    table = text.split(M.BEGIN, 1)[1].split(M.END, 1)[0].strip('\n')
    lines = table.splitlines()
    assert '\n'.join(lines[:2]) == M.HEADER
    rows = lines[2:]
    assert rows, 'the table has no row'
    row = re.compile(r'^\| (\d+\.\d+\.\d+) \| (\d+|-) \| (\d+|-) \| (\d+|-) \| (\d+|-) \| '
                     r'((?:[^|\\]|\\.)*) \|$')
    versions = []
    for line in rows:
        match = row.match(line)
        assert match, line
        versions.append(match.group(1))
        if match.group(3).isdigit() and match.group(6):  # reasons with counts, summed
            counts = re.findall(r' \((\d+)\)(?:; |$)', match.group(6))
            assert match.group(6).endswith(')') and sum(map(int, counts)) == int(
                match.group(3)), line
    compat = (ROOT / '.ci' / 'compat').read_text()
    oldest = re.search(r'^version=\$\{1:-([0-9.]+)\}$', compat, re.M).group(1)
    assert versions[0] == oldest
    assert M.replace_table(text, table + '\n') == text  # the writer's own layout


# ----------------------------------------------------------------- .ci/matrix --write


FAKE_COMPAT = '''#!/usr/bin/env bash
# Prints what .ci/compat prints for a version, from canned files; no pytest run.
cat "$(dirname "$0")/canned-$1.txt"
[ "$1" != 2.13.0 ]
'''


@pytest.fixture
def checkout(tmp_path):
    """A copy of .ci/ with a compat that prints canned output, and a page to write."""
    if shutil.which('bash') is None:
        pytest.skip('.ci/matrix is a bash script')
    ci = tmp_path / '.ci'
    ci.mkdir()
    for name in ('matrix', '_matrix_table.py'):
        shutil.copy2(ROOT / '.ci' / name, ci / name)
    (ci / 'compat').write_text(FAKE_COMPAT)
    (ci / 'compat').chmod(0o755)
    (ci / 'canned-1.13.1.txt').write_text(RUN_113)
    (ci / 'canned-2.13.0.txt').write_text(RUN_213)
    (ci / 'canned-2.0.1.txt').write_text('compat: skipped: the package index cannot be '
                                         'reached\n')
    page = tmp_path / 'docs' / 'reference' / 'supported-torch.md'
    page.parent.mkdir(parents=True)
    page.write_text(f'# Supported torch\n\n{M.BEGIN}\n{M.END}\n\nThe rest.\n')
    return tmp_path


def _matrix(root: Path, *args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, FP16UTILS_VENV_CACHE=str(root / 'cache'), PYTHON=sys.executable)
    return subprocess.run(['bash', str(root / '.ci' / 'matrix'), *args], cwd=str(root),
                          env=env, capture_output=True, text=True, timeout=120)


def test_matrix_write_puts_the_table_of_its_runs_into_the_page(checkout):
    done = _matrix(checkout, '--write', '1.13.1', '2.0.1', '2.13.0')
    assert done.returncode == 1, done.stdout + done.stderr  # 2.13.0's suite failed
    page = (checkout / 'docs' / 'reference' / 'supported-torch.md').read_text()
    expected = M.table(M.parse((RUN_113 + 'compat-result: 2.0.1 - - - - no-result\n'
                                + RUN_213).splitlines()))
    assert page == f'# Supported torch\n\n{M.BEGIN}\n\n{expected}\n{M.END}\n\nThe rest.\n'
    assert expected in done.stdout
    assert (checkout / 'cache' / 'matrix-1.13.1.txt').read_text() == RUN_113


def test_matrix_without_write_prints_the_table_and_leaves_the_page(checkout):
    page = checkout / 'docs' / 'reference' / 'supported-torch.md'
    before = page.read_text()
    done = _matrix(checkout, '1.13.1')
    assert done.returncode == 0, done.stdout + done.stderr
    assert M.table(M.parse(RUN_113.splitlines())) in done.stdout
    assert page.read_text() == before


def test_matrix_write_fails_on_a_page_without_markers_and_leaves_it(checkout):
    page = checkout / 'docs' / 'reference' / 'supported-torch.md'
    page.write_text('# Supported torch\n\nno markers\n')
    done = _matrix(checkout, '--write', '1.13.1')
    assert done.returncode == 1
    assert 'needs exactly one' in done.stderr
    assert page.read_text() == '# Supported torch\n\nno markers\n'
