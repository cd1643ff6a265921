"""The step engine: accumulation arithmetic, one source of truth for the scale, resume order,
the step state, and the checks of saved state."""

from __future__ import annotations

import copy
import importlib.util
import io
import logging
import pickle
import re
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

from fp16utils import AmpOptimWrapper, Fp16OptimizerHook, LossScaler, _torch
from fp16utils._args.spec import MMCV_DYNAMIC, TORCH_DYNAMIC
from fp16utils.engine import (
    AccumulationWindow,
    LegacyEngine,
    NativeEngine,
    ResumeState,
    StepDriver,
    StepEngine,
    StepState,
    check_optimizer_state,
    check_resume,
    check_tensors,
    optimizer_device_type,
    ranks,
    resume_state_from_meta,
    snapshot_optimizer,
)

_spec = importlib.util.spec_from_file_location('_runner', Path(__file__).with_name('_runner.py'))
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)


# ------------------------------------------------------------------ accumulation window


@pytest.mark.parametrize('counts,max_counts,divisors,steps', [
    (1, 5, [1] * 5, [0, 1, 2, 3, 4]),
    (3, 7, [3, 3, 3, 3, 3, 3, 1], [2, 5, 6]),
    (4, 10, [4] * 8 + [2, 2], [3, 7, 9]),
    (4, 8, [4] * 8, [3, 7]),
    (2, -1, [2] * 5, [1, 3]),
])
def test_window_divides_and_steps_like_one_large_batch(counts, max_counts, divisors, steps):
    window = AccumulationWindow(counts, 'owner', 'accumulative_counts')
    window.start(max_counts)
    n = len(divisors)
    assert [window.divisor(i) for i in range(n)] == divisors
    assert [i for i in range(n) if window.completes(i)] == steps


@pytest.mark.parametrize('bad', [0, -1, 1.5, True, '2', None])
def test_window_rejects_a_count_that_is_not_an_int_of_at_least_one(bad):
    with pytest.raises(ValueError, match=r'owner: cumulative_iters must be an int >= 1'):
        AccumulationWindow(bad, 'owner', 'cumulative_iters')


def test_window_warnings_name_the_argument_and_the_remedy(caplog):
    window = AccumulationWindow(4, 'owner', 'cumulative_iters')
    log = logging.getLogger('test_engine')
    with caplog.at_level(logging.WARNING, logger='test_engine'):
        window.warn_on_start(nn.BatchNorm1d(2), 5, False, log, 'keep them somehow')
        window.warn_on_start(nn.Linear(2, 2), 5, True, log, 'keep them somehow')
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 2
    assert 'not a multiple of cumulative_iters=4' in lines[0] and 'keep them somehow' in lines[0]
    assert 'BatchNorm' in lines[1]


# ------------------------------------------------------------------ one truth for the scale
#
# These are about the GradScaler that float16 training on the CPU uses.


def _trained_wrapper(init_scale=1024.0):
    model = R.Net()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01),
                              loss_scale=dict(init_scale=init_scale))
    batch = R.make_data(1)[0]
    with wrapper.optim_context(model):
        loss = R.mse(model, batch)
    wrapper.update_params(loss)
    return model, wrapper


def test_loading_into_the_grad_scaler_is_seen_by_the_wrapper():
    _caps.require(torch.float16, 'native')
    model, wrapper = _trained_wrapper()
    state = wrapper.loss_scaler.state_dict()
    wrapper.loss_scaler.load_state_dict(dict(state, scale=64.0, _growth_tracker=3))
    assert wrapper.loss_scale == 64.0
    saved = wrapper.state_dict()['loss_scaler']
    assert saved['scale'] == 64.0 and saved['_growth_tracker'] == 3
    # And the next step runs at that scale: the scaled loss is 64 times the loss.
    batch = R.make_data(1)[0]
    with wrapper.optim_context(model):
        loss = R.mse(model, batch)
    assert wrapper.loss_scaler.scale(loss).item() == pytest.approx(64.0 * loss.item(), rel=1e-3)


def test_setting_the_scale_through_update_is_seen_by_the_wrapper():
    _caps.require(torch.float16, 'native')
    _, wrapper = _trained_wrapper()
    wrapper.loss_scaler.update(32.0)
    assert wrapper.loss_scale == 32.0
    assert wrapper.state_dict()['loss_scaler']['scale'] == 32.0
    assert wrapper.scale_history[-1][1] == 32.0


def test_loading_into_the_hooks_grad_scaler_is_seen_by_the_hook():
    _caps.require(torch.float16, 'native')
    hook = Fp16OptimizerHook(loss_scale=dict(init_scale=512.0), backend='native')
    model = R.Net()
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.01), [hook],
                          max_iters=2, meta={})
    runner.run(R.make_data(2), R.mse, until=1)
    hook.loss_scaler.load_state_dict(dict(hook.loss_scaler.state_dict(), scale=8.0))
    assert hook.loss_scale == 8.0
    runner.outputs = {'loss': R.mse(model, R.make_data(2)[1])}
    hook.after_train_iter(runner)  # the next iteration, in the same run
    assert runner.meta['fp16']['loss_scaler']['scale'] == 8.0


def test_the_wrappers_own_steps_are_not_mistaken_for_outside_changes():
    _caps.require(torch.float16, 'native')
    _, wrapper = _trained_wrapper()
    scaler = wrapper.loss_scaler
    changes = _torch.state.grad_scaler_changes(scaler)
    model = R.Net()
    wrapper2 = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01),
                               loss_scale=256.0)  # static: update(scale) on every step
    for batch in R.make_data(3):
        with wrapper2.optim_context(model):
            loss = R.mse(model, batch)
        wrapper2.update_params(loss)
    assert _torch.state.grad_scaler_changes(scaler) == changes
    assert _torch.state.grad_scaler_changes(wrapper2.loss_scaler) == 0
    assert wrapper2.loss_scale == 256.0


def test_the_grad_scaler_pickles_and_deep_copies_as_a_plain_grad_scaler():
    _caps.require(torch.float16, 'native')
    _, wrapper = _trained_wrapper(init_scale=128.0)
    scaler = wrapper.loss_scaler
    plain = type(_torch.factory.make_grad_scaler('cpu', enabled=False))
    assert isinstance(scaler, plain) and type(scaler) is not plain  # a GradScaler subclass
    for clone in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert type(clone) is plain
        assert clone.get_scale() == 128.0
    buffer = io.BytesIO()
    torch.save(scaler.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer)['scale'] == 128.0


# ------------------------------------------------------------------ resume: check, then load


def test_resume_checks_everything_before_it_loads_the_optimizer():
    engine = NativeEngine(TORCH_DYNAMIC, torch.float16, lambda: 'cpu')
    loaded = []
    p = nn.Parameter(torch.ones(3))
    bad_states = [
        ResumeState(scaler={'scale': float('inf'), 'growth_factor': 2.0,
                            'backoff_factor': 0.5, 'growth_interval': 5,
                            '_growth_tracker': 0}),
        ResumeState(scaler={'scale': 2.0}),
        ResumeState(pending=[torch.ones(4)]),
    ]
    for state in bad_states:
        with pytest.raises((ValueError, KeyError)):
            engine.resume(state, 0, 'owner', [p], load_optimizer=lambda: loaded.append(1))
    assert loaded == [] and engine.loss_scale == 2.0**16 and p.grad is None


def test_resume_restores_stats_then_notes_the_loaded_scale():
    engine = NativeEngine(TORCH_DYNAMIC, torch.float16, lambda: 'cpu')
    p = nn.Parameter(torch.ones(2))
    state = ResumeState(
        scaler={'cur_scale': 64.0, 'cur_iter': 10, 'mode': 'dynamic', 'last_overflow_iter': 7,
                'scale_factor': 2.0, 'scale_window': 5},
        stats={'skipped_steps': 3, 'scale_history': [(0, 512.0), (7, 64.0)]},
        pending=[torch.full((2,), 0.5)])
    engine.resume(state, 10, 'owner', [p])
    assert engine.skipped_steps == 3 and engine.loss_scale == 64.0
    assert engine.scale_history == [(0, 512.0), (7, 64.0)]
    assert engine.state_dict()['_growth_tracker'] == 2  # (10 - 7 - 1) % 5
    assert torch.equal(p.grad, torch.full((2,), 0.5))


def test_the_base_engine_neither_scales_nor_skips():
    engine = StepEngine()
    p = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([p], lr=1.0)
    engine.backward((p * torch.tensor([1.0, float('inf')])).sum())
    assert engine.step(optimizer, 1, {}) is False  # 'ignore': applied as plain torch
    assert torch.isinf(p).any() and engine.loss_scale == 1.0 and engine.state_dict() == {}


# ------------------------------------------------------------------ the step state


class _Boom(Exception):
    pass


def _one_param_step(engine, optimizer_step=None):
    p = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([p], lr=1.0)
    if optimizer_step is not None:
        optimizer.step = optimizer_step(optimizer.step)
    engine.backward(p.sum())
    return p, optimizer


def test_a_step_moves_the_state_and_returns_it_to_ready():
    engine = StepEngine(clip=('norm', {'max_norm': 10.0}))
    seen = []

    def watch(step):
        def wrapped(**kwargs):
            seen.append(engine.state)
            step(**kwargs)
        return wrapped

    p, optimizer = _one_param_step(engine, watch)
    assert engine.state is StepState.READY
    assert engine.step(optimizer, 1, {}) is False
    assert seen == [StepState.UNSCALED]  # clipped in place before the optimizer ran
    assert engine.state is StepState.READY and p.tolist() == [0.0, 0.0]


def _legacy_step_that_raises_after_the_update(monkeypatch, clip=None):
    """A legacy engine whose LossScaler update (after the masters stepped) raises."""
    p = nn.Parameter(torch.ones(2))
    optimizer = torch.optim.SGD([p], lr=1.0)
    engine = LegacyEngine(optimizer, MMCV_DYNAMIC._replace(init_scale=4.0), torch.float16,
                          'test', clip=clip)

    def update_scale(self, overflow):
        raise _Boom

    monkeypatch.setattr(LossScaler, 'update_scale', update_scale)
    engine.backward(p.sum())
    return p, optimizer, engine


def test_a_step_that_raises_says_how_far_it_got(monkeypatch):
    p, optimizer, engine = _legacy_step_that_raises_after_the_update(monkeypatch)
    with pytest.raises(_Boom):
        engine.step(optimizer, 1, {})
    assert engine.state is StepState.STEPPED and engine.state.applied
    assert p.tolist() == [0.0, 0.0]  # completed: the masters reached the model

    def before(step):
        def wrapped(**kwargs):
            raise _Boom
        return wrapped

    untouched = StepEngine()
    _, optimizer = _one_param_step(untouched, before)
    with pytest.raises(_Boom):
        untouched.step(optimizer, 1, {})
    assert untouched.state is StepState.READY  # nothing changed: the step may be retried


def test_only_the_moves_of_a_step_are_allowed():
    engine = StepEngine()
    engine.move(StepState.APPLIED)
    with pytest.raises(RuntimeError, match='APPLIED cannot move to UNSCALED'):
        engine.move(StepState.UNSCALED)
    engine.move(StepState.SPENT)  # any state may become spent, or ready again
    engine.move(StepState.READY)
    assert engine.state is StepState.READY


def test_the_driver_spends_gradients_a_raising_step_changed_and_records_an_applied_one(
        monkeypatch):
    p, optimizer, engine = _legacy_step_that_raises_after_the_update(
        monkeypatch, clip=('norm', {'max_norm': 10.0}))
    driver = StepDriver('test', AccumulationWindow(2, 'test', 'counts'), engine)
    with pytest.raises(_Boom):
        driver.step(optimizer, 1, {})
    assert driver.steps_taken == 1 and driver.last_result.stepped
    assert round(driver.last_result.grad_norm, 4) == 1.4142  # this step's clipping
    assert engine.state is StepState.SPENT
    assert driver.pending_window(optimizer, 1, copy=True) is None
    with pytest.raises(RuntimeError, match=r'test\.step\(\): the last iteration raised'):
        driver.step(optimizer, 2, {})
    driver.grads_cleared()
    assert engine.state is StepState.READY


# ------------------------------------------------------------------ checks and small helpers


def test_saved_state_checks_name_what_does_not_fit():
    p = nn.Parameter(torch.ones(2))
    with pytest.raises(ValueError, match=re.escape(
            'example: the saved pending gradients [0] is torch.float32 (3,) on cpu, expected a '
            'floating-point tensor of shape (2,) with data; load a state saved from the same '
            'model and optimizer.')):
        check_resume(ResumeState(pending=[torch.ones(3)]), [p], 'example', False)
    assert check_tensors([None], [p], 'pending gradients', 'example', True) == [None]
    optimizer = torch.optim.SGD([p], lr=0.1)
    check_optimizer_state(optimizer, optimizer.state_dict(), 'example')
    with pytest.raises(ValueError, match='example: the saved optimizer state has 0 param '
                                         'groups, this optimizer 1; load a state saved'):
        check_optimizer_state(optimizer, {'state': {}, 'param_groups': []}, 'example')
    undo = snapshot_optimizer(optimizer)
    optimizer.param_groups = []
    undo()
    assert len(optimizer.param_groups) == 1


def test_meta_without_fp16_state_resumes_nothing_and_no_optimizer_means_cpu():
    assert resume_state_from_meta(None, 0, 'hook') == ({}, ResumeState())
    assert optimizer_device_type(None) == 'cpu'


def test_a_bfloat16_native_engine_does_not_scale():
    engine = NativeEngine(TORCH_DYNAMIC, torch.bfloat16, lambda: 'cpu')
    assert (engine.enabled, engine.loss_scale, engine.backend) == (False, 1.0, 'native')


def test_the_legacy_engine_gives_masters_to_an_added_param_group():
    optimizer = torch.optim.SGD(nn.Linear(2, 1).parameters(), lr=0.1)
    engine = LegacyEngine(optimizer, MMCV_DYNAMIC, torch.float16, 'example')
    extra = nn.Parameter(torch.ones(3))
    optimizer.add_param_group({'params': [extra]})
    engine.adopt_added_groups(optimizer)
    assert len(engine.masters) == 3 and optimizer.param_groups[1]['params'][0] is not extra


def test_a_window_splits_off_its_shorter_last_part():
    window = AccumulationWindow(4, 'hook', 'cumulative_iters')
    window.start(10)
    assert (window.divisible, window.remainder) == (8, 2)


def test_the_rank_flag_carries_a_veto_and_is_written_back_in_place():
    assert ranks.check_setting(False, 'example') is False
    with pytest.raises(TypeError, match='agree_across_ranks must be None'):
        ranks.check_setting('yes', 'example')
    reduce, seen = ranks.with_veto(lambda f: f, veto=True)
    assert reduce(torch.zeros(1)).item() >= ranks.VETO and len(seen) == 1
    flags = {'cpu': torch.tensor([0.0])}
    assert ranks.agree_found(flags, 'cpu', lambda f: f + 1)['cpu'].tolist() == [1.0]
    empty = ranks.agree_found({}, 'cpu', lambda f: f + 1)  # a rank with no gradient joins
    assert [v.tolist() for v in empty.values()] == [[1.0]]
