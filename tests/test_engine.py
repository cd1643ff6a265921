"""The step engine: accumulation arithmetic, one source of truth for the scale, resume order."""

from __future__ import annotations

import copy
import importlib.util
import io
import logging
import pickle
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

from fp16utils import AmpOptimWrapper, Fp16OptimizerHook, _torch
from fp16utils._args.spec import TORCH_DYNAMIC
from fp16utils.engine import AccumulationWindow, NativeEngine, ResumeState, StepEngine

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
