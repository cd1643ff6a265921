"""Degenerate numbers for every scale, window and factor argument, and in every state load.

Denormal and huge scales, the float32-reciprocal line, integral floats, numpy
scalars, 0-d tensors, bools, and growth intervals at torch's integer bounds,
given to ``AmpOptimWrapper`` (both backends), ``Fp16OptimizerHook``,
``LossScaler``, and to the ``load_state_dict`` paths. A value that works is
taken and trains (weights finite, the state a plain float or int that saves
and loads); one that cannot work is refused up front with a ValueError naming
it, and nothing changes: parameters, optimizer state and scaler state
bit-identical, the model not converted.
"""

from __future__ import annotations

import math
from typing import Any, Dict

import _caps
import _runner as R
import numpy as np
import pytest
import torch
from _state_attacks import WEIGHTS_ONLY_FLOATS, weights_only_roundtrip

from fp16utils import AmpOptimWrapper, Fp16OptimizerHook, LossScaler
from fp16utils._args.limits import MAX_GROWTH_INTERVAL, MAX_GROWTH_TRACKER

F16 = torch.float16
INF = math.inf
#: The smallest float32 whose float32 reciprocal is finite (a denormal).
TINY_OK = 2.0**-128 + 2.0**-149

#: Scales that work, and the float they are taken as.
SCALES_OK = [
    (2.0**-126, 2.0**-126), (TINY_OK, TINY_OK), (2.0**127, 2.0**127), (512, 512.0),
    (512.0, 512.0), (np.float64(512.0), 512.0), (np.float32(512.0), 512.0),
    (torch.tensor(512.0), 512.0), (np.int64(512), 512.0), (torch.tensor(512), 512.0),
]
#: Plain numbers only: a static ``loss_scale=`` is a number (mmcv's takes a float).
STATIC_OK = [s for s in SCALES_OK if isinstance(s[0], (int, float))]
#: Scales that cannot work: a float32 reciprocal that is inf, zero, negative, too large.
SCALES_BAD = [
    1e-40, 2.0**-128, 2.0**-149, 5e-324, 0.0, -1.0, 2.0**127 * (1 + 2.0**-52),
    3.4028234663852886e38, INF, math.nan, True, np.float64(1e-40), torch.tensor(1e-40),
    torch.tensor(True), torch.tensor([512.0]),
]


def _ids(values: Any) -> list:
    return [f'{type(v).__name__}:{v!r}'[:40] for v in values]


def _backend_dtype(backend: str, scaled: bool = False) -> torch.dtype:
    """float16 on the native backend; on the legacy one the low dtype it trains in here,
    float16 when the test needs a scale in use (bfloat16 trains unscaled)."""
    if backend == 'native' or scaled:
        _caps.require(F16, 'native' if backend == 'native' else None)
        return F16
    _caps.require(_caps.LEGACY_LOW)
    return _caps.LEGACY_LOW


def _setup(backend: str, scaled: bool = False):
    dtype = _backend_dtype(backend, scaled)
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    return dtype, model, optimizer


def _train(wrapper: AmpOptimWrapper, model: torch.nn.Module, steps: int = 2) -> list:
    results = []
    for batch in R.make_data(steps, seed=3):
        with wrapper.optim_context(model):
            loss = R.mse(model, batch)
        results.append(wrapper.update_params(loss))
    return results


def _all_finite(model: torch.nn.Module, optimizer: Any) -> bool:
    return all(bool(torch.isfinite(t).all()) for t in R.snapshot(model, optimizer).values()
               if t.is_floating_point())


def _plain_roundtrip(state: Dict[str, Any]) -> Dict[str, Any]:
    """Through torch.save and a weights-only load: plain floats and ints only. Where
    torch's weights-only reader cannot read python floats (torch < 2.0), a full load
    whose values are then checked to be plain."""
    loaded = weights_only_roundtrip(state)
    if not WEIGHTS_ONLY_FLOATS:
        _assert_plain(loaded)
    return loaded


def _assert_plain(value: Any) -> None:
    if isinstance(value, dict):
        for key, item in value.items():
            _assert_plain(key)
            _assert_plain(item)
    elif isinstance(value, (list, tuple)):
        for item in value:
            _assert_plain(item)
    else:
        assert value is None or type(value) in (bool, int, float, str), type(value)


def _assert_refused_unchanged(call, model, optimizer, match: str) -> None:
    before = R.snapshot(model, optimizer)
    groups = [list(g['params']) for g in optimizer.param_groups]
    dtypes = {p.dtype for p in model.parameters()}
    with pytest.raises(ValueError, match=match):
        call()
    R.assert_identical(before, R.snapshot(model, optimizer))
    assert [list(g['params']) for g in optimizer.param_groups] == groups
    assert {p.dtype for p in model.parameters()} == dtypes


# ------------------------------------------------------------------------------- scales


@pytest.mark.parametrize('value,taken', SCALES_OK, ids=_ids([v for v, _ in SCALES_OK]))
def test_loss_scaler_takes_a_working_scale_as_a_float(value, taken):
    scaler = LossScaler(init_scale=value, scale_window=1)
    assert type(scaler.cur_scale) is float and scaler.cur_scale == taken
    p = torch.nn.Parameter(torch.ones(2))
    p.grad = torch.full((2,), taken)
    assert scaler.unscale_([p]) is False and bool(torch.isfinite(p.grad).all())
    scaler.update_scale(False)
    assert _plain_roundtrip(scaler.state_dict())['cur_scale'] == min(taken * 2, 2.0**127)


@pytest.mark.parametrize('value', SCALES_BAD, ids=_ids(SCALES_BAD))
def test_loss_scaler_refuses_a_scale_that_cannot_work(value):
    with pytest.raises(ValueError, match=r'init_scale must be .*float32 reciprocal'):
        LossScaler(init_scale=value)


@pytest.mark.parametrize('value', SCALES_BAD, ids=_ids(SCALES_BAD))
def test_loss_scaler_load_refuses_such_a_scale_and_keeps_its_state(value):
    scaler = LossScaler(init_scale=64.0)
    scaler.update_scale(True)
    before = dict(scaler.state_dict())
    with pytest.raises(ValueError, match='cur_scale'):
        scaler.load_state_dict(dict(before, cur_scale=value))
    assert scaler.state_dict() == before


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('value,taken', SCALES_OK, ids=_ids([v for v, _ in SCALES_OK]))
def test_wrapper_trains_with_a_working_initial_scale(value, taken, backend):
    dtype, model, optimizer = _setup(backend, scaled=True)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(init_scale=value), dtype=dtype,
                              backend=backend, model=model)
    assert wrapper.loss_scale == taken
    results = _train(wrapper, model)
    assert _all_finite(model, optimizer)
    assert results[0].scale == taken
    state = _plain_roundtrip(wrapper.state_dict()['loss_scaler'])
    scale = state['scale' if backend == 'native' else 'cur_scale']
    assert type(scale) is float and 0 < scale <= 2.0**127


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('value,taken', STATIC_OK, ids=_ids([v for v, _ in STATIC_OK]))
def test_wrapper_static_scale_never_applies_a_non_finite_step(value, taken, backend):
    dtype, model, optimizer = _setup(backend, scaled=True)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=value, dtype=dtype, backend=backend,
                              model=model)
    results = _train(wrapper, model)
    assert _all_finite(model, optimizer)
    assert wrapper.loss_scale == taken  # static: never changes
    assert all(r.stepped or r.skipped for r in results)


@pytest.mark.parametrize('where', ['number', 'dict'])
@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('value', SCALES_BAD, ids=_ids(SCALES_BAD))
def test_wrapper_refuses_a_scale_that_cannot_work_and_changes_nothing(value, backend, where):
    dtype, model, optimizer = _setup(backend)
    loss_scale = value if where == 'number' else dict(init_scale=value)
    _assert_refused_unchanged(
        lambda: AmpOptimWrapper(optimizer, loss_scale=loss_scale, dtype=dtype,
                                backend=backend, model=model),
        model, optimizer, 'loss_scale must be')


def test_the_reported_defect_a_tiny_static_scale_no_longer_poisons_the_weights():
    dtype, model, optimizer = _setup('native')
    with pytest.raises(ValueError, match='1e-40.*float32 reciprocal'):
        AmpOptimWrapper(optimizer, loss_scale=1e-40, dtype=dtype)
    with pytest.raises(ValueError, match='float32 reciprocal'):
        AmpOptimWrapper(optimizer, loss_scale=dict(init_scale=1e-40), dtype=dtype)


@pytest.mark.parametrize('loss_scale', ['dynamic', 512.0, 512, dict(init_scale=TINY_OK),
                                        dict(init_scale=np.float32(256.0)), 2.0**127],
                         ids=['dynamic', 'float', 'int', 'tiny', 'np32', 'max'])
@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_hook_trains_with_a_working_scale(loss_scale, backend):
    _caps.require(F16, 'native' if backend == 'native' else None)
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = Fp16OptimizerHook(loss_scale=loss_scale, backend=backend, dtype=F16)
    runner = R.MiniRunner(model, optimizer, [hook], max_iters=2, meta={})
    runner.run(R.make_data(2, seed=3), R.mse)
    assert _all_finite(model, optimizer) and hook.steps_taken + hook.skipped_steps == 2
    _plain_roundtrip(runner.meta['fp16']['loss_scaler'])


@pytest.mark.parametrize('where', ['number', 'dict'])
@pytest.mark.parametrize('value', SCALES_BAD, ids=_ids(SCALES_BAD))
def test_hook_refuses_a_scale_that_cannot_work(value, where):
    with pytest.raises(ValueError, match='loss_scale must be'):
        Fp16OptimizerHook(loss_scale=value if where == 'number' else dict(init_scale=value))


def _trained_wrapper(backend: str, scaled: bool = False):
    dtype, model, optimizer = _setup(backend, scaled)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(init_scale=64.0), dtype=dtype,
                              backend=backend, model=model)
    _train(wrapper, model)
    return model, optimizer, wrapper


def _assert_load_refused(wrapper, model, optimizer, state, match: str) -> None:
    before = R.snapshot(model, optimizer)
    saved = wrapper.state_dict()
    with pytest.raises(ValueError, match=match):
        wrapper.load_state_dict(state)
    R.assert_identical(before, R.snapshot(model, optimizer))
    after = wrapper.state_dict()
    assert after['loss_scaler'] == saved['loss_scaler']
    assert after['fp16_stats'] == saved['fp16_stats']


@pytest.mark.parametrize('fmt', ['torch', 'mmcv'])
@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('value', SCALES_BAD[:8], ids=_ids(SCALES_BAD[:8]))
def test_wrapper_load_refuses_a_saved_scale_that_cannot_work(value, backend, fmt):
    model, optimizer, wrapper = _trained_wrapper(backend)
    state = wrapper.state_dict()
    key = 'scale' if fmt == 'torch' else 'cur_scale'
    if fmt == 'torch':
        scaler = dict(scale=value, growth_factor=2.0, backoff_factor=0.5, growth_interval=10,
                      _growth_tracker=0)
    else:
        scaler = dict(cur_scale=value, cur_iter=3, mode='dynamic', last_overflow_iter=-1,
                      scale_factor=2.0, scale_window=10)
    _assert_load_refused(wrapper, model, optimizer, dict(state, loss_scaler=scaler), key)


@pytest.mark.parametrize('value', [1e-40, 2.0**-128, 0.0], ids=_ids([1e-40, 2.0**-128, 0.0]))
def test_grad_scaler_load_from_outside_refuses_such_a_scale(value):
    model, optimizer, wrapper = _trained_wrapper('native')
    scaler = wrapper.loss_scaler
    before = scaler.state_dict()
    with pytest.raises(ValueError, match='scale'):
        scaler.load_state_dict(dict(before, scale=value))
    assert scaler.state_dict() == before and wrapper.loss_scale == before['scale']
    with pytest.raises(ValueError, match='scale'):
        scaler.update(value)  # update(new_scale) is checked the same way
    assert scaler.get_scale() == before['scale']


@pytest.mark.parametrize('value', [1e-40, 2.0**-149], ids=['1e-40', 'min-denormal'])
@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_hook_resume_refuses_a_saved_scale_that_cannot_work(value, backend):
    _caps.require(F16, 'native' if backend == 'native' else None)
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = Fp16OptimizerHook(loss_scale='dynamic', backend=backend, dtype=F16)
    saved = dict(cur_scale=value, cur_iter=3, mode='dynamic', last_overflow_iter=-1,
                 scale_factor=2.0, scale_window=10)
    runner = R.MiniRunner(model, optimizer, [hook], meta={'fp16': {'loss_scaler': saved}})
    before = R.snapshot(model, optimizer)
    with pytest.raises(ValueError, match='cur_scale'):
        hook.before_run(runner)
    R.assert_identical(before, R.snapshot(model, optimizer))
    assert {p.dtype for p in model.parameters()} == {torch.float32}  # not converted
    assert not getattr(model, 'fp16_enabled', False)


# ------------------------------------------------------------------------------ windows

#: Growth intervals GradScaler takes (its update kernel reads an int64), and more.
WINDOWS_NATIVE_OK = [1, 2000, 2**31 - 1, 2**31, MAX_GROWTH_INTERVAL, np.int64(7)]
WINDOWS_NATIVE_BAD = [MAX_GROWTH_INTERVAL + 1, 2**64, 2**100]
WINDOWS_BAD = [0, -1, True, 2.5, '5', None]


@pytest.mark.parametrize('key', ['growth_interval', 'scale_window'])
@pytest.mark.parametrize('value', WINDOWS_NATIVE_OK[:-1], ids=_ids(WINDOWS_NATIVE_OK[:-1]))
def test_native_trains_with_any_interval_its_update_kernel_takes(value, key):
    dtype, model, optimizer = _setup('native')
    wrapper = AmpOptimWrapper(optimizer, loss_scale={'init_scale': 64.0, key: value},
                              dtype=dtype)
    results = _train(wrapper, model, steps=3)
    assert all(r.stepped for r in results) and _all_finite(model, optimizer)
    state = wrapper.state_dict()['loss_scaler']
    assert state['growth_interval'] == value
    assert state['_growth_tracker'] == (0 if value == 1 else 3 % value)
    assert wrapper.loss_scale == (64.0 * 8 if value == 1 else 64.0)


@pytest.mark.parametrize('key', ['growth_interval', 'scale_window'])
@pytest.mark.parametrize('value', WINDOWS_NATIVE_BAD, ids=_ids(WINDOWS_NATIVE_BAD))
def test_native_refuses_an_interval_past_int64_before_anything_changes(value, key):
    dtype, model, optimizer = _setup('native')
    _assert_refused_unchanged(
        lambda: AmpOptimWrapper(optimizer, loss_scale={'init_scale': 64.0, key: value},
                                dtype=dtype),
        model, optimizer, r'2\*\*63 - 1.*int64')


@pytest.mark.parametrize('value', WINDOWS_NATIVE_BAD, ids=_ids(WINDOWS_NATIVE_BAD))
def test_the_legacy_backend_counts_in_python_and_takes_a_huge_window(value):
    """mmcv's LossScaler takes any window and it works (a scale that never grows)."""
    dtype, model, optimizer = _setup('legacy', scaled=True)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(init_scale=64.0, scale_window=value),
                              dtype=dtype, backend='legacy', model=model)
    results = _train(wrapper, model, steps=3)
    assert all(r.stepped for r in results) and wrapper.loss_scale == 64.0
    assert wrapper.state_dict()['loss_scaler']['scale_window'] == value
    scaler = LossScaler(init_scale=8.0, scale_window=value)
    for _ in range(3):
        scaler.update_scale(False)
    assert scaler.loss_scale == 8.0 and _plain_roundtrip(scaler.state_dict())['cur_iter'] == 3


@pytest.mark.parametrize('value', WINDOWS_NATIVE_BAD[:2], ids=_ids(WINDOWS_NATIVE_BAD[:2]))
def test_a_static_native_scale_never_uses_its_interval_and_takes_any(value):
    dtype, model, optimizer = _setup('native')
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(init_scale=64.0, mode='static',
                                                         growth_interval=value), dtype=dtype)
    assert all(r.stepped for r in _train(wrapper, model)) and wrapper.loss_scale == 64.0


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('value', WINDOWS_BAD, ids=_ids(WINDOWS_BAD))
def test_a_window_that_is_not_a_whole_number_at_least_one_is_refused(value, backend):
    dtype, model, optimizer = _setup(backend)
    _assert_refused_unchanged(
        lambda: AmpOptimWrapper(optimizer, loss_scale=dict(growth_interval=value),
                                dtype=dtype, backend=backend, model=model),
        model, optimizer, 'growth_interval')


@pytest.mark.parametrize('value', [2**64, 2**63], ids=['2**64', '2**63'])
def test_the_reported_defect_a_hook_refuses_it_in_before_run_before_the_model_changes(value):
    _caps.require(F16, 'native')
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    hook = Fp16OptimizerHook(loss_scale=dict(init_scale=64.0, growth_interval=value),
                             backend='native', dtype=F16)
    runner = R.MiniRunner(model, optimizer, [hook], meta={})
    before = R.snapshot(model, optimizer)
    with pytest.raises(ValueError, match=r'2\*\*63 - 1'):
        hook.before_run(runner)
    R.assert_identical(before, R.snapshot(model, optimizer))
    assert not model.fp16_enabled  # wrap_fp16_model did not run


@pytest.mark.parametrize('state_key,value,fmt', [
    ('growth_interval', 2**64, 'torch'), ('growth_interval', MAX_GROWTH_INTERVAL + 1, 'torch'),
    ('_growth_tracker', MAX_GROWTH_TRACKER + 1, 'torch'), ('scale_window', 2**64, 'mmcv'),
], ids=['interval-2**64', 'interval-2**63', 'tracker-2**31', 'mmcv-window-2**64'])
def test_native_load_refuses_counters_grad_scaler_cannot_hold(state_key, value, fmt):
    model, optimizer, wrapper = _trained_wrapper('native')
    if fmt == 'torch':
        scaler = dict(scale=32.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2**40,
                      _growth_tracker=0)
    else:
        scaler = dict(cur_scale=32.0, cur_iter=3, mode='dynamic', last_overflow_iter=-1,
                      scale_factor=2.0, scale_window=10)
    scaler[state_key] = value
    _assert_load_refused(wrapper, model, optimizer, dict(wrapper.state_dict(),
                                                         loss_scaler=scaler), r'2\*\*(63|31)')
    outside = wrapper.loss_scaler
    if fmt == 'torch':
        before = outside.state_dict()
        with pytest.raises(ValueError, match=r'2\*\*(63|31)'):
            outside.load_state_dict(scaler)
        assert outside.state_dict() == before


def test_legacy_load_takes_a_huge_mmcv_window_and_trains_on():
    model, optimizer, wrapper = _trained_wrapper('legacy', scaled=True)
    state = wrapper.state_dict()
    state['loss_scaler'] = dict(state['loss_scaler'], scale_window=2**64)
    wrapper.load_state_dict(state)
    assert all(r.stepped for r in _train(wrapper, model)) and _all_finite(model, optimizer)


# ------------------------------------------------------------------------------ factors

FACTORS_OK = [(2, 2.0), (2.0, 2.0), (np.float64(2.0), 2.0), (1.0 + 2.0**-20, 1.0 + 2.0**-20),
              (1e30, 1e30)]
FACTORS_BAD = [1.0, 0.5, 0, -2.0, INF, math.nan, True, '2']


@pytest.mark.parametrize('value,taken', FACTORS_OK, ids=_ids([v for v, _ in FACTORS_OK]))
def test_a_growth_factor_that_works_is_taken_and_capped_at_2_127(value, taken):
    dtype, model, optimizer = _setup('native')
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(init_scale=64.0, growth_factor=value,
                                                         growth_interval=1), dtype=dtype)
    _train(wrapper, model, steps=2)
    assert wrapper.state_dict()['loss_scaler']['growth_factor'] == taken
    assert 64.0 < wrapper.loss_scale <= 2.0**127 and _all_finite(model, optimizer)
    scaler = LossScaler(init_scale=64.0, scale_factor=value, scale_window=1)
    scaler.update_scale(False)
    scaler.update_scale(False)
    assert 64.0 < scaler.loss_scale <= 2.0**127


@pytest.mark.parametrize('value', FACTORS_BAD, ids=_ids(FACTORS_BAD))
def test_a_growth_factor_that_cannot_grow_is_refused(value):
    dtype, model, optimizer = _setup('native')
    _assert_refused_unchanged(
        lambda: AmpOptimWrapper(optimizer, loss_scale=dict(growth_factor=value), dtype=dtype),
        model, optimizer, 'growth_factor')
    if type(value) is float and value == 1.0:  # mmcv takes it: a scale that never moves
        assert LossScaler(init_scale=64.0, scale_factor=value).scale_factor == 1.0
        return
    with pytest.raises(ValueError, match='scale_factor'):
        LossScaler(scale_factor=value)


@pytest.mark.parametrize('value', [1e-30, 2.0**-149, np.float64(0.25)],
                         ids=['1e-30', 'min-denormal', 'np-0.25'])
def test_a_tiny_backoff_factor_backs_off_to_the_floor_not_to_zero(value):
    dtype, model, optimizer = _setup('native')
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(init_scale=64.0, backoff_factor=value),
                              dtype=dtype)
    with wrapper.optim_context(model):
        loss = R.mse(model, R.overflow_batch())
    assert wrapper.update_params(loss).skipped
    floor = max(64.0 * float(value), 1.0)  # never below min(1, init_scale)
    assert wrapper.loss_scale == wrapper.loss_scaler.get_scale() == floor
    assert all(r.stepped for r in _train(wrapper, model)) and _all_finite(model, optimizer)


# ------------------------------------------------- clip_grad(error_if_nonfinite=True)

CLIP_RAISES = dict(max_norm=1.0, error_if_nonfinite=True)


@pytest.mark.parametrize('style', ['wrapper', 'hook'])
def test_an_overflow_with_error_if_nonfinite_clipping_is_a_skipped_step(style):
    """float16: an overflow backs the scale off, as without clipping; clean steps clip."""
    _caps.require(F16, 'native')
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    data = [R.overflow_batch(), *R.make_data(2, seed=3)]
    if style == 'wrapper':
        wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(init_scale=64.0), dtype=F16,
                                  clip_grad=CLIP_RAISES)
        before = R.snapshot(model, optimizer)
        with wrapper.optim_context(model):
            loss = R.mse(model, data[0])
        first = wrapper.update_params(loss)
        assert first.skipped and first.grad_norm is None and wrapper.loss_scale == 32.0
        R.assert_identical(before, R.snapshot(model, optimizer))
        results = _train(wrapper, model)
        assert all(r.stepped and r.grad_norm is not None for r in results)
    else:
        hook = Fp16OptimizerHook(loss_scale=dict(init_scale=64.0), dtype=F16,
                                 backend='native', grad_clip=CLIP_RAISES)
        runner = R.MiniRunner(model, optimizer, [hook], max_iters=3, meta={})
        runner.run(data, R.mse)
        assert hook.skipped_steps == 1 and hook.steps_taken == 2 and hook.loss_scale == 32.0
    assert _all_finite(model, optimizer)


def test_error_if_nonfinite_still_raises_for_a_real_non_finite_without_scaling():
    """bfloat16, nonfinite='ignore' (apply as torch would): torch's error, nothing applied."""
    _caps.require(torch.bfloat16, 'native', scaled=False)
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    wrapper = AmpOptimWrapper(optimizer, dtype='bfloat16', nonfinite='ignore',
                              clip_grad=CLIP_RAISES)
    before = R.snapshot(model, optimizer)
    with wrapper.optim_context(model):
        loss = R.mse(model, R.make_data(1)[0]) * INF
    with pytest.raises(RuntimeError, match='non-finite'):
        wrapper.update_params(loss)
    R.assert_identical(before, R.snapshot(model, optimizer))
    assert wrapper.steps_taken == 0 and wrapper.inner_count == 0
    assert all(r.stepped for r in _train(wrapper, model))  # the next iterations train
