"""Attacks on mmcv 1.7.2's optimizer-hook API as 0.x subclasses use it.

Every public attribute and method of mmcv's ``OptimizerHook``, ``Fp16OptimizerHook``
(both variants), ``GradientCumulative(Fp16)OptimizerHook``, ``Hook`` helpers and
``LossScaler`` that 0.x subclasses reach is looked up and exercised on this package's
hooks, on the backend where it means something; subclasses written the mmcv way
(``tests/_mmcv_subclasses.py``) train through the runner stand-in exactly as the hook
itself does. The same subclasses run against real mmcv in
``tests/consumers/test_hook_api_mmcv.py``. Whole-number windows given as floats
(``scale_window=2.0``), which mmcv accepts, work everywhere; fractional ones are refused.
"""

from __future__ import annotations

import logging
import math

import _caps
import _mmcv_subclasses as S
import _runner as R
import numpy as np
import pytest
import torch
from torch import nn

from fp16utils import (
    AmpOptimWrapper,
    Fp16OptimizerHook,
    GradientCumulativeFp16OptimizerHook,
    LossScaler,
)
from fp16utils._args.numbers import window_note

F16 = torch.float16
BACKENDS = ['native', 'legacy']


class Runner(S.ThisRunner, R.MiniRunner):
    """The runner stand-in, with what mmcv's own hook helpers read too."""


def _require(backend):
    _caps.require(F16, 'native' if backend == 'native' else None)


def _data(n=5, overflow=(2,)):
    data = R.make_data(n)
    for i in overflow:
        data[i] = R.overflow_batch()
    return data


def _run(hook, n=5, overflow=(2,), seed=4, lr=0.05, max_iters=None, until=None):
    model = R.Net(seed=seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)
    runner = Runner(model, optimizer, [hook], max_iters=max_iters or n, meta={})
    runner.run(_data(n, overflow), R.mse, until=until)
    return runner


def _params(runner):
    return [p.detach().clone() for p in runner.model.parameters()]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)


SCALE = dict(init_scale=256., growth_interval=1)        # grows every clean step
MMCV_SCALE = dict(init_scale=256., scale_window=1)     # the same, in mmcv's words


# ------------------------------------------------------- subclasses written the mmcv way


def test_a_native_style_override_trains_exactly_as_the_hook():
    _require('native')
    plain = _run(Fp16OptimizerHook(grad_clip=dict(max_norm=1.0), loss_scale=SCALE,
                                   backend='native'))
    cls = S.native_style(Fp16OptimizerHook)
    hook = cls(grad_clip=dict(max_norm=1.0), loss_scale=SCALE, backend='native')
    runner = _run(hook)
    _same(_params(plain), _params(runner))
    # The GradScaler it drove backed off at the overflow and grew at each clean step;
    # the hook follows what was done to its scaler (no step of its own was taken).
    assert hook.loss_scale == plain.hooks[0].loss_scale == 256. * 2 ** 3
    assert runner.meta['fp16']['loss_scaler'] == plain.meta['fp16']['loss_scaler']
    logged = [r for r, _ in runner.log_buffer.records]
    assert {'grad_norm_fc1', 'grad_norm_fc2', 'grad_norm'} <= set().union(*logged)
    assert hook.skipped_steps == 0 and hook.steps_taken == 0  # its own steps only


def test_a_legacy_style_override_trains_exactly_as_the_hook():
    _require('legacy')
    plain = _run(Fp16OptimizerHook(grad_clip=dict(max_norm=1.0), loss_scale=MMCV_SCALE,
                                   backend='legacy'))
    hook = S.legacy_style(Fp16OptimizerHook)(grad_clip=dict(max_norm=1.0),
                                             loss_scale=MMCV_SCALE, backend='legacy')
    runner = _run(hook)
    _same(_params(plain), _params(runner))
    assert runner.model.fc1.weight.dtype == F16  # the legacy backend's half model
    assert isinstance(hook.loss_scaler, LossScaler)
    assert hook.loss_scaler.state_dict() == plain.meta['fp16']['loss_scaler']
    assert runner.meta['fp16']['loss_scaler']['cur_scale'] == 256. * 2 ** 3
    assert runner.meta['fp16']['loss_scaler']['last_overflow_iter'] == 2


def test_a_cumulative_override_steps_when_mmcv_would():
    _require('native')
    kw = dict(cumulative_iters=2, grad_clip=dict(max_norm=1.0), loss_scale=SCALE,
              backend='native')
    plain = _run(GradientCumulativeFp16OptimizerHook(**kw), overflow=())
    hook = S.cumulative_native_style(GradientCumulativeFp16OptimizerHook)(**kw)
    runner = _run(hook, overflow=())
    assert hook.updates == [1, 3, 4]  # every 2nd iteration, and the last one
    assert (hook.divisible_iters, hook.remainder_iters, hook.initialized) == (4, 1, True)
    _same(_params(plain), _params(runner))
    assert runner.meta['fp16']['loss_scaler'] == plain.meta['fp16']['loss_scaler']


@pytest.mark.parametrize('loss_scale', [SCALE, 64.0, 'dynamic'])
def test_an_mmcv_style_init_without_super_sets_the_hook_up_from_its_attributes(loss_scale):
    _require('native')
    cls = S.own_init_style(Fp16OptimizerHook, lambda **kw: torch.amp.GradScaler('cpu', **kw))
    hook = cls(grad_clip=dict(max_norm=1.0), loss_scale=loss_scale)
    expected = Fp16OptimizerHook(grad_clip=dict(max_norm=1.0), loss_scale=loss_scale)
    assert hook.loss_scale == expected.loss_scale  # read before anything ran
    assert hook._scale_update_param == expected._scale_update_param
    runner, plain = _run(hook), _run(expected)
    _same(_params(plain), _params(runner))
    assert hook.loss_scale == expected.loss_scale
    assert hook.skipped_steps == expected.skipped_steps == 1
    assert runner.meta['fp16']['loss_scaler'] == plain.meta['fp16']['loss_scaler']


def test_an_mmcv_style_init_with_a_loss_scaler_picks_the_legacy_backend():
    _require('legacy')
    cls = S.own_init_style(Fp16OptimizerHook,
                           lambda init_scale=2.**32: LossScaler(init_scale, 'dynamic',
                                                                scale_window=1))
    hook = cls(loss_scale=256.)
    hook._scale_update_param = None  # mmcv's legacy variant has none: the scaler decides
    runner = _run(hook)
    plain = _run(Fp16OptimizerHook(loss_scale=MMCV_SCALE, backend='legacy'))
    assert hook.backend == 'legacy'
    _same(_params(plain), _params(runner))


@pytest.mark.parametrize('backend', BACKENDS)
def test_an_overridden_clip_grads_is_what_the_hooks_own_update_calls(backend):
    _require(backend)
    scale = SCALE if backend == 'native' else MMCV_SCALE
    hook = S.clip_override_style(Fp16OptimizerHook)(
        grad_clip=dict(max_norm=0.01), loss_scale=scale, backend=backend)
    runner = _run(hook)
    # As mmcv: the model's parameters (native) or the float32 masters (legacy) are
    # clipped; the native variant clips before the skip is known, the legacy one after.
    expected = (list(runner.model.parameters()) if backend == 'native'
                else hook._engine.masters)
    assert len(hook.clip_calls) == (5 if backend == 'native' else 4)
    assert all(all(a is b for a, b in zip(call, expected)) for call in hook.clip_calls)
    # The same override under mmcv's own after_train_iter body trains the same weights.
    style = S.native_style if backend == 'native' else S.legacy_style
    reference = style(S.clip_override_style(Fp16OptimizerHook))(
        grad_clip=dict(max_norm=0.01), loss_scale=scale, backend=backend)
    _same(_params(_run(reference)), _params(runner))
    plain = _run(Fp16OptimizerHook(grad_clip=dict(max_norm=0.01), loss_scale=scale,
                                   backend=backend))
    assert not torch.equal(_params(plain)[2], _params(runner)[2])  # fc2 was not clipped


def test_before_run_extended_after_super():
    _require('native')
    hook = S.before_run_style(Fp16OptimizerHook)(custom_fp16={'': False}, backend='native')
    runner = Runner(R.Net(), torch.optim.SGD(R.Net().parameters(), lr=0.1), [hook], meta={})
    hook.before_run(runner)
    assert runner.model.fp16_enabled is False  # set by the subclass after wrap_fp16_model
    assert runner.model(torch.ones(1, 8)).dtype == torch.float32


# ----------------------------------------------------- every attribute, on both backends


def _ready(backend, **kwargs):
    _require(backend)
    hook = Fp16OptimizerHook(backend=backend, **kwargs)
    runner = _run(hook, n=2, overflow=())
    return hook, runner


#: (name, what mmcv's subclasses read it as): every attribute of mmcv's optimizer hooks.
ATTRIBUTES = [
    ('grad_clip', lambda h: h.grad_clip == {'max_norm': 2.0, 'norm_type': 2}),
    ('detect_anomalous_params', lambda h: h.detect_anomalous_params is False),
    ('coalesce', lambda h: h.coalesce is False),
    ('bucket_size_mb', lambda h: h.bucket_size_mb == 8),
    ('distributed', lambda h: h.distributed is False),
    ('_scale_update_param', lambda h: h._scale_update_param == 64.0),
    ('loss_scaler', lambda h: h.loss_scaler is not None),
    ('priority', lambda h: h.priority == 'ABOVE_NORMAL'),
] + [(name, lambda h, name=name: callable(getattr(h, name))) for name in (
    'clip_grads', 'detect_anomalous_parameters', 'copy_grads_to_fp32', 'copy_params_to_fp16',
    'before_run', 'after_run', 'before_epoch', 'after_epoch', 'before_iter', 'after_iter',
    'before_train_epoch', 'after_train_epoch', 'before_val_epoch', 'after_val_epoch',
    'before_train_iter', 'after_train_iter', 'before_val_iter', 'after_val_iter',
    'every_n_epochs', 'every_n_inner_iters', 'every_n_iters', 'end_of_epoch',
    'is_last_epoch', 'is_last_iter')]


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('name, check', ATTRIBUTES, ids=[a[0] for a in ATTRIBUTES])
def test_every_attribute_of_mmcvs_optimizer_hooks_is_there(backend, name, check):
    hook, _ = _ready(backend, grad_clip=dict(max_norm=2.0, norm_type=2), coalesce=False,
                     bucket_size_mb=8, distributed=False, loss_scale=64.0)
    assert check(hook), name


#: What mmcv's LossScaler gives (the legacy backend's loss_scaler).
LOSS_SCALER_ATTRIBUTES = ['cur_scale', 'cur_iter', 'mode', 'last_overflow_iter',
                          'scale_factor', 'scale_window', 'loss_scale', 'has_overflow',
                          'update_scale', 'state_dict', 'load_state_dict', '_has_inf_or_nan']
#: What mmcv's torch >= 1.6 hooks call on their GradScaler (the native backend's).
GRAD_SCALER_METHODS = ['scale', 'unscale_', 'step', 'update', 'state_dict', 'load_state_dict',
                       'get_scale', 'is_enabled']


@pytest.mark.parametrize('backend, names', [('legacy', LOSS_SCALER_ATTRIBUTES),
                                            ('native', GRAD_SCALER_METHODS)])
def test_the_loss_scaler_is_the_kind_the_backends_mmcv_variant_has(backend, names):
    hook, _ = _ready(backend, loss_scale=MMCV_SCALE if backend == 'legacy' else SCALE)
    missing = [n for n in names if not hasattr(hook.loss_scaler, n)]
    assert missing == []
    kind = LossScaler if backend == 'legacy' else torch.amp.GradScaler
    assert isinstance(hook.loss_scaler, kind)


def test_scale_update_param_is_the_static_scale_only():
    assert Fp16OptimizerHook(loss_scale=512.)._scale_update_param == 512.
    assert Fp16OptimizerHook(loss_scale=dict(init_scale=8., mode='static'))._scale_update_param \
        == 8.
    assert Fp16OptimizerHook(loss_scale='dynamic')._scale_update_param is None
    assert Fp16OptimizerHook(loss_scale=dict(init_scale=8.))._scale_update_param is None


@pytest.mark.parametrize('clip', [dict(max_norm=1.0), dict(max_norm=0.5, norm_type=1),
                                  dict(max_norm=0.5, norm_type='inf')])
def test_clip_grads_is_torchs_clipping_of_the_parameters_that_have_gradients(clip):
    hook = Fp16OptimizerHook(grad_clip=clip)
    gen = torch.Generator().manual_seed(0)
    a, b, frozen, idle = (nn.Parameter(torch.randn(5, generator=gen)) for _ in range(4))
    frozen.requires_grad_(False)
    for p in (a, b):
        p.grad = torch.randn(5, generator=gen) * 3
    ref = [nn.Parameter(p.detach().clone()) for p in (a, b)]
    for r, p in zip(ref, (a, b)):
        r.grad = p.grad.clone()
    kwargs = dict(clip, norm_type=math.inf if clip.get('norm_type') == 'inf'
                  else clip.get('norm_type', 2))
    expected = torch.nn.utils.clip_grad_norm_(ref, **kwargs)
    norm = hook.clip_grads(iter([a, frozen, b, idle]))  # a generator, as mmcv is given one
    assert torch.equal(norm, expected)
    assert torch.equal(a.grad, ref[0].grad) and torch.equal(b.grad, ref[1].grad)
    assert hook.clip_grads([frozen, idle]) is None  # nothing with a gradient


def test_clip_grads_without_grad_clip_says_so():
    with pytest.raises(TypeError, match='grad_clip is None'):
        Fp16OptimizerHook().clip_grads([nn.Parameter(torch.ones(1))])


@pytest.mark.parametrize('bad', [dict(max_norm=-1), dict(norm_type=2), 'max_norm=1', dict()])
def test_setting_a_bad_grad_clip_is_refused_and_changes_nothing(bad):
    hook = Fp16OptimizerHook(grad_clip=dict(max_norm=3.0))
    with pytest.raises(ValueError):
        hook.grad_clip = bad
    assert hook.grad_clip == {'max_norm': 3.0} and hook._clip[1]['max_norm'] == 3.0


@pytest.mark.parametrize('backend', BACKENDS)
def test_grad_clip_set_or_changed_mid_run_applies_at_the_next_update(backend):
    _require(backend)
    hook = Fp16OptimizerHook(loss_scale=SCALE, backend=backend)
    runner = _run(hook, n=4, overflow=(), until=2)
    assert not any('grad_norm' in r for r, _ in runner.log_buffer.records)
    hook.grad_clip = dict(max_norm=1e-3)
    hook.grad_clip['max_norm'] = 1e-4  # in place, as mmcv reads it at each update
    runner.run(_data(4, ()), R.mse)
    norms = [r['grad_norm'] for r, _ in runner.log_buffer.records if 'grad_norm' in r]
    assert len(norms) == 2 and hook._engine.clip[1]['max_norm'] == 1e-4


@pytest.mark.parametrize('backend', BACKENDS)
def test_detect_anomalous_params_logs_the_parameters_the_loss_does_not_use(backend, caplog):
    _require(backend)
    hook = Fp16OptimizerHook(loss_scale=SCALE, backend=backend)
    hook.detect_anomalous_params = True
    model = R.Net(seed=1)
    model.unused = nn.Linear(2, 2)
    runner = Runner(model, torch.optim.SGD(model.parameters(), lr=0.1), [hook], meta={},
                    logger=logging.getLogger('anomalous'))
    with caplog.at_level(logging.ERROR, logger='anomalous'):
        runner.run(_data(1, ()), R.mse)
    lines = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
    assert sorted(line.split()[0] for line in lines) == ['unused.bias', 'unused.weight']


def test_copy_grads_and_params_act_on_the_legacy_masters_as_in_mmcv():
    _require('legacy')
    hook, runner = _ready('legacy', loss_scale=MMCV_SCALE)
    masters = [p for g in runner.optimizer.param_groups for p in g['params']]
    assert [m.dtype for m in masters] == [torch.float32] * 4
    assert all(m is e for m, e in zip(masters, hook._engine.masters))
    for p in runner.model.parameters():
        p.grad = torch.full_like(p, 0.5)
    for m in masters:
        m.grad = None
    hook.copy_grads_to_fp32(runner.model, masters)
    assert all(m.grad.dtype == torch.float32 and bool((m.grad == 0.5).all()) for m in masters)
    with torch.no_grad():
        for m in masters:
            m.fill_(0.25)
    hook.copy_params_to_fp16(runner.model, masters)
    assert all(p.dtype == F16 and bool((p == 0.25).all()) for p in runner.model.parameters())


def test_copy_grads_and_params_leave_the_native_backends_own_parameters_alone():
    _require('native')
    hook, runner = _ready('native', loss_scale=SCALE)
    params = [p for g in runner.optimizer.param_groups for p in g['params']]
    for p in params:
        p.grad = torch.full_like(p, 3.0)
    before = [p.detach().clone() for p in params]
    hook.copy_grads_to_fp32(runner.model, params)  # the same tensors: nothing to copy
    hook.copy_params_to_fp16(runner.model, params)
    _same(before, [p.detach().clone() for p in params])
    assert all(bool((p.grad == 3.0).all()) for p in params)


def test_copy_grads_to_fp32_pairs_in_order_and_leaves_out_missing_gradients():
    net = nn.Sequential(nn.Linear(2, 2), nn.Linear(2, 1)).half()
    net[0].weight.grad = torch.ones(2, 2, dtype=F16)
    weights = [nn.Parameter(torch.zeros_like(p, dtype=torch.float32)) for p in net.parameters()]
    weights[2].grad = torch.full((1, 2), 7.0)
    Fp16OptimizerHook().copy_grads_to_fp32(net, weights)
    assert weights[0].grad.tolist() == [[1.0, 1.0], [1.0, 1.0]]
    assert weights[1].grad is None and weights[3].grad is None
    assert weights[2].grad.tolist() == [[7.0, 7.0]]  # no gradient on that side: left as it was


@pytest.mark.parametrize('x, expected', [
    (torch.ones(3), False), (torch.tensor([1.0, math.inf]), True),
    (torch.tensor([-math.inf]), True), (torch.tensor([math.nan, 0.0]), True),
    (torch.ones(2, dtype=F16), False), (torch.tensor([6e4, 6e4], dtype=F16), False),
    (torch.arange(3), False)])
def test_has_inf_or_nan_is_callable_as_mmcv_calls_it(x, expected):
    assert LossScaler._has_inf_or_nan(x) is expected
    assert LossScaler()._has_inf_or_nan(x) is expected


def test_loss_scaler_has_overflow_and_update_scale_follow_mmcvs_arithmetic():
    s = LossScaler(init_scale=16., scale_window=2)
    p = nn.Parameter(torch.ones(2))
    scales = []
    for grad in (1.0, 1.0, math.inf, 1.0, 1.0, 1.0):
        p.grad = torch.full((2,), grad)
        s.update_scale(s.has_overflow([p]))
        scales.append((s.cur_scale, s.cur_iter, s.last_overflow_iter))
    # mmcv: grow when (cur_iter - last_overflow_iter) % scale_window == 0, halve on overflow.
    assert scales == [(16., 1, -1), (32., 2, -1), (16., 3, 2), (16., 4, 2), (32., 5, 2),
                      (32., 6, 2)]


def test_the_cumulative_hooks_extra_api():
    hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=3)
    assert hook.has_batch_norm(nn.Sequential(nn.Linear(1, 1), nn.Sequential(nn.BatchNorm1d(1))))
    assert hook.has_batch_norm(nn.SyncBatchNorm(2))
    assert not hook.has_batch_norm(nn.Sequential(nn.Linear(1, 1), nn.GroupNorm(1, 1)))
    runner = Runner(R.Net(), torch.optim.SGD(R.Net().parameters(), lr=0.1), [hook],
                    max_iters=7, meta={})
    assert not hook.initialized
    hook._init(runner)
    assert (hook.divisible_iters, hook.remainder_iters, hook.initialized) == (6, 1, True)
    factors = []
    for it in range(7):
        runner.iter = it
        factors.append(hook._get_loss_factor(runner))
    assert factors == [3, 3, 3, 3, 3, 3, 1]
    flags = []
    for it in range(7):
        runner.iter = it
        flags.append((hook.every_n_iters(runner, 3), hook.is_last_iter(runner)))
    assert [i for i, (every, last) in enumerate(flags) if every or last] == [2, 5, 6]
    assert hook.every_n_iters(runner, 0) is False


def test_the_base_reads_a_runners_public_or_private_totals():
    from types import SimpleNamespace

    hook = Fp16OptimizerHook()
    assert hook.is_last_iter(SimpleNamespace(iter=2, _max_iters=3))
    assert hook.is_last_epoch(SimpleNamespace(epoch=1, max_epochs=2))
    assert hook.every_n_epochs(SimpleNamespace(epoch=3), 2)
    assert hook.every_n_inner_iters(SimpleNamespace(inner_iter=4), 5)
    assert hook.end_of_epoch(SimpleNamespace(inner_iter=2, data_loader=[0, 1, 2]))


@pytest.mark.parametrize('backend, wrong', [
    ('native', lambda: LossScaler()), ('legacy', lambda: torch.amp.GradScaler('cpu'))])
def test_a_scaler_of_the_other_backends_kind_is_refused_and_changes_nothing(backend, wrong):
    hook, runner = _ready(backend, loss_scale=SCALE if backend == 'native' else MMCV_SCALE)
    scaler, scale = hook.loss_scaler, hook.loss_scale
    with pytest.raises(TypeError, match='GradScaler' if backend == 'native' else 'LossScaler'):
        hook.loss_scaler = wrong()
    assert hook.loss_scaler is scaler and hook.loss_scale == scale


def test_a_grad_scaler_assigned_after_before_run_is_scaled_with():
    _require('native')
    hook, runner = _ready('native', loss_scale=SCALE)
    hook.loss_scaler = torch.amp.GradScaler('cpu', init_scale=4.0, growth_interval=1000)
    assert hook.loss_scale == 4.0
    for batch in _data(2, ()):  # the run goes on (a new before_run would restore the meta's)
        runner.outputs = {'loss': R.mse(runner.model, batch), 'num_samples': 4}
        hook.after_train_iter(runner)
        runner.iter += 1
    assert runner.meta['fp16']['loss_scaler']['scale'] == 4.0
    assert hook.loss_scaler.get_scale() == 4.0 and hook.last_result.scale == 4.0


# -------------------------------------------------------- windows given as whole floats


@pytest.mark.parametrize('window', [2.0, np.float64(2.0), np.int64(2), 2])
def test_loss_scaler_takes_a_whole_window_as_mmcv_does(window):
    a, b = LossScaler(init_scale=8., scale_window=window), LossScaler(8., scale_window=2)
    for overflow in (False, False, True, False, False, False):
        a.update_scale(overflow)
        b.update_scale(overflow)
        assert a.state_dict() == b.state_dict()
    assert type(a.scale_window) is int


@pytest.mark.parametrize('window, note', [
    (2.5, 'every 5 clean iterations'), (0.5, 'every 1 clean iteration with'),
    (1.25, 'every 5 clean iterations'), (0.1, 'practically never')])
def test_a_window_with_a_fraction_is_refused_saying_what_mmcv_would_do(window, note):
    with pytest.raises(ValueError, match='whole number') as info:
        LossScaler(scale_window=window)
    assert note in str(info.value)
    # What the note says is what mmcv's arithmetic does with the window.
    period = next((k for k in range(1, 10) if k % window == 0), None)
    if period is not None:
        assert f'every {period} clean iteration' in window_note(window)


def test_a_saved_state_with_whole_floats_loads_as_ints():
    s = LossScaler()
    s.load_state_dict(dict(cur_scale=64, cur_iter=7.0, mode='dynamic', last_overflow_iter=3.0,
                           scale_factor=2, scale_window=4.0))
    assert s.state_dict() == dict(cur_scale=64.0, cur_iter=7, mode='dynamic',
                                  last_overflow_iter=3, scale_factor=2.0, scale_window=4)
    assert all(type(s.state_dict()[k]) is int for k in ('cur_iter', 'last_overflow_iter',
                                                         'scale_window'))


@pytest.mark.parametrize('key, value', [('scale_window', 2.5), ('cur_iter', 3.5),
                                        ('last_overflow_iter', 0.5)])
def test_a_saved_state_with_a_fraction_is_refused_and_changes_nothing(key, value):
    s = LossScaler(init_scale=8.)
    before = s.state_dict()
    with pytest.raises(ValueError, match=key):
        s.load_state_dict(dict(before, **{key: value}))
    assert s.state_dict() == before


@pytest.mark.parametrize('backend', BACKENDS)
def test_the_hook_takes_a_float_window_in_either_vocabulary(backend):
    _require(backend)
    runs = [_run(Fp16OptimizerHook(loss_scale=dict(init_scale=256., **{key: w}),
                                   backend=backend))
            for key in ('scale_window', 'growth_interval') for w in (2, 2.0)]
    for other in runs[1:]:
        _same(_params(runs[0]), _params(other))
        assert other.hooks[0].scale_history == runs[0].hooks[0].scale_history
    # Grew after 2 clean steps, backed off at the overflow (step 3), grew 2 steps later.
    assert runs[0].hooks[0].scale_history == [(0, 256.), (2, 512.), (3, 256.), (5, 512.)]


@pytest.mark.parametrize('backend', BACKENDS)
def test_the_wrapper_takes_float_windows_and_states_holding_them(backend):
    _require(backend)
    model = R.Net()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), backend=backend,
                              model=model, loss_scale=dict(init_scale=8., scale_window=3.0))
    assert wrapper.state_dict()['loss_scaler'][
        'scale_window' if backend == 'legacy' else 'growth_interval'] == 3
    mmcv_state = dict(cur_scale=64.0, cur_iter=10.0, mode='dynamic', last_overflow_iter=4.0,
                      scale_factor=2.0, scale_window=3.0)
    torch_state = dict(scale=32.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=4.0,
                       _growth_tracker=1.0)
    for state, scale in ((mmcv_state, 64.0), (torch_state, 32.0)):
        wrapper.load_state_dict(dict(wrapper.state_dict(), loss_scaler=state))
        assert wrapper.loss_scale == scale
    with pytest.raises(ValueError, match='every 5 clean iterations'):
        wrapper.load_state_dict(dict(wrapper.state_dict(),
                                     loss_scaler=dict(mmcv_state, scale_window=2.5)))
    assert wrapper.loss_scale == 32.0
