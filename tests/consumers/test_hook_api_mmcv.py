"""The same 0.x hook subclasses on real mmcv 1.7.2's classes and on this package's.

Each subclass in ``tests/_mmcv_subclasses.py`` is written against mmcv's API; here it is
built on mmcv's own ``Fp16OptimizerHook`` (the patch taken off) and on this package's,
and both train the same model on the same data through the runner stand-in.

What is comparable on a machine without CUDA: mmcv's torch >= 1.6 hooks make a
``torch.cuda.amp.GradScaler``, which disables itself there, so the mmcv side is given
an enabled ``torch.amp.GradScaler('cpu')`` with the same arguments right after it is
built (the scaler it would have on a GPU); this package's native backend makes that
same CPU GradScaler itself. The float16 forward is the same on both sides (the model's
``@auto_fp16`` forward autocasts on the CPU). mmcv's torch < 1.6 variant (float32
master weights, mmcv's own ``LossScaler``) is what mmcv defines when it reads an older
torch version: it is compared in a process where mmcv is made to read one.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import _consumers

_consumers.require()

import _mmcv_subclasses as S  # noqa: E402
import _runner as R  # noqa: E402
import mmcv.runner.hooks.optimizer as mmcv_optimizer  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

import fp16utils  # noqa: E402

F16 = torch.float16
SCALE = dict(init_scale=256., growth_interval=1)


@pytest.fixture
def mmcv_hooks():
    """mmcv's own hook classes (the patch is put back by the tier's fixture afterwards)."""
    fp16utils.unpatch_mmcv()
    return mmcv_optimizer.Fp16OptimizerHook, mmcv_optimizer.GradientCumulativeFp16OptimizerHook


class Runner(S.ThisRunner, R.MiniRunner):
    pass


def _enabled_like_on_a_gpu(hook, loss_scale):
    """mmcv made a CUDA GradScaler (disabled here): the same one, enabled, on the CPU."""
    assert not hook.loss_scaler.is_enabled()
    kwargs = (dict(loss_scale) if isinstance(loss_scale, dict) else
              {'init_scale': loss_scale} if isinstance(loss_scale, float) else {})
    hook.loss_scaler = torch.amp.GradScaler('cpu', **kwargs)
    return hook


def _run(hook, n=6, overflow=(2,), seed=4):
    model = R.Net(seed=seed)
    runner = Runner(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), [hook],
                    max_iters=n, meta={})
    data = R.make_data(n)
    for i in overflow:
        data[i] = R.overflow_batch()
    runner.run(data, R.mse)
    return runner


def _same_params(a, b):
    for x, y in zip(a.model.parameters(), b.model.parameters()):
        assert x.dtype == y.dtype and torch.equal(x, y)


def _pair(make, mmcv_base, ours_base, loss_scale, **kwargs):
    theirs = _enabled_like_on_a_gpu(make(mmcv_base)(loss_scale=loss_scale, **kwargs),
                                    loss_scale)
    ours = make(ours_base)(loss_scale=loss_scale, **kwargs)
    return theirs, ours


@pytest.mark.parametrize('loss_scale', [SCALE, 64.0, 'dynamic'])
def test_a_native_style_override_trains_the_same_on_mmcv_and_on_ours(mmcv_hooks, loss_scale):
    _consumers.fp16utils._torch  # noqa: B018  (the tier's environment is set up)
    theirs, ours = _pair(S.native_style, mmcv_hooks[0], fp16utils.Fp16OptimizerHook,
                         loss_scale, grad_clip=dict(max_norm=1.0))
    a, b = _run(theirs), _run(ours)
    _same_params(a, b)
    assert a.meta['fp16']['loss_scaler'] == b.meta['fp16']['loss_scaler']
    assert theirs.loss_scaler.get_scale() == ours.loss_scale
    # And this package's own after_train_iter does what mmcv's does.
    plain = _enabled_like_on_a_gpu(mmcv_hooks[0](loss_scale=loss_scale,
                                                 grad_clip=dict(max_norm=1.0)), loss_scale)
    mine = fp16utils.Fp16OptimizerHook(loss_scale=loss_scale, grad_clip=dict(max_norm=1.0))
    c, d = _run(plain), _run(mine)
    _same_params(c, a)
    _same_params(d, a)
    assert c.meta['fp16']['loss_scaler'] == d.meta['fp16']['loss_scaler']
    grad_norms = [[repr(r['grad_norm']) for r, _ in x.log_buffer.records if 'grad_norm' in r]
                  for x in (c, d)]
    assert grad_norms[0] == grad_norms[1] and len(grad_norms[0]) == 6
    assert grad_norms[0][2] == 'nan'  # the overflow step, clipped before the skip, as mmcv


def test_a_cumulative_override_steps_at_the_same_iterations(mmcv_hooks):
    theirs, ours = _pair(S.cumulative_native_style, mmcv_hooks[1],
                         fp16utils.GradientCumulativeFp16OptimizerHook, SCALE,
                         cumulative_iters=4, grad_clip=dict(max_norm=1.0))
    a, b = _run(theirs, overflow=()), _run(ours, overflow=())
    assert theirs.updates == ours.updates == [3, 5]
    for name in ('divisible_iters', 'remainder_iters', 'initialized', 'cumulative_iters'):
        assert getattr(theirs, name) == getattr(ours, name), name
    _same_params(a, b)
    assert a.meta['fp16']['loss_scaler'] == b.meta['fp16']['loss_scaler']


def test_an_overridden_clip_grads_is_called_alike(mmcv_hooks):
    theirs, ours = _pair(S.clip_override_style, mmcv_hooks[0], fp16utils.Fp16OptimizerHook,
                         SCALE, grad_clip=dict(max_norm=0.01))
    a, b = _run(theirs), _run(ours)
    assert len(theirs.clip_calls) == len(ours.clip_calls) == 6
    for run, hook in ((a, theirs), (b, ours)):
        model_params = list(run.model.parameters())
        assert all(all(p is q for p, q in zip(call, model_params)) for call in hook.clip_calls)
    _same_params(a, b)


def test_an_own_init_subclass_trains_the_same(mmcv_hooks):
    make = lambda base: S.own_init_style(  # noqa: E731
        base, lambda **kw: torch.amp.GradScaler('cpu', **kw))
    theirs, ours = make(mmcv_hooks[0])(loss_scale=SCALE), make(fp16utils.Fp16OptimizerHook)(
        loss_scale=SCALE)
    a, b = _run(theirs), _run(ours)
    _same_params(a, b)
    assert a.meta['fp16']['loss_scaler'] == b.meta['fp16']['loss_scaler']


def test_before_run_extended_after_super_alike(mmcv_hooks):
    for base in (mmcv_hooks[0], fp16utils.Fp16OptimizerHook):
        hook = S.before_run_style(base)(custom_fp16={'': False})
        runner = Runner(R.Net(), torch.optim.SGD(R.Net().parameters(), lr=0.1), [hook],
                        meta={})
        hook.before_run(runner)
        assert runner.model.fp16_enabled is False


@pytest.mark.parametrize('which', ['Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook'])
def test_every_attribute_of_mmcvs_hook_instances_is_on_ours(mmcv_hooks, which):
    theirs = getattr(mmcv_optimizer, which)(loss_scale=512., grad_clip=dict(max_norm=1.0))
    ours = getattr(fp16utils, which)(loss_scale=512., grad_clip=dict(max_norm=1.0))
    names = {n for n in dir(theirs) if not n.startswith('__')}
    assert len(names) > 30
    assert names - set(dir(ours)) == set()
    for name in ('grad_clip', 'coalesce', 'bucket_size_mb', 'distributed',
                 '_scale_update_param', 'stages'):
        assert getattr(theirs, name) == getattr(ours, name), name
    if which.startswith('Gradient'):
        for name in ('cumulative_iters', 'divisible_iters', 'remainder_iters', 'initialized'):
            assert getattr(theirs, name) == getattr(ours, name), name


def test_every_attribute_of_mmcvs_loss_scaler_is_on_ours(mmcv_hooks):
    from mmcv.runner.fp16_utils import LossScaler as MmcvLossScaler

    theirs, ours = MmcvLossScaler(init_scale=64., scale_window=2), fp16utils.LossScaler(
        init_scale=64., scale_window=2)
    names = {n for n in dir(theirs) if not n.startswith('__')}
    assert names - set(dir(ours)) == set()
    p = torch.nn.Parameter(torch.ones(2))
    for grad in (1.0, float('inf'), 1.0, 1.0, float('nan'), 1.0):
        p.grad = torch.full((2,), grad)
        assert theirs.has_overflow([p]) == ours.has_overflow([p])
        assert MmcvLossScaler._has_inf_or_nan(p.grad) == ours._has_inf_or_nan(p.grad)
        theirs.update_scale(theirs.has_overflow([p]))
        ours.update_scale(ours.has_overflow([p]))
        assert theirs.state_dict() == ours.state_dict()
    # A whole float window: mmcv grows on it as on the int; so does ours.
    theirs, ours = MmcvLossScaler(init_scale=64., scale_window=3.0), fp16utils.LossScaler(
        init_scale=64., scale_window=3.0)
    for _ in range(7):
        theirs.update_scale(False)
        ours.update_scale(False)
        assert theirs.cur_scale == ours.cur_scale
    ours.load_state_dict(theirs.state_dict())  # a state that holds the float window
    assert ours.state_dict() == dict(theirs.state_dict(), scale_window=3)


LEGACY_RUN = '''
import json, sys
import mmcv.utils
mmcv.utils.TORCH_VERSION = '1.5.0'  # mmcv defines its torch < 1.6 hooks
import mmcv.runner.hooks.optimizer as mmcv_optimizer
import torch
import _mmcv_subclasses as S
import _runner as R
import fp16utils

assert 'mmcv' in mmcv_optimizer.Fp16OptimizerHook.__doc__  # "(mmcv's implementation)"

class Runner(S.ThisRunner, R.MiniRunner):
    pass

def run(hook):
    model = R.Net(seed=4)
    runner = Runner(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9), [hook],
                    max_iters=6, meta={})
    data = R.make_data(6)
    data[2] = R.overflow_batch()
    runner.run(data, R.mse)
    return dict(params=[p.detach().float().flatten().tolist() for p in model.parameters()],
                dtypes=[str(p.dtype) for p in model.parameters()],
                scaler=runner.meta['fp16']['loss_scaler'])

scale = dict(init_scale=256., mode='dynamic', scale_window=1.0)
ours = dict(backend='legacy')
print(json.dumps({
    'mmcv': run(mmcv_optimizer.Fp16OptimizerHook(loss_scale=dict(scale))),
    'mmcv-subclass': run(S.legacy_style(mmcv_optimizer.Fp16OptimizerHook)(
        loss_scale=dict(scale))),
    'ours': run(fp16utils.Fp16OptimizerHook(loss_scale=dict(scale), **ours)),
    'ours-subclass': run(S.legacy_style(fp16utils.Fp16OptimizerHook)(
        loss_scale=dict(scale), **ours)),
}))
'''


def test_the_legacy_variant_trains_the_same_on_mmcv_and_on_ours(tmp_path):
    script = tmp_path / 'legacy_run.py'
    script.write_text(textwrap.dedent(LEGACY_RUN))
    tests = _consumers.HERE.parent
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [str(_consumers.REPO), str(tests), str(_consumers.STANDINS)]))
    proc = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    runs = json.loads(proc.stdout.strip().splitlines()[-1])
    reference = runs.pop('mmcv')
    assert reference['dtypes'] == ['torch.float16'] * 4  # the half model
    assert reference['scaler']['last_overflow_iter'] == 2
    assert reference['scaler']['cur_scale'] == 256. * 2**4  # 5 clean steps, 1 overflow
    for name, got in runs.items():
        assert got['params'] == reference['params'], name
        assert got['scaler'] == dict(reference['scaler'], scale_window=1), name
