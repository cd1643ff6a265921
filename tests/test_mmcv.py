"""fp16utils with mmcv 1.x: the hooks' base, patch_mmcv / unpatch_mmcv, ``fp16utils run``.

These tests use a small stand-in ``mmcv`` package written into tmp_path: the shape
that fp16utils touches (``mmcv.runner`` and its ``fp16_utils``, the ``hooks``
modules, a ``HOOKS`` registry, ``Hook``, a runner whose ``register_hook`` checks
what mmcv's checks, ``IterBasedRunner.resume``), nothing of mmcv's code. Real
mmcv, mmdet and mmseg are exercised by the consumer tier (``tests/consumers``).
"""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

import fp16utils
import fp16utils.mmcv as fmmcv
from fp16utils.hooks import optimizer as hooks
from fp16utils.tools.cli import main

ROOT = Path(__file__).resolve().parents[1]

FAKE_MMCV = {
    '__init__.py': "__version__ = '1.7.2'\n",
    'runner/__init__.py': '''
        from .fp16_utils import LossScaler, auto_fp16, force_fp32, wrap_fp16_model
        from .hooks import HOOKS, Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook, Hook
        from .base_runner import BaseRunner
        from .iter_based_runner import IterBasedRunner
        ''',
    'runner/fp16_utils.py': '''
        import functools

        def auto_fp16(apply_to=None, out_fp32=False, supported_types=None):
            def wrapper(func):
                @functools.wraps(func)
                def new_func(*args, **kwargs):
                    return func(*args, **kwargs)
                return new_func
            return wrapper

        force_fp32 = auto_fp16

        def wrap_fp16_model(model):
            return model

        def patch_norm_fp32(module):
            return module

        def patch_forward_method(func, src_type, dst_type, convert_output=True):
            return func

        def cast_tensor_type(inputs, src_type, dst_type):
            return inputs

        class LossScaler:
            pass
        ''',
    'runner/hooks/__init__.py': '''
        from .hook import HOOKS, Hook
        from .optimizer import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook
        ''',
    'runner/hooks/hook.py': '''
        class Registry:
            def __init__(self):
                self._module_dict = {}

            def get(self, name):
                return self._module_dict.get(name)

            def register_module(self, name=None, force=False, module=None):
                def register(cls):
                    key = name or cls.__name__
                    if key in self._module_dict and not force:
                        raise KeyError(key)
                    self._module_dict[key] = cls
                    return cls
                return register if module is None else register(module)

        HOOKS = Registry()

        class Hook:
            def before_run(self, runner):
                pass

            def after_train_iter(self, runner):
                pass
        ''',
    'runner/hooks/optimizer.py': '''
        from ..fp16_utils import LossScaler, wrap_fp16_model
        from .hook import HOOKS, Hook

        @HOOKS.register_module()
        class Fp16OptimizerHook(Hook):
            pass

        @HOOKS.register_module()
        class GradientCumulativeFp16OptimizerHook(Fp16OptimizerHook):
            pass
        ''',
    'runner/base_runner.py': '''
        import torch
        from .hooks import Hook

        class BaseRunner:
            def __init__(self, meta=None):
                self.meta, self.hooks, self.iter = meta, [], 0

            def register_hook(self, hook, priority='NORMAL'):
                assert isinstance(hook, Hook)
                if hasattr(hook, 'priority'):
                    raise ValueError('"priority" is a reserved attribute for hooks')
                hook.priority = priority
                self.hooks.append(hook)

            def load_checkpoint(self, filename, map_location='cpu'):
                return torch.load(filename, map_location=map_location)
        ''',
    'runner/iter_based_runner.py': '''
        import torch
        from .base_runner import BaseRunner

        class IterBasedRunner(BaseRunner):
            def resume(self, checkpoint, resume_optimizer=True, map_location='default'):
                if map_location == 'default':
                    device = torch.cuda.current_device()  # as mmcv 1.x does
                    map_location = lambda storage, loc: storage.cuda(device)
                checkpoint = self.load_checkpoint(checkpoint, map_location=map_location)
                self.iter = checkpoint['meta']['iter']  # and nothing else of meta
        ''',
}


def write_fake_mmcv(root: Path, files: dict = FAKE_MMCV) -> Path:
    for name, text in files.items():
        path = root / 'mmcv' / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return root


def forget_mmcv() -> None:
    """Unpatch, drop every mmcv module, give the hooks their plain base back."""
    fp16utils.unpatch_mmcv()
    for name in [m for m in sys.modules if m == 'mmcv' or m.startswith('mmcv.')]:
        del sys.modules[name]
    hooks._set_base(None)
    importlib.invalidate_caches()


@pytest.fixture
def fake_mmcv(tmp_path, monkeypatch):
    """The stand-in mmcv on sys.path (not imported yet); everything undone afterwards."""
    forget_mmcv()
    root = write_fake_mmcv(tmp_path / 'site')
    monkeypatch.syspath_prepend(str(root))
    yield root
    forget_mmcv()


def fresh_python(code: str, *paths: Path) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *map(str, paths)]))
    return subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True,
                          text=True, env=env, timeout=120)


# -- the hooks' base ------------------------------------------------------------------------


def test_without_mmcv_the_hooks_have_every_stage_and_a_priority():
    assert 'mmcv.runner' not in sys.modules
    hook = fp16utils.GradientCumulativeFp16OptimizerHook(cumulative_iters=2)
    assert hook.priority == 'ABOVE_NORMAL'
    calls = []
    hook.before_iter = lambda runner: calls.append(runner)
    hook.before_train_iter('runner')
    hook.after_val_epoch('runner')  # nothing to do, and no error
    assert calls == ['runner']


def test_hooks_become_mmcv_hooks_when_mmcv_is_imported_after_them(fake_mmcv):
    made_before = fp16utils.Fp16OptimizerHook(loss_scale='dynamic')
    runner_module = importlib.import_module('mmcv.runner')
    Hook = runner_module.Hook
    assert issubclass(fp16utils.Fp16OptimizerHook, Hook)
    assert issubclass(fp16utils.GradientCumulativeFp16OptimizerHook, Hook)
    assert isinstance(made_before, Hook)
    assert not hasattr(made_before, 'priority')  # mmcv's register_hook refuses one
    runner = runner_module.BaseRunner()
    runner.register_hook(made_before, priority='ABOVE_NORMAL')
    runner.register_hook(fp16utils.GradientCumulativeFp16OptimizerHook(cumulative_iters=2))
    assert [h.priority for h in runner.hooks] == ['ABOVE_NORMAL', 'NORMAL']


def test_hooks_follow_an_mmcv_imported_before_fp16utils_and_never_import_it(fake_mmcv):
    code = '''
        import sys
        import fp16utils, fp16utils.hooks.optimizer, fp16utils.mmcv
        from fp16utils import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook, patch_mmcv
        Fp16OptimizerHook(); GradientCumulativeFp16OptimizerHook(cumulative_iters=2)
        print(sorted(m for m in sys.modules if m.startswith('mmcv')))
        import mmcv.runner
        print(issubclass(GradientCumulativeFp16OptimizerHook, mmcv.runner.Hook))
        '''
    proc = fresh_python(code, fake_mmcv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split('\n')[:2] == ['[]', 'True']
    proc = fresh_python('import mmcv.runner, fp16utils\n'
                        'hook = fp16utils.Fp16OptimizerHook()\n'
                        'mmcv.runner.BaseRunner().register_hook(hook)\n'
                        'print(isinstance(hook, mmcv.runner.Hook))', fake_mmcv)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == 'True'


# -- patch_mmcv / unpatch_mmcv ---------------------------------------------------------------


def test_patch_replaces_the_names_and_the_registry_and_unpatch_puts_them_back(fake_mmcv):
    import mmcv.runner
    import mmcv.runner.fp16_utils as mmcv_fp16
    import mmcv.runner.hooks.optimizer as mmcv_optimizer

    originals = {name: getattr(mmcv_fp16, name) for name in (
        'auto_fp16', 'force_fp32', 'wrap_fp16_model', 'LossScaler', 'cast_tensor_type')}
    hook_cls = mmcv.runner.Fp16OptimizerHook
    resume = mmcv.runner.IterBasedRunner.resume
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # nothing was decorated before: no warning
        replaced = fp16utils.patch_mmcv()
    assert mmcv.runner.auto_fp16 is mmcv_fp16.auto_fp16 is fp16utils.auto_fp16
    assert mmcv.runner.force_fp32 is fp16utils.force_fp32
    assert mmcv_fp16.cast_tensor_type is fp16utils.cast_tensor_type
    assert mmcv.runner.LossScaler is mmcv_optimizer.LossScaler is fp16utils.LossScaler
    assert mmcv.runner.wrap_fp16_model is mmcv_optimizer.wrap_fp16_model is fmmcv.wrap_fp16_model
    assert mmcv.runner.Fp16OptimizerHook is mmcv.runner.hooks.Fp16OptimizerHook
    assert mmcv.runner.HOOKS.get('Fp16OptimizerHook') is fmmcv.Fp16OptimizerHook
    assert (mmcv.runner.HOOKS.get('GradientCumulativeFp16OptimizerHook')
            is mmcv_optimizer.GradientCumulativeFp16OptimizerHook
            is fmmcv.GradientCumulativeFp16OptimizerHook)
    assert issubclass(fmmcv.Fp16OptimizerHook, fp16utils.Fp16OptimizerHook)
    assert issubclass(fmmcv.Fp16OptimizerHook, mmcv.runner.Hook)
    assert 'mmcv.runner.fp16_utils.patch_norm_fp32' in replaced
    assert "HOOKS['Fp16OptimizerHook']" in replaced
    assert 'mmcv.runner.iter_based_runner.IterBasedRunner.resume' in replaced
    assert len(replaced) == 22

    assert fp16utils.patch_mmcv() == replaced  # idempotent: nothing replaced twice
    assert mmcv.runner.IterBasedRunner.resume.__fp16utils_original__ is resume

    assert fp16utils.unpatch_mmcv() == replaced
    assert {name: getattr(mmcv_fp16, name) for name in originals} == originals
    assert mmcv.runner.Fp16OptimizerHook is hook_cls
    assert mmcv.runner.HOOKS.get('Fp16OptimizerHook') is hook_cls
    assert mmcv.runner.IterBasedRunner.resume is resume
    assert fp16utils.unpatch_mmcv() == []


@pytest.fixture
def user_modules():
    """Names of modules a test imports; removed from sys.modules afterwards."""
    names = ['early_model', 'late_model']
    yield names
    for name in names:
        sys.modules.pop(name, None)


def test_patch_warns_naming_modules_that_bound_mmcv_names_before_it(fake_mmcv, user_modules):
    fake_mmcv.joinpath('early_model.py').write_text(textwrap.dedent('''
        from torch import nn
        from mmcv.runner import Fp16OptimizerHook, auto_fp16

        class Head(nn.Module):
            @auto_fp16(apply_to=('x',))
            def forward(self, x):
                return x
        '''))
    fake_mmcv.joinpath('late_model.py').write_text(
        fake_mmcv.joinpath('early_model.py').read_text())
    import early_model

    with pytest.warns(UserWarning) as caught:
        fp16utils.patch_mmcv()
    message = str(caught[0].message)
    assert '1 module(s) imported before the patch' in message  # mmcv's own are patched
    assert 'early_model (Fp16OptimizerHook, auto_fp16, Head.forward)' in message
    assert '`fp16utils run`' in message
    import late_model  # imported after the patch: ours

    assert late_model.Fp16OptimizerHook is fmmcv.Fp16OptimizerHook
    assert late_model.Head.forward.__code__ is not early_model.Head.forward.__code__
    with warnings.catch_warnings():
        warnings.simplefilter('error')
        fp16utils.patch_mmcv()  # already patched: no second warning


def test_patch_defaults_dtype_and_backend_of_what_it_installs(fake_mmcv):
    with pytest.raises(ValueError):
        fp16utils.patch_mmcv(dtype=torch.float32)
    with pytest.raises(ValueError):
        fp16utils.patch_mmcv(backend='apex')
    assert 'mmcv' not in sys.modules  # checked before anything is imported
    fp16utils.patch_mmcv(dtype='bfloat16', backend='legacy')
    import mmcv.runner

    hook = mmcv.runner.Fp16OptimizerHook(loss_scale=512.)
    assert (hook.dtype, hook.backend) == (torch.bfloat16, 'legacy')
    assert mmcv.runner.Fp16OptimizerHook(dtype='float16').dtype == torch.float16  # config wins
    gc = mmcv.runner.HOOKS.get('GradientCumulativeFp16OptimizerHook')(cumulative_iters=2)
    assert (gc.dtype, gc.backend, gc.cumulative_iters) == (torch.bfloat16, 'legacy', 2)

    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc, self.bn, self.fp16_enabled = nn.Linear(2, 2), nn.BatchNorm1d(2), False

    net = mmcv.runner.wrap_fp16_model(Net())
    assert net.fc.weight.dtype == torch.bfloat16 and net.bn.weight.dtype == torch.float32
    assert net.fp16_enabled and net.fp16_dtype == torch.bfloat16

    fp16utils.patch_mmcv()  # again, without defaults: fp16utils' own
    assert mmcv.runner.Fp16OptimizerHook().dtype == torch.float16


def test_patch_without_mmcv_1x_says_what_is_missing(tmp_path, monkeypatch):
    forget_mmcv()
    monkeypatch.setitem(sys.modules, 'mmcv', None)  # import mmcv -> ImportError
    with pytest.raises(ImportError, match=r'needs mmcv 1\.x, which is not importable'):
        fp16utils.patch_mmcv()
    monkeypatch.delitem(sys.modules, 'mmcv')
    write_fake_mmcv(tmp_path, {'__init__.py': "__version__ = '2.1.0'\n"})
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ImportError, match=r'mmcv 2\.1\.0 has none .*MMEngine'):
            fp16utils.patch_mmcv()
    finally:
        forget_mmcv()


def test_iter_runner_resume_keeps_the_fp16_meta_and_loads_to_the_cpu(fake_mmcv, tmp_path):
    _caps.require(torch.float16)  # loss scaling: float16 kernels on the CPU
    import mmcv.runner

    fp16 = {'loss_scaler': {'scale': 4096.0, 'growth_factor': 2.0, 'backoff_factor': 0.5,
                            'growth_interval': 2, '_growth_tracker': 1},
            'stats': {'skipped_steps': 1, 'scale_history': [(1, 8192.0), (3, 4096.0)]}}
    torch.save({'meta': {'iter': 3, 'fp16': fp16, 'hook_msgs': {}}}, tmp_path / 'iter_4.pth')
    if not torch.cuda.is_available():  # mmcv's own resume asks CUDA for a device
        with pytest.raises((RuntimeError, AssertionError)):
            mmcv.runner.IterBasedRunner().resume(str(tmp_path / 'iter_4.pth'))
    fp16utils.patch_mmcv()
    runner = mmcv.runner.IterBasedRunner(meta={'exp_name': 'x'})
    runner.resume(str(tmp_path / 'iter_4.pth'))
    assert runner.iter == 3 and 'load_checkpoint' not in vars(runner)
    assert runner.meta == {'exp_name': 'x', 'fp16': fp16}
    hook = fp16utils.Fp16OptimizerHook(loss_scale=dict(init_scale=2.**10, growth_interval=2))
    model = nn.Linear(2, 1)
    runner.model, runner.optimizer = model, torch.optim.SGD(model.parameters(), lr=0.1)
    runner.logger = None
    hook.before_run(runner)
    assert hook.loss_scale == 4096.0 and hook.skipped_steps == 1

    bare = mmcv.runner.IterBasedRunner(meta=None)
    torch.save({'meta': {'iter': 2}}, tmp_path / 'plain.pth')
    bare.resume(str(tmp_path / 'plain.pth'), map_location='cpu')
    assert bare.iter == 2 and bare.meta is None  # nothing of ours to bring back


def test_hook_warns_when_a_resumed_run_has_no_scale_state(caplog):
    _caps.require(torch.float16)  # loss scaling: float16 kernels on the CPU
    model = nn.Linear(2, 1)

    class Runner:
        meta, iter, logger = {}, 7, None
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)

    Runner.model = model
    hook = fp16utils.Fp16OptimizerHook(loss_scale='dynamic')
    with caplog.at_level('WARNING', logger='fp16utils'):
        hook.before_run(Runner())
    assert 'starts at iteration 7 but runner.meta holds no loss-scaler state' in caplog.text
    assert 'patch_mmcv' in caplog.text
    caplog.clear()
    static = fp16utils.Fp16OptimizerHook(loss_scale=512.)
    with caplog.at_level('WARNING', logger='fp16utils'):
        static.before_run(Runner())
    assert caplog.text == ''  # a static scale has nothing to lose


# -- fp16utils run ---------------------------------------------------------------------------

SCRIPT = '''
import json, sys
import mmcv.runner
print(json.dumps(dict(
    name=__name__, argv=sys.argv[1:], path0=sys.path[0],
    hook=mmcv.runner.HOOKS.get('Fp16OptimizerHook').__module__,
    dtype=str(mmcv.runner.Fp16OptimizerHook().dtype))))
if sys.argv[1:2] == ['exit']:
    sys.exit(int(sys.argv[2]) if sys.argv[2].isdigit() else sys.argv[2])
if sys.argv[1:2] == ['crash']:
    def inner():
        raise KeyError('boom')
    inner()
'''


@pytest.fixture
def script(fake_mmcv, tmp_path):
    path = tmp_path / 'tools' / 'train.py'
    path.parent.mkdir()
    path.write_text(SCRIPT)
    return path


def test_run_patches_mmcv_then_runs_the_script_as_main(script, capsys):
    import json

    argv, path0 = list(sys.argv), sys.path[0]
    assert main(['run', '--dtype', 'bfloat16', str(script), 'cfg.py', '--work-dir', 'w']) == 0
    seen = json.loads(capsys.readouterr().out)
    assert seen == dict(name='__main__', argv=['cfg.py', '--work-dir', 'w'],
                        path0=str(script.parent), hook='fp16utils.mmcv',
                        dtype='torch.bfloat16')
    assert (sys.argv, sys.path[0]) == (argv, path0)  # put back


@pytest.mark.parametrize('args, code, stderr', [
    (['exit', '3'], 3, ''),
    (['exit', '0'], 0, ''),
    (['exit', 'stopped: bad config'], 1, 'stopped: bad config\n'),
])
def test_run_passes_the_scripts_exit_code_on(script, capsys, args, code, stderr):
    assert main(['run', str(script), *args]) == code
    assert capsys.readouterr().err == stderr


def test_run_a_crashing_script_prints_its_traceback_from_the_script_on(script, capsys):
    assert main(['run', str(script), 'crash']) == 1
    err = capsys.readouterr().err
    assert err.startswith('Traceback (most recent call last):\n')
    assert f'File "{script}", line' in err and "KeyError: 'boom'" in err
    assert 'runpy' not in err and 'cli.py' not in err


def test_run_usage_errors(tmp_path, capsys, monkeypatch):
    assert main(['run', str(tmp_path / 'missing.py')]) == 2
    assert 'missing.py: no such file' in capsys.readouterr().err
    forget_mmcv()
    monkeypatch.setitem(sys.modules, 'mmcv', None)
    present = tmp_path / 'present.py'
    present.write_text('raise SystemExit(5)\n')
    assert main(['run', str(present)]) == 1  # mmcv missing: not run
    assert 'run: patch_mmcv() needs mmcv 1.x' in capsys.readouterr().err
    assert main(['run', '--dtype', 'float32', str(present)]) == 2


def test_python_m_fp16utils_run(script, fake_mmcv):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), str(fake_mmcv)]))
    proc = subprocess.run([sys.executable, '-m', 'fp16utils', 'run', str(script), 'exit', '4'],
                          capture_output=True, text=True, env=env, timeout=120)
    assert proc.returncode == 4, proc.stderr
    assert '"hook": "fp16utils.mmcv"' in proc.stdout
