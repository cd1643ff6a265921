"""Attacks on the 0.x hooks: odd ``runner.meta``, bad resume states, wrong call order.

A refused ``before_run`` must leave the model (dtype and weights), the optimizer
(its param groups still hold the model's parameters) and the hook as they were.
"""

from __future__ import annotations

import _runner as R
import pytest
import torch
from _state_attacks import (
    INF,
    MMCV_STATE,
    NAN,
    TORCH_STATE,
    assert_same,
    deep,
    require_f16,
    require_weights_only,
    weights_only_roundtrip,
)

from fp16utils import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook

BACKENDS = ['native', 'legacy']


def _runner(backend, meta, iter_=0, cumulative=False):
    require_f16(backend)
    cls = GradientCumulativeFp16OptimizerHook if cumulative else Fp16OptimizerHook
    kwargs = dict(cumulative_iters=2) if cumulative else {}
    hook = cls(loss_scale='dynamic', backend=backend, dtype='float16', **kwargs)
    model = R.Net(seed=5)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    runner = R.MiniRunner(model, optimizer, [hook], max_iters=4, meta=meta)
    runner.iter = iter_
    return hook, runner


def _snap(hook, runner):
    return deep({
        'model': dict(runner.model.state_dict()),
        'groups': [[id(p) for p in g['params']] for g in runner.optimizer.param_groups],
        'optimizer': runner.optimizer.state_dict(),
        'fp16_enabled': runner.model.fp16_enabled,
        'hook': (hook.backend, hook.loss_scale, hook.skipped_steps, list(hook.scale_history),
                 hook.loss_scaler is None),
    })


def _assert_refused(hook, runner, call, exc, match):
    """``call(runner)`` raises ``exc`` (its message holds ``match``); nothing changed."""
    before = _snap(hook, runner)
    with pytest.raises(exc) as info:
        call(runner)
    assert match in str(info.value)
    assert_same(before, _snap(hook, runner))


def _pending(runner, **changes):
    grads = [torch.zeros_like(p) for p in runner.model.parameters()]
    return {'iter': 0, 'grads': grads, **changes}


BAD_META = [
    ('meta-a-str', lambda r: 'meta', TypeError, 'runner.meta'),
    ('meta-a-list', lambda r: ['fp16'], TypeError, 'runner.meta'),
    ('fp16-a-str', lambda r: {'fp16': 'x'}, TypeError, "runner.meta['fp16']"),
    ('fp16-a-list', lambda r: {'fp16': [1]}, TypeError, "runner.meta['fp16']"),
    ('scaler-inf', lambda r: {'fp16': {'loss_scaler': {**TORCH_STATE, 'scale': INF}}},
     ValueError, 'scale=inf'),
    ('scaler-nan', lambda r: {'fp16': {'loss_scaler': {**TORCH_STATE, 'scale': NAN}}},
     ValueError, 'scale=nan'),
    ('scaler-bool', lambda r: {'fp16': {'loss_scaler': {**TORCH_STATE, 'scale': True}}},
     ValueError, 'scale=True'),
    ('scaler-huge', lambda r: {'fp16': {'loss_scaler': {**TORCH_STATE, 'scale': 1e308}}},
     ValueError, 'scale=1e+308'),
    ('scaler-interval-0', lambda r: {'fp16': {'loss_scaler': {**TORCH_STATE,
                                                              'growth_interval': 0}}},
     ValueError, 'growth_interval=0'),
    ('scaler-tracker-over', lambda r: {'fp16': {'loss_scaler': {**TORCH_STATE,
                                                                '_growth_tracker': 3}}},
     ValueError, '_growth_tracker=3'),
    ('mmcv-inf', lambda r: {'fp16': {'loss_scaler': {**MMCV_STATE, 'cur_scale': INF}}},
     ValueError, 'cur_scale=inf'),
    ('mmcv-bogus-mode', lambda r: {'fp16': {'loss_scaler': {**MMCV_STATE, 'mode': 'x'}}},
     ValueError, "mode='x'"),
    ('mmcv-overflow-ahead', lambda r: {'fp16': {'loss_scaler': {
        **MMCV_STATE, 'last_overflow_iter': 12}}}, ValueError, 'last_overflow_iter=12'),
    ('mmcv-missing', lambda r: {'fp16': {'loss_scaler': {'cur_scale': 8.0}}}, KeyError,
     'missing'),
    ('scaler-extra', lambda r: {'fp16': {'loss_scaler': {**TORCH_STATE, 'x': 1}}}, ValueError,
     "'x'"),
    ('scaler-a-list', lambda r: {'fp16': {'loss_scaler': [1]}}, TypeError, 'must be a dict'),
    ('stats-bad', lambda r: {'fp16': {'stats': {'skipped_steps': -1, 'scale_history': []}}},
     ValueError, 'skipped_steps'),
    ('stats-a-str', lambda r: {'fp16': {'stats': 'x'}}, ValueError, 'statistics'),
    ('pending-a-str', lambda r: {'fp16': {'pending_window': 'x'}}, ValueError,
     'pending_window'),
    ('pending-iter-str', lambda r: {'fp16': {'pending_window': _pending(r, iter='0')}},
     ValueError, 'pending_window'),
    ('pending-short', lambda r: {'fp16': {'pending_window': _pending(
        r, grads=_pending(r)['grads'][:1])}}, ValueError, 'pending gradients'),
    ('pending-shape', lambda r: {'fp16': {'pending_window': _pending(
        r, grads=[torch.ones(1)] * len(_pending(r)['grads']))}}, ValueError,
     'pending gradients'),
]


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize(('case', 'meta', 'exc', 'match'), BAD_META, ids=[c[0] for c in BAD_META])
def test_a_refused_before_run_changes_nothing(backend, case, meta, exc, match):
    hook, runner = _runner(backend, None)
    runner.meta = meta(runner)
    _assert_refused(hook, runner, hook.before_run, exc, match)
    assert all(p.dtype == torch.float32 for p in runner.model.parameters())
    runner.meta = {}
    hook.before_run(runner)  # still usable
    assert hook.loss_scaler is not None


@pytest.mark.parametrize('case', ['one-short', 'wrong-shape', 'int', 'a-str'])
def test_bad_legacy_masters_in_meta_are_refused_before_the_model_is_converted(case):
    hook, runner = _runner('legacy', None)
    masters = [p.detach().clone() for p in runner.model.parameters()]
    bad = {'one-short': masters[:-1], 'wrong-shape': [torch.ones(2)] + masters[1:],
           'int': [masters[0].int()] + masters[1:], 'a-str': 'm'}[case]
    runner.meta = {'fp16': {'master_params': bad}}
    _assert_refused(hook, runner, hook.before_run, ValueError, 'master weights')


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_refused_resume_on_a_prepared_hook_changes_nothing(backend):
    data = R.make_data(4)
    hook, runner = _runner(backend, {})
    runner.run(data, R.mse, until=2)
    good = deep(runner.meta)
    runner.meta = {'fp16': {**good['fp16'], 'loss_scaler': {**TORCH_STATE, 'scale': INF}}}
    _assert_refused(hook, runner, hook.before_run, ValueError, 'scale=inf')
    runner.meta = good
    hook.before_run(runner)


@pytest.mark.parametrize('backend', BACKENDS)
def test_after_train_iter_before_before_run_is_a_clear_error(backend):
    hook, runner = _runner(backend, {})
    runner.outputs = {'loss': R.mse(runner.model, R.make_data(1)[0])}
    _assert_refused(hook, runner, hook.after_train_iter, RuntimeError, 'before_run')


@pytest.mark.parametrize('backend', BACKENDS)
def test_before_run_twice_prepares_once(backend):
    hook, runner = _runner(backend, {})
    hook.before_run(runner)
    groups = [[id(p) for p in g['params']] for g in runner.optimizer.param_groups]
    scaler = hook.loss_scaler
    hook.before_run(runner)
    assert [[id(p) for p in g['params']] for g in runner.optimizer.param_groups] == groups
    assert hook.loss_scaler is scaler
    runner.run(R.make_data(4), R.mse)
    assert hook.scale_history[0][1] == (2.0**16 if backend == 'native' else 2.0**32)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('meta', [None, {}, {'fp16': None}, {'fp16': {}}, {'other': 1}])
def test_empty_meta_in_any_form_starts_afresh(backend, meta):
    hook, runner = _runner(backend, deep(meta), cumulative=True)
    runner.run(R.make_data(3), R.mse, until=3)
    assert hook.scale_history[0] == (0, 2.0**16 if backend == 'native' else 2.0**32)
    assert runner.meta['fp16']['loss_scaler'] and runner.meta['fp16']['pending_window']


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_pending_window_for_another_iteration_is_ignored(backend):
    hook, runner = _runner(backend, None, iter_=2, cumulative=True)
    runner.meta = {'fp16': {'pending_window': _pending(runner, iter=1)}}
    hook.before_run(runner)
    assert all(p.grad is None for p in runner.model.parameters())


@pytest.mark.parametrize('loss_scale', [
    INF, NAN, 0, -1, True, 1e308, 'bogus', None, [512], dict(init_scale=INF),
    dict(init_scale=0), dict(init_scale=True), dict(mode='bogus'), dict(scale_factor=1),
    dict(scale_window=0), dict(growth_interval=2.5), dict(backoff_factor=1.5), dict(x=1)])
@pytest.mark.parametrize('cls', [Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook])
def test_the_hooks_refuse_a_bad_loss_scale(cls, loss_scale):
    with pytest.raises(ValueError, match='loss_scale'):
        cls(loss_scale=loss_scale)


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_hook_checkpoint_round_trips_with_weights_only(backend):
    require_weights_only()
    hook, runner = _runner(backend, {}, cumulative=True)
    runner.run(R.make_data(3), R.mse, until=3)  # mid-window: pending gradients saved
    meta = weights_only_roundtrip(runner.meta)
    twin, twin_runner = _runner(backend, meta, iter_=3, cumulative=True)
    twin_runner.model.load_state_dict(runner.model.state_dict())
    twin.before_run(twin_runner)
    assert twin.loss_scale == hook.loss_scale
    assert twin.skipped_steps == hook.skipped_steps
    assert all(p.grad is not None for p in twin._grad_params())  # the window came back
