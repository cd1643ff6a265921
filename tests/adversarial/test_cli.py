"""Attacks on the ``fp16utils`` command: every failure is one line on stderr, exit 1 or 2.

Most attacks call ``cli.main`` in this process; a handful run ``python -m fp16utils``
for the real stderr and exit code. "Nothing written" is checked byte for byte.
"""

from __future__ import annotations

import io
import json
import os
import stat

import pytest

from adversarial._attack import (
    CONFIGS,
    call,
    deny_listing,
    deny_temp_files,
    make_odd,
    one_line_error,
    run,
    tree,
)

FIXABLE = 'from mmcv.runner import auto_fp16\n'
CONFIG = CONFIGS / 'retinanet_r50_fpn_fp16_1x_coco.py'
needs_fifo = pytest.mark.skipif(not hasattr(os, 'mkfifo'), reason='no FIFOs on this system')


@pytest.fixture
def config(tmp_path):
    """A 0.x fp16 config in a folder of its own."""
    (tmp_path / 'configs').mkdir()
    path = tmp_path / 'configs' / 'fp16_cfg.py'
    path.write_text("model = dict(type='RetinaNet')\noptimizer = dict(type='SGD', lr=0.02)\n"
                    "fp16 = dict(loss_scale=512.)\n")
    return path


# ---------------------------------------------------------------------- migrate


def test_migrate_output_equal_to_the_input_is_refused_and_the_input_kept(config):
    before = config.read_bytes()
    one_line_error(call('migrate', str(config), '-o', str(config)), 2, 'input config itself')
    assert config.read_bytes() == before


def test_migrate_output_that_links_to_the_input_is_refused(config, tmp_path):
    before = config.read_bytes()
    os.symlink(config, tmp_path / 'link.py')
    one_line_error(call('migrate', str(config), '-o', str(tmp_path / 'link.py')), 2,
                   'link.py', 'input config itself')
    assert config.read_bytes() == before


def test_migrate_output_dash_is_stdout(config):
    proc = call('migrate', str(config), '-o', '-')
    assert proc.returncode == 0 and proc.stdout.startswith('# Converted from')
    assert "type='AmpOptimWrapper'" in proc.stdout and not os.path.exists('-')


def test_migrate_output_replaces_atomically_and_keeps_the_mode(config, tmp_path):
    target = tmp_path / 'out.py'
    target.write_text('old')
    os.chmod(target, 0o600)
    victim = tmp_path / 'victim.txt'
    victim.write_text('precious')
    os.symlink(victim, tmp_path / 'out.py.fp16utils-tmp')
    proc = call('migrate', str(config), '-o', str(target))
    assert proc.returncode == 0, proc.stderr
    assert target.read_text().startswith('# Converted from')
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o600
    assert victim.read_text() == 'precious'
    assert sorted(os.listdir(tmp_path)) == ['configs', 'out.py', 'out.py.fp16utils-tmp',
                                            'victim.txt']


def test_migrate_output_through_a_link_writes_the_linked_file(config, tmp_path):
    real = tmp_path / 'real.py'
    real.write_text('old')
    os.symlink(real, tmp_path / 'link.py')
    assert call('migrate', str(config), '-o', str(tmp_path / 'link.py')).returncode == 0
    assert (tmp_path / 'link.py').is_symlink()
    assert real.read_text().startswith('# Converted from')


@pytest.mark.parametrize('make, needle', [
    ('dir', 'is a directory'),
    ('dangling', 'dangling symbolic link'),
    ('missing-folder', 'No such file or directory'),
    ('file-as-folder', 'Not a directory'),
])
def test_migrate_output_that_cannot_be_a_file_is_one_error_and_writes_nothing(
        config, tmp_path, make, needle):
    out = tmp_path / 'out'
    if make in ('dir', 'dangling'):
        make_odd(out, make)
    elif make == 'missing-folder':
        out = tmp_path / 'missing' / 'out.py'
    else:
        (tmp_path / 'plain').write_text('x')
        out = tmp_path / 'plain' / 'out.py'
    before = tree(tmp_path)
    one_line_error(call('migrate', str(config), '-o', str(out)), 1, 'could not be written',
                   needle)
    assert tree(tmp_path) == before


def test_migrate_output_in_a_read_only_folder_is_one_error(config, tmp_path, monkeypatch):

    deny_temp_files(monkeypatch)
    (tmp_path / 'out.py').write_text('old')
    one_line_error(call('migrate', str(config), '-o', str(tmp_path / 'out.py')), 1,
                   'out.py', 'Permission denied')
    assert (tmp_path / 'out.py').read_text() == 'old'


@pytest.mark.parametrize('text, needle', [
    ('x = {"class": object}\n', 'x.class'),
    ('import os\nx = [os]\n', 'module'),
    ('x = dict(f=lambda: 0)\n', '(function)'),
    ('x = [print]\n', 'builtin_function_or_method'),
    ('x = []\nx.append(x)\n', 'nests too deeply'),
])
def test_migrate_never_writes_a_config_that_does_not_load_back(tmp_path, text, needle):
    (tmp_path / 'c.py').write_text(text)
    (tmp_path / 'out.py').write_text('old')
    proc = call('migrate', str(tmp_path / 'c.py'), '-o', str(tmp_path / 'out.py'))
    one_line_error(proc, 1, 'c.py', needle, 'nothing written')
    assert (tmp_path / 'out.py').read_text() == 'old' and proc.stdout == ''
    assert call('migrate', str(tmp_path / 'c.py')).stdout == ''  # nor to stdout


@pytest.mark.parametrize('text', [
    'x = float("inf")\n',
    'x = dict(y=[float("nan"), -float("inf")], z=(complex(1, float("inf")),))\n',
])
def test_migrate_writes_non_finite_numbers_so_that_they_load_back(tmp_path, text):
    (tmp_path / 'c.py').write_text(text)
    proc = call('migrate', str(tmp_path / 'c.py'), '-o', str(tmp_path / 'out.py'))
    assert proc.returncode == 0, proc.stderr
    written = (tmp_path / 'out.py').read_text()
    assert "float('" in written
    ns: dict = {}
    exec(written, ns)  # noqa: S102 - the text under test
    old: dict = {}
    exec(text, old)  # noqa: S102
    assert repr(ns['x']) == repr(old['x'])  # (nan == nan is False; their reprs agree)


def test_migrate_writes_keyword_keys_as_a_literal_that_loads_back(tmp_path):
    (tmp_path / 'c.py').write_text('x = {"class": 1, "a b": 2, 3: (1,)}\n')
    proc = call('migrate', str(tmp_path / 'c.py'), '-o', str(tmp_path / 'out.py'))
    assert proc.returncode == 0, proc.stderr
    ns: dict = {}
    exec((tmp_path / 'out.py').read_text(), ns)  # noqa: S102 - the text under test
    assert ns['x'] == {'class': 1, 'a b': 2, 3: (1,)}


@pytest.mark.parametrize('text, code, needle', [
    ('raise RuntimeError("boom")\n', 1, 'RuntimeError: boom'),
    ('import sys\nsys.exit(0)\n', 1, 'exit(0)'),
    ('import sys\nsys.exit("bye")\n', 1, "exit('bye')"),
    ('x = (\n', 1, 'syntax error'),
    ('x = ' + '+'.join(['1'] * 100_000) + '\n', 1, 'RecursionError'),
    ('_base_ = 5\n', 1, '_base_ must be a file name'),
    ('_base_ = [None]\n', 1, '_base_ must be a file name'),
    ("_base_ = 'missing.py'\n", 1, 'does not exist'),
    ("_base_ = '.'\n", 1, 'is a directory'),
    ("_base_ = 'c.py'\n", 1, 'cycle'),
    ('raise KeyboardInterrupt\n', 130, None),
])
def test_migrate_of_a_config_that_fails_is_one_line(tmp_path, text, code, needle):
    (tmp_path / 'c.py').write_text(text)
    proc = call('migrate', str(tmp_path / 'c.py'))
    if needle is None:
        assert (proc.returncode, proc.stderr) == (130, 'fp16utils: interrupted\n')
    else:
        one_line_error(proc, code, 'c.py', needle)
    assert proc.stdout == ''


@pytest.mark.parametrize('raw', [b'\x00\x01\xff\xfe', b'x = "\xff"\n'])
def test_migrate_of_a_binary_or_undecodable_config_is_one_line(tmp_path, raw):
    (tmp_path / 'c.py').write_bytes(raw)
    one_line_error(call('migrate', str(tmp_path / 'c.py')), 1, 'c.py')


@pytest.mark.parametrize('make', ['missing', 'dir', 'dangling', 'fifo'])
def test_migrate_of_something_that_is_not_a_config_file_is_a_usage_error(tmp_path, make):
    path = make_odd(tmp_path / 'c.py', make)
    one_line_error(call('migrate', str(path)), 2, 'c.py')


def test_migrate_of_an_empty_bom_crlf_config_writes_an_empty_config(tmp_path):
    (tmp_path / 'c.py').write_bytes(b'\xef\xbb\xbf\r\n')
    proc = call('migrate', str(tmp_path / 'c.py'))
    assert proc.returncode == 0 and proc.stdout.startswith('# Converted from c.py')


def test_migrate_warning_with_newlines_stays_one_line_per_problem(tmp_path):
    (tmp_path / 'c.py').write_text('optimizer = "a\\nb"\nfp16 = dict(loss_scale=1.)\n')
    proc = call('migrate', str(tmp_path / 'c.py'), '--strict')
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    assert len(lines) == 2 and lines[-1].startswith('fp16utils: error: ')
    assert ": warning: optimizer: expected dict(type='SGD'" in lines[0]
    assert "got 'a\\nb'" in lines[0]


def test_migrate_config_that_prints_and_chdirs_does_not_break_the_output(tmp_path):
    (tmp_path / 'c.py').write_text('import os\nprint("noise")\nos.chdir("/")\na = 1\n')
    target = tmp_path / 'out.py'
    cwd = os.getcwd()
    try:
        proc = call('migrate', str(tmp_path / 'c.py'), '-o', str(target))
    finally:
        os.chdir(cwd)
    assert proc.returncode == 0 and target.read_text().endswith('a = 1\n')


# ------------------------------------------------------------------------- scan


def test_scan_of_a_tree_with_an_unreadable_file_is_not_clean(tmp_path):
    (tmp_path / 'bin.py').write_bytes(b'\x00\xff\xfe')
    proc = call('scan', str(tmp_path))
    assert proc.returncode == 1
    assert 'bin.py:1:1: unreadable: cannot decode the file' in proc.stdout
    assert proc.stdout.endswith('1 finding(s) in 1 file(s) (1 could not be read: not scanned)\n')


def test_scan_of_a_tree_with_a_folder_it_cannot_list_is_not_clean(tmp_path, monkeypatch):
    (tmp_path / 'locked').mkdir()
    deny_listing(monkeypatch, 'locked')
    proc = call('scan', str(tmp_path), '--json')
    assert proc.returncode == 1
    (finding,) = json.loads(proc.stdout)
    assert finding['kind'] == 'unreadable' and finding['path'].endswith('locked')


def test_scan_of_a_clean_tree_says_so(tmp_path):
    (tmp_path / 'm.py').write_text('import torch\n')
    proc = call('scan', str(tmp_path))
    assert (proc.returncode, proc.stdout) == (0, '0 finding(s) in 0 file(s)\n')


@pytest.mark.parametrize('make, needle', [
    ('missing', 'no such file or directory'),
    ('dangling', 'dangling symbolic link'),
    ('fifo', 'not a regular file or a folder'),
])
def test_scan_of_a_path_that_is_neither_file_nor_folder_is_a_usage_error(tmp_path, make,
                                                                         needle):
    path = make_odd(tmp_path / 'p', make)
    for extra in ([], ['--fix'], ['--json']):
        one_line_error(call('scan', str(path), *extra), 2, needle)


def test_scan_json_keeps_a_non_utf8_file_name_that_opens_the_file(tmp_path):
    name = os.fsdecode(b'caf\xe9.py')
    with open(os.path.join(str(tmp_path), name), 'w') as fh:
        fh.write(FIXABLE)
    (tmp_path / 'bad.py').write_text('def f(:\n')
    proc = call('scan', str(tmp_path), '--json')
    proc.stdout.encode('ascii')  # \udcXX escapes: plain ASCII JSON
    data = json.loads(proc.stdout)
    assert sorted(f['kind'] for f in data) == ['import', 'syntax-error']
    path = next(f['path'] for f in data if f['kind'] == 'import')
    assert os.fsencode(path).endswith(b'caf\xe9.py')
    with open(os.fsencode(path), 'rb') as fh:  # the name reported opens the file
        assert fh.read() == FIXABLE.encode()


def test_scan_text_output_quotes_a_non_utf8_file_name_as_a_shell_would_read_it(tmp_path):
    import shutil
    import subprocess

    name = os.fsdecode(b'\xff\xfe.py')
    with open(os.path.join(str(tmp_path), name), 'w') as fh:
        fh.write(FIXABLE)
    proc = run('scan', str(tmp_path), env={'PYTHONIOENCODING': 'utf-8'})
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr
    line = proc.stdout.splitlines()[0]
    quoted = "$'" + str(tmp_path) + "/\\xff\\xfe.py'"
    assert line == f'{quoted}:1:1: import: imports auto_fp16 from mmcv.runner', line
    if shutil.which('bash'):  # pasted into a shell, the name reads the file
        cat = subprocess.run(['bash', '-c', f'cat -- {quoted}'], capture_output=True)
        assert cat.stdout == FIXABLE.encode()


def test_scan_fix_json_lists_changes_and_skipped_files(tmp_path):
    (tmp_path / 'a.py').write_text(FIXABLE)
    (tmp_path / 'b.py').write_bytes(b'\xff')
    proc = call('scan', str(tmp_path), '--fix', '--json')
    data = json.loads(proc.stdout)
    assert [(os.path.basename(c['path']), c['changed'], bool(c['error'])) for c in data] == [
        ('a.py', True, False), ('b.py', False, True)]
    assert proc.returncode == 1
    one_line_error(proc, 1, 'b.py', 'cannot decode the file')


def test_scan_dry_run_alone_shows_the_diff_and_writes_nothing(tmp_path):
    (tmp_path / 'a.py').write_text(FIXABLE)
    proc = call('scan', str(tmp_path), '--dry-run')
    assert proc.returncode == 0 and '+from fp16utils import auto_fp16' in proc.stdout
    assert (tmp_path / 'a.py').read_text() == FIXABLE


def test_scan_fix_through_a_planted_link_never_writes_outside_the_tree(tmp_path):
    code = tmp_path / 'code'
    code.mkdir()
    (code / 'a.py').write_text(FIXABLE)
    (tmp_path / 'outside.txt').write_text('precious')
    os.symlink(tmp_path / 'outside.txt', code / 'a.py.fp16utils-tmp')
    proc = call('scan', str(code), '--fix')
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / 'outside.txt').read_text() == 'precious'
    assert (code / 'a.py').read_text() == 'from fp16utils import auto_fp16\n'


def test_scan_fix_of_a_file_it_cannot_write_is_one_line_per_file_and_exit_1(tmp_path,
                                                                             monkeypatch):

    (tmp_path / 'a.py').write_text(FIXABLE)

    deny_temp_files(monkeypatch)
    proc = call('scan', str(tmp_path), '--fix')
    one_line_error(proc, 1, 'a.py', 'could not be written: Permission denied')
    assert (tmp_path / 'a.py').read_text() == FIXABLE
    assert 'changed 0 file(s), skipped 1 that could not be read or written' in proc.stdout


def test_scan_fix_twice_on_the_same_file_given_by_name(tmp_path):
    (tmp_path / 'a.py').write_text(FIXABLE)
    first = call('scan', str(tmp_path / 'a.py'), '--fix')
    second = call('scan', str(tmp_path / 'a.py'), '--fix')
    assert (first.returncode, second.returncode) == (0, 0)
    assert 'changed 0 file(s)' in second.stdout


def test_two_concurrent_scan_fix_processes_agree(tmp_path):
    import subprocess
    import sys

    for i in range(30):
        (tmp_path / f'm{i}.py').write_text(FIXABLE)
    env = dict(os.environ)
    procs = [subprocess.Popen([sys.executable, '-m', 'fp16utils', 'scan', str(tmp_path), '--fix'],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
             for _ in range(2)]
    results = [p.communicate(timeout=60) for p in procs]
    assert [p.returncode for p in procs] == [0, 0], results
    assert all(not err for _, err in results)
    assert sorted(os.listdir(tmp_path)) == sorted(f'm{i}.py' for i in range(30))
    assert {(tmp_path / f'm{i}.py').read_text() for i in range(30)} == {
        'from fp16utils import auto_fp16\n'}


def test_migrate_output_onto_a_read_only_file_is_refused(config, tmp_path):
    (tmp_path / 'out.py').write_text('old')
    os.chmod(tmp_path / 'out.py', 0o444)
    one_line_error(call('migrate', str(config), '-o', str(tmp_path / 'out.py')), 1,
                   'out.py', 'read-only')
    assert (tmp_path / 'out.py').read_text() == 'old'


def test_scan_interrupted_is_one_line_and_exit_130(tmp_path, monkeypatch):
    from fp16utils.migrate import scanner

    def interrupted(path):
        raise KeyboardInterrupt

    monkeypatch.setattr(scanner, 'load_source', interrupted)
    (tmp_path / 'a.py').write_text(FIXABLE)
    proc = call('scan', str(tmp_path))
    assert (proc.returncode, proc.stderr) == (130, 'fp16utils: interrupted\n')


def test_real_process_migrate_of_a_non_utf8_path_is_one_line(tmp_path):
    import subprocess
    import sys

    path = os.path.join(os.fsencode(tmp_path), b'\xff.py')  # missing, undecodable name
    proc = subprocess.run([sys.executable, '-m', 'fp16utils', 'migrate', path],
                          capture_output=True, timeout=60)
    err = proc.stderr.decode('utf-8')
    assert proc.returncode == 2 and err.count('\n') == 1 and 'Traceback' not in err
    assert "\\xff.py': no such config file" in err


def test_scan_output_to_a_closed_pipe_is_quiet(tmp_path):
    class Closed(io.StringIO):
        def write(self, text):
            raise BrokenPipeError(32, 'Broken pipe')

    (tmp_path / 'a.py').write_text(FIXABLE)
    proc = call('scan', str(tmp_path), out=Closed())
    assert proc.returncode == 1 and proc.stderr == ''


# ---------------------------------------------------------- odd argv, env, others


@pytest.mark.parametrize('argv, needle', [
    ([], None),
    (['nope'], 'invalid choice'),
    (['scan'], 'required'),
    (['migrate'], 'required'),
    (['scan', '.', '--bogus'], 'unrecognized arguments'),
    (['migrate', str(CONFIG), '--dtype', 'float8'], 'invalid choice'),
    (['migrate', str(CONFIG), '--dtype', 'bfloat16'], '--dtype only applies with --amp'),
    (['demo', '--steps', '0'], 'is not >= 1'),
    (['demo', '--steps', 'many'], 'is not an integer'),
    (['demo', '--seed', '1.5'], 'is not an integer'),
    (['bench', '../tests/conftest'], 'not a benchmark name'),
    (['bench', '/etc/passwd'], 'not a benchmark name'),
    (['bench', 'no_such_bench'], 'no such benchmark'),
    (['run'], 'required'),
])
def test_odd_argv_is_a_one_line_usage_error(argv, needle):
    proc = call(*argv)
    assert proc.returncode == 2 and 'Traceback' not in proc.stderr
    if needle is not None:
        one_line_error(proc, 2, needle)


@pytest.mark.parametrize('make', ['missing', 'dir'])
def test_run_of_something_that_is_not_a_script_is_a_usage_error(tmp_path, make):
    path = tmp_path / 'train.py'
    if make == 'dir':
        path.mkdir()
    one_line_error(call('run', str(path)), 2, 'train.py', 'no such file')


@pytest.mark.parametrize('make, needle', [
    ('folder', 'is a directory'),
    ('dangling', 'dangling symbolic link'),
    ('missing-folder', 'existing folder'),
])
def test_demo_plot_target_that_cannot_be_written_is_refused_before_training(tmp_path, make,
                                                                           needle):
    if make == 'missing-folder':
        target = tmp_path / 'missing' / 'plot.png'
    else:
        target = make_odd(tmp_path / 'plot.png', make)
    proc = call('demo', '--steps', '1', '--device', 'cpu', '--plot', str(target))
    one_line_error(proc, 2, 'plot.png', needle)
    assert proc.stdout == ''


def test_demo_plot_is_written_atomically_through_a_link(tmp_path, monkeypatch):
    import sys
    import types
    from unittest import mock

    from fp16utils.tools import demo

    def savefig(target, format):
        target.write(b'PNG:' + format.encode())

    fig = mock.MagicMock()
    fig.savefig.side_effect = savefig
    pyplot = types.SimpleNamespace(subplots=lambda *a, **k: (fig, (mock.MagicMock(),) * 2),
                                   close=lambda f: None)
    fake = types.SimpleNamespace(use=lambda backend: None, pyplot=pyplot)
    monkeypatch.setitem(sys.modules, 'matplotlib', fake)
    monkeypatch.setitem(sys.modules, 'matplotlib.pyplot', pyplot)
    real = tmp_path / 'real.png'
    real.write_bytes(b'old')
    os.symlink(real, tmp_path / 'plot.png')
    (tmp_path / 'plot.png.fp16utils-tmp').symlink_to(tmp_path / 'victim')
    demo.plot_results([], str(tmp_path / 'plot.png'))
    assert (tmp_path / 'plot.png').is_symlink() and real.read_bytes() == b'PNG:png'
    assert not (tmp_path / 'victim').exists()


def test_demo_with_an_unknown_device_is_a_usage_error():
    one_line_error(call('demo', '--device', 'warp-drive'), 2, 'not a torch device')


@pytest.mark.parametrize('argv', [['env'], ['demo', '--steps', '1', '--device', 'cpu']])
def test_a_bad_backend_in_the_environment_is_one_line(monkeypatch, argv):
    from fp16utils import _torch

    monkeypatch.setenv('FP16UTILS_BACKEND', 'bogus')
    _torch.decisions.refresh()
    try:
        proc = call(*argv)
    finally:
        monkeypatch.delenv('FP16UTILS_BACKEND')
        _torch.decisions.refresh()
    one_line_error(proc, 2, 'FP16UTILS_BACKEND', 'bogus')
    assert proc.stdout == ''


# ------------------------------------------------ through a real process: stderr


@pytest.mark.parametrize('argv, code, needles', [
    (['migrate', 'MISSING.py'], 2, ['MISSING.py', 'no such config file']),
    (['scan', 'MISSING'], 2, ['MISSING', 'no such file or directory']),
    (['bench', '../x'], 2, ['not a benchmark name']),
])
def test_real_process_failures_are_one_line(argv, code, needles):
    one_line_error(run(*argv), code, *needles)


def test_real_process_config_that_exits_or_raises_is_one_line(tmp_path):
    (tmp_path / 'exits.py').write_text('raise SystemExit(4)\n')
    (tmp_path / 'raises.py').write_text('1/0\n')
    one_line_error(run('migrate', str(tmp_path / 'exits.py')), 1, 'exits.py', 'exit(4)')
    one_line_error(run('migrate', str(tmp_path / 'raises.py')), 1, 'raises.py',
                   'ZeroDivisionError')


def test_real_process_scan_piped_into_a_closed_reader_is_quiet(tmp_path):
    import subprocess
    import sys

    for i in range(300):
        (tmp_path / f'm{i}.py').write_text(FIXABLE)
    proc = subprocess.Popen([sys.executable, '-m', 'fp16utils', 'scan', str(tmp_path)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader goes away at once (``| head -0``)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 1 and b'Traceback' not in err, err


def test_real_process_env_with_a_bad_backend_is_one_line():
    proc = run('env', env={'FP16UTILS_BACKEND': 'bogus'})
    one_line_error(proc, 2, 'FP16UTILS_BACKEND')

