"""Tests for fp16utils.optim: the 1.x optimizer wrappers and build_optim_wrapper."""

from __future__ import annotations

import contextlib
import copy
import inspect
import io
import logging
import math

import _caps  # tests/ is on sys.path: see conftest.py
import _runner as R
import pytest
import torch
from torch import nn

import fp16utils
from fp16utils import (
    AmpOptimWrapper,
    LossScaler,
    OptimWrapper,
    OptimWrapperDict,
    build_optim_wrapper,
)
from fp16utils import optim as optim_mod

BACKENDS = ['native', 'legacy']


def amp(model, backend='native', opt_cls=torch.optim.Adam, lr=1e-2, **kwargs):
    """An AmpOptimWrapper (float16 unless ``dtype`` is given): skips where the CPU lacks it."""
    _caps.require(fp16utils._torch.dtypes.resolve_dtype(kwargs.get('dtype')),
                  'native' if backend == 'native' else None)
    optimizer = opt_cls(model.parameters(), lr=lr)
    return AmpOptimWrapper(optimizer, backend=backend, model=model, **kwargs)


def train(wrapper, model, batches):
    for x, y in batches:
        with wrapper.optim_context(model):
            out = model(x)
        wrapper.update_params((out.float() - y).pow(2).mean())


# ------------------------------------------------------------------------ OptimWrapper


def test_update_params_steps_and_zeroes_like_plain_sgd():
    model, ref = R.Net(), R.Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for batch in R.make_data(3):
        wrapper.update_params(R.mse(model, batch))
        ref_opt.zero_grad()
        R.mse(ref, batch).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
        assert p.grad is None or not p.grad.any()  # torch's zero_grad default: None or zeros
    assert wrapper.inner_count == 3


@pytest.mark.parametrize('opt_cls', [torch.optim.SGD, torch.optim.Adam])
def test_accumulation_equals_one_large_batch(opt_cls):
    small = R.make_data(4, batch_size=2)
    large = (torch.cat([b[0] for b in small]), torch.cat([b[1] for b in small]))
    model, ref = R.Net(), R.Net()
    wrapper = OptimWrapper(opt_cls(model.parameters(), lr=0.1), accumulative_counts=4)
    ref_wrapper = OptimWrapper(opt_cls(ref.parameters(), lr=0.1))
    for i, batch in enumerate(small):
        wrapper.update_params(R.mse(model, batch))
        assert wrapper.should_update() == (i == 3)
    ref_wrapper.update_params(R.mse(ref, large))
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_last_incomplete_window_is_divided_by_its_length():
    data = R.make_data(6, batch_size=2)
    model, ref = R.Net(), R.Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=4)
    wrapper.initialize_count_status(model, 0, 6)
    updates = []
    for batch in data:
        wrapper.update_params(R.mse(model, batch))
        updates.append(wrapper.should_update())
    assert updates == [False, False, False, True, False, True]
    ref_opt = torch.optim.SGD(ref.parameters(), lr=0.1)
    for window in (data[:4], data[4:]):
        ref_opt.zero_grad()
        x = torch.cat([b[0] for b in window])
        y = torch.cat([b[1] for b in window])
        R.mse(ref, (x, y)).backward()
        ref_opt.step()
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q, rtol=1e-5, atol=1e-6)


def test_counters_scale_loss_and_sync_schedule():
    p = nn.Parameter(torch.ones(1))
    wrapper = OptimWrapper(torch.optim.SGD([p], lr=1.0), accumulative_counts=3)
    wrapper.initialize_count_status(nn.Identity(), 0, 7)
    factors, syncs = [], []
    for _ in range(7):
        syncs.append(wrapper.should_sync())
        factors.append(wrapper.scale_loss(torch.tensor(6.0)).item())
        wrapper.backward((p * 0).sum())
    assert factors == [2.0] * 6 + [6.0]
    assert syncs == [False, False, True, False, False, True, True]
    assert wrapper.max_counts == 7 and wrapper.accumulative_counts == 3


def test_resume_count_not_multiple_warns(caplog):
    p = nn.Parameter(torch.ones(1))
    wrapper = OptimWrapper(torch.optim.SGD([p], lr=1.0), accumulative_counts=4)
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        wrapper.initialize_count_status(nn.BatchNorm1d(2), 5, 10)
    text = caplog.text
    assert 'not a multiple of accumulative_counts=4' in text and 'BatchNorm' in text
    assert wrapper.inner_count == 5


class _FakeDDP(nn.Module):
    def __init__(self, module):
        super().__init__()
        self.module = module
        self.no_sync_calls = 0

    @contextlib.contextmanager
    def no_sync(self):
        self.no_sync_calls += 1
        yield

    def forward(self, x):
        return self.module(x)


@pytest.mark.parametrize('wrapper_cls', [OptimWrapper, AmpOptimWrapper])
def test_optim_context_skips_gradient_sync_while_accumulating(wrapper_cls):
    model = _FakeDDP(R.Net())
    kwargs = {} if wrapper_cls is OptimWrapper else {'dtype': _caps.train_dtype('native')}
    wrapper = wrapper_cls(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2,
                          **kwargs)
    calls = []
    for batch in R.make_data(4):
        with wrapper.optim_context(model):
            loss = R.mse(model, batch)
        calls.append(model.no_sync_calls)
        wrapper.update_params(loss)
    assert calls == [1, 1, 2, 2]


class _Forwarding(nn.Module):
    """Finds missing attributes on the module it wraps (no_sync included)."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def __getattr__(self, name):
        try:
            return super().__getattr__(name)
        except AttributeError:
            return getattr(super().__getattr__('inner'), name)

    def forward(self, x):
        return self.inner(x)


@pytest.mark.parametrize('wrapper_cls', [OptimWrapper, AmpOptimWrapper])
def test_no_sync_found_through_a_forwarding_getattr_and_not_on_plain_modules(wrapper_cls):
    ddp = _FakeDDP(R.Net())
    model = _Forwarding(ddp)
    kwargs = {} if wrapper_cls is OptimWrapper else {'dtype': _caps.train_dtype('native')}
    wrapper = wrapper_cls(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2,
                          **kwargs)
    for batch in R.make_data(2):
        with wrapper.optim_context(model):
            loss = R.mse(model, batch)
        wrapper.update_params(loss)
    assert ddp.no_sync_calls == 1
    # A plain module (even one with a submodule called no_sync) enters no context.
    plain = R.Net()
    plain.no_sync = nn.Identity()
    wrapper = wrapper_cls(torch.optim.SGD(plain.parameters(), lr=0.1), accumulative_counts=2,
                          **kwargs)
    with wrapper.optim_context(plain):
        R.mse(plain, R.make_data(1)[0])


def test_clip_grad_norm_matches_torch_and_exposes_the_norm():
    batch = R.make_data(1)[0]
    model, ref = R.Net(), R.Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                           clip_grad=dict(max_norm=0.05, norm_type=2))
    assert wrapper.grad_norm is None
    wrapper.update_params(R.mse(model, batch))
    R.mse(ref, batch).backward()
    expected = nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
    torch.optim.SGD(ref.parameters(), lr=0.1).step()
    torch.testing.assert_close(wrapper.grad_norm, expected)
    assert float(wrapper.grad_norm) > 0.05  # the clip did something
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p, q)
    assert wrapper.clip_grad == {'type': 'norm', 'max_norm': 0.05, 'norm_type': 2,
                                 'foreach': None}


def test_clip_grad_by_value():
    p = nn.Parameter(torch.zeros(3))
    wrapper = OptimWrapper(torch.optim.SGD([p], lr=1.0),
                           clip_grad=dict(type='value', clip_value=0.5))
    wrapper.update_params((p * torch.tensor([2.0, -3.0, 0.1])).sum())
    assert p.tolist() == pytest.approx([-0.5, 0.5, -0.1])
    assert wrapper.grad_norm is None


@pytest.mark.parametrize('clip_grad, words', [
    ('max_norm', 'clip_grad must be'),
    ({}, 'clip_grad must be'),
    (dict(norm_type=2), 'needs max_norm'),
    (dict(max_norm=-1), 'max_norm must be'),
    (dict(max_norm=1, norm_type=-2), 'norm_type'),
    (dict(type='value'), 'clip_value'),
    (dict(type='percentile', max_norm=1), "'percentile'"),
    (dict(max_norm=1, clip_value=2), "unknown key(s) ['clip_value']"),
])
def test_bad_clip_grad_is_a_clear_value_error(clip_grad, words):
    model = R.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    groups = [list(g['params']) for g in optimizer.param_groups]
    for cls in (OptimWrapper, AmpOptimWrapper):
        with pytest.raises(ValueError) as err:
            cls(optimizer, clip_grad=clip_grad)
        assert words in str(err.value)
        assert 'clip_grad' in str(err.value)
    assert [list(g['params']) for g in optimizer.param_groups] == groups


def test_clip_grad_norm_type_inf_string_is_accepted():
    p = nn.Parameter(torch.zeros(2))
    wrapper = OptimWrapper(torch.optim.SGD([p], lr=1.0),
                           clip_grad=dict(max_norm=1.0, norm_type='inf'))
    wrapper.update_params((p * torch.tensor([3.0, -4.0])).sum())
    assert float(wrapper.grad_norm) == 4.0


@pytest.mark.parametrize('bad', [0, -2, 1.5, True, '2'])
def test_bad_accumulative_counts(bad):
    with pytest.raises(ValueError, match='accumulative_counts must be an int >= 1'):
        OptimWrapper(torch.optim.SGD([nn.Parameter(torch.ones(1))], lr=1), bad)


def test_not_an_optimizer_is_a_type_error():
    with pytest.raises(TypeError, match='wraps a torch.optim.Optimizer, got Linear'):
        OptimWrapper(nn.Linear(2, 2))


def test_lr_momentum_and_state_dict_round_trip():
    model = R.Net()
    sgd = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.3, momentum=0.8))
    assert sgd.get_lr() == {'lr': [0.3]}
    assert sgd.get_momentum() == {'momentum': [0.8]}
    adam = OptimWrapper(torch.optim.Adam(model.parameters(), lr=1e-3, betas=(0.5, 0.9)))
    assert adam.get_momentum() == {'momentum': [0.5]}
    rms = OptimWrapper(torch.optim.Adagrad(model.parameters()))
    assert rms.get_momentum() == {'momentum': [0]}
    train(sgd, model, R.make_data(2))
    state = copy.deepcopy(sgd.state_dict())
    other = OptimWrapper(torch.optim.SGD(R.Net().parameters(), lr=0.1, momentum=0.1))
    other.load_state_dict(state)
    assert other.get_lr() == {'lr': [0.3]}
    assert sgd.param_groups is sgd.optimizer.param_groups
    assert 'OptimWrapper(optimizer=SGD' in repr(sgd)


# ------------------------------------------------------------------------ AmpOptimWrapper


@pytest.mark.parametrize('dtype', [
    d for d in (torch.float16, torch.bfloat16, 'float16', 'bfloat16')
    if fp16utils._torch.dtypes.resolve_dtype(d) in _caps.NATIVE_DTYPES])
def test_optim_context_autocasts_the_whole_forward_on_cpu(dtype):
    model = nn.Sequential(nn.Linear(4, 4), nn.ReLU(), nn.Linear(4, 2))
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype=dtype,
                              backend='native')
    with wrapper.optim_context(model):
        out = model(torch.ones(3, 4))
        assert _caps.autocast_now()[0]
    assert not _caps.autocast_now()[0]
    assert out.dtype == fp16utils._torch.dtypes.resolve_dtype(dtype)
    assert wrapper.dtype == out.dtype


def test_native_scaler_is_lazy_and_made_for_the_parameters_device():
    model = R.Net()
    wrapper = amp(model)
    assert wrapper._engine._scaler is None
    train(wrapper, model, R.make_data(1))
    scaler = wrapper.loss_scaler
    assert isinstance(scaler, torch.amp.GradScaler)
    assert scaler._device == 'cpu'
    assert wrapper.loss_scale == scaler.get_scale() == 2.0**16


@pytest.mark.parametrize('backend', BACKENDS)
def test_skipped_step_leaves_everything_bit_identical(backend, caplog):
    model = R.Net()
    wrapper = amp(model, backend, loss_scale=dict(init_scale=256.0))
    optimizer = wrapper.optimizer
    train(wrapper, model, R.make_data(3))
    assert R.state_tensors(optimizer) > 0
    before = R.snapshot(model, optimizer)
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        train(wrapper, model, [R.overflow_batch()])
    R.assert_identical(before, R.snapshot(model, optimizer))
    assert wrapper.skipped_steps == 1
    assert wrapper.loss_scale == 128.0
    assert wrapper.scale_history == [(0, 256.0), (4, 128.0)]
    records = [r for r in caplog.records if r.name == 'fp16utils']
    assert len(records) == 1
    assert 'step 4' in records[0].getMessage() and '-> 128.0' in records[0].getMessage()
    # Training goes on.
    train(wrapper, model, R.make_data(1, seed=5))
    after = R.snapshot(model, optimizer)
    assert not torch.equal(after['model.fc1.weight'], before['model.fc1.weight'])
    assert wrapper.skipped_steps == 1


@pytest.mark.parametrize('backend', BACKENDS)
def test_static_loss_scale_never_changes_but_still_skips(backend):
    model = R.Net()
    wrapper = amp(model, backend, loss_scale=64.0)
    train(wrapper, model, R.make_data(2))
    before = R.snapshot(model, wrapper.optimizer)
    train(wrapper, model, [R.overflow_batch()])
    R.assert_identical(before, R.snapshot(model, wrapper.optimizer))
    train(wrapper, model, R.make_data(4))
    assert wrapper.skipped_steps == 1
    assert wrapper.loss_scale == 64.0
    assert wrapper.scale_history == [(0, 64.0)]
    if backend == 'native':
        assert wrapper.loss_scaler.get_scale() == 64.0


def test_native_host_mirror_matches_the_grad_scaler():
    """The sync-free state_dict() equals GradScaler.state_dict() through skips and growth."""
    model = R.Net()
    wrapper = amp(model, loss_scale=dict(init_scale=128.0, growth_interval=2,
                                         growth_factor=4.0, backoff_factor=0.25))
    data = R.make_data(9)
    for i in (2, 5, 6):
        data[i] = R.overflow_batch()
    scales = []
    for batch in data:
        train(wrapper, model, [batch])
        assert wrapper.state_dict()['loss_scaler'] == wrapper.loss_scaler.state_dict()
        scales.append(wrapper.loss_scale)
    assert scales == [128.0, 512.0, 128.0, 128.0, 512.0, 128.0, 32.0, 32.0, 128.0]
    assert wrapper.skipped_steps == 3
    assert wrapper.scale_history == [(0, 128.0), (2, 512.0), (3, 128.0), (5, 512.0),
                                     (6, 128.0), (7, 32.0), (9, 128.0)]


def test_scale_history_is_short():
    model = R.Net()
    wrapper = amp(model, loss_scale=dict(init_scale=2.0**20, growth_interval=1))
    # Alternate overflow / clean steps so the scale changes on every step without
    # reaching its floor.
    batches = [R.overflow_batch(), R.make_data(1)[0]] * ((optim_mod.SCALE_HISTORY_LEN + 5) // 2)
    batches.append(R.overflow_batch())
    train(wrapper, model, batches)
    assert len(wrapper.scale_history) == optim_mod.SCALE_HISTORY_LEN
    assert wrapper.scale_history[-1] == (optim_mod.SCALE_HISTORY_LEN + 5, wrapper.loss_scale)


@pytest.mark.parametrize('backend', BACKENDS)
def test_bfloat16_does_no_loss_scaling(backend):
    model = R.Net()
    wrapper = amp(model, backend, dtype='bfloat16', loss_scale=512.0)
    train(wrapper, model, R.make_data(2))
    assert wrapper.loss_scale == 1.0
    # Saved in GradScaler's keys (an enabled GradScaler refuses {}): the configured scale.
    assert wrapper.state_dict()['loss_scaler'] == {
        'scale': 512.0, 'growth_factor': 2.0, 'backoff_factor': 0.5, 'growth_interval': 2000,
        '_growth_tracker': 0}
    assert wrapper.scale_history == [] and wrapper.skipped_steps == 0
    if backend == 'native':
        assert not wrapper.loss_scaler.is_enabled()
    else:
        assert next(model.parameters()).dtype == torch.bfloat16


def test_gradients_are_unscaled_before_clipping():
    batch = R.make_data(1)[0]
    model, ref = R.Net(), R.Net()
    wrapper = amp(model, opt_cls=torch.optim.SGD, loss_scale=1024.0,
                  clip_grad=dict(max_norm=1e3))
    train(wrapper, model, [batch])
    with torch.autocast('cpu', dtype=torch.float16):
        out = ref(batch[0])
    (out.float() - batch[1]).pow(2).mean().backward()
    expected = nn.utils.clip_grad_norm_(ref.parameters(), 1e3)
    torch.testing.assert_close(wrapper.grad_norm, expected, rtol=1e-2, atol=0)


@pytest.mark.parametrize('backend', BACKENDS)
def test_amp_matches_float32_training_closely(backend):
    data = R.make_data(5)
    model, ref = R.Net(), R.Net()
    dtype = _caps.train_dtype(backend)
    wrapper = amp(model, backend, opt_cls=torch.optim.SGD, lr=0.05, dtype=dtype,
                  loss_scale=dict(init_scale=1024.0))
    train(wrapper, model, data)
    ref_wrapper = OptimWrapper(torch.optim.SGD(ref.parameters(), lr=0.05))
    train(ref_wrapper, ref, data)
    atol = 5e-3 if dtype == torch.float16 else 3e-2
    for p, q in zip(model.parameters(), ref.parameters()):
        torch.testing.assert_close(p.float(), q, rtol=0, atol=atol)
    assert wrapper.skipped_steps == 0


@pytest.mark.parametrize('backend', BACKENDS)
def test_amp_accumulation_equals_one_large_batch(backend):
    small = R.make_data(4, batch_size=2)
    large = (torch.cat([b[0] for b in small]), torch.cat([b[1] for b in small]))
    model, ref = R.Net(), R.Net()
    dtype = _caps.train_dtype(backend)
    wrapper = amp(model, backend, opt_cls=torch.optim.SGD, lr=0.1, accumulative_counts=4,
                  loss_scale=512.0, dtype=dtype)
    ref_wrapper = amp(ref, backend, opt_cls=torch.optim.SGD, lr=0.1, loss_scale=512.0,
                      dtype=dtype)
    train(wrapper, model, small)
    train(ref_wrapper, ref, [large])
    masters = wrapper.master_params or list(model.parameters())
    ref_masters = ref_wrapper.master_params or list(ref.parameters())
    atol = 2e-3 if dtype == torch.float16 else 2e-2
    for p, q in zip(masters, ref_masters):
        torch.testing.assert_close(p, q, rtol=0, atol=atol)


# ---------------------------------------------------------------- AmpOptimWrapper, legacy


def test_legacy_owns_float32_masters_and_converts_the_model():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 2))
    originals = [p.detach().clone() for p in model.parameters()]
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    low = _caps.LEGACY_LOW
    wrapper = AmpOptimWrapper(optimizer, backend='legacy', model=model, loss_scale=16.0,
                              dtype=low)
    assert wrapper.optimizer is optimizer
    assert [p.dtype for p in model.parameters()] == [
        low, low, torch.float32, torch.float32, low, low]
    masters = wrapper.master_params
    assert masters == optimizer.param_groups[0]['params']
    assert all(m.dtype == torch.float32 for m in masters)
    assert all(torch.equal(m, o) for m, o in zip(masters, originals))
    assert not any(m is p for m, p in zip(masters, model.parameters()))
    assert isinstance(wrapper.loss_scaler, LossScaler)
    with wrapper.optim_context(model):
        out = model(torch.ones(3, 4))
    assert out.dtype == torch.float32
    assert not model._forward_hooks and not model._forward_pre_hooks
    wrapper.update_params(out.sum())
    assert all(p.grad is None for p in model.parameters())
    assert all(m.grad is None for m in masters)
    for m, p in zip(masters, model.parameters()):
        assert torch.equal(m.to(p.dtype), p)
    assert len(optimizer.state) == 6 and all(m in optimizer.state for m in masters)


def test_legacy_rekeys_existing_optimizer_state():
    model = R.Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    R.mse(model, R.make_data(1)[0]).backward()
    optimizer.step()
    steps = [optimizer.state[p]['step'].clone() for p in model.parameters()]
    wrapper = AmpOptimWrapper(optimizer, backend='legacy', model=model, loss_scale=128.0,
                              dtype=_caps.LEGACY_LOW)
    assert [optimizer.state[m]['step'] for m in wrapper.master_params] == steps
    train(wrapper, model, R.make_data(1))
    assert all(optimizer.state[m]['step'].item() == 2 for m in wrapper.master_params)


def test_legacy_needs_the_model_and_float32_params():
    model = R.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    low = _caps.LEGACY_LOW
    with pytest.raises(ValueError, match='needs the model: pass'):
        AmpOptimWrapper(optimizer, backend='legacy', dtype=low)
    model.to(low)
    with pytest.raises(ValueError, match='optimizer built on the float32 model'):
        AmpOptimWrapper(optimizer, backend='legacy', model=model, dtype=low)
    assert optimizer.param_groups[0]['params'] == list(model.parameters())


def test_legacy_zero_grad_can_keep_tensors():
    model = R.Net()
    wrapper = amp(model, 'legacy', loss_scale=128.0, dtype=_caps.LEGACY_LOW)
    with wrapper.optim_context(model):
        loss = R.mse(model, R.make_data(1)[0])
    wrapper.backward(loss)
    wrapper.zero_grad(set_to_none=False)
    assert all(p.grad is not None and not p.grad.any() for p in model.parameters())


def test_legacy_rejects_an_inconsistent_backoff():
    model = R.Net()
    with pytest.raises(ValueError, match='backs off by 1/growth_factor'):
        amp(model, 'legacy', loss_scale=dict(growth_factor=2.0, backoff_factor=0.25))
    assert next(model.parameters()).dtype == torch.float32


@pytest.fixture
def torch_1_5(monkeypatch):
    """Make fp16utils believe torch is 1.5.0 (no native AMP), env choice cleared."""
    monkeypatch.delenv(fp16utils._torch.versions.BACKEND_ENV, raising=False)
    monkeypatch.setattr(fp16utils._torch.versions, 'TORCH_VERSION', '1.5.0')
    fp16utils._torch.decisions.refresh()
    yield
    monkeypatch.undo()
    fp16utils._torch.decisions.refresh()


def test_old_torch_defaults_to_legacy(torch_1_5):
    _caps.require(torch.float16)  # loss scaling: float16
    model = R.Net()
    with pytest.raises(ValueError, match='needs the model'):
        AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    wrapper = amp(model, None, loss_scale=dict(init_scale=256.0))
    assert wrapper.backend == 'legacy'
    train(wrapper, model, R.make_data(2))
    before = R.snapshot(model, wrapper.optimizer)
    train(wrapper, model, [R.overflow_batch()])
    R.assert_identical(before, R.snapshot(model, wrapper.optimizer))
    assert wrapper.loss_scale == 128.0
    with pytest.raises(ValueError, match='needs torch >= 1.6'):
        AmpOptimWrapper(torch.optim.SGD(R.Net().parameters(), lr=0.1), backend='native')


# ------------------------------------------------------------------------ loss_scale values


@pytest.mark.parametrize('loss_scale, words', [
    ('static', "got the string 'static'"),
    (-1.0, 'not a finite number > 0'),
    (0, 'not a finite number > 0'),
    (math.inf, 'not a finite number > 0'),
    (True, 'got bool True'),
    ([512.0], 'got list'),
    (dict(init_scale=8.0, window=3), "unknown key(s) ['window']"),
    (dict(growth_factor=0.5), 'growth_factor (scale_factor) > 1'),
    (dict(growth_interval=0), 'growth_interval (scale_window) must be a whole number >= 1'),
    (dict(mode='sometimes'), "mode must be 'dynamic' or 'static'"),
    (dict(init_scale=-3), 'init_scale must be a finite number > 0'),
    (dict(scale_factor=2.0, growth_factor=2.0), 'give only one of them'),
])
@pytest.mark.parametrize('backend', BACKENDS)
def test_bad_loss_scale_is_a_clear_value_error_and_changes_nothing(loss_scale, words, backend):
    model = R.Net()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    params = list(model.parameters())
    with pytest.raises(ValueError) as err:
        AmpOptimWrapper(optimizer, loss_scale=loss_scale, backend=backend, model=model)
    assert words in str(err.value) and 'loss_scale must be' in str(err.value)
    assert optimizer.param_groups[0]['params'] == params
    assert all(p.dtype == torch.float32 for p in model.parameters())


def test_mmcv_loss_scale_dict_works_on_native():
    model = R.Net()
    wrapper = amp(model, loss_scale=dict(init_scale=64.0, mode='dynamic', scale_factor=4.0,
                                         scale_window=3))
    state = wrapper.state_dict()['loss_scaler']
    assert state == {'scale': 64.0, 'growth_factor': 4.0, 'backoff_factor': 0.25,
                     'growth_interval': 3, '_growth_tracker': 0}


def test_bad_dtype_and_backend():
    params = [nn.Parameter(torch.ones(1))]
    with pytest.raises(ValueError, match="Unsupported dtype torch.int8; expected 'float16'"):
        AmpOptimWrapper(torch.optim.SGD(params, lr=1), dtype=torch.int8)
    with pytest.raises(ValueError, match='Unknown fp16utils backend'):
        AmpOptimWrapper(torch.optim.SGD(params, lr=1), backend='apex')


def test_half_parameters_on_native_say_to_use_legacy():
    _caps.require(torch.float16, 'native')
    model = nn.Linear(2, 2).half()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), backend='native')
    wrapper.backward(model(torch.ones(1, 2).half()).float().sum())
    with pytest.raises(ValueError, match="backend='legacy'"):
        wrapper.step()


# ------------------------------------------------------------------------ state dicts


def _roundtrip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer)  # weights_only: checkpoints hold tensors and plain data


@pytest.mark.parametrize('backend', BACKENDS)
def test_resume_mid_run_is_bit_identical(backend):
    data = R.make_data(8)
    data[2] = R.overflow_batch()
    kwargs = dict(loss_scale=dict(init_scale=512.0, growth_interval=2),
                  clip_grad=dict(max_norm=1.0), accumulative_counts=2)
    model = R.Net()
    wrapper = amp(model, backend, **kwargs)
    wrapper.initialize_count_status(model, 0, len(data))
    train(wrapper, model, data)

    first = R.Net()
    w1 = amp(first, backend, **kwargs)
    w1.initialize_count_status(first, 0, len(data))
    train(w1, first, data[:4])
    ckpt = _roundtrip({'model': first.state_dict(), 'optim': w1.state_dict()})
    assert ('master_params' in ckpt['optim']) == (backend == 'legacy')

    resumed = R.Net(seed=123)
    w2 = amp(resumed, backend, **kwargs)
    resumed.load_state_dict(ckpt['model'])
    snapshot = copy.deepcopy(ckpt['optim'])
    w2.load_state_dict(ckpt['optim'])
    assert ckpt['optim'].keys() == snapshot.keys()  # the argument is not changed
    w2.initialize_count_status(resumed, 4, len(data))
    assert w2.loss_scale == w1.loss_scale
    train(w2, resumed, data[4:])
    R.assert_identical(R.snapshot(model, wrapper.optimizer),
                       R.snapshot(resumed, w2.optimizer))
    assert w2.loss_scale == wrapper.loss_scale


def test_scaler_state_crosses_backends():
    mmcv_state = {'cur_scale': 1024.0, 'cur_iter': 10, 'mode': 'dynamic',
                  'last_overflow_iter': 7, 'scale_factor': 2.0, 'scale_window': 5}
    native_model, legacy_model = R.Net(), R.Net()
    native = amp(native_model, 'native')
    native.load_state_dict({**native.state_dict(), 'loss_scaler': mmcv_state})
    assert native.loss_scaler.state_dict() == {
        'scale': 1024.0, 'growth_factor': 2.0, 'backoff_factor': 0.5, 'growth_interval': 5,
        '_growth_tracker': 2}
    assert native.scale_history[-1] == (0, 1024.0)
    legacy = amp(legacy_model, 'legacy')
    legacy.load_state_dict({**legacy.state_dict(),
                            'loss_scaler': native.state_dict()['loss_scaler']})
    assert legacy.loss_scaler.loss_scale == 1024.0
    assert legacy.loss_scaler.scale_window == 5
    # mmcv would grow the scale at the third clean update from here; so do both.
    for wrapper, model in ((native, native_model), (legacy, legacy_model)):
        scales = []
        for x, _ in R.make_data(4):
            with wrapper.optim_context(model):
                out = model(x)
            wrapper.update_params(out.float().sum() * 0)
            scales.append(wrapper.loss_scale)
        assert scales == [1024.0, 1024.0, 2048.0, 2048.0]
        assert wrapper.skipped_steps == 0


def test_bad_scaler_state_is_rejected_before_anything_loads():
    model = R.Net()
    wrapper = amp(model)
    train(wrapper, model, R.make_data(1))
    state = copy.deepcopy(wrapper.state_dict())
    state['loss_scaler'] = {'scale': 8.0}
    lr_before = wrapper.get_lr()
    state['param_groups'][0]['lr'] = 123.0
    with pytest.raises(KeyError, match='missing'):
        wrapper.load_state_dict(state)
    assert wrapper.get_lr() == lr_before


# ------------------------------------------------------------------------ OptimWrapperDict


def _gan():
    class GAN(nn.Module):
        def __init__(self):
            super().__init__()
            self.generator = R.Net(seed=1)
            self.discriminator = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 1))

    return GAN()


def test_optim_wrapper_dict_mapping_access_and_merged_lr():
    gan = _gan()
    g = OptimWrapper(torch.optim.Adam(gan.generator.parameters(), lr=1e-4, betas=(0.0, 0.99)))
    d = OptimWrapper(torch.optim.SGD(gan.discriminator.parameters(), lr=4e-4, momentum=0.5))
    wrappers = OptimWrapperDict(generator=g, discriminator=d)
    assert wrappers['generator'] is g and 'discriminator' in wrappers and 'x' not in wrappers
    assert len(wrappers) == 2 and list(wrappers) == ['generator', 'discriminator']
    assert list(wrappers.keys()) == ['generator', 'discriminator']
    assert list(wrappers.values()) == [g, d]
    assert dict(wrappers.items()) == {'generator': g, 'discriminator': d}
    assert wrappers.get_lr() == {'generator.lr': [1e-4], 'discriminator.lr': [4e-4]}
    assert wrappers.get_momentum() == {'generator.momentum': [0.0],
                                       'discriminator.momentum': [0.5]}
    with pytest.raises(KeyError, match=r"no entry 'gen'; its entries are \['generator'"):
        wrappers['gen']
    assert 'OptimWrapperDict(generator=OptimWrapper' in repr(wrappers)


@pytest.mark.parametrize('call', [
    lambda w: w.update_params(torch.tensor(1.0)),
    lambda w: w.step(),
    lambda w: w.backward(torch.tensor(1.0)),
    lambda w: w.optim_context(nn.Identity()),
])
def test_optim_wrapper_dict_refuses_to_step_as_a_whole(call):
    gan = _gan()
    wrappers = OptimWrapperDict(
        generator=OptimWrapper(torch.optim.SGD(gan.generator.parameters(), lr=0.1)),
        discriminator=OptimWrapper(torch.optim.SGD(gan.discriminator.parameters(), lr=0.1)))
    with pytest.raises(NotImplementedError) as err:
        call(wrappers)
    message = str(err.value)
    assert "['generator', 'discriminator']" in message
    assert "optim_wrapper['generator']." in message


def test_optim_wrapper_dict_state_round_trip_and_errors():
    gan = _gan()
    wrappers = build_optim_wrapper(gan, dict(
        constructor='MultiOptimWrapperConstructor',
        generator=dict(type='AmpOptimWrapper', optimizer=dict(type='Adam', lr=1e-3),
                       dtype=_caps.train_dtype('native')),
        discriminator=dict(optimizer=dict(type='Adam', lr=1e-3))))
    state = wrappers.state_dict()
    assert set(state) == {'generator', 'discriminator'}
    assert 'loss_scaler' in state['generator'] and 'loss_scaler' not in state['discriminator']
    with pytest.raises(KeyError, match=r"\['critic'\], which are not entries"):
        wrappers.load_state_dict({'generator': state['generator'], 'critic': {}})
    wrappers.load_state_dict(state)
    with pytest.raises(TypeError, match="entry 'generator' must be an OptimWrapper"):
        OptimWrapperDict(generator=torch.optim.SGD(gan.generator.parameters(), lr=0.1))


def test_optim_wrapper_dict_initializes_every_count():
    gan = _gan()
    wrappers = OptimWrapperDict(
        generator=OptimWrapper(torch.optim.SGD(gan.generator.parameters(), lr=0.1)),
        discriminator=OptimWrapper(torch.optim.SGD(gan.discriminator.parameters(), lr=0.1)))
    wrappers.initialize_count_status(gan, 4, 10)
    assert [w.inner_count for w in wrappers.values()] == [4, 4]
    assert [w.max_counts for w in wrappers.values()] == [10, 10]


# ------------------------------------------------------------------------ build_optim_wrapper


def test_build_single_wrappers():
    model = R.Net()
    plain = build_optim_wrapper(model, dict(optimizer=dict(type='SGD', lr=0.1, momentum=0.9)))
    assert type(plain) is OptimWrapper and isinstance(plain.optimizer, torch.optim.SGD)
    assert plain.get_momentum() == {'momentum': [0.9]}
    cfg = dict(type='AmpOptimWrapper', constructor='DefaultOptimWrapperConstructor',
               optimizer=dict(type='AdamW', lr=1e-3, weight_decay=0.01),
               accumulative_counts=2, clip_grad=dict(max_norm=1.0), loss_scale=256.0,
               dtype='bfloat16', backend='native')
    frozen = copy.deepcopy(cfg)
    wrapper = build_optim_wrapper(model, cfg)
    assert cfg == frozen
    assert isinstance(wrapper, AmpOptimWrapper) and isinstance(wrapper.optimizer,
                                                                torch.optim.AdamW)
    assert wrapper.dtype == torch.bfloat16 and wrapper.accumulative_counts == 2
    assert wrapper.clip_grad['max_norm'] == 1.0
    direct = build_optim_wrapper(model, dict(type=AmpOptimWrapper,
                                             optimizer=dict(type=torch.optim.RMSprop, lr=1),
                                             dtype=_caps.train_dtype('native')))
    assert isinstance(direct.optimizer, torch.optim.RMSprop)


def test_build_single_legacy_converts_the_model():
    model = R.Net()
    wrapper = build_optim_wrapper(model, dict(
        type='AmpOptimWrapper', constructor='OptimWrapperConstructor',
        optimizer=dict(type='Adam', lr=1e-3), backend='legacy', dtype=_caps.LEGACY_LOW))
    assert wrapper.backend == 'legacy'
    assert next(model.parameters()).dtype == _caps.LEGACY_LOW
    assert all(m.dtype == torch.float32 for m in wrapper.master_params)


def test_build_multi_from_the_seed_config():
    cfg = dict(
        constructor='MultiOptimWrapperConstructor',
        generator=dict(optimizer=dict(type='Adam', lr=0.0002, betas=(0.0, 0.999), eps=1e-6)),
        discriminator=dict(
            optimizer=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999), eps=1e-6)))
    frozen = copy.deepcopy(cfg)
    gan = _gan()
    wrappers = build_optim_wrapper(gan, cfg)
    assert cfg == frozen
    assert isinstance(wrappers, OptimWrapperDict)
    assert wrappers.get_lr() == {'generator.lr': [0.0002], 'discriminator.lr': [0.0004]}
    gen_params = wrappers['generator'].param_groups[0]['params']
    assert gen_params == list(gan.generator.parameters())


def test_build_amp_per_name_under_optim_wrapper_constructor():
    dtype = _caps.train_dtype('native')
    cfg = dict(
        constructor='OptimWrapperConstructor',
        generator=dict(accumulative_counts=8, type='AmpOptimWrapper', loss_scale='dynamic',
                       optimizer=dict(type='Adam', lr=0.0001, betas=(0.0, 0.999), eps=1e-06),
                       dtype=dtype),
        discriminator=dict(accumulative_counts=8, type='AmpOptimWrapper', loss_scale='dynamic',
                           optimizer=dict(type='Adam', lr=0.0004, betas=(0.0, 0.999),
                                          eps=1e-06), dtype=dtype))
    wrappers = build_optim_wrapper(_gan(), cfg)
    assert [type(w).__name__ for w in wrappers.values()] == ['AmpOptimWrapper'] * 2
    assert [w.accumulative_counts for w in wrappers.values()] == [8, 8]


def test_build_unwraps_data_parallel():
    gan = _gan()
    wrappers = build_optim_wrapper(nn.DataParallel(gan), dict(
        constructor='MultiOptimWrapperConstructor',
        generator=dict(optimizer=dict(type='SGD', lr=0.1))))
    assert list(wrappers) == ['generator']


@pytest.mark.parametrize('cfg, error, words', [
    (dict(type='FancyWrapper', optimizer=dict(type='SGD', lr=0.1)), ValueError,
     "unknown wrapper type 'FancyWrapper'; expected one of ['OptimWrapper', "),
    (dict(optimizer=dict(type='Adamm', lr=0.1)), ValueError,
     "unknown optimizer type 'Adamm'; expected a torch.optim class name, one of"),
    (dict(optimizer=dict(lr=0.1)), ValueError, "must be a dict with a 'type'"),
    (dict(type='OptimWrapper'), ValueError, "missing 'optimizer'"),
    (dict(optimizer=dict(type='SGD', lr=0.1), loss_scale=512.0), ValueError,
     "belong to type='AmpOptimWrapper'"),
    (dict(optimizer=dict(type='SGD', lr=0.1), paramwise_cfg=dict(bias_mult=2.0)), ValueError,
     "optim_wrapper.paramwise_cfg: unknown option(s) ['bias_mult']"),
    (dict(optimizer=dict(type='SGD', lr=0.1), paramwise_cfg=dict(norm_decay_mult=0.0)),
     ValueError, 'no weight_decay to multiply'),
    (dict(optimizer=dict(type='SGD', lr=0.1), paramwise_cfg=[]), TypeError,
     'paramwise_cfg should be None or a dict'),
    (dict(constructor='MultiOptimWrapperConstructor', paramwise_cfg=dict(bias_lr_mult=2.0),
          generator=dict(optimizer=dict(type='SGD', lr=0.1))), ValueError,
     'takes paramwise_cfg inside each sub-model config'),
    (dict(type='AmpOptimWrapper', optimizer=dict(type='SGD', lr=0.1), loss_scale='auto'),
     ValueError, 'loss_scale must be'),
    (dict(type='AmpOptimWrapper', optimizer=dict(type='SGD', lr=0.1), dtype='int8'),
     ValueError, "Unsupported dtype 'int8'"),
    (dict(optimizer=dict(type='SGD', lr=0.1), clip_grad=dict(max_norm='big')), ValueError,
     'max_norm must be'),
    (dict(optimizer=dict(type='SGD', lr=0.1, momentm=0.9)), TypeError,
     "optim_wrapper.optimizer: SGD rejected {'lr': 0.1, 'momentm': 0.9}"),
    (dict(constructor='MyConstructor', optimizer=dict(type='SGD', lr=0.1)), ValueError,
     "unknown constructor 'MyConstructor'"),
    (dict(constructor='MultiOptimWrapperConstructor'), ValueError,
     'needs one config per sub-model'),
])
def test_build_errors_are_clear(cfg, error, words):
    model = R.Net()
    frozen = copy.deepcopy(cfg)
    with pytest.raises(error) as err:
        build_optim_wrapper(model, cfg)
    assert words in str(err.value)
    assert cfg == frozen


def test_unknown_optimizer_lists_what_exists():
    with pytest.raises(ValueError) as err:
        build_optim_wrapper(R.Net(), dict(optimizer=dict(type='Adamm', lr=0.1)))
    assert "'Adam'" in str(err.value) and "'SGD'" in str(err.value)


def test_unknown_submodule_names_what_exists_and_changes_nothing():
    gan = _gan()
    cfg = dict(constructor='MultiOptimWrapperConstructor',
               generator=dict(type='AmpOptimWrapper', backend='legacy',
                              optimizer=dict(type='Adam', lr=1e-3)),
               critic=dict(optimizer=dict(type='Adam', lr=1e-3)))
    with pytest.raises(ValueError) as err:
        build_optim_wrapper(gan, cfg)
    assert "has no sub-module 'critic'; its sub-modules are ['generator', 'discriminator']" in (
        str(err.value))
    assert all(p.dtype == torch.float32 for p in gan.parameters())
    bad_entry = dict(constructor='MultiOptimWrapperConstructor', generator='Adam')
    with pytest.raises(ValueError, match='must be a wrapper config dict'):
        build_optim_wrapper(gan, bad_entry)


def test_build_type_errors():
    with pytest.raises(TypeError, match='takes an nn.Module'):
        build_optim_wrapper('model', {})
    with pytest.raises(TypeError, match='takes a config dict'):
        build_optim_wrapper(R.Net(), [('optimizer', {})])


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_step_without_any_gradient_is_harmless(backend):
    model = R.Net()
    wrapper = amp(model, backend, loss_scale=dict(init_scale=64.0, growth_interval=1),
                  dtype=_caps.train_dtype(backend))
    before = R.snapshot(model, wrapper.optimizer)
    model.requires_grad_(False)
    with wrapper.optim_context(model):
        out = model(R.make_data(1)[0][0])
    wrapper.update_params(out.float().sum() + torch.zeros((), requires_grad=True))
    R.assert_identical(before, R.snapshot(model, wrapper.optimizer))
    assert wrapper.skipped_steps == 0
    model.requires_grad_(True)
    train(wrapper, model, R.make_data(1))
    assert wrapper.skipped_steps == 0


def test_closure_is_refused_with_loss_scaling():
    model = R.Net()
    wrapper = amp(model)
    with wrapper.optim_context(model):
        loss = R.mse(model, R.make_data(1)[0])
    wrapper.backward(loss)
    before = R.snapshot(model, wrapper.optimizer)
    with pytest.raises(RuntimeError, match='closure'):
        wrapper.step(closure=lambda: loss)
    R.assert_identical(before, R.snapshot(model, wrapper.optimizer))


def test_repr_names_the_settings():
    model = R.Net()
    low = _caps.LEGACY_LOW
    text = repr(amp(model, 'legacy', loss_scale=32.0, dtype=low))
    assert f"AmpOptimWrapper(optimizer=Adam, backend='legacy', dtype={low}" in text
    assert f'loss_scale={32.0 if low == torch.float16 else 1.0}' in text  # bfloat16: none


@pytest.mark.skipif('assign' not in inspect.signature(nn.Module.load_state_dict).parameters,
                    reason='nn.Module.load_state_dict has no assign= here')
def test_autocast_follows_parameters_replaced_by_an_assigning_load():
    """The device is looked up anew: a model first on 'meta', then loaded with assign=True."""
    low = _caps.LOW
    source = nn.Linear(4, 2)
    model = nn.Linear(4, 2).to('meta')
    wrapper = AmpOptimWrapper(torch.optim.SGD(source.parameters(), lr=0.1), dtype=low)
    before = _caps.autocast_now('cpu')
    with wrapper.optim_context(model):  # torch has no autocast for 'meta': none entered
        assert _caps.autocast_now('cpu') == before
        assert model(torch.ones(1, 4, device='meta')).device.type == 'meta'
    model.load_state_dict(source.state_dict(), assign=True)
    with wrapper.optim_context(model):
        out = model(torch.ones(1, 4))
    assert out.dtype == low and out.device.type == 'cpu'


def test_optim_wrapper_dict_errors_read_as_mmengine_writes_them():
    """Code written against MMEngine catches the same exceptions with the same words."""
    gan = nn.ModuleDict(dict(generator=nn.Linear(2, 2)))
    sgd = torch.optim.SGD(gan.generator.parameters(), lr=0.1)
    for kind in (TypeError, AssertionError):
        with pytest.raises(kind, match='`OptimWrapperDict` only accept'):
            OptimWrapperDict(generator=sgd)
    wrappers = OptimWrapperDict(generator=OptimWrapper(sgd))
    for what, call in (('update_params', lambda: wrappers.update_params(torch.ones(()))),
                       ('backward', lambda: wrappers.backward(torch.ones(()))),
                       ('step', wrappers.step),
                       ('optim_context', lambda: wrappers.optim_context(gan))):
        with pytest.raises(NotImplementedError, match=f'`{what}` should be called') as err:
            call()
        assert "optim_wrapper['generator']" in str(err.value)


def test_resume_warnings_keep_mmengine_words(caplog):
    """Log filters written for MMEngine's messages still catch these warnings."""
    p = nn.Parameter(torch.ones(1))
    wrapper = OptimWrapper(torch.optim.SGD([p], lr=1.0), accumulative_counts=3)
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        wrapper.initialize_count_status(nn.BatchNorm2d(1), 2, 100)
    messages = [r.getMessage() for r in caplog.records]
    assert len(messages) == 2
    assert messages[0].startswith('Resumed iteration number 2 is not a multiple')
    assert messages[1].startswith('Gradient accumulative training with BatchNorm')


def test_clip_grad_that_is_not_a_dict_reads_as_mmengine_writes_it():
    p = nn.Parameter(torch.ones(1))
    for kind in (ValueError, AssertionError):
        with pytest.raises(kind, match=r'If `clip_grad` is not None, it should be a `dict`'):
            OptimWrapper(torch.optim.SGD([p], lr=1.0), clip_grad=[])


def test_a_stand_in_optimizer_is_driven_as_it_is():
    """An Optimizer instance (a mock in someone's tests, say) is stepped and zeroed as is."""
    from unittest.mock import MagicMock
    optimizer = MagicMock(spec=torch.optim.Optimizer)
    wrapper = OptimWrapper(optimizer)
    wrapper.step()
    wrapper.zero_grad()
    optimizer.step.assert_called_once_with()
    optimizer.zero_grad.assert_called_once_with()
    with pytest.raises(TypeError, match='wraps a torch.optim.Optimizer, got object'):
        OptimWrapper(object())


# --------------------------------------------------------------------------- module layout


def test_help_shows_a_readable_loss_scale_default():
    import pydoc

    text = pydoc.render_doc(AmpOptimWrapper)
    assert 'object at 0x' not in text
    default = inspect.signature(AmpOptimWrapper).parameters['loss_scale'].default
    assert "'dynamic'" in repr(default) and 'object at' not in repr(default)
    assert f'= {default!r}' in text


def test_default_loss_scale_is_dynamic_and_still_told_from_a_given_one():
    _caps.require(torch.float16, 'native')  # the default dtype
    model = nn.Linear(2, 1)
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    assert wrapper.loss_scale == 2.0 ** 16  # 'dynamic': GradScaler's default start
    with pytest.raises(TypeError, match="multiple values for argument 'loss_scale'"):
        AmpOptimWrapper('dynamic', optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                        loss_scale=512.)


def test_import_paths_of_the_optim_modules():
    from fp16utils.optim import amp as amp_mod
    from fp16utils.optim import builder, contexts
    from fp16utils.optim.amp import AmpOptimWrapper as FromAmp
    from fp16utils.optim.amp import deferred_model_conversion, resolve_cast_dtype

    assert FromAmp is AmpOptimWrapper is optim_mod.AmpOptimWrapper
    assert deferred_model_conversion is builder.deferred_model_conversion
    assert resolve_cast_dtype('bfloat16') == torch.bfloat16
    assert {'CastIO', 'Guarded', 'TwoContexts'} <= set(contexts.__all__)
    with pytest.raises(AttributeError, match='no attribute'):
        amp_mod.no_such_name  # noqa: B018 - the module's __getattr__ answers only one name


def test_deferred_conversion_waits_for_the_caller():
    from fp16utils.optim.amp import deferred_model_conversion

    _caps.require(torch.float16)
    model = nn.Linear(2, 1)
    with deferred_model_conversion() as conversions:
        AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), backend='legacy',
                        model=model)
        assert model.weight.dtype == torch.float32 and len(conversions) == 1
    assert model.weight.dtype == torch.float32  # nothing runs them but the caller
    conversions[0]()
    assert model.weight.dtype == torch.float16


def test_cast_dtype_names_come_from_the_dtype_table_and_auto_from_precision():
    from fp16utils.optim.amp import resolve_cast_dtype

    assert resolve_cast_dtype(None) == torch.float16
    assert resolve_cast_dtype('float64') == resolve_cast_dtype(torch.float64) == torch.float64
    assert resolve_cast_dtype('torch.float32') == torch.float32
    assert resolve_cast_dtype('BF16') == torch.bfloat16
    for bad in ('fp32', 'int8', torch.int8, 'auto'):  # 'auto' needs a device: the wrapper's
        with pytest.raises(ValueError, match="Unsupported dtype .*'auto' for the best native"):
            resolve_cast_dtype(bad)
    model = nn.Linear(2, 1)
    with pytest.raises(ValueError, match="Unsupported dtype 'fp32'"):
        build_optim_wrapper(model, dict(type='AmpOptimWrapper', dtype='fp32',
                                        optimizer=dict(type='SGD', lr=0.1)))
    built = build_optim_wrapper(model, dict(type='AmpOptimWrapper', dtype='Auto',
                                            optimizer=dict(type='SGD', lr=0.1)))
    assert built.dtype == fp16utils.precision.auto_dtype('cpu')[0]


def test_two_contexts_enter_in_order_and_exit_in_reverse():
    from fp16utils.optim.contexts import TwoContexts

    events = []

    @contextlib.contextmanager
    def ctx(name, fail_enter=False):
        events.append(f'enter {name}')
        if fail_enter:
            raise KeyError(name)
        try:
            yield
        finally:
            events.append(f'exit {name}')

    with TwoContexts(ctx('outer'), ctx('inner')):
        events.append('body')
    assert events == ['enter outer', 'enter inner', 'body', 'exit inner', 'exit outer']
    events.clear()
    with pytest.raises(KeyError, match='inner'):  # inner fails to enter: outer is exited
        with TwoContexts(ctx('outer'), ctx('inner', fail_enter=True)):
            events.append('body')
    assert events == ['enter outer', 'enter inner', 'exit outer']
    seen = []

    class Outer:
        def __enter__(self):
            return self

        def __exit__(self, *exc):
            seen.append(exc[0])

    with TwoContexts(Outer(), contextlib.suppress(KeyError)):
        raise KeyError('suppressed by the inner context')
    assert seen == [None]  # what inner suppresses, outer does not see


def test_cast_io_casts_inputs_and_outputs_only_while_open():
    from fp16utils.optim.contexts import CastIO

    model = nn.Linear(2, 2).to(torch.bfloat16)
    with CastIO(model, torch.bfloat16):
        out = model(torch.ones(1, 2))
        assert len(model._forward_hooks) == 1
    assert out.dtype == torch.float32 and len(model._forward_hooks) == 0
    with pytest.raises(RuntimeError):  # closed: a float32 input meets bfloat16 weights
        model(torch.ones(1, 2))
