"""Sweep: the edges of Python and of floating point that scan, migrate and the
diagnostics meet: very long and very deep expressions, huge configs, inf and nan in a
config, and float64 magnitudes beyond float32.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
from pathlib import Path

import pytest
import torch
from torch import nn

import fp16utils
from adversarial._attack import call, one_line_error, tree

FIXABLE = 'from mmcv.runner import auto_fp16\n'
FIXED = 'from fp16utils import auto_fp16\n'
MMCV_PY = Path.home() / '.cache' / 'fp16utils' / 'consumers' / 'bin' / 'python'

LONG = FIXABLE + 'x = ' + ' + '.join(['1'] * 1000) + '\n'
DEEP = {  # valid Python that nests deeper than the parser takes
    'parens': FIXABLE + 'x = ' + '(' * 300 + '1' + ')' * 300 + '\n',
    'brackets': FIXABLE + 'x = ' + '[' * 300 + ']' * 300 + '\n',
    'mixed': FIXABLE + 'x = ' + '([{' * 100 + '}])' * 100 + '\n',
    'unary': FIXABLE + 'x = ' + '-' * 5000 + '1\n',
}


# ---------------------------------------------------------------- long and deep code


def test_scan_reads_a_1000_term_expression_and_reports_its_import(tmp_path):
    compile(LONG, 'long.py', 'exec')  # the file is valid Python that Python itself compiles
    (tmp_path / 'long.py').write_text(LONG)
    proc = call('scan', str(tmp_path), '--json')
    assert proc.returncode == 1 and proc.stderr == ''
    assert [(f['kind'], f['line'], f['message']) for f in json.loads(proc.stdout)] == [
        ('import', 1, 'imports auto_fp16 from mmcv.runner')]


def test_scan_fix_of_a_1000_term_expression_rewrites_only_the_import(tmp_path):
    (tmp_path / 'long.py').write_text(LONG)
    proc = call('scan', str(tmp_path / 'long.py'), '--fix')
    assert (proc.returncode, proc.stderr) == (0, '')
    assert (tmp_path / 'long.py').read_text() == FIXED + LONG[len(FIXABLE):]


@pytest.mark.parametrize('kind', sorted(DEEP))
def test_scan_reports_a_too_deep_file_as_unreadable_and_scans_the_others(tmp_path, kind):
    (tmp_path / 'deep.py').write_text(DEEP[kind])
    (tmp_path / 'ok.py').write_text(FIXABLE)
    proc = call('scan', str(tmp_path), '--json')
    assert proc.returncode == 1 and proc.stderr == '' and 'Traceback' not in proc.stdout
    found = sorted((os.path.basename(f['path']), f['kind'], f['message'])
                   for f in json.loads(proc.stdout))
    assert [(name, k) for name, k, _ in found] == [('deep.py', 'unreadable'),
                                                    ('ok.py', 'import')], found
    assert 'nest' in found[0][2], found[0][2]
    text = call('scan', str(tmp_path))
    assert text.stdout.endswith('2 finding(s) in 2 file(s) (1 could not be read: not scanned)\n')


@pytest.mark.parametrize('kind', sorted(DEEP))
def test_scan_fix_skips_a_too_deep_file_in_one_line_and_fixes_the_others(tmp_path, kind):
    (tmp_path / 'deep.py').write_text(DEEP[kind])
    (tmp_path / 'ok.py').write_text(FIXABLE)
    proc = call('scan', str(tmp_path), '--fix')
    one_line_error(proc, 1, 'deep.py', 'nest')
    assert (tmp_path / 'deep.py').read_text() == DEEP[kind]
    assert (tmp_path / 'ok.py').read_text() == FIXED
    assert proc.stdout.endswith('changed 1 file(s), skipped 1 that could not be read or '
                                'written\n')


# -------------------------------------------------------------------- huge configs


def test_migrate_of_a_config_with_20000_keys_loads_back_the_same(tmp_path):
    big = {f'k{i}': i for i in range(20000)}
    (tmp_path / 'c.py').write_text("model = dict(type='RetinaNet')\n"
                                   "optimizer = dict(type='SGD', lr=0.01)\n"
                                   'fp16 = dict(loss_scale=512.)\n'
                                   f'big = {big!r}\n')
    proc = call('migrate', str(tmp_path / 'c.py'), '-o', str(tmp_path / 'out.py'))
    assert proc.returncode == 0 and proc.stderr == ''
    ns: dict = {}
    exec((tmp_path / 'out.py').read_text(), ns)  # noqa: S102 - the text under test
    assert ns['big'] == big and ns['optim_wrapper']['loss_scale'] == 512.0


def test_migrate_of_a_5_mb_list_converts_or_is_refused_in_one_line(tmp_path):
    items = [f'{i:06d}' + 'x' * 94 for i in range(50_000)]  # 50,000 strings of 100
    (tmp_path / 'c.py').write_text("optimizer = dict(type='SGD', lr=0.01)\n"
                                   f'big = {items!r}\n')
    assert (tmp_path / 'c.py').stat().st_size > 5_000_000
    before = tree(tmp_path)
    proc = call('migrate', str(tmp_path / 'c.py'), '-o', str(tmp_path / 'out.py'))
    if proc.returncode == 0:
        assert proc.stderr == ''
        ns: dict = {}
        exec((tmp_path / 'out.py').read_text(), ns)  # noqa: S102
        assert ns['big'] == items
    else:
        one_line_error(proc, 1, 'c.py')
        assert tree(tmp_path) == before


def test_migrate_writes_a_dict_of_many_keys_as_a_literal_that_compiles_in_linear_time(tmp_path):
    """CPython compiles dict(k0=..., ...) in time quadratic in the keys (its duplicate-
    keyword check): 15x the {...} literal at 10,000 keys, 50x at 40,000. Past 255 keys
    migrate writes the literal; below, the readable dict(...)."""
    big = {f'k{i}': i for i in range(10_000)}
    small = {f'k{i}': i for i in range(255)}
    (tmp_path / 'c.py').write_text(f'big = {big!r}\nsmall = {small!r}\n')
    assert call('migrate', str(tmp_path / 'c.py'), '-o', str(tmp_path / 'out.py')
                ).returncode == 0
    written = (tmp_path / 'out.py').read_text()
    assert "big = {\n    'k0': 0," in written and 'small = dict(\n    k0=0,' in written
    ns: dict = {}
    exec(written, ns)  # noqa: S102 - the text under test
    assert ns['big'] == big and ns['small'] == small


# ------------------------------------------------------------------ inf and nan

NON_FINITE = (
    "optimizer = dict(type='SGD', lr=0.01, weight_decay=-0.0)\n"
    "optimizer_config = dict(grad_clip=dict(max_norm=float('inf'), norm_type=float('inf')))\n"
    'fp16 = dict(loss_scale=512.)\n'
    "model = dict(ignore_index=float('inf'), clip=float('nan'), low=float('-inf'),\n"
    '             top=1.7976931348623157e308, tiny=5e-324,\n'
    "             nested=[(float('nan'), {'k': float('-inf')})])\n")


def _same(a, b) -> bool:
    """Equal, nan equal to nan, -0.0 apart from 0.0, types kept."""
    if isinstance(a, float) and isinstance(b, float):
        return (math.isnan(a) and math.isnan(b)) or (a == b and math.copysign(1, a) ==
                                                       math.copysign(1, b))
    if type(a) is not type(b):
        return False
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_same(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.parametrize('extra', [(), ('--amp', '--plugin')], ids=['plain', 'amp-plugin'])
def test_migrate_writes_inf_and_nan_so_that_they_load_back(tmp_path, extra):
    (tmp_path / 'c.py').write_text(NON_FINITE)
    proc = call('migrate', str(tmp_path / 'c.py'), '-o', str(tmp_path / 'out.py'), *extra)
    assert proc.returncode == 0, proc.stderr
    written = (tmp_path / 'out.py').read_text()
    for literal in ("float('inf')", "float('-inf')", "float('nan')"):
        assert literal in written
    ns: dict = {}
    exec(written, ns)  # noqa: S102 - the text under test
    old: dict = {}
    exec(NON_FINITE, old)  # noqa: S102
    assert _same(ns['model'], old['model']), ns['model']
    assert ns['optim_wrapper']['clip_grad'] == dict(max_norm=math.inf, norm_type=math.inf)
    assert math.copysign(1, ns['optim_wrapper']['optimizer']['weight_decay']) == -1


def test_migrated_inf_and_nan_load_back_in_mmcv_config_fromfile(tmp_path):
    if not MMCV_PY.exists():
        pytest.skip(f'no consumer virtualenv with mmcv 1.7.2 at {MMCV_PY}')
    (tmp_path / 'c.py').write_text(NON_FINITE)
    assert call('migrate', str(tmp_path / 'c.py'), '-o', str(tmp_path / 'out.py')).returncode == 0
    script = ('import sys, json, warnings\nwarnings.simplefilter("ignore")\n'
              'from mmcv import Config\n'
              'cfg = Config.fromfile(sys.argv[1])\n'
              'print(repr(cfg.model.to_dict()))\n'
              'print(repr(cfg.optim_wrapper.to_dict()))\n')
    proc = subprocess.run([str(MMCV_PY), '-c', script, str(tmp_path / 'out.py')],
                          capture_output=True, text=True, timeout=120)
    if 'No module named' in proc.stderr and 'mmcv' in proc.stderr:
        pytest.skip('mmcv 1.7.2 is not (yet) importable in the consumer virtualenv')
    assert proc.returncode == 0, proc.stderr[-2000:]
    model, wrapper = proc.stdout.splitlines()[-2:]
    nan, inf = math.nan, math.inf  # noqa: F841 - the names repr() writes
    old: dict = {}
    exec(NON_FINITE, old)  # noqa: S102
    assert _same(eval(model), old['model']), model  # noqa: S307 - mmcv's repr of floats
    assert eval(wrapper)['clip_grad'] == dict(max_norm=inf, norm_type=inf)  # noqa: S307


# --------------------------------------------------- float64 beyond float32's range


@pytest.mark.parametrize('values, want', [
    ([1e300, float('inf'), -2.0], 1e300),
    ([-1e300, float('nan'), float('-inf')], 1e300),
    ([1e-320, float('inf')], 1e-320),  # a float64 subnormal, not flushed to 0
])
def test_nonfinite_summary_of_float64_keeps_the_float64_max_abs(values, want):
    (record,) = fp16utils.nonfinite_summary({'w': torch.tensor(values, dtype=torch.float64)})
    assert record.max_abs == want and record.dtype == torch.float64
    assert (record.num_inf, record.num_nan) == (
        sum(math.isinf(v) for v in values), sum(math.isnan(v) for v in values))


def test_nonfinite_summary_of_complex128_judges_the_float64_parts():
    t = torch.tensor([complex(1e300, 0), complex(0, float('inf'))], dtype=torch.complex128)
    (record,) = fp16utils.nonfinite_summary([t])
    assert record.max_abs == 1e300 and record.num_inf == 1


def test_find_overflow_record_of_a_float64_output_keeps_its_max_abs():
    class Scale(nn.Module):
        def forward(self, x):
            return x * torch.tensor([1e300, float('inf'), 1.0], dtype=torch.float64)

    model = nn.Sequential(Scale())
    with fp16utils.find_overflow(model) as report:
        model(torch.ones(3, dtype=torch.float64))
    assert report.first_module == '0'
    assert report.to_dict()['forward']['max_abs'] == 1e300
    assert '1e+300' in str(report)
