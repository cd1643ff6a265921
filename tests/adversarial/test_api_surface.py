"""Adversarial use of the rest of the public surface: the backend choice, ``_torch``'s
public helpers, lazy attribute access, the MMEngine plug-in without mmengine, and
``patch_mmcv`` / ``unpatch_mmcv``.
"""

from __future__ import annotations

import importlib
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from test_mmcv import FAKE_MMCV, fake_mmcv, forget_mmcv, write_fake_mmcv  # noqa: F401
from torch import nn

import fp16utils
from fp16utils import _torch

ROOT = Path(__file__).resolve().parents[2]


def fresh_python(code, **env):
    import os

    environ = dict(os.environ, PYTHONPATH=str(ROOT))
    environ.update(env)
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True,
                          text=True, env=environ, timeout=120)


# --------------------------------------------------------------------------- backend choice


@pytest.mark.parametrize('value', ['bogus', 'natve', 'cuda', '1'])
def test_bad_backend_variable_is_one_clear_error_naming_it(force_backend, value):
    force_backend(value)

    class Net(nn.Linear):
        fp16_enabled = False

    net = Net(1, 1)
    with pytest.raises(ValueError, match=rf"FP16UTILS_BACKEND='{value}' is not a backend; "
                                         r"set it to one of \('native', 'legacy'\)"):
        fp16utils.wrap_fp16_model(net)
    assert net.fp16_enabled is False and net.weight.dtype == torch.float32


def test_bad_backend_variable_fails_in_a_fresh_process_without_a_deep_traceback():
    done = fresh_python('''
        import torch, fp16utils
        from torch import nn
        class Net(nn.Linear):
            fp16_enabled = False
        fp16utils.wrap_fp16_model(Net(1, 1))
        ''', FP16UTILS_BACKEND='nope')
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith("ValueError: FP16UTILS_BACKEND='nope' is not a backend")
    assert 'torch/' not in done.stderr.replace('fp16utils/_torch/', '')


@pytest.mark.parametrize(('value', 'backend'), [(' Legacy ', 'legacy'), ('NATIVE', 'native')])
def test_backend_variable_ignores_case_and_spaces(force_backend, value, backend):
    force_backend(value)
    assert _torch.versions.default_backend() == backend


def test_empty_backend_variable_means_unset(force_backend):
    force_backend('')
    assert _torch.versions.default_backend() == 'native'


@pytest.mark.parametrize('backend', ['bogus', 'Native', 1, ['native']])
def test_backend_argument_must_be_a_known_name(backend):
    with pytest.raises(ValueError, match='Unknown fp16utils backend'):
        _torch.versions.resolve_backend(backend)


def test_native_backend_on_a_torch_without_native_amp_says_so(old_torch):
    with pytest.raises(ValueError, match="backend='native' needs torch >= 1.6"):
        _torch.versions.resolve_backend('native')
    assert _torch.versions.resolve_backend(None) == 'legacy'


# --------------------------------------------------------------------------- _torch's public bits


@pytest.mark.parametrize('version', [None, '', 'abc', (1, 6), '1..6'])
def test_digit_version_of_what_is_not_a_version_is_a_clear_value_error(version):
    with pytest.raises(ValueError, match='is not a PEP 440 version string'):
        fp16utils.digit_version(version)


@pytest.mark.parametrize('length', [0, -1, '3', 2.0, True])
def test_digit_version_length_must_be_a_positive_int(length):
    with pytest.raises(ValueError, match='needs an int length >= 1'):
        fp16utils.digit_version('1.6.0', length=length)


def test_digit_version_orders_pre_dev_post_and_local_releases():
    order = ['1.6.0.dev1', '1.6.0a1', '1.6.0rc1', '1.6.0', '1.6.0+cu121', '1.6.0.post1', '1.7']
    keys = [fp16utils.digit_version(v) for v in order]
    assert keys[3] == keys[4] and sorted(keys) == keys
    assert fp16utils.digit_version(1.6) == fp16utils.digit_version('1.6')


@pytest.mark.parametrize(('version', 'native'), [
    ('parrots', False), ('1.5.1', False), ('1.6.0a0+git', True), ('2.13.0+cpu', True)])
def test_has_native_amp_judges_the_version_given(version, native):
    assert fp16utils.has_native_amp(version) is native


def test_has_native_amp_of_a_bad_version_is_a_value_error():
    with pytest.raises(ValueError, match='not a PEP 440 version'):
        fp16utils.has_native_amp('not-a-version')


def test_torch_version_is_the_running_torch_as_a_plain_str():
    assert type(fp16utils.TORCH_VERSION) is str
    assert fp16utils.TORCH_VERSION == str(torch.__version__)


# --------------------------------------------------------------------------- lazy attributes


@pytest.mark.parametrize('name', ['nope', 'AutoFp16', 'autofp16', '__wrapped__', 'cli_main'])
def test_unknown_attribute_is_an_attribute_error_naming_it(name):
    with pytest.raises(AttributeError, match=f"'fp16utils' has no attribute '{name}'"):
        getattr(fp16utils, name)
    assert not hasattr(fp16utils, name)


def test_dir_lists_the_public_api_and_not_the_package_s_own_imports():
    names = dir(fp16utils)
    assert set(fp16utils.__all__) <= set(names)
    assert not {'importlib', 'Any', 'TYPE_CHECKING', '_EXPORTS'} & set(names)
    assert names == sorted(names)


def test_star_import_gives_every_public_name_in_a_fresh_process():
    done = fresh_python('''
        from fp16utils import *
        import fp16utils
        missing = [n for n in fp16utils.__all__ if n not in globals()]
        print(missing)
        ''')
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[]'


def test_every_public_name_resolves_to_its_module_s_object():
    for name, module in fp16utils._EXPORTS.items():
        assert getattr(fp16utils, name) is getattr(
            importlib.import_module(f'fp16utils.{module}'), name)


# --------------------------------------------------------------------------- the MMEngine plug-in


def test_plug_in_import_without_mmengine_says_what_to_install(tmp_path):
    blocker = tmp_path / 'mmengine'
    blocker.mkdir()
    (blocker / '__init__.py').write_text("raise ImportError('No module named mmengine')\n")
    done = fresh_python('import fp16utils.mmengine', PYTHONPATH=f'{tmp_path}:{ROOT}')
    assert done.returncode == 1
    last = done.stderr.strip().splitlines()[-1]
    assert last.startswith('ModuleNotFoundError: fp16utils.mmengine is the plug-in for '
                           'MMEngine and needs mmengine')
    assert 'pip install mmengine' in last


def test_import_fp16utils_never_imports_mmengine_or_mmcv():
    done = fresh_python('''
        import sys, fp16utils
        fp16utils.wrap_fp16_model, fp16utils.AmpOptimWrapper, fp16utils.patch_mmcv
        print(sorted(m for m in sys.modules if m.split('.')[0] in ('mmengine', 'mmcv')))
        ''')
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == '[]'


# --------------------------------------------------------------------------- patch_mmcv


@pytest.mark.parametrize(('kwargs', 'match'), [
    ({'dtype': 'int8'}, 'Unsupported low-precision dtype'),
    ({'dtype': torch.float64}, 'Unsupported low-precision dtype'),
    ({'backend': 'bogus'}, 'Unknown fp16utils backend'),
])
def test_patch_mmcv_with_bad_arguments_changes_nothing(fake_mmcv, kwargs, match):  # noqa: F811
    runner = importlib.import_module('mmcv.runner')
    original = runner.auto_fp16
    with pytest.raises(ValueError, match=match):
        fp16utils.patch_mmcv(**kwargs)
    assert runner.auto_fp16 is original and fp16utils.unpatch_mmcv() == []


def test_patch_mmcv_bad_arguments_after_a_patch_keep_the_patch_and_its_defaults(
        fake_mmcv):  # noqa: F811
    import fp16utils.mmcv as fmmcv

    fp16utils.patch_mmcv(dtype='bfloat16')
    with pytest.raises(ValueError):
        fp16utils.patch_mmcv(dtype='bogus')
    runner = importlib.import_module('mmcv.runner')
    assert runner.auto_fp16 is fp16utils.auto_fp16
    assert fmmcv._patch.dtype == torch.bfloat16


def test_patch_mmcv_that_fails_half_way_puts_everything_back(tmp_path, monkeypatch):
    forget_mmcv()
    files = dict(FAKE_MMCV)
    files['runner/hooks/hook.py'] = FAKE_MMCV['runner/hooks/hook.py'].replace(
        'return register if module is None else register(module)',
        "if module is not None and name == 'GradientCumulativeFp16OptimizerHook':\n"
        "                    raise RuntimeError('registry is locked')\n"
        '                return register if module is None else register(module)')
    monkeypatch.syspath_prepend(str(write_fake_mmcv(tmp_path / 'site', files)))
    try:
        runner = importlib.import_module('mmcv.runner')
        fp16_utils = importlib.import_module('mmcv.runner.fp16_utils')
        before = (runner.auto_fp16, fp16_utils.cast_tensor_type,
                  runner.HOOKS.get('Fp16OptimizerHook'))
        with pytest.raises(RuntimeError, match='registry is locked'):
            fp16utils.patch_mmcv()
        assert (runner.auto_fp16, fp16_utils.cast_tensor_type,
                runner.HOOKS.get('Fp16OptimizerHook')) == before
        assert fp16utils.unpatch_mmcv() == []
    finally:
        forget_mmcv()


def test_unpatch_twice_and_patch_twice(fake_mmcv):  # noqa: F811
    first = fp16utils.patch_mmcv()
    assert fp16utils.patch_mmcv() == first
    assert fp16utils.unpatch_mmcv() == first
    assert fp16utils.unpatch_mmcv() == []
    runner = importlib.import_module('mmcv.runner')
    assert runner.auto_fp16 is not fp16utils.auto_fp16
