"""Attacks on the functions that read and write files: atomic_write, scan, fix_imports,
load_config, format_config, convert_config(_report) and enable_amp.

Each test is one attack; "nothing changed" is checked byte for byte where a call is
refused. Permission problems are simulated with monkeypatch (the tests may run as root).
"""

from __future__ import annotations

import os
import stat
import threading
import warnings
from collections import OrderedDict
from enum import IntEnum

import pytest

from adversarial._attack import denied, deny_listing, deny_temp_files, make_odd, tree
from fp16utils.migrate import (
    ConfigConversionError,
    _source_files,
    convert_config,
    convert_config_report,
    enable_amp,
    fix_imports,
    scan,
)
from fp16utils.migrate._atomic import atomic_write
from fp16utils.migrate.config_files import format_config, load_config
from fp16utils.migrate.errors import CommandError, UsageError

FIXABLE = 'from mmcv.runner import auto_fp16\n'
FIXED = 'from fp16utils import auto_fp16\n'
needs_fifo = pytest.mark.skipif(not hasattr(os, 'mkfifo'), reason='no FIFOs on this system')


def leftovers(folder) -> list[str]:
    return sorted(n for n in os.listdir(folder) if 'fp16utils-tmp' in n)


# ------------------------------------------------------------------ atomic_write


def test_atomic_write_keeps_the_mode_and_leaves_no_temp_file(tmp_path):
    target = tmp_path / 'a.py'
    target.write_text('old')
    os.chmod(target, 0o604)
    atomic_write(target, b'new')
    assert target.read_bytes() == b'new'
    assert stat.S_IMODE(os.stat(target).st_mode) == 0o604
    assert leftovers(tmp_path) == []


def test_atomic_write_of_a_new_file_follows_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_write(tmp_path / 'new.py', b'x')
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / 'new.py').st_mode) == 0o640


def test_atomic_write_never_follows_a_link_planted_at_a_temp_name(tmp_path):
    victim = tmp_path / 'victim.txt'
    victim.write_text('precious')
    target = tmp_path / 'a.py'
    target.write_text('old')
    for name in ('a.py.fp16utils-tmp', '.a.py.fp16utils-tmp', 'a.py.tmp'):
        os.symlink(victim, tmp_path / name)
    atomic_write(target, b'new')
    assert victim.read_text() == 'precious'
    assert target.read_bytes() == b'new'


def test_atomic_write_through_a_link_replaces_the_file_and_keeps_the_link(tmp_path):
    real = tmp_path / 'real' / 'a.py'
    real.parent.mkdir()
    real.write_text('old')
    link = tmp_path / 'link.py'
    os.symlink(real, link)
    atomic_write(link, b'new')
    assert link.is_symlink() and os.readlink(link) == str(real)
    assert real.read_bytes() == b'new'
    assert leftovers(tmp_path) == [] and leftovers(real.parent) == []


def test_atomic_write_refuses_a_dangling_link_and_creates_nothing(tmp_path):
    link = tmp_path / 'link.py'
    os.symlink(tmp_path / 'elsewhere' / 'x.py', link)
    with pytest.raises(OSError, match='dangling'):
        atomic_write(link, b'x')
    assert not (tmp_path / 'elsewhere').exists() and os.listdir(tmp_path) == ['link.py']


def test_atomic_write_refuses_a_link_loop(tmp_path):
    os.symlink(tmp_path / 'b', tmp_path / 'a')
    os.symlink(tmp_path / 'a', tmp_path / 'b')
    with pytest.raises(OSError, match='loop'):
        atomic_write(tmp_path / 'a', b'x')
    assert sorted(os.listdir(tmp_path)) == ['a', 'b']


def test_atomic_write_refuses_a_directory(tmp_path):
    (tmp_path / 'd.py').mkdir()
    with pytest.raises(IsADirectoryError):
        atomic_write(tmp_path / 'd.py', b'x')
    assert (tmp_path / 'd.py').is_dir() and leftovers(tmp_path) == []


@needs_fifo
def test_atomic_write_refuses_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / 'p.py')
    with pytest.raises(OSError, match='not a regular file'):
        atomic_write(tmp_path / 'p.py', b'x')
    assert stat.S_ISFIFO(os.lstat(tmp_path / 'p.py').st_mode)


def test_atomic_write_into_a_missing_folder_fails_cleanly(tmp_path):
    with pytest.raises(FileNotFoundError):
        atomic_write(tmp_path / 'missing' / 'a.py', b'x')
    assert os.listdir(tmp_path) == []


def _interrupt(*args):
    raise KeyboardInterrupt


@pytest.mark.parametrize('step, fails, error', [
    ('replace', denied, PermissionError),  # the move onto the target is refused
    ('fsync', _interrupt, KeyboardInterrupt),  # Ctrl-C in the middle of the write
])
def test_atomic_write_that_fails_midway_keeps_the_original(tmp_path, monkeypatch, step,
                                                           fails, error):
    target = tmp_path / 'a.py'
    target.write_text('old')
    monkeypatch.setattr(os, step, fails)
    with pytest.raises(error):
        atomic_write(target, b'new')
    assert target.read_text() == 'old' and leftovers(tmp_path) == []


def test_atomic_write_in_a_read_only_folder_fails_cleanly(tmp_path, monkeypatch):
    target = tmp_path / 'a.py'
    target.write_text('old')

    deny_temp_files(monkeypatch)
    with pytest.raises(PermissionError):
        atomic_write(target, b'new')
    assert target.read_text() == 'old'


def test_concurrent_atomic_writes_never_mix(tmp_path):
    target = tmp_path / 'a.py'
    target.write_bytes(b'0' * 100_000)
    payloads = [bytes([65 + i]) * 100_000 for i in range(8)]
    errors = []

    def write(data):
        try:
            for _ in range(5):
                atomic_write(target, data)
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=write, args=(p,)) for p in payloads]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == []
    assert target.read_bytes() in payloads and leftovers(tmp_path) == []


# ------------------------------------------------------------------------- scan


@pytest.mark.parametrize('content', [b'', b'\xef\xbb\xbf', b'\r\n\r\n', b'\n' * 10000,
                                     b'# coding: latin-1\n', b'x = 1\r'])
def test_scan_of_empty_and_odd_but_valid_files_is_clean(tmp_path, content):
    (tmp_path / 'm.py').write_bytes(content)
    assert scan(tmp_path) == []


def test_scan_reads_bom_and_crlf_files(tmp_path):
    (tmp_path / 'm.py').write_bytes(b'\xef\xbb\xbf' + FIXABLE.replace('\n', '\r\n').encode())
    assert [(f.line, f.col, f.kind) for f in scan(tmp_path)] == [(1, 1, 'import')]


@pytest.mark.parametrize('content, expected', [
    (b'\x00\x01\x02\xff\xfe binary', 'unreadable'),
    (b'x = "\xff"\n', 'unreadable'),
    (b'# coding: no-such-codec\nx = 1\n', 'unreadable'),
    (b'x = 1\x00\n', 'syntax-error'),
])
def test_scan_reports_binary_and_undecodable_files(tmp_path, content, expected):
    (tmp_path / 'm.py').write_bytes(content)
    (tmp_path / 'n.py').write_text(FIXABLE)
    kinds = [(os.path.basename(f.path), f.kind) for f in scan(tmp_path)]
    assert kinds == [('m.py', expected), ('n.py', 'import')]


@pytest.mark.parametrize('expression', [
    '+'.join(['1'] * 100_000),
    '(' * 300 + '1' + ')' * 300,
    '[' * 5000 + ']' * 5000,
    'not ' * 50_000 + 'x',
])
def test_scan_of_very_deep_expressions_reports_the_file(tmp_path, expression):
    (tmp_path / 'deep.py').write_text(f'x = {expression}\n')
    (kind,) = [f.kind for f in scan(tmp_path)]
    assert kind in ('unreadable', 'syntax-error')


def test_scan_when_the_visit_itself_recurses_too_deep_reports_the_file(tmp_path, monkeypatch):
    from fp16utils.migrate import scanner

    (tmp_path / 'a.py').write_text(FIXABLE)
    (tmp_path / 'b.py').write_text(FIXABLE)

    visit = scanner._Scanner.visit

    def too_deep(self, tree):
        if self.src.path.endswith('a.py'):
            raise RecursionError('maximum recursion depth exceeded')
        return visit(self, tree)

    monkeypatch.setattr(scanner._Scanner, 'visit', too_deep)
    assert [(os.path.basename(f.path), f.kind) for f in scan(tmp_path)] == [
        ('a.py', 'unreadable'), ('b.py', 'import')]


@pytest.mark.parametrize('terms', [1000, 2500])
def test_scan_reads_a_long_flat_expression_that_python_compiles(tmp_path, terms):
    body = FIXABLE + 'x = ' + ' + '.join(['1'] * terms) + '\n'
    (tmp_path / 'm.py').write_text(body)
    compile(body, 'm.py', 'exec')  # Python itself reads it
    assert [f.kind for f in scan(tmp_path)] == ['import']


def test_format_config_writes_non_finite_numbers_that_load_back():
    cfg = {'a': float('inf'), 'b': dict(c=[-float('inf'), float('nan')]),
           'd': complex(float('nan'), 2.0), 'e': (float('inf'),)}
    text = format_config(cfg)
    assert "a = float('inf')" in text and "float('-inf')" in text
    ns: dict = {}
    exec(text, ns)  # noqa: S102 - the text under test
    assert repr({k: ns[k] for k in cfg}) == repr(cfg)


def test_format_config_refuses_a_set_holding_nan_which_cannot_compare_equal():
    with pytest.raises(ValueError, match='s: the written config would not load back'):
        format_config({'s': {float('nan')}})


def test_scan_of_a_huge_single_line_works(tmp_path):
    (tmp_path / 'm.py').write_text('x = "' + 'a' * 2_000_000 + '"; ' + FIXABLE)
    assert [f.kind for f in scan(tmp_path)] == ['import']


@needs_fifo
def test_scan_reports_a_fifo_named_py_without_blocking(tmp_path):
    os.mkfifo(tmp_path / 'pipe.py')
    (finding,) = scan(tmp_path)
    assert finding.kind == 'unreadable' and 'not a regular file' in finding.message


def test_scan_reports_a_dangling_link(tmp_path):
    os.symlink(tmp_path / 'gone.py', tmp_path / 'm.py')
    (finding,) = scan(tmp_path)
    assert finding.kind == 'unreadable' and finding.path.endswith('m.py')


def test_scan_does_not_loop_on_a_folder_link_cycle(tmp_path):
    (tmp_path / 'pkg').mkdir()
    (tmp_path / 'pkg' / 'm.py').write_text(FIXABLE)
    os.symlink(tmp_path, tmp_path / 'pkg' / 'loop')
    assert [f.kind for f in scan(tmp_path)] == ['import']


def test_scan_skips_a_folder_named_like_a_module(tmp_path):
    (tmp_path / 'weird.py').mkdir()
    (tmp_path / 'weird.py' / 'm.py').write_text(FIXABLE)
    assert [os.path.relpath(f.path, tmp_path) for f in scan(tmp_path)] == ['weird.py/m.py']


def test_scan_reports_a_folder_it_cannot_list(tmp_path, monkeypatch):
    (tmp_path / 'locked').mkdir()
    (tmp_path / 'locked' / 'm.py').write_text(FIXABLE)
    deny_listing(monkeypatch, 'locked')
    (finding,) = scan(tmp_path)
    assert finding.kind == 'unreadable' and finding.path.endswith('locked')
    assert 'Permission denied' in finding.message


def test_scan_reports_a_file_it_cannot_open(tmp_path, monkeypatch):
    (tmp_path / 'm.py').write_text(FIXABLE)

    monkeypatch.setattr(_source_files, 'open', denied, raising=False)
    (finding,) = scan(tmp_path)
    assert (finding.kind, finding.message) == ('unreadable',
                                               'cannot read the file: Permission denied')


def test_scan_handles_non_utf8_file_names(tmp_path):
    name = os.fsdecode(b'caf\xe9.py')  # latin-1 bytes: not UTF-8
    with open(os.path.join(str(tmp_path), name), 'w') as fh:
        fh.write(FIXABLE)
    (finding,) = scan(tmp_path)
    assert finding.kind == 'import' and finding.path.endswith(name)


def test_scan_of_a_non_py_file_given_by_name_reads_it(tmp_path):
    (tmp_path / 'script').write_text(FIXABLE)
    assert [f.kind for f in scan(tmp_path / 'script')] == ['import']


# ------------------------------------------------------------------ fix_imports


def test_fix_never_follows_a_link_planted_at_the_old_temp_name(tmp_path):
    victim = tmp_path / 'outside.txt'
    victim.write_text('precious')
    code = tmp_path / 'code'
    code.mkdir()
    (code / 'm.py').write_text(FIXABLE)
    os.symlink(victim, code / 'm.py.fp16utils-tmp')
    (change,) = fix_imports(code)
    assert change.changed and change.error is None
    assert victim.read_text() == 'precious'
    assert (code / 'm.py').read_text() == FIXED


def test_fix_of_a_linked_source_keeps_the_link(tmp_path):
    real = tmp_path / 'real.py'
    real.write_text(FIXABLE)
    code = tmp_path / 'code'
    code.mkdir()
    os.symlink(real, code / 'm.py')
    fix_imports(code)
    assert (code / 'm.py').is_symlink()
    assert real.read_text() == FIXED


def test_fix_keeps_the_mode_of_each_file(tmp_path):
    (tmp_path / 'm.py').write_text(FIXABLE)
    os.chmod(tmp_path / 'm.py', 0o751)
    fix_imports(tmp_path)
    assert stat.S_IMODE(os.stat(tmp_path / 'm.py').st_mode) == 0o751


def test_fix_that_cannot_write_reports_it_and_changes_nothing(tmp_path, monkeypatch):
    (tmp_path / 'm.py').write_text(FIXABLE)

    deny_temp_files(monkeypatch)
    (change,) = fix_imports(tmp_path)
    assert not change.changed and 'could not be written: Permission denied' in change.error
    assert (tmp_path / 'm.py').read_text() == FIXABLE


def test_fix_of_the_same_file_twice_through_a_link_changes_it_once(tmp_path):
    (tmp_path / 'a.py').write_text(FIXABLE)
    os.symlink(tmp_path / 'a.py', tmp_path / 'b.py')
    changes = fix_imports(tmp_path)
    assert [c.changed for c in changes] == [True, False]
    assert (tmp_path / 'a.py').read_text() == FIXED and (tmp_path / 'b.py').is_symlink()


def test_concurrent_fixes_of_one_tree_agree(tmp_path):
    for i in range(20):
        (tmp_path / f'm{i}.py').write_text(f'# {i}\n' + FIXABLE)
    errors = []

    def fix():
        try:
            changes = fix_imports(tmp_path)
            errors.extend(c.error for c in changes if c.error)
        except Exception as err:  # noqa: BLE001 - collected and asserted below
            errors.append(err)

    threads = [threading.Thread(target=fix) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert errors == [] and leftovers(tmp_path) == []
    assert all((tmp_path / f'm{i}.py').read_text() == f'# {i}\n' + FIXED for i in range(20))


@pytest.mark.parametrize('raw', [
    b'\xef\xbb\xbf' + FIXABLE.encode(),
    FIXABLE.replace('\n', '\r\n').encode() + b'x = 1\r\n',
    b'# -*- coding: latin-1 -*-\ns = "\xe9"\n' + FIXABLE.encode(),
    FIXABLE.rstrip('\n').encode(),
])
def test_fix_keeps_bom_line_endings_and_encoding(tmp_path, raw):
    (tmp_path / 'm.py').write_bytes(raw)
    (change,) = fix_imports(tmp_path)
    assert change.changed
    assert (tmp_path / 'm.py').read_bytes() == raw.replace(b'mmcv.runner', b'fp16utils')


def test_fix_reports_unreadable_files_and_folders(tmp_path, monkeypatch):
    (tmp_path / 'bin.py').write_bytes(b'\xff\xfe\x00')
    (tmp_path / 'locked').mkdir()
    deny_listing(monkeypatch, 'locked')
    changes = fix_imports(tmp_path)
    assert sorted((os.path.basename(c.path), c.error.split(':')[0]) for c in changes) == [
        ('bin.py', 'cannot decode the file'), ('locked', 'cannot list the folder')]
    assert (tmp_path / 'bin.py').read_bytes() == b'\xff\xfe\x00'


def test_fix_dry_run_writes_nothing_anywhere(tmp_path):
    (tmp_path / 'm.py').write_text(FIXABLE)
    before = tree(tmp_path)
    (change,) = fix_imports(tmp_path, dry_run=True)
    assert change.changed and '+from fp16utils import auto_fp16' in change.diff
    assert tree(tmp_path) == before


def test_fix_of_a_very_deep_file_skips_it(tmp_path):
    (tmp_path / 'deep.py').write_text(FIXABLE + 'x = ' + '+'.join(['1'] * 100_000) + '\n')
    (change,) = fix_imports(tmp_path)
    assert not change.changed and 'nest too deeply' in change.error
    assert (tmp_path / 'deep.py').read_text().startswith(FIXABLE)


@needs_fifo
def test_fix_reports_a_fifo_without_blocking(tmp_path):
    os.mkfifo(tmp_path / 'p.py')
    (change,) = fix_imports(tmp_path)
    assert not change.changed and 'not a regular file' in change.error


# ------------------------------------------------------------------ load_config


def write(path, text):
    path.write_text(text)
    return path


@pytest.mark.parametrize('base, needle', [
    ('5', '_base_ must be a file name or a list of file names (str), got 5'),
    ("['ok.py', 3]", "got ['ok.py', 3]"),
    ("{'a': 1}", "got {'a': 1}"),
    ("'missing.py'", 'missing.py does not exist'),
    ("'sub'", 'is a directory'),
    ("'c.py'", 'cycle'),
])
def test_load_config_refuses_odd_bases_with_one_clear_error(tmp_path, base, needle):
    (tmp_path / 'sub').mkdir()
    write(tmp_path / 'ok.py', 'a = 1\n')
    cfg = write(tmp_path / 'c.py', f'_base_ = {base}\n')
    with pytest.raises(CommandError, match=__import__('re').escape(needle)):
        load_config(cfg)


def test_load_config_refuses_a_two_file_cycle(tmp_path):
    write(tmp_path / 'a.py', "_base_ = 'b.py'\n")
    write(tmp_path / 'b.py', "_base_ = ['a.py']\n")
    with pytest.raises(CommandError, match='cycle'):
        load_config(tmp_path / 'a.py')


@pytest.mark.parametrize('text, needle', [
    ('raise RuntimeError("boom")\n', 'RuntimeError: boom'),
    ('import sys\nsys.exit(3)\n', 'it called exit(3)'),
    ('exit()\n', 'it called exit(None)'),
    ('def f(): f()\nf()\n', 'RecursionError'),
    ('x = ' + '+'.join(['1'] * 100_000) + '\n', 'RecursionError'),
    ('raise GeneratorExit\n', 'GeneratorExit'),
    ('x = (\n', 'syntax error'),
    ('raise ValueError("a\\nb")\n', 'ValueError: a b'),
])
def test_load_config_turns_every_failure_of_the_file_into_one_error(tmp_path, text, needle):
    with pytest.raises(CommandError) as info:
        load_config(write(tmp_path / 'c.py', text))
    assert needle in str(info.value) and '\n' not in str(info.value)


def test_load_config_of_an_undecodable_file_names_the_line(tmp_path):
    (tmp_path / 'c.py').write_bytes(b'x = "\xff"\n')
    with pytest.raises(CommandError, match=r'c\.py:1: syntax error'):
        load_config(tmp_path / 'c.py')


def test_load_config_lets_keyboard_interrupt_through(tmp_path):
    with pytest.raises(KeyboardInterrupt):
        load_config(write(tmp_path / 'c.py', 'raise KeyboardInterrupt\n'))


@pytest.mark.parametrize('make', ['missing', 'dir', 'dangling', 'loop', 'fifo'])
def test_load_config_of_something_that_is_not_a_file_is_a_usage_error(tmp_path, make):
    path = make_odd(tmp_path / 'c.py', make)
    with pytest.raises((UsageError, CommandError)):
        load_config(path)


@pytest.mark.parametrize('raw', [b'', b'\xef\xbb\xbfa = 1\r\n', b'a = 1\r', b'# only\n'])
def test_load_config_of_empty_bom_and_crlf_files(tmp_path, raw):
    (tmp_path / 'c.py').write_bytes(raw)
    assert load_config(tmp_path / 'c.py') == ({} if b'a' not in raw else {'a': 1})


def test_load_config_leaves_out_functions_classes_modules_and_builtins(tmp_path):
    cfg = write(tmp_path / 'c.py', 'import os\nfrom math import sqrt\ndef f(): pass\n'
                                   'class C: pass\na = 1\n')
    assert load_config(cfg) == {'a': 1}


# ---------------------------------------------------------------- format_config


@pytest.mark.parametrize('cfg', [
    {'a': {'class': 1, 'import': {'if': 2}}},
    {'a': {'not an identifier': 1, 3: 'int key', (1, 2): 'tuple', None: 0, True: 1}},
    {'a': (1,), 'b': (), 'c': [], 'd': {}, 'e': ((1,),)},
    {'a': {1, 2}, 'b': set(), 'c': frozenset({3}), 'd': frozenset()},
    {'a': b'\x00\xff', 'b': 1j, 'c': -0.0, 'd': 1e308, 'e': 10 ** 100},
    {'a': 'quote \' " \\ \n \udcff', 'b': '\u2028', 'c': '#'},
    {'a': OrderedDict(b=1)},
])
def test_format_config_writes_what_loads_back_equal(cfg):
    text = format_config(cfg)
    namespace: dict = {}
    exec(text, namespace)  # noqa: S102 - the text under test
    del namespace['__builtins__']
    assert namespace == cfg


@pytest.mark.parametrize('cfg, needle', [
    ({'a': int}, "a: <class 'int'> (type)"),
    ({'a': {'f': len}}, 'a.f: <built-in function len>'),
    ({'a': os}, '(module)'),
    ({'a': lambda: 0}, '(function)'),
    ({'a': object()}, '(object)'),
    ({'a': IntEnum('E', 'X').X}, '(E)'),
    ({'a': {int: 1}}, "a[<class 'int'>]"),
    ({'class': 1}, 'a top-level config key must be a Python name'),
    ({'a b': 1}, 'a top-level config key must be a Python name'),
    ({1: 1}, 'a top-level config key must be a Python name'),
    ({'__builtins__': 1}, 'not a config key'),
])
def test_format_config_refuses_what_cannot_load_back(cfg, needle):
    with pytest.raises(ValueError) as info:
        format_config(cfg)
    assert needle in str(info.value)


def test_format_config_refuses_a_value_with_an_evil_repr():
    class Evil(str):
        def __repr__(self):
            return "__import__('os').system('echo pwned')"

    with pytest.raises(ValueError, match='cannot be written as a literal'):
        format_config({'a': Evil('x')})


def test_format_config_of_a_self_containing_value_is_refused():
    loop: list = []
    loop.append(loop)
    with pytest.raises(ValueError, match='nests too deeply'):
        format_config({'a': loop})


def test_format_config_of_a_very_deep_value_is_refused():
    deep: dict = {}
    node = deep
    for _ in range(5000):
        node['x'] = {}
        node = node['x']
    with pytest.raises(ValueError):
        format_config({'a': deep})


def test_format_config_of_an_int_too_long_for_repr_is_refused():
    with pytest.raises(ValueError):
        format_config({'a': 10 ** 5000})


# ------------------------------------------------------ convert_config, enable_amp


ODD_VALUES = [None, 5, 'x', [1], (1,), {'type': None}, {'type': 5}, {'_delete_': True},
              float('nan'), object(), {'type': 'SGD', 'lr': float('inf')}]


@pytest.mark.parametrize('key', ['optimizer', 'optimizer_config', 'fp16', 'runner',
                                 'train_cfg', 'optim_wrapper'])
def test_convert_and_enable_amp_never_crash_on_odd_values(key):
    for value in ODD_VALUES:
        cfg = {key: value}
        snapshot = repr(cfg)
        converted, problems = convert_config_report(cfg)
        assert isinstance(converted, dict) and isinstance(problems, list)
        assert repr(cfg) == snapshot  # the input is never changed
        try:
            with warnings.catch_warnings():
                warnings.simplefilter('ignore')
                enable_amp(converted)
        except ValueError as err:
            assert str(err)


def test_convert_config_strict_raises_one_error_listing_the_problems():
    with pytest.raises(ConfigConversionError) as info:
        convert_config({'optimizer': 5, 'fp16': 'yes'}, strict=True)
    assert [p.split(':')[0] for p in info.value.problems] == ['optimizer']
    assert str(info.value).startswith('the config cannot be converted safely')


def test_convert_config_refuses_a_non_dict():
    with pytest.raises((TypeError, ValueError)):
        convert_config([('fp16', {})])


# ------------------------------------------------------------------ read-only targets


def test_atomic_write_refuses_a_read_only_file_even_as_root(tmp_path):
    target = tmp_path / 'a.py'
    target.write_text('old')
    os.chmod(target, 0o444)
    with pytest.raises(PermissionError, match='read-only'):
        atomic_write(target, b'new')
    assert target.read_text() == 'old' and leftovers(tmp_path) == []


def test_fix_skips_a_read_only_source_and_says_why(tmp_path):
    (tmp_path / 'm.py').write_text(FIXABLE)
    os.chmod(tmp_path / 'm.py', 0o444)
    (change,) = fix_imports(tmp_path)
    assert not change.changed and 'read-only' in change.error
    assert (tmp_path / 'm.py').read_text() == FIXABLE
