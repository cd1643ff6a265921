"""The "Guarantees and design" pages (docs/design/) name what exists.

Reliability's table counts the adversarial attacks per file as pytest collects them;
every test file and benchmark option the pages name exists. (The architecture page is
checked by tests/test_architecture_doc.py.)
"""

from __future__ import annotations

import collections
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DESIGN = ROOT / 'docs' / 'design'


def _collected(folder: str) -> collections.Counter:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(ROOT), *filter(None, [os.environ.get('PYTHONPATH')])]))
    done = subprocess.run([sys.executable, '-m', 'pytest', '--collect-only', '-q',
                           '-p', 'no:cacheprovider', folder], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-2000:]
    return collections.Counter(line.split('::', 1)[0].rsplit('/', 1)[-1]
                               for line in done.stdout.splitlines() if '::' in line)


def test_the_adversarial_table_counts_the_attacks_pytest_collects():
    page = (DESIGN / 'reliability.md').read_text()
    rows = dict(re.findall(r'^\| `(test_\w+\.py)` \| .+ \| (\d+) \|$', page, re.M))
    total = int(re.search(r'^\| all \| \| (\d+) \|$', page, re.M).group(1))
    collected = _collected('tests/adversarial')
    on_disk = {p.name for p in (ROOT / 'tests' / 'adversarial').glob('test_*.py')}
    assert set(rows) == on_disk
    assert {name: int(n) for name, n in rows.items()} == dict(collected)
    assert total == sum(collected.values())


@pytest.mark.parametrize('page', sorted(p.name for p in DESIGN.glob('*.md')))
def test_every_test_file_a_design_page_names_exists(page):
    text = (DESIGN / page).read_text()
    for path in re.findall(r'`(tests/[\w/]+\.py)`', text):
        assert ROOT.joinpath(path).is_file(), path


def _options(benchmark: str) -> str:
    done = subprocess.run([sys.executable, str(ROOT / 'benchmarks' / f'{benchmark}.py'),
                           '--help'], capture_output=True, text=True, timeout=120,
                          env=dict(os.environ, PYTHONPATH=str(ROOT)))
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_every_benchmark_command_the_pages_give_takes_its_options():
    commands = []
    for page in sorted(DESIGN.glob('*.md')):
        text = ' '.join(page.read_text().split())  # commands may wrap
        commands += re.findall(r'python benchmarks/(\w+)\.py((?: --[\w-]+(?: \d+)?)*)', text)
    assert len(commands) >= 6
    helps = {name: _options(name) for name in {name for name, _ in commands}}
    for name, args in commands:
        for option in re.findall(r'--[\w-]+', args):
            assert option in helps[name], f'benchmarks/{name}.py has no {option}'
