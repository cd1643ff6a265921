"""Tests for LossScaler: mmcv's update rule and state, and the single-sync overflow check."""

import collections
import math
import random
import threading

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fp16utils.scaler
from fp16utils import LossScaler
from fp16utils.scaler import non_finite_check_

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
STATE_KEYS = {'cur_scale', 'cur_iter', 'mode', 'last_overflow_iter', 'scale_factor',
              'scale_window'}


class MmcvLossScaler:
    """mmcv 1.x LossScaler's update rule, written out as the reference.

    Two documented differences: the scale stops growing at 2**127 (mmcv's grows to
    inf), and an overflow never raises a scale that is already below 1.
    """

    def __init__(self, init_scale=2**32, mode='dynamic', scale_factor=2., scale_window=1000):
        self.cur_scale = init_scale
        self.cur_iter = 0
        self.mode = mode
        self.last_overflow_iter = -1
        self.scale_factor = scale_factor
        self.scale_window = scale_window

    def update_scale(self, overflow):
        if self.mode != 'dynamic':
            return
        if overflow:
            self.cur_scale = max(self.cur_scale / self.scale_factor, min(1, self.cur_scale))
            self.last_overflow_iter = self.cur_iter
        else:
            if (self.cur_iter - self.last_overflow_iter) % self.scale_window == 0:
                self.cur_scale = min(self.cur_scale * self.scale_factor, 2.0**127)
        self.cur_iter += 1


def param(grad, requires_grad=True):
    p = nn.Parameter(torch.zeros_like(grad, dtype=grad.dtype if grad.is_floating_point()
                                      else F32), requires_grad=requires_grad)
    p.grad = grad
    return p


def bits(t):
    """A view of a tensor's raw bits, for bit-identical comparisons (nan included)."""
    return t.view({F32: torch.int32, F16: torch.int16, BF16: torch.int16}[t.dtype]).clone()


# --------------------------------------------------------------------------- construction


def test_defaults():
    s = LossScaler()
    assert s.cur_scale == 2.0**32 and s.loss_scale == 2.0**32
    assert s.mode == 'dynamic'
    assert s.scale_factor == 2.0
    assert s.scale_window == 1000
    assert s.cur_iter == 0
    assert s.last_overflow_iter == -1


def test_scale_multiplies_loss():
    s = LossScaler(init_scale=8.0)
    loss = torch.tensor(1.5, requires_grad=True)
    scaled = s.scale(loss)
    assert scaled.item() == 12.0
    scaled.backward()
    assert loss.grad.item() == 8.0


@pytest.mark.parametrize(('kwargs', 'name'), [
    ({'mode': 'auto'}, 'mode'),
    ({'mode': None}, 'mode'),
    ({'init_scale': 0}, 'init_scale'),
    ({'init_scale': -4.0}, 'init_scale'),
    ({'init_scale': math.inf}, 'init_scale'),
    ({'init_scale': math.nan}, 'init_scale'),
    ({'init_scale': '512'}, 'init_scale'),
    ({'init_scale': True}, 'init_scale'),
    ({'scale_factor': 0}, 'scale_factor'),
    ({'scale_factor': 0.99}, 'scale_factor'),
    ({'scale_factor': 0.5}, 'scale_factor'),
    ({'scale_window': 0}, 'scale_window'),
    ({'scale_window': 1.5}, 'scale_window'),
    ({'scale_window': True}, 'scale_window'),
    ({'scale_window': -3}, 'scale_window'),
])
def test_constructor_validation(kwargs, name):
    with pytest.raises(ValueError, match=name) as info:
        LossScaler(**kwargs)
    assert repr(next(iter(kwargs.values()))) in str(info.value) or name == 'scale_factor'


def test_static_mode_accepts_factor_one():
    s = LossScaler(init_scale=512., mode='static', scale_factor=1.0)
    assert s.loss_scale == 512.0


@pytest.mark.parametrize('factor', [np.float32(2.0), np.int64(2), torch.tensor(2.0)],
                         ids=['np.float32', 'np.int64', 'tensor'])
def test_a_numpy_or_tensor_factor_is_taken_as_mmcv_takes_it(factor):
    s, ref = LossScaler(init_scale=8., scale_factor=factor, scale_window=1), LossScaler(
        init_scale=8., scale_factor=2.0, scale_window=1)
    for overflow in (False, True, False):
        s.update_scale(overflow)
        ref.update_scale(overflow)
    assert s.state_dict() == ref.state_dict() and type(s.scale_factor) is float
    s.load_state_dict(dict(ref.state_dict(), scale_factor=factor))
    assert s.state_dict() == ref.state_dict() and type(s.scale_factor) is float


@pytest.mark.parametrize('factor', [1, 1.0])
def test_dynamic_factor_one_keeps_the_scale_and_still_counts_overflows(factor):
    """mmcv takes ``scale_factor=1``: the scale never moves, overflows are still recorded."""
    s = LossScaler(init_scale=8., mode='dynamic', scale_factor=factor, scale_window=1)
    for overflow in (True, False, False, True, False):
        s.update_scale(overflow)
        assert s.loss_scale == 8.0
    assert (s.cur_iter, s.last_overflow_iter) == (5, 3)
    twin = LossScaler()
    twin.load_state_dict(s.state_dict())  # its own state loads back
    assert twin.state_dict() == s.state_dict() and twin.scale_factor == 1.0
    with pytest.raises(ValueError, match='scale_factor'):  # below 1 is still refused
        twin.load_state_dict(dict(s.state_dict(), scale_factor=0.5))
    assert twin.state_dict() == s.state_dict()


# --------------------------------------------------------------------------- update rule


def test_update_rule_by_hand():
    s = LossScaler(init_scale=4.0, scale_window=2)
    flags = [False, False, False, True, False, False, False]
    scales = []
    for flag in flags:
        s.update_scale(flag)
        scales.append(s.loss_scale)
    assert scales == [4.0, 8.0, 8.0, 4.0, 4.0, 8.0, 8.0]
    assert s.cur_iter == 7 and s.last_overflow_iter == 3


def test_overflow_never_below_one():
    s = LossScaler(init_scale=3.0, scale_factor=2.0)
    for expected in (1.5, 1.0, 1.0, 1.0):
        s.update_scale(True)
        assert s.loss_scale == expected


def test_window_one_grows_every_clean_step():
    s = LossScaler(init_scale=1.0, scale_window=1)
    for i in range(1, 6):
        s.update_scale(False)
        assert s.loss_scale == 2.0**i


def test_growth_counts_from_last_overflow():
    s = LossScaler(init_scale=2.0**10, scale_window=5)
    for _ in range(3):
        s.update_scale(False)
    s.update_scale(True)  # iteration 3
    assert s.loss_scale == 2.0**9
    grown_at = []
    for i in range(4, 20):
        before = s.loss_scale
        s.update_scale(False)
        if s.loss_scale != before:
            grown_at.append(i)
    assert grown_at == [8, 13, 18]


def _compare_with_mmcv(flags, **kwargs):
    ours, ref = LossScaler(**kwargs), MmcvLossScaler(**kwargs)
    for flag in flags:
        ours.update_scale(flag)
        ref.update_scale(flag)
        assert ours.loss_scale == ref.cur_scale
        assert ours.cur_iter == ref.cur_iter
        assert ours.last_overflow_iter == ref.last_overflow_iter


@pytest.mark.parametrize(('seed', 'kwargs'), [
    (0, dict(init_scale=2.0**16, scale_window=3)),
    (1, dict(init_scale=8.0, scale_window=2, scale_factor=2.0)),
    (2, dict(init_scale=2.0**32, scale_window=7, scale_factor=3.0)),
    (3, dict(init_scale=512.0, scale_window=1)),
    (4, dict()),
])
def test_matches_mmcv_scripted(seed, kwargs):
    rng = random.Random(seed)
    flags = [rng.random() < 0.2 for _ in range(2500)]
    _compare_with_mmcv(flags, **kwargs)


@settings(max_examples=80, deadline=None)
@given(st.lists(st.booleans(), max_size=60), st.integers(1, 6),
       st.sampled_from([2.0, 1.5, 4.0]), st.sampled_from([1.0, 4.0, 2.0**20]))
def test_matches_mmcv_property(flags, window, factor, init):
    _compare_with_mmcv(flags, init_scale=init, scale_window=window, scale_factor=factor)


def test_static_never_changes_scale():
    s = LossScaler(init_scale=512.0, mode='static', scale_window=1)
    for flag in [True, False, True, True] + [False] * 10:
        s.update_scale(flag)
        assert s.loss_scale == 512.0
    # As in mmcv, a static scaler does not count iterations either.
    assert s.cur_iter == 0 and s.last_overflow_iter == -1


def test_static_still_detects_overflow():
    s = LossScaler(init_scale=512.0, mode='static')
    assert s.has_overflow([param(torch.tensor([1.0, math.inf]))]) is True
    assert s.has_overflow([param(torch.tensor([1.0, 2.0]))]) is False


# --------------------------------------------------------------------------- state


def test_state_dict_keys_and_values():
    s = LossScaler(init_scale=64.0, scale_factor=4.0, scale_window=3)
    for flag in [False, True, False]:
        s.update_scale(flag)
    state = s.state_dict()
    assert set(state) == STATE_KEYS
    assert state == {'cur_scale': 16.0, 'cur_iter': 3, 'mode': 'dynamic',
                     'last_overflow_iter': 1, 'scale_factor': 4.0, 'scale_window': 3}


def test_state_dict_round_trip_continues_identically():
    a = LossScaler(init_scale=2.0**8, scale_window=4)
    for flag in [False, True, False, False, False]:
        a.update_scale(flag)
    b = LossScaler()
    b.load_state_dict(a.state_dict())
    assert b.state_dict() == a.state_dict()
    for flag in [False] * 10 + [True] + [False] * 5:
        a.update_scale(flag)
        b.update_scale(flag)
        assert a.loss_scale == b.loss_scale
    assert b.state_dict() == a.state_dict()


def test_load_mmcv_written_state():
    # As mmcv's LossScaler.state_dict() writes it (an int init_scale stays int there).
    mmcv_state = {'cur_scale': 2**32, 'cur_iter': 1200, 'mode': 'dynamic',
                  'last_overflow_iter': 1100, 'scale_factor': 2.0, 'scale_window': 1000}
    s = LossScaler(init_scale=1.0)
    s.load_state_dict(mmcv_state)
    assert s.loss_scale == 2**32
    assert s.cur_iter == 1200 and s.last_overflow_iter == 1100
    ref = MmcvLossScaler()
    ref.__dict__.update(mmcv_state)
    for i in range(1000):
        flag = i == 500
        s.update_scale(flag)
        ref.update_scale(flag)
        assert s.loss_scale == ref.cur_scale
    assert set(s.state_dict()) == STATE_KEYS


def test_load_static_state():
    s = LossScaler()
    s.load_state_dict({'cur_scale': 512.0, 'cur_iter': 0, 'mode': 'static',
                       'last_overflow_iter': -1, 'scale_factor': 2.0, 'scale_window': 1000})
    s.update_scale(True)
    assert s.mode == 'static' and s.loss_scale == 512.0


@pytest.mark.parametrize('missing', sorted(STATE_KEYS))
def test_load_missing_key(missing):
    source = LossScaler(init_scale=8.0, scale_window=3).state_dict()
    del source[missing]
    s = LossScaler(init_scale=1024.0, scale_window=5)
    s.update_scale(False)
    before = s.state_dict()
    with pytest.raises(KeyError) as info:
        s.load_state_dict(source)
    assert repr(missing) in str(info.value)
    assert s.state_dict() == before


def test_load_bad_mode():
    s = LossScaler()
    state = dict(s.state_dict(), mode='auto', cur_scale=4.0)
    with pytest.raises(ValueError, match="'auto'"):
        s.load_state_dict(state)
    assert s.loss_scale == 2.0**32


def test_repr_names_state():
    text = repr(LossScaler(init_scale=8.0, mode='static'))
    assert 'cur_scale=8.0' in text and "mode='static'" in text


# --------------------------------------------------------------------------- has_overflow


@pytest.mark.parametrize('dtype', [F16, BF16, F32])
@pytest.mark.parametrize('bad', [math.inf, -math.inf, math.nan])
def test_has_overflow_detects(dtype, bad):
    clean = param(torch.ones(5, dtype=dtype))
    dirty = param(torch.tensor([1.0, bad, 2.0], dtype=dtype))
    s = LossScaler()
    assert s.has_overflow([clean, dirty]) is True
    assert s.has_overflow([dirty, clean]) is True
    assert s.has_overflow([clean]) is False


@pytest.mark.parametrize('dtype', [F16, BF16, F32])
def test_has_overflow_false_on_large_finite(dtype):
    big = torch.finfo(dtype).max
    p = param(torch.tensor([big, -big, 0.0, -0.0, torch.finfo(dtype).tiny], dtype=dtype))
    assert LossScaler().has_overflow([p]) is False


def test_has_overflow_skips_none_grads():
    p = nn.Parameter(torch.ones(3))
    assert p.grad is None
    s = LossScaler()
    assert s.has_overflow([p]) is False
    assert s.has_overflow([]) is False
    assert s.has_overflow([p, param(torch.tensor([math.nan]))]) is True


def test_has_overflow_mixed_dtypes():
    s = LossScaler()
    params = [param(torch.ones(4, dtype=F16)), param(torch.ones(4, dtype=BF16)),
              param(torch.ones(4, dtype=F32))]
    assert s.has_overflow(params) is False
    for i, dtype in enumerate([F16, BF16, F32]):
        params[i].grad = torch.tensor([0.0, math.inf, 1.0, 1.0], dtype=dtype)
        assert s.has_overflow(params) is True
        params[i].grad = torch.ones(4, dtype=dtype)
    assert s.has_overflow(params) is False


def test_has_overflow_accepts_generator():
    model = nn.Linear(3, 3)
    model(torch.ones(1, 3)).sum().backward()
    assert LossScaler().has_overflow(model.parameters()) is False
    model.weight.grad[0, 0] = math.nan
    assert LossScaler().has_overflow(p for p in model.parameters()) is True


@pytest.mark.parametrize('dtype', [F16, BF16, F32])
def test_has_overflow_does_not_modify_grads(dtype):
    values = [1.0, -0.0, math.nan, math.inf, -math.inf, 3.14159, 1e-40, -2.5]
    grads = [torch.tensor(values, dtype=dtype), torch.randn(7).to(dtype)]
    params = [param(g) for g in grads]
    before = [bits(g) for g in grads]
    versions = [g._version for g in grads]
    assert LossScaler(init_scale=1024.0).has_overflow(params) is True
    for p, g, b, v in zip(params, grads, before, versions):
        assert p.grad is g
        assert torch.equal(bits(g), b)
        assert g._version == v


# --------------------------------------------------------------------------- unscale_


@pytest.mark.parametrize('dtype', [F16, BF16, F32])
def test_unscale_divides_by_scale(dtype):
    s = LossScaler(init_scale=64.0)
    grads = [torch.tensor([64.0, -128.0, 0.5], dtype=dtype), torch.full((3,), 32.0, dtype=dtype)]
    params = [param(g.clone()) for g in grads]
    assert s.unscale_(params) is False
    for p, g in zip(params, grads):
        assert p.grad.dtype == dtype
        assert torch.equal(p.grad, g / 64.0)
    assert s.loss_scale == 64.0  # unscale_ does not update the scale


def test_unscale_reports_overflow():
    s = LossScaler(init_scale=4.0)
    params = [param(torch.tensor([8.0, math.inf])), param(torch.tensor([4.0], dtype=F16))]
    assert s.unscale_(params) is True
    assert params[0].grad[0].item() == 2.0 and params[1].grad.item() == 1.0
    s.update_scale(True)
    assert s.loss_scale == 2.0


def test_unscale_skips_none_grads():
    p, q = nn.Parameter(torch.ones(2)), param(torch.full((2,), 6.0))
    assert LossScaler(init_scale=2.0).unscale_([p, q]) is False
    assert p.grad is None and torch.equal(q.grad, torch.full((2,), 3.0))


# --------------------------------------------------------------------------- sparse


def _sparse_param():
    emb = nn.Embedding(10, 3, sparse=True)
    emb(torch.tensor([1, 4, 4])).sum().backward()
    assert emb.weight.grad.is_sparse
    return emb.weight


def test_sparse_grads():
    p = _sparse_param()
    s = LossScaler(init_scale=4.0)
    assert s.has_overflow([p]) is False
    dense_before = p.grad.to_dense()
    assert s.unscale_([p]) is False
    assert torch.equal(p.grad.to_dense(), dense_before / 4.0)
    p.grad._values()[0, 1] = math.inf
    assert s.has_overflow([p]) is True
    assert s.has_overflow([param(torch.ones(2)), p]) is True


# --------------------------------------------------------------------------- one sync


class SyncCounter:
    """Counts host transfers of tensor values (item, bool, tolist, cpu)."""

    def __init__(self, monkeypatch):
        self.calls = []
        for name in ('item', '__bool__', 'tolist', 'cpu'):
            real = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._wrap(name, real))

    def _wrap(self, name, real):
        def counted(tensor, *args, **kwargs):
            self.calls.append(name)
            return real(tensor, *args, **kwargs)
        return counted


def _many_params(n=160, bad_at=None):
    dtypes = [F32, F16, BF16, F32]
    params = [param(torch.ones(3, dtype=dtypes[i % 4])) for i in range(n)]
    if bad_at is not None:
        params[bad_at].grad[1] = math.inf
    return params


@pytest.mark.parametrize('bad_at', [None, 0, 159])
def test_has_overflow_single_sync(monkeypatch, bad_at):
    params = _many_params(bad_at=bad_at)
    fused_here = all(fp16utils._torch.caps.fused_check_supports('cpu', d)
                     for d in {p.grad.dtype for p in params})
    fused_calls = _counting_fused(monkeypatch)
    counter = SyncCounter(monkeypatch)
    scaler = LossScaler()
    for _ in range(3):  # the first call makes the flag tensors, later ones reuse them
        result = scaler.has_overflow(params)
        assert result is (bad_at is not None)
    assert counter.calls == ['item'] * 3
    # On the CPU, whose kernel walks the tensors one by one anyway, a pure check
    # is one call over all 160 gradients, whatever their dtypes; where the kernel
    # takes one dtype a call, the whole-list try is made once, then each check is
    # one call per dtype.
    if not fused_here:
        return  # no fused kernel for the CPU here: the per-tensor check, still one sync
    by_dtype = list(collections.Counter(p.grad.dtype for p in params).values())
    calls = list(fused_calls)
    if calls == [160] * 3:
        return
    if calls[0] == 160 and sum(calls) == 160 * 4:  # the refused whole-list try
        calls = calls[1:]
    assert sorted(calls) == sorted(by_dtype * 3)


def _counting_fused(monkeypatch):
    calls = []
    real_fused = torch._amp_foreach_non_finite_check_and_unscale_

    def counting_fused(*args):
        calls.append(len(args[0]))
        return real_fused(*args)

    monkeypatch.setattr(torch, '_amp_foreach_non_finite_check_and_unscale_', counting_fused)
    return calls


def test_unscale_single_sync(monkeypatch):
    params = _many_params()
    fused_calls = _counting_fused(monkeypatch)
    counter = SyncCounter(monkeypatch)
    assert LossScaler(init_scale=2.0).unscale_(params) is False
    assert counter.calls == ['item']
    assert all(torch.equal(p.grad, torch.full((3,), 0.5, dtype=p.grad.dtype)) for p in params)
    # One fused launch per dtype, covering all 160 gradients.
    assert sorted(fused_calls) == [40, 40, 80]


def test_sparse_and_dense_single_sync(monkeypatch):
    """Sparse gradients send the check to the grouped path, still with one sync."""
    params = [_sparse_param(), *_many_params(8)]
    counter = SyncCounter(monkeypatch)
    scaler = LossScaler()
    assert scaler.has_overflow(params) is False
    params[0].grad._values()[0, 0] = math.nan
    assert scaler.has_overflow(params) is True
    params[0].grad._values()[0, 0] = 1.0
    params[3].grad[0] = -math.inf
    assert scaler.has_overflow(params) is True
    assert counter.calls == ['item'] * 3


# --------------------------------------------------------------------------- no fused kernel


@pytest.fixture
def no_fused_kernel(monkeypatch):
    """A device where torch's fused kernel is not implemented."""
    def not_here(*args):
        raise NotImplementedError('Could not run this kernel with the CPU backend')

    monkeypatch.setattr(torch, '_amp_foreach_non_finite_check_and_unscale_', not_here)


@pytest.mark.usefixtures('no_fused_kernel')
@pytest.mark.parametrize('dtype', [F16, BF16, F32])
@pytest.mark.parametrize('bad', [math.inf, -math.inf, math.nan])
def test_fallback_detects(dtype, bad):
    s = LossScaler()
    assert s.has_overflow([param(torch.ones(3, dtype=dtype))]) is False
    dirty = param(torch.tensor([1.0, bad], dtype=dtype))
    assert s.has_overflow([param(torch.ones(3, dtype=dtype)), dirty]) is True


@pytest.mark.usefixtures('no_fused_kernel')
def test_fallback_unscale_and_single_sync(monkeypatch):
    params = _many_params(bad_at=17)
    before = [bits(p.grad) for p in params]
    counter = SyncCounter(monkeypatch)
    assert LossScaler().has_overflow(params) is True
    assert counter.calls == ['item']
    assert all(torch.equal(bits(p.grad), b) for p, b in zip(params, before))
    params[17].grad[1] = 1.0
    assert LossScaler(init_scale=4.0).unscale_(params) is False
    assert all(torch.equal(p.grad, torch.full((3,), 0.25, dtype=p.grad.dtype)) for p in params)
    assert counter.calls == ['item', 'item']


def test_non_finite_check_direct():
    assert non_finite_check_([]) is False
    t = torch.tensor([2.0, 4.0])
    assert non_finite_check_([t], 0.5) is False
    assert torch.equal(t, torch.tensor([1.0, 2.0]))
    assert non_finite_check_([t, torch.tensor([math.nan], dtype=F16)]) is True
    assert fp16utils.scaler.non_finite_check_ is non_finite_check_


# --------------------------------------------------------------------------- cached flags


@pytest.mark.parametrize('dtype', [F16, BF16, F32])
def test_flag_reset_between_calls(dtype):
    """The reused found_inf flag starts from zero on every call."""
    s = LossScaler(init_scale=2.0)
    clean = param(torch.ones(4, dtype=dtype))
    dirty = param(torch.tensor([1.0, math.inf], dtype=dtype))
    assert s.has_overflow([clean, dirty]) is True
    assert s.has_overflow([clean]) is False
    assert s.has_overflow([dirty]) is True
    assert s.has_overflow([clean, clean]) is False
    # unscale_ (the grouped path) too, and through non_finite_check_.
    assert s.unscale_([dirty]) is True
    assert s.unscale_([clean]) is False
    assert non_finite_check_([torch.tensor([math.nan], dtype=dtype)]) is True
    assert non_finite_check_([torch.ones(2, dtype=dtype)]) is False
    assert non_finite_check_([torch.tensor([math.nan], dtype=dtype)], 0.5) is True
    assert non_finite_check_([torch.ones(2, dtype=dtype)], 0.5) is False


@pytest.mark.usefixtures('no_fused_kernel')
def test_flag_reset_between_calls_without_fused_kernel():
    s = LossScaler()
    clean, dirty = param(torch.ones(2)), param(torch.tensor([math.nan, 1.0]))
    assert [s.has_overflow([dirty]), s.has_overflow([clean]), s.has_overflow([dirty])] == [
        True, False, True]


def test_results_are_plain_bools():
    """Only a Python bool comes back, never a (reused) flag tensor."""
    s = LossScaler()
    for params in ([param(torch.ones(2))], [param(torch.tensor([math.inf]))], [_sparse_param()]):
        for result in (s.has_overflow(params), s.unscale_(params),
                       non_finite_check_([p.grad for p in params if not p.grad.is_sparse])):
            assert type(result) is bool


def test_inv_scale_follows_the_scale():
    """The reused inv_scale tensor is refilled whenever the factor changes."""
    for scale in (2.0, 4.0, 4.0, 0.5, 2.0**20):
        s = LossScaler(init_scale=scale)
        p = param(torch.full((3,), 8.0))
        q = param(torch.full((2,), 8.0, dtype=F16))
        assert s.unscale_([p, q]) is False
        assert torch.equal(p.grad, torch.full((3,), 8.0 / scale))
        assert torch.equal(q.grad, torch.full((2,), 8.0 / scale, dtype=F16))
        # A pure check in between neither scales nor disturbs the next unscale_.
        r = param(torch.full((2,), 3.0))
        assert s.has_overflow([r]) is False
        assert torch.equal(r.grad, torch.full((2,), 3.0))


def test_mixed_dtypes_both_paths():
    """Several dtypes in one list: the one-call CPU check and the grouped unscale_."""
    dtypes = [F32, F16, BF16, torch.float64]
    s = LossScaler(init_scale=4.0)
    for bad in range(len(dtypes)):
        params = [param(torch.full((3,), 4.0, dtype=d)) for d in dtypes]
        assert s.has_overflow(params) is False
        params[bad].grad[2] = math.nan
        assert s.has_overflow(params) is True
        assert s.unscale_(params) is True
        for p in params:
            p.grad.fill_(4.0)
        assert s.unscale_(params) is False
        assert all(torch.equal(p.grad, torch.ones(3, dtype=p.grad.dtype)) for p in params)


def test_complex_grads_checked_and_unchanged():
    """A dtype the fused kernel lacks, after others it has: each tensor checked once."""
    s = LossScaler()
    real = param(torch.tensor([1.5, -2.0]))
    cplx = nn.Parameter(torch.zeros(2, dtype=torch.complex64))
    cplx.grad = torch.tensor([1 + 1j, 2 - 1j], dtype=torch.complex64)
    before = real.grad.clone(), cplx.grad.clone()
    for _ in range(2):
        assert s.has_overflow([real, cplx]) is False
        assert torch.equal(real.grad, before[0]) and torch.equal(cplx.grad, before[1])
    cplx.grad[1] = complex(math.inf, 0)
    assert s.has_overflow([real, cplx]) is True
    cplx.grad[1] = 1j
    assert s.has_overflow([real, cplx]) is False
    real.grad[0] = math.nan
    assert s.has_overflow([real, cplx]) is True


def _in_fresh_thread(fn):
    """Run fn in a new thread (fresh per-thread flag tensors); return or raise its result."""
    out = {}

    def target():
        try:
            out['value'] = fn()
        except BaseException as err:  # noqa: BLE001 - re-raised in the caller
            out['error'] = err

    t = threading.Thread(target=target)
    t.start()
    t.join()
    if 'error' in out:
        raise out['error']
    return out['value']


def test_flags_made_in_inference_mode_work_outside_it():
    def run():
        s = LossScaler(init_scale=2.0)
        p = param(torch.tensor([1.0, math.inf]))
        with torch.inference_mode():
            first = s.has_overflow([p]), s.unscale_([p])
        p.grad = torch.tensor([2.0, 4.0])
        return first, s.has_overflow([p]), s.unscale_([p]), p.grad.tolist()

    assert _in_fresh_thread(run) == ((True, True), False, False, [1.0, 2.0])


def test_flags_not_kept_under_a_dispatch_mode():
    """Under a dispatch mode (as fake/meta tracing uses) the flags are made afresh."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Passthrough(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            return func(*args, **(kwargs or {}))

    def run():
        s = LossScaler()
        p = param(torch.tensor([1.0, math.nan]))
        with Passthrough():
            under_mode = s.has_overflow([p]), s.unscale_([p])
        kept = dict(getattr(fp16utils.scaler._local, 'table', {}))
        return under_mode, kept, s.has_overflow([p])

    under_mode, kept, after = _in_fresh_thread(run)
    assert under_mode == (True, True) and kept == {} and after is True


def test_threads_do_not_share_flags():
    """Threads checking clean and dirty gradients at once each get their own answer."""
    n_threads, rounds = 4, 200
    results = [[] for _ in range(n_threads)]
    barrier = threading.Barrier(n_threads)

    def worker(i):
        s = LossScaler()
        dirty = i % 2 == 1
        params = [param(torch.ones(2000)) for _ in range(8)]
        if dirty:
            params[-1].grad[-1] = math.inf
        barrier.wait()
        for _ in range(rounds):
            results[i].append(s.has_overflow(params))
            results[i].append(s.unscale_(params))

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, got in enumerate(results):
        assert got == [i % 2 == 1] * (2 * rounds)


@pytest.mark.skipif(not torch.cuda.is_available(), reason='needs a CUDA device')
@pytest.mark.parametrize('first', ['cpu', 'cuda'])
def test_two_devices_reused_flags(first):
    s = LossScaler(init_scale=2.0)
    devices = [first, 'cuda' if first == 'cpu' else 'cpu']
    params = [param(torch.full((3,), 2.0, device=d, dtype=dt))
              for d in devices for dt in (F32, F16)]
    for bad in range(len(params)):
        assert s.has_overflow(params) is False
        params[bad].grad[1] = math.inf
        assert s.has_overflow(params) is True
        params[bad].grad[1] = 2.0
    assert s.unscale_(params) is False
    assert all(torch.equal(p.grad.cpu(), torch.ones(3, dtype=p.grad.dtype)) for p in params)
