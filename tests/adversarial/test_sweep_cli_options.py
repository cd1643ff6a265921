"""Sweep: every combination of the options of ``migrate`` and ``scan`` that the help allows.

The cases are generated with ``itertools.combinations`` over each command's option set
(every single option, pair, triple, ...): what the help text allows works, what it
does not is one usage line (exit 2) with nothing written. ``migrate``'s written config
loads back to the dict its Python API returns for the same options.
"""

from __future__ import annotations

import itertools
import json
import warnings

import pytest

from adversarial._attack import call, one_line_error, tree
from fp16utils.migrate import convert_config, enable_amp, load_config

FP16_CONFIG = ("optimizer = dict(type='SGD', lr=0.01)\n"
               'optimizer_config = dict(grad_clip=None)\n'
               'fp16 = dict(loss_scale=512.)\n')
PLAIN_CONFIG = ("optimizer = dict(type='SGD', lr=0.01)\n"
                'optimizer_config = dict(grad_clip=None)\n')
CONFIGS = {'fp16': FP16_CONFIG, 'plain': PLAIN_CONFIG}
DTYPES = ('float16', 'bfloat16', 'auto')


def subsets(options):
    """Every combination of ``options``: none, each one, each pair, each triple, ..."""
    return [combo for r in range(len(options) + 1)
            for combo in itertools.combinations(options, r)]


def _migrate_cases():
    cases = []
    for combo in subsets(('-o', '--amp', '--dtype', '--plugin', '--strict')):
        for dtype in (DTYPES if '--dtype' in combo else (None,)):
            for config in CONFIGS:
                cases.append(pytest.param(
                    config, combo, dtype,
                    id=f'{config}:' + ','.join(o if o != '--dtype' else f'--dtype={dtype}'
                                               for o in combo)))
    return cases


def _loaded(text):
    ns: dict = {}
    exec(text, ns)  # noqa: S102 - the written config under test
    ns.pop('__builtins__')
    return ns


def _api(config_path, plugin, amp, dtype):
    """What the Python API gives for the same options."""
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        converted = convert_config(load_config(str(config_path)), plugin=plugin)
        return enable_amp(converted, dtype=dtype) if amp else converted


# ------------------------------------------------------------------------- migrate


@pytest.mark.parametrize('config, combo, dtype', _migrate_cases())
def test_migrate_option_combination(tmp_path, config, combo, dtype):
    src = tmp_path / 'cfg.py'
    src.write_text(CONFIGS[config])
    target = tmp_path / 'out.py'
    argv = ['migrate', str(src)]
    for option in combo:
        argv += {'-o': ['-o', str(target)], '--dtype': ['--dtype', dtype]}.get(option, [option])
    amp, plugin, strict = '--amp' in combo, '--plugin' in combo, '--strict' in combo
    before = tree(tmp_path)
    proc = call(*argv)

    if dtype is not None and not amp:  # the help: --dtype only with --amp
        one_line_error(proc, 2, '--dtype', '--amp')
        assert proc.stdout == '' and tree(tmp_path) == before
        return

    dtype_ignored = config == 'fp16' and dtype is not None
    warnings_ = [line for line in proc.stderr.splitlines() if ': warning: ' in line]
    if dtype_ignored:  # the config trains in fp16 already: --dtype ignored, with a warning
        assert len(warnings_) == 1, proc.stderr
        assert f"'{dtype}'" in warnings_[0] or f'--dtype {dtype}' in warnings_[0]
        assert 'ignored' in warnings_[0] or 'not applied' in warnings_[0], warnings_[0]
    else:  # a plain valid config: nothing to warn about (--amp on fp16 is no problem)
        assert warnings_ == [], proc.stderr
    if dtype_ignored and strict:  # --strict: a warning is a failure, nothing written
        assert proc.returncode == 1 and proc.stdout == ''
        assert proc.stderr.splitlines()[-1].startswith('fp16utils: error: ')
        assert 'Traceback' not in proc.stderr and tree(tmp_path) == before
        return

    assert proc.returncode == 0, proc.stderr
    assert 'error' not in proc.stderr
    if '-o' in combo:
        assert proc.stdout == f'wrote {target}\n'
        text = target.read_text()
    else:
        text = proc.stdout
        assert not target.exists()
    assert text.startswith('# Converted from cfg.py by `fp16utils migrate`.\n')
    assert src.read_text() == CONFIGS[config]  # the input is never touched

    written = _loaded(text)
    assert written == _api(src, plugin, amp, dtype)
    wrapper = written['optim_wrapper']
    assert wrapper['optimizer'] == dict(type='SGD', lr=0.01)
    in_fp16 = amp or config == 'fp16'
    want_type = ('Fp16utils' if plugin else '') + ('AmpOptimWrapper' if in_fp16
                                                   else 'OptimWrapper')
    assert wrapper['type'] == want_type
    if plugin:
        assert wrapper['constructor'] == 'Fp16utilsOptimWrapperConstructor'
        assert written['custom_imports']['imports'] == ['fp16utils.mmengine']
    else:
        assert 'constructor' not in wrapper and 'custom_imports' not in written
    if config == 'fp16':
        assert wrapper['loss_scale'] == 512.0 and 'dtype' not in wrapper
    elif amp and dtype not in (None, 'float16'):
        assert wrapper['dtype'] == dtype
    elif amp:
        assert wrapper['loss_scale'] == 'dynamic' and wrapper.get('dtype', dtype) == dtype


@pytest.mark.parametrize('combo', subsets(('--amp', '--plugin', '--strict')),
                         ids=lambda c: ','.join(c) or 'none')
def test_migrate_output_to_stdout_dash_is_the_same_text_as_the_file(tmp_path, combo):
    src = tmp_path / 'cfg.py'
    src.write_text(FP16_CONFIG)
    to_stdout = call('migrate', str(src), '-o', '-', *combo)
    to_file = call('migrate', str(src), '-o', str(tmp_path / 'o.py'), *combo)
    plain = call('migrate', str(src), *combo)
    assert to_stdout.returncode == to_file.returncode == plain.returncode == 0
    assert to_stdout.stdout == plain.stdout == (tmp_path / 'o.py').read_text()
    assert not (tmp_path / '-').exists()


# ---------------------------------------------------------------------------- scan

FIXABLE = 'from mmcv.runner import auto_fp16\n'
FIXED = 'from fp16utils import auto_fp16\n'
UNFIXABLE = 'class Head:\n    fp16_enabled = False\n'  # a finding --fix does not rewrite


def _tree_with(kind, root):
    if kind == 'findings':
        (root / 'pkg').mkdir()
        (root / 'pkg' / 'a.py').write_text(FIXABLE)
        (root / 'pkg' / 'head.py').write_text(UNFIXABLE)
        (root / 'pkg' / 'clean.py').write_text('import torch\n')
        return root / 'pkg'
    if kind == 'file':
        (root / 'a.py').write_text(FIXABLE)
        return root / 'a.py'
    (root / 'clean').mkdir()
    (root / 'clean' / 'm.py').write_text('import torch\n')
    return root / 'clean'


@pytest.mark.parametrize('target', ['findings', 'file', 'clean'])
@pytest.mark.parametrize('combo', subsets(('--fix', '--dry-run', '--json')),
                         ids=lambda c: ','.join(c) or 'none')
def test_scan_option_combination(tmp_path, combo, target):
    path = _tree_with(target, tmp_path)
    before = tree(tmp_path)
    proc = call('scan', str(path), *combo)
    fix, dry, as_json = '--fix' in combo, '--dry-run' in combo, '--json' in combo
    assert proc.stderr == '', proc.stderr
    fixable = target in ('findings', 'file')
    a_py = path if target == 'file' else path / 'a.py'

    if not (fix or dry):  # a report: exit 1 with findings, 0 clean; nothing written
        assert proc.returncode == (0 if target == 'clean' else 1)
        assert tree(tmp_path) == before
        if as_json:
            found = json.loads(proc.stdout)
            assert sorted((f['path'], f['line'], f['kind']) for f in found) == {
                'findings': [(str(path / 'a.py'), 1, 'import'),
                             (str(path / 'head.py'), 2, 'fp16-enabled')],
                'file': [(str(path), 1, 'import')], 'clean': []}[target]
        else:
            n = {'findings': 2, 'file': 1, 'clean': 0}[target]
            assert proc.stdout.endswith(f'{n} finding(s) in {n} file(s)\n'), proc.stdout
            assert (f'{a_py}:1:1: import: imports auto_fp16 from mmcv.runner\n'
                    in proc.stdout) == fixable
        return

    # --fix and/or --dry-run: exit 0 when every file that needed it was handled.
    assert proc.returncode == 0, proc.stdout
    if dry or not fixable:
        assert tree(tmp_path) == before  # --dry-run (or a clean tree): nothing written
    else:
        assert a_py.read_text() == FIXED
        if target == 'findings':
            assert (path / 'head.py').read_text() == UNFIXABLE
            assert (path / 'clean.py').read_text() == 'import torch\n'
    if as_json:
        changes = json.loads(proc.stdout)
        assert [(c['path'], c['changed'], c['error']) for c in changes] == (
            [(str(a_py), True, None)] if fixable else [])
        if fixable:
            assert '+from fp16utils import auto_fp16' in changes[0]['diff']
    else:
        verb = 'would change' if dry else 'changed'
        assert proc.stdout.endswith(f'{verb} {int(fixable)} file(s)\n'), proc.stdout
        if dry and fixable:
            assert f'--- {a_py}\n' in proc.stdout
            assert '-from mmcv.runner import auto_fp16\n+from fp16utils import auto_fp16\n' \
                in proc.stdout
        elif fixable:
            assert f'fixed imports in {a_py}\n' in proc.stdout


@pytest.mark.parametrize('combo', subsets(('--fix', '--dry-run', '--json')),
                         ids=lambda c: ','.join(c) or 'none')
def test_scan_path_with_a_leading_dash_after_double_dash(tmp_path, monkeypatch, combo):
    monkeypatch.chdir(tmp_path)
    (tmp_path / '-a.py').write_text(FIXABLE)
    proc = call('scan', *combo, '--', '-a.py')
    fixes = '--fix' in combo or '--dry-run' in combo
    assert proc.returncode == (0 if fixes else 1) and proc.stderr == ''
    assert '-a.py' in proc.stdout
    written = '--fix' in combo and '--dry-run' not in combo
    assert (tmp_path / '-a.py').read_text() == (FIXED if written else FIXABLE)
