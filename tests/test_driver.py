"""The step driver shared by the optimizer wrappers and the 0.x hooks, and its pending window."""

from __future__ import annotations

import copy
import io

import _caps  # tests/ is on sys.path: see conftest.py
import _runner as R
import pytest
import torch
from torch import nn

from fp16utils import GradientCumulativeFp16OptimizerHook
from fp16utils.engine import (
    AccumulationWindow,
    ResumeState,
    StepDriver,
    StepEngine,
    check_resume,
    read_pending_window,
)
from fp16utils.optim import AmpOptimWrapper, OptimWrapper

N = 6  # iterations of the runs compared


def _driver(counts=1, nonfinite='ignore'):
    p = nn.Parameter(torch.tensor([1.0, -2.0]))
    optimizer = torch.optim.Adam([p], lr=0.1)
    window = AccumulationWindow(counts, 'test', 'counts')
    return p, optimizer, StepDriver('test', window, StepEngine(nonfinite=nonfinite))


def _iterate(driver, p, optimizer, done, grad_scale=1.0):
    """One iteration through the driver; returns its StepResult."""
    driver.backward((p * grad_scale).sum(), done + 1, done % driver.window.counts,
                    optimizer.zero_grad)
    if driver.window.completes(done):
        result = driver.step(optimizer, done + 1, {})
        optimizer.zero_grad()
        driver.grads_cleared()
        return result
    return driver.accumulated()


# --------------------------------------------------------------------- the driver itself


def test_the_driver_counts_steps_and_keeps_the_last_result():
    p, optimizer, driver = _driver(counts=2)
    assert driver.steps_taken == 0 and driver.last_result is None
    results = [_iterate(driver, p, optimizer, i) for i in range(4)]
    assert [(r.stepped, r.accumulating) for r in results] == [(False, True), (True, False)] * 2
    assert driver.steps_taken == 2
    assert driver.last_result is results[-1]
    assert results[1].scale is None and results[1].grad_norm is None  # float32, no clipping


def test_a_skipped_step_leaves_parameters_and_optimizer_state_bit_identical():
    p, optimizer, driver = _driver(nonfinite='warn')
    _iterate(driver, p, optimizer, 0)  # a clean step: Adam now has state
    before = R.snapshot(nn.Linear(1, 1), optimizer)
    assert R.state_tensors(optimizer) > 0
    result = _iterate(driver, p, optimizer, 1, grad_scale=float('inf'))
    assert result.skipped and not result.stepped
    assert driver.steps_taken == 1 and driver.last_result is result
    assert driver.engine.skipped_steps == 1
    after = R.snapshot(nn.Linear(1, 1), optimizer)
    before = {k: v for k, v in before.items() if k.startswith('opt.')}
    R.assert_identical(before, {k: v for k, v in after.items() if k.startswith('opt.')})
    assert _iterate(driver, p, optimizer, 2).stepped and driver.steps_taken == 2


def test_the_pending_window_is_written_in_one_format_and_read_back():
    p, optimizer, driver = _driver(counts=3)
    _iterate(driver, p, optimizer, 0)
    pending = driver.pending_window(optimizer, 1, copy=True)
    assert set(pending) == {'iter', 'grads'} and pending['iter'] == 1
    assert torch.equal(pending['grads'][0], p.grad) and pending['grads'][0] is not p.grad
    assert driver.pending_window(optimizer, 1, copy=False)['grads'][0] is p.grad
    assert driver.pending_window(optimizer, 3, copy=True) is None  # a window ends there
    count, grads = read_pending_window(pending, 'pending_window', 'test')
    assert count == 1 and grads is pending['grads']


def test_an_iteration_that_raised_leaves_no_pending_window_and_refuses_a_step():
    p, optimizer, driver = _driver(counts=2)
    _iterate(driver, p, optimizer, 0)
    with pytest.raises(RuntimeError, match='boom'):
        driver.backward(_Raising.apply(p).sum(), 2, 1, optimizer.zero_grad)
    assert driver.pending_window(optimizer, 1, copy=True) is None
    with pytest.raises(RuntimeError, match='run a new backward first'):
        driver.step(optimizer, 2, {})
    assert driver.steps_taken == 0


class _Raising(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x):
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        raise RuntimeError('boom')


@pytest.mark.parametrize('pending, problem', [
    ({'grads': []}, 'no count'),
    ({'iter': 1}, 'no grads'),
    ({'iter': -1, 'grads': []}, 'negative'),
    ({'iter': True, 'grads': []}, 'a bool'),
    ({'iter': 1, 'inner_count': 1, 'grads': []}, 'both keys'),
    ([1, []], 'a list'),
])
def test_a_bad_pending_window_is_refused_with_a_clear_message(pending, problem):
    with pytest.raises(ValueError, match=r"owner: where must be a dict \{'iter': an int >= 0"):
        read_pending_window(pending, 'where', 'owner')


def test_a_wrapper_refuses_a_bad_pending_window_and_changes_nothing():
    model = R.Net()
    wrapper = OptimWrapper(torch.optim.Adam(model.parameters(), lr=0.1), accumulative_counts=2)
    for batch in R.make_data(3):
        wrapper.update_params(R.mse(model, batch))
    state = wrapper.state_dict()
    before = R.snapshot(model, wrapper.optimizer)
    grads = [p.grad.clone() for p in model.parameters()]
    bad = dict(state, pending_window={'iter': 1, 'inner_count': 1,
                                      'grads': state['pending_window']['grads']})
    with pytest.raises(ValueError, match="the saved pending_window must be a dict"):
        wrapper.load_state_dict(bad)
    R.assert_identical(before, R.snapshot(model, wrapper.optimizer))
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert wrapper.inner_count == 3


def test_check_resume_names_the_entry_that_does_not_fit():
    p = nn.Parameter(torch.ones(2))
    check_resume(ResumeState(pending=[None], masters=[torch.ones(2)]), [p], 'o', masters=True)
    with pytest.raises(ValueError, match='master weights'):
        check_resume(ResumeState(masters=[torch.ones(3)]), [p], 'o', masters=True)
    check_resume(ResumeState(masters=[torch.ones(3)]), [p], 'o', masters=False)  # unused
    with pytest.raises(ValueError, match='skipped_steps'):
        check_resume(ResumeState(stats={'skipped_steps': -1, 'scale_history': []}), [p], 'o',
                     masters=False)


# --------------------------------------------------------------- the two styles, one driver


def _wrapper_run(backend, dtype, data, counts, upto=None, state=None, start=0):
    model = R.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    wrapper = AmpOptimWrapper(optimizer=optimizer, loss_scale=256., dtype=dtype, backend=backend,
                              accumulative_counts=counts, clip_grad=dict(max_norm=1.0),
                              model=model if backend == 'legacy' else None)
    if state is not None:
        model.load_state_dict(state['model'])
        wrapper.load_state_dict(state['optim'])
    wrapper.initialize_count_status(model, start, len(data))
    for batch in data[start:upto]:
        with wrapper.optim_context(model):
            loss = R.mse(model, batch)
        wrapper.update_params(loss)
    return model, wrapper


def _hook_run(backend, dtype, data, counts, upto=None, meta=None, start=0, ckpt=None):
    model = R.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    if ckpt is not None:  # saved from a float32 model (native) or a half one (legacy)
        model.load_state_dict({k: v.float() for k, v in ckpt['state_dict'].items()})
        optimizer.load_state_dict(ckpt['optimizer'])
    hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=counts, loss_scale=256.,
                                               dtype=dtype, backend=backend,
                                               grad_clip=dict(max_norm=1.0))
    runner = R.MiniRunner(model, optimizer, [hook], max_iters=len(data),
                          meta={} if meta is None else meta)
    runner.iter = start
    runner.run(data, R.mse, until=upto)
    return runner, hook


def _weights(model):
    return [p.detach().float().clone() for p in model.parameters()]


def _same(a, b):
    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.dtype == y.dtype and torch.equal(x, y)


def _require(backend):
    dtype = _caps.train_dtype(backend)
    _caps.require(dtype, 'native' if backend == 'native' else None)
    return dtype


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_a_wrapper_run_and_a_hook_run_give_bit_identical_parameters(backend):
    dtype = _require(backend)
    data = R.make_data(N)
    data[2] = R.overflow_batch()  # a skipped step in both
    model, wrapper = _wrapper_run(backend, dtype, data, counts=2)
    runner, hook = _hook_run(backend, dtype, data, counts=2)
    _same(_weights(model), _weights(runner.model))
    assert wrapper.steps_taken == hook.steps_taken
    assert wrapper.last_result == hook.last_result
    assert wrapper.skipped_steps == hook.skipped_steps
    if dtype == torch.float16:
        assert wrapper.skipped_steps == 1


def _old_wrapper_format(pending):
    return {'inner_count': pending['iter'], 'grads': pending['grads']}


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('fmt', ['current', 'old-wrapper', 'old-hook'])
def test_a_wrapper_resumes_mid_window_from_every_pending_format(backend, fmt):
    dtype = _require(backend)
    data = R.make_data(N)
    full, _ = _wrapper_run(backend, dtype, data, counts=3)
    model, wrapper = _wrapper_run(backend, dtype, data, counts=3, upto=4)
    optim = copy.deepcopy(wrapper.state_dict())
    assert set(optim['pending_window']) == {'iter', 'grads'}
    assert optim['pending_window']['iter'] == 4
    if fmt == 'old-wrapper':
        optim['pending_window'] = _old_wrapper_format(optim['pending_window'])
    # 'old-hook': {'iter', 'grads'}, the format the hooks wrote, is the current one.
    state = {'model': copy.deepcopy(model.state_dict()), 'optim': optim}
    resumed, again = _wrapper_run(backend, dtype, data, counts=3, state=state, start=4)
    assert again.inner_count == N
    _same(_weights(full), _weights(resumed))


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('fmt', ['current', 'old-wrapper'])
def test_a_hook_resumes_mid_window_from_every_pending_format(backend, fmt):
    dtype = _require(backend)
    data = R.make_data(N)
    full, _ = _hook_run(backend, dtype, data, counts=3)
    runner, _ = _hook_run(backend, dtype, data, counts=3, upto=4)
    ckpt = torch.load(io.BytesIO(runner.save_checkpoint()), weights_only=False)
    meta = ckpt['meta']
    assert set(meta['fp16']['pending_window']) == {'iter', 'grads'}
    if fmt == 'old-wrapper':
        meta['fp16']['pending_window'] = _old_wrapper_format(meta['fp16']['pending_window'])
    resumed, _ = _hook_run(backend, dtype, data, counts=3, meta=meta, start=4, ckpt=ckpt)
    _same(_weights(full.model), _weights(resumed.model))


def test_the_cumulative_hooks_mmcv_attributes_are_views_of_its_window():
    hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=4)
    assert (hook.divisible_iters, hook.remainder_iters, hook.initialized) == (0, 0, False)
    runner = R.MiniRunner(R.Net(), torch.optim.SGD(R.Net().parameters(), lr=0.1), [hook],
                          max_iters=10, meta={})
    hook._init(runner)
    assert (hook.divisible_iters, hook.remainder_iters, hook.initialized) == (8, 2, True)
    assert 'divisible_iters' not in vars(hook) and 'initialized' not in vars(hook)
    hook.remainder_iters = 3  # as an mmcv-style _init sets it: the window follows
    assert (hook.divisible_iters, hook.remainder_iters) == (8, 3)
    runner.iter = 8
    assert hook._get_loss_factor(runner) == 3
    hook.initialized = False
    assert not hook._driver.window.started
