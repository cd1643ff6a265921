"""Sweep: file and folder names that are not UTF-8 or hold odd characters.

``scan --json`` keeps every path as the file system gives it (an undecodable byte as a
surrogate escape, which json writes as ``\\udcXX``), so ``os.fsencode(json path)``
opens the file. Text output prints a printable name as it is, and one with
undecodable bytes or control characters in bash's ``$'...'`` quoting, which pasted
into bash names the file. ``scan --fix`` and ``migrate`` name files the same way.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys

import pytest

from adversarial._attack import call, one_line_error, tree

FIXABLE = b'from mmcv.runner import auto_fp16\n'
FIXED = b'from fp16utils import auto_fp16\n'
CONFIG = (b"model = dict(type='RetinaNet')\noptimizer = dict(type='SGD', lr=0.01)\n"
          b"fp16 = dict(loss_scale=512.)\n")

#: Relative names (bytes), a folder part included where there is a slash.
NAMES = [
    b'\xfe.py', b'caf\xe9.py', b'd\xff/m.py', b'sp ace.py', b'new\nline.py', b'tab\t.py',
    b"qu'ote.py", b'dq"uote.py', b'$dollar.py', b'$(touch pwned).py', b'back\\slash.py',
    b'-dash.py', 'é.py'.encode(), '😀.py'.encode(), b'\x1b[31mred.py', b'cr\r.py',
    b"mix \xe9'$\\\n.py", 'd é/x\t.py'.encode(), b'sp\xff ce/-\x7f.py',
]
IDS = [repr(n)[2:-1] for n in NAMES]


def place(root: str, name: bytes, content: bytes) -> bytes:
    """Write ``content`` at ``root/name`` (folders made); return the full path as bytes."""
    full = os.path.join(os.fsencode(root), name)
    os.makedirs(os.path.dirname(full), exist_ok=True)
    with open(full, 'wb') as fh:
        fh.write(content)
    return full


def printable(full: bytes) -> bool:
    return os.fsdecode(full).isprintable()


def bash_reads(quoted) -> bytes:
    """What ``cat -- QUOTED`` prints, the quoted text (str or bytes) pasted into bash."""
    if not shutil.which('bash'):
        pytest.skip('no bash here')
    command = (b'cat -- ' + quoted) if isinstance(quoted, bytes) else f'cat -- {quoted}'
    proc = subprocess.run(['bash', '-c', command], capture_output=True, timeout=30, cwd='/')
    assert proc.returncode == 0, (quoted, proc.stderr)
    return proc.stdout


def assert_names_the_file(shown: str, full: bytes) -> None:
    """``shown`` is the name as printed: as it is, or $'...' that bash reads as the file."""
    if printable(full):
        assert shown == os.fsdecode(full), shown
    else:
        assert shown.startswith("$'") and shown.endswith("'") and shown.isprintable(), shown
        with open(full, 'rb') as fh:
            assert bash_reads(shown) == fh.read(), shown


def split_shown(line: str, tail: str) -> str:
    """The name part of ``line``, which ends with ``tail``."""
    assert line.endswith(tail), line
    return line[:-len(tail)]


@pytest.mark.parametrize('name', NAMES, ids=IDS)
def test_scan_json_path_opens_the_real_file(tmp_path, name):
    full = place(str(tmp_path), name, FIXABLE)
    proc = call('scan', str(tmp_path), '--json')
    assert proc.returncode == 1 and proc.stderr == ''
    proc.stdout.encode('ascii')  # \uXXXX escapes: plain ASCII JSON
    (finding,) = json.loads(proc.stdout)
    assert (finding['kind'], finding['line'], finding['col']) == ('import', 1, 1)
    assert os.fsencode(finding['path']) == full
    with open(os.fsencode(finding['path']), 'rb') as fh:
        assert fh.read() == FIXABLE


@pytest.mark.parametrize('name', NAMES, ids=IDS)
def test_scan_text_names_the_file_as_it_is_or_bash_quoted(tmp_path, name):
    full = place(str(tmp_path), name, FIXABLE)
    proc = call('scan', str(tmp_path))
    assert proc.returncode == 1 and proc.stderr == ''
    lines = proc.stdout.splitlines()
    assert len(lines) == 3 and lines[-1] == '1 finding(s) in 1 file(s)', proc.stdout
    shown = split_shown(lines[0], ':1:1: import: imports auto_fp16 from mmcv.runner')
    assert_names_the_file(shown, full)


@pytest.mark.parametrize('name', NAMES, ids=IDS)
def test_scan_fix_rewrites_in_place_and_reports_the_name_the_same_way(tmp_path, name):
    full = place(str(tmp_path), name, FIXABLE)
    proc = call('scan', str(tmp_path), '--fix')
    assert proc.returncode == 0 and proc.stderr == ''
    with open(full, 'rb') as fh:
        assert fh.read() == FIXED
    first, last = proc.stdout.splitlines()
    assert last == 'changed 1 file(s)'
    assert first.startswith('fixed imports in ')
    assert_names_the_file(first[len('fixed imports in '):], full)
    entries = sorted(os.listdir(os.path.dirname(full)))
    assert entries == [os.path.basename(full)]  # no temp file left beside it


@pytest.mark.parametrize('name', NAMES, ids=IDS)
def test_scan_fix_json_and_dry_run_name_the_real_file(tmp_path, name):
    full = place(str(tmp_path), name, FIXABLE)
    dry = call('scan', str(tmp_path), '--dry-run', '--json')
    (change,) = json.loads(dry.stdout)
    assert dry.returncode == 0 and os.fsencode(change['path']) == full and change['changed']
    with open(full, 'rb') as fh:
        assert fh.read() == FIXABLE  # --dry-run wrote nothing
    fixed = call('scan', os.fsdecode(full), '--fix', '--json')  # the file itself as PATH
    (change,) = json.loads(fixed.stdout)
    assert fixed.returncode == 0 and os.fsencode(change['path']) == full
    with open(full, 'rb') as fh:
        assert fh.read() == FIXED


def test_scan_of_a_file_that_cannot_be_read_names_it_the_same_way_on_stderr(tmp_path):
    full = place(str(tmp_path), b'bad\xff\n.py', b'\xff\xfe\x00')
    proc = call('scan', str(tmp_path), '--fix')
    line = one_line_error(proc, 1, 'cannot decode the file')
    shown = line[len('fp16utils: error: '):line.index(': cannot decode')]
    assert_names_the_file(shown, full)
    with open(full, 'rb') as fh:
        assert fh.read() == b'\xff\xfe\x00'


# ------------------------------------------------------------------------- migrate


@pytest.mark.parametrize('name', NAMES, ids=IDS)
def test_migrate_of_a_config_at_an_odd_path_converts_and_names_it(tmp_path, name):
    full = place(str(tmp_path), name, CONFIG)
    proc = call('migrate', os.fsdecode(full))
    assert proc.returncode == 0 and proc.stderr == ''
    header, *rest = proc.stdout.splitlines()
    assert header.startswith('# Converted from ') and header.endswith(' by `fp16utils migrate`.')
    ns: dict = {}
    exec(proc.stdout, ns)  # noqa: S102 - the name cannot break the written config
    assert ns['optim_wrapper']['loss_scale'] == 512.0
    if printable(full):
        assert header == f'# Converted from {os.fsdecode(os.path.basename(full))} by ' \
                         '`fp16utils migrate`.'


@pytest.mark.parametrize('name', NAMES, ids=IDS)
def test_migrate_output_to_an_odd_path_is_written_there_and_named(tmp_path, name):
    src = place(str(tmp_path), b'src/cfg.py', CONFIG)
    out = os.path.join(os.fsencode(tmp_path), b'out', name)
    os.makedirs(os.path.dirname(out))
    proc = call('migrate', os.fsdecode(src), '-o', os.fsdecode(out))
    assert proc.returncode == 0 and proc.stderr == ''
    assert proc.stdout.startswith('wrote ') and proc.stdout.endswith('\n')
    assert_names_the_file(proc.stdout[len('wrote '):-1], out)
    with open(out, 'rb') as fh:
        assert fh.read().startswith(b'# Converted from cfg.py')


@pytest.mark.parametrize('name', NAMES, ids=IDS)
def test_migrate_errors_name_an_odd_config_path_the_same_way(tmp_path, name):
    full = place(str(tmp_path), name, b"raise RuntimeError('boom')\n")
    before = tree(tmp_path)
    line = one_line_error(call('migrate', os.fsdecode(full), '-o', str(tmp_path / 'o.py')), 1,
                          'RuntimeError: boom')
    shown = line[len('fp16utils: error: '):line.index(': could not be executed')]
    assert_names_the_file(shown, full)
    assert tree(tmp_path) == before and not (tmp_path / 'o.py').exists()


@pytest.mark.parametrize('name', [b'\xfe.py', b'new\nline.py', b'sp ace.py'],
                         ids=['undecodable', 'newline', 'space'])
def test_migrate_of_a_missing_odd_path_is_a_usage_error_naming_it(tmp_path, name):
    missing = os.path.join(os.fsencode(tmp_path), name)
    line = one_line_error(call('migrate', os.fsdecode(missing)), 2, 'no such config file')
    shown = line[len('fp16utils: error: '):line.index(': no such config file')]
    if printable(missing):
        assert shown == os.fsdecode(missing)
    else:
        assert shown.startswith("$'") and '\\x' in shown and shown.isprintable()


def test_migrate_warnings_name_an_odd_config_path_the_same_way(tmp_path):
    full = place(str(tmp_path), b'w\xfe\t.py',
                 b"model = dict(type='RetinaNet')\nfp16 = dict(loss_scale=512.)\n")
    proc = call('migrate', os.fsdecode(full), '--strict')
    assert proc.returncode == 1 and proc.stdout == ''
    warning, error = proc.stderr.splitlines()
    assert_names_the_file(warning[:warning.index(': warning: ')], full)
    assert error.startswith('fp16utils: error: ')
    assert_names_the_file(error[len('fp16utils: error: '):error.index(': 1 problem')], full)


# --------------------------------------------------- a real process, its stdout not UTF-8


@pytest.mark.parametrize('encoding', ['ascii', 'latin-1'])
def test_real_process_scan_to_a_non_utf8_stdout_names_unicode_files_bash_reads(tmp_path,
                                                                             encoding):
    full = place(str(tmp_path), '😀 é.py'.encode(), FIXABLE)
    env = dict(os.environ, PYTHONIOENCODING=encoding)
    env.pop('FP16UTILS_BACKEND', None)
    proc = subprocess.run([sys.executable, '-m', 'fp16utils', 'scan', str(tmp_path)],
                          capture_output=True, env=env, timeout=60)
    assert proc.returncode == 1 and b'Traceback' not in proc.stderr, proc.stderr[-600:]
    first = proc.stdout.splitlines()[0]
    tail = b':1:1: import: imports auto_fp16 from mmcv.runner'
    assert first.endswith(tail), first
    with open(full, 'rb') as fh:
        assert bash_reads(first[:-len(tail)]) == fh.read(), first
