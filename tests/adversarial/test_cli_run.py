"""Attacks on ``fp16utils run`` and ``fp16utils demo --seed``.

``fp16utils run SCRIPT`` must run SCRIPT exactly as ``python SCRIPT`` does, also when
SCRIPT is reached through symbolic links (compared with a real ``python`` process: what
the script sees as ``sys.argv[0]``, ``__file__`` and ``sys.path[0]``, and which modules
beside the link or beside its target it can import). An mmcv whose own import fails is
one line, and the script does not run. A ``--seed`` torch cannot take is a usage error.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from adversarial._attack import call, one_line_error, run
from fp16utils.tools import cli

ROOT = Path(__file__).resolve().parents[2]
needs_links = pytest.mark.skipif(not hasattr(os, 'symlink') or os.name == 'nt',
                                 reason='symbolic links as on POSIX')

SCRIPT = '''\
import json, os, sys
seen = {'argv0': sys.argv[0], 'args': sys.argv[1:], 'file': __file__, 'path0': sys.path[0],
        'name': __name__}
for module in ('beside_target', 'beside_link'):
    try:
        seen[module] = __import__(module).WHERE
    except ImportError:
        seen[module] = None
print(json.dumps(seen))
'''


def _fake_mmcv(root: Path, runner_body: str = '') -> Path:
    """An importable ``mmcv`` 1.x whose ``mmcv.runner`` runs ``runner_body``."""
    (root / 'mmcv' / 'runner').mkdir(parents=True)
    (root / 'mmcv' / '__init__.py').write_text("__version__ = '1.7.2'\n")
    (root / 'mmcv' / 'runner' / '__init__.py').write_text(runner_body)
    return root


def _env(*paths: Path) -> dict:
    env = dict(os.environ, OMP_NUM_THREADS='1')
    env.pop('FP16UTILS_BACKEND', None)
    env['PYTHONPATH'] = os.pathsep.join([str(ROOT), *map(str, paths)])
    return env


def _seen(argv, cwd, env):
    proc = subprocess.run(argv, capture_output=True, text=True, cwd=cwd, env=env, timeout=120)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.fixture(scope='module')
def linked(tmp_path_factory):
    """real/train.py, with links to it from links/ (relative, absolute, a link to a link)."""
    top = tmp_path_factory.mktemp('linked')
    (top / 'real').mkdir()
    (top / 'links').mkdir()
    (top / 'real' / 'train.py').write_text(SCRIPT)
    (top / 'real' / 'beside_target.py').write_text("WHERE = 'real'\n")
    (top / 'links' / 'beside_link.py').write_text("WHERE = 'links'\n")
    if hasattr(os, 'symlink'):
        os.symlink('../real/train.py', top / 'links' / 'train.py')
        os.symlink(top / 'real' / 'train.py', top / 'links' / 'absolute.py')
        os.symlink('train.py', top / 'links' / 'again.py')  # a link to the link
    return top, _fake_mmcv(tmp_path_factory.mktemp('site'))


@needs_links
@pytest.mark.parametrize('cwd, script', [
    ('links', './train.py'), ('.', 'links/train.py'), ('.', 'links/../links/absolute.py'),
    ('links', 'again.py')])
def test_run_sees_what_python_sees_through_links(linked, cwd, script):
    top, site = linked
    env = _env(site)
    where = top / cwd
    python = _seen([sys.executable, script, 'a', '--b'], where, env)
    ours = _seen([sys.executable, '-m', 'fp16utils', 'run', script, 'a', '--b'], where, env)
    assert ours == python
    # What Python does: argv[0] as typed, __file__ absolute but not resolved, and the
    # folder of the real file first on sys.path: the modules beside the target are seen,
    # those beside a link are not.
    assert python['argv0'] == script and python['args'] == ['a', '--b']
    assert python['file'] == os.path.join(str(where), script)
    assert python['path0'] == str((top / 'real').resolve())
    assert (python['beside_target'], python['beside_link']) == ('real', None)
    assert python['name'] == '__main__'


@needs_links
def test_run_in_process_puts_argv_and_path_back(linked, monkeypatch, capsys):
    top, site = linked
    monkeypatch.syspath_prepend(str(site))
    monkeypatch.chdir(top / 'links')
    argv, path0 = list(sys.argv), sys.path[0]
    try:
        assert cli.main(['run', 'train.py', 'x']) == 0
    finally:
        import fp16utils

        fp16utils.unpatch_mmcv()
        for name in [m for m in sys.modules if m == 'mmcv' or m.startswith('mmcv.')]:
            del sys.modules[name]
    seen = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    assert seen['argv0'] == 'train.py' and seen['file'] == str(top / 'links' / 'train.py')
    assert (sys.argv, sys.path[0]) == (argv, path0)


def test_an_mmcv_whose_import_fails_is_one_line_and_nothing_runs(tmp_path):
    """A real process: mmcv 1.x under numpy 2 fails inside its own import like this."""
    site = _fake_mmcv(tmp_path / 'site', "import numpy\nnumpy.float\n")
    marker = tmp_path / 'ran'
    script = tmp_path / 'train.py'
    script.write_text(f'open({str(marker)!r}, "w").close()\n')
    proc = run('run', str(script), env={'PYTHONPATH': os.pathsep.join([str(ROOT), str(site)])})
    one_line_error(proc, 1, 'importing mmcv.runner failed', 'AttributeError', 'numpy',
                   'python -c "import mmcv.runner"', 'nothing was run')
    assert not marker.exists()


@pytest.mark.parametrize('body, error', [
    ("raise RuntimeError('CUDA driver initialization failed\\nsecond line')\n",
     'RuntimeError: CUDA driver initialization failed second line'),
    ("1 / 0\n", 'ZeroDivisionError'),
    ("raise KeyError('MMCV_HOME')\n", "KeyError: 'MMCV_HOME'"),
])
def test_other_failures_inside_mmcvs_import_are_one_line_too(tmp_path, monkeypatch, body,
                                                             error):
    site = _fake_mmcv(tmp_path / 'site', body)
    monkeypatch.syspath_prepend(str(site))
    marker = tmp_path / 'ran'
    script = tmp_path / 'train.py'
    script.write_text(f'open({str(marker)!r}, "w").close()\n')
    try:
        one_line_error(call('run', str(script)), 1, 'importing mmcv.runner failed', error)
    finally:
        for name in [m for m in sys.modules if m == 'mmcv' or m.startswith('mmcv.')]:
            del sys.modules[name]
    assert not marker.exists()


def test_a_missing_mmcv_is_still_its_own_message(tmp_path):
    script = tmp_path / 'train.py'
    script.write_text('raise SystemExit(3)\n')
    empty = tmp_path / 'empty'
    empty.mkdir()
    (empty / 'mmcv.py').write_text("raise ImportError('No module named mmcv._ext')\n")
    proc = run('run', str(script), env={'PYTHONPATH': os.pathsep.join([str(ROOT), str(empty)])})
    one_line_error(proc, 1, 'patch_mmcv() needs mmcv 1.x')


@pytest.mark.parametrize('seed', [str(2**64), str(-2**63 - 1), str(10**30)])
def test_a_seed_torch_cannot_take_is_a_usage_error_naming_the_range(seed):
    line = one_line_error(call('demo', f'--seed={seed}'), 2, '--seed', seed,
                          str(-2**63), str(2**64 - 1))
    assert 'Traceback' not in line


@pytest.mark.parametrize('seed', [-2**63, -1, 0, 2**63, 2**64 - 1])
def test_every_seed_torch_takes_is_accepted(seed):
    import torch

    args = cli.build_parser().parse_args(['demo', f'--seed={seed}'])
    assert args.seed == seed
    torch.Generator().manual_seed(seed)  # and torch does take it


def test_the_demo_runs_at_the_top_of_the_seed_range():
    proc = call('demo', '--steps', '1', '--device', 'cpu', f'--seed={2**64 - 1}')
    assert proc.returncode == 0, proc.stderr
    assert 'final loss' in proc.stdout


def test_the_seed_help_names_the_range():
    text = textwrap.dedent(cli.build_parser()._subparsers._group_actions[0]
                           .choices['demo'].format_help())
    assert '-2**63' in text and '2**64-1' in text
