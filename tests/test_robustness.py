"""Thread safety, exception safety, and copies (deepcopy, pickle, torch.save, EMA).

Autocast state is thread-local in torch, and the decorators keep no per-call
state of their own, so threads must never see each other's autocast settings.
Wrapped and patched models must copy into independent models whose decorators
and fp16 flags keep working.
"""

from __future__ import annotations

import copy
import threading

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from _roundtrip import pickle_roundtrip, torch_save_roundtrip
from torch import nn

from fp16utils import (
    auto_fp16,
    force_fp32,
    patch_norm_fp32,
    wrap_fp16_model,
)
from fp16utils.wrap import _PatchedForward

CPU = 'cpu'
LOW = _caps.LOW  # float16 where CPU autocast has it, else bfloat16
LEGACY = _caps.LEGACY_LOW  # float16 where the CPU has its kernels, else bfloat16


def _autocast_state():
    return _caps.autocast_now(CPU)


class Probe(nn.Module):
    """Records the autocast state seen inside its decorated methods."""

    def __init__(self, barrier: threading.Barrier | None = None) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.fp16_enabled = False
        self.barrier = barrier
        self.seen = threading.local()

    @auto_fp16(apply_to=('x',))
    def forward(self, x, fail=False):
        if self.barrier is not None:
            self.barrier.wait(timeout=30)  # every thread is inside at once
        self.seen.forward = (*_autocast_state(), x.dtype)
        if fail:
            raise ValueError('forward failed on purpose')
        return self.fc(x)

    @force_fp32(apply_to=('pred',))
    def loss(self, pred, fail=False):
        if self.barrier is not None:
            self.barrier.wait(timeout=30)
        self.seen.loss = (*_autocast_state(), pred.dtype)
        if fail:
            raise ValueError('loss failed on purpose')
        return pred.square().mean()


# ----------------------------------------------------------------- threads


def test_threads_see_their_own_autocast_state():
    _caps.require(torch.float16, 'native', scaled=False)  # threads in float16 and bfloat16
    iterations, parties = 20, 6
    barrier = threading.Barrier(parties)
    torch.manual_seed(0)
    bf16 = wrap_fp16_model(Probe(barrier), dtype=torch.bfloat16, backend='native')
    torch.manual_seed(0)
    fp16 = wrap_fp16_model(Probe(barrier), dtype=torch.float16, backend='native')
    off = Probe(barrier)
    off.load_state_dict(bf16.state_dict())
    x = torch.randn(4, 8)
    # Single-threaded references for the values.
    refs = {}
    for name, model in (('bf16', bf16), ('fp16', fp16), ('off', off)):
        model.barrier = None
        refs[name] = model(x)
        model.barrier = barrier
    assert (refs['bf16'].dtype, refs['fp16'].dtype, refs['off'].dtype) == (
        torch.bfloat16, torch.float16, torch.float32)
    errors: list = []
    results: dict = {}

    def decorated(name, model):
        out = []
        for _ in range(iterations):
            y = model(x)
            out.append((model.seen.forward, y, _autocast_state()[0]))
        results[threading.get_ident()] = (name, out)

    def outer_autocast_loss():
        out = []
        with torch.autocast(CPU, dtype=torch.float16):
            for _ in range(iterations):
                loss = fp16.loss(torch.ones(2, dtype=torch.float16))
                out.append((fp16.seen.loss, loss.dtype, _autocast_state()))
        results[threading.get_ident()] = ('loss', out)

    def plain():
        out = []
        for _ in range(iterations):
            barrier.wait(timeout=30)  # while the others are inside autocast
            out.append((_autocast_state()[0], torch.mm(x, x.t()).dtype))
        results[threading.get_ident()] = ('plain', out)

    def guard(fn, *args):
        try:
            fn(*args)
        except BaseException as err:  # reported below, in the main thread
            errors.append(err)
            barrier.abort()

    threads = [threading.Thread(target=guard, args=args) for args in (
        (decorated, 'bf16', bf16), (decorated, 'bf16', bf16),
        (decorated, 'fp16', fp16), (decorated, 'fp16', fp16),
        (outer_autocast_loss,), (plain,))]
    assert len(threads) == parties
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert not errors, errors
    assert len(results) == parties

    expected_state = {'bf16': (True, torch.bfloat16, torch.bfloat16),
                      'fp16': (True, torch.float16, torch.float16)}
    names = sorted(name for name, _ in results.values())
    assert names == ['bf16', 'bf16', 'fp16', 'fp16', 'loss', 'plain']
    for name, out in results.values():
        assert len(out) == iterations
        for item in out:
            if name in expected_state:
                seen, y, after = item
                assert seen == expected_state[name]
                assert y.dtype == refs[name].dtype
                torch.testing.assert_close(y, refs[name], rtol=0, atol=0)
                assert after is False  # the decorator restored this thread's state
            elif name == 'loss':
                seen, dtype, after = item
                assert seen == (False, torch.float16, torch.float32)
                assert dtype == torch.float32
                assert after == (True, torch.float16)
            else:
                assert item == (False, torch.float32)
    # Nothing leaked into the main thread either.
    assert _autocast_state()[0] is False


def test_threads_calling_one_disabled_and_one_enabled_instance():
    # The fp16 flag is per instance: flipping one instance in one thread does
    # not affect another instance used by another thread.
    torch.manual_seed(0)
    on = wrap_fp16_model(Probe(), dtype=torch.bfloat16, backend='native')
    off = Probe()
    x = torch.randn(2, 8)
    dtypes = {'on': set(), 'off': set()}

    def run(name, model):
        for _ in range(50):
            dtypes[name].add(model(x).dtype)

    threads = [threading.Thread(target=run, args=a) for a in (('on', on), ('off', off))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert dtypes == {'on': {torch.bfloat16}, 'off': {torch.float32}}


# -------------------------------------------------------------- exceptions


@pytest.mark.parametrize('outer', [None, *sorted(_caps.LOW_DTYPES, key=str, reverse=True)])
def test_auto_fp16_restores_state_when_it_raises(outer):
    model = wrap_fp16_model(Probe(), dtype=LOW, backend='native')
    x = torch.randn(2, 8)

    def call():
        with pytest.raises(ValueError, match='forward failed'):
            model(x, fail=True)
        assert model.seen.forward[:2] == (True, LOW)
        return _autocast_state()

    if outer is None:
        before = _autocast_state()
        assert call() == before == (False, before[1])
    else:
        with torch.autocast(CPU, dtype=outer):
            assert call() == (True, outer)
        assert _autocast_state()[0] is False
    assert model(x).dtype == LOW  # still works afterwards


@pytest.mark.parametrize('outer', [None, torch.bfloat16])
def test_force_fp32_restores_state_when_it_raises(outer):
    model = wrap_fp16_model(Probe(), dtype=LOW, backend='native')
    pred = torch.ones(2, dtype=LOW)
    if outer is None:
        with pytest.raises(ValueError, match='loss failed'):
            model.loss(pred, fail=True)
        assert model.seen.loss[0] is False and model.seen.loss[2] == torch.float32
        assert _autocast_state()[0] is False
    else:
        with torch.autocast(CPU, dtype=outer):
            with pytest.raises(ValueError, match='loss failed'):
                model.loss(pred, fail=True)
            assert model.seen.loss[:1] == (False,)
            assert _autocast_state() == (True, outer)
        assert _autocast_state()[0] is False


class Nested(nn.Module):
    """force_fp32 loss called from inside an auto_fp16 forward."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 4)
        self.fp16_enabled = False
        self.inner_states: list = []

    @auto_fp16()
    def forward(self, x):
        y = self.fc(x)
        try:
            self.loss(y)
        except ValueError:
            self.inner_states.append(_autocast_state())  # back in auto_fp16's context
            raise
        return y

    @force_fp32()
    def loss(self, pred):
        self.inner_states.append((*_autocast_state(), pred.dtype))
        raise ValueError('nested loss failed on purpose')


def test_nested_decorators_restore_state_when_inner_raises():
    model = wrap_fp16_model(Nested(), dtype=LOW, backend='native')
    with torch.autocast(CPU, dtype=torch.bfloat16):
        with pytest.raises(ValueError, match='nested loss failed'):
            model(torch.randn(2, 4))
        after_outer = _autocast_state()
    assert model.inner_states == [
        (False, LOW, torch.float32),  # inside force_fp32
        (True, LOW),  # auto_fp16 level after force_fp32 unwound
    ]
    assert after_outer == (True, torch.bfloat16)
    assert _autocast_state()[0] is False


# ------------------------------------------------------------------ copies


class Block(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.gn = nn.GroupNorm(2, 6)
        self.bn = nn.BatchNorm1d(6)
        self.fp16_enabled = False

    @auto_fp16()
    def forward(self, x):
        return self.bn(self.gn(self.fc(x)))

    @force_fp32()
    def loss(self, pred):
        return pred.square().mean()


class Plain(nn.Module):
    """No decorators: a half model made mixed by patch_norm_fp32 alone."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 6)
        self.gn = nn.GroupNorm(2, 6)

    def forward(self, x):
        return self.gn(self.fc(x))


def _native(dtype):
    def build():
        _caps.require_native_norms(dtype)  # Block has a float32 GroupNorm
        torch.manual_seed(0)
        return wrap_fp16_model(Block(), dtype=dtype, backend='native')
    return build


def _legacy():
    torch.manual_seed(0)
    return wrap_fp16_model(Block(), dtype=LEGACY, backend='legacy')


def _patched():
    torch.manual_seed(0)
    return patch_norm_fp32(Plain().to(LEGACY), LEGACY)


BUILDERS = {
    'native-fp16': (_native(torch.float16), torch.float32, torch.float16),
    'native-bf16': (_native(torch.bfloat16), torch.float32, torch.bfloat16),
    'legacy': (_legacy, LEGACY, LEGACY),
    'patched': (_patched, LEGACY, LEGACY),
}


def _deepcopy(model):
    return copy.deepcopy(model)


CLONERS = {'deepcopy': _deepcopy, 'pickle': pickle_roundtrip,
           'torch.save': torch_save_roundtrip}


def _flags(model):
    return [(name, m.__dict__.get('fp16_enabled'), m.__dict__.get('_fp16_autocast'),
             m.__dict__.get('fp16_dtype')) for name, m in model.named_modules()]


@pytest.mark.parametrize('cloner', list(CLONERS))
@pytest.mark.parametrize('kind', list(BUILDERS))
def test_copies_are_independent_working_models(kind, cloner):
    build, in_dtype, out_dtype = BUILDERS[kind]
    model = build().eval()
    x = torch.randn(5, 4).to(in_dtype)
    ref = model(x)
    assert ref.dtype == out_dtype

    clone = CLONERS[cloner](model).eval()
    assert clone is not model
    assert _flags(clone) == _flags(model)
    out = clone(x)
    assert out.dtype == out_dtype
    torch.testing.assert_close(out, ref, rtol=0, atol=0)
    # Patched GroupNorm forwards belong to the copy, not the original.
    patched = clone.gn.__dict__.get('forward')
    if kind in ('legacy', 'patched'):
        assert isinstance(patched, _PatchedForward) and patched.owner is clone.gn
        assert clone.gn.weight.dtype == torch.float32
    else:
        assert patched is None
    if hasattr(clone, 'loss'):
        assert clone.loss(out).dtype == torch.float32  # force_fp32 still works

    # Changing the original leaves the copy alone, and the other way round.
    with torch.no_grad():
        model.fc.weight.add_(1.0)
        model.gn.weight.mul_(3.0)
    torch.testing.assert_close(clone(x), ref, rtol=0, atol=0)
    changed = model(x)
    assert not torch.equal(changed, ref)
    with torch.no_grad():
        clone.gn.bias.add_(5.0)
    torch.testing.assert_close(model(x), changed, rtol=0, atol=0)
    assert not torch.equal(clone(x), ref)
    assert all(p.data_ptr() != q.data_ptr()
               for p, q in zip(model.parameters(), clone.parameters()))


@pytest.mark.parametrize('kind', ['native-fp16', 'legacy'])
def test_buffers_of_copies_are_independent(kind):
    build, in_dtype, _ = BUILDERS[kind]
    model = build()
    clone = copy.deepcopy(model)
    before = clone.bn.running_mean.clone()
    model.train()(torch.randn(8, 4).to(in_dtype) + 3)  # updates model's running stats
    assert not torch.equal(model.bn.running_mean, before)
    assert torch.equal(clone.bn.running_mean, before)


@pytest.mark.parametrize('kind', list(BUILDERS))
def test_state_dict_round_trip(kind):
    build, in_dtype, _ = BUILDERS[kind]
    model = build().eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.5)
    fresh = build().eval()
    fresh.load_state_dict(model.state_dict())
    x = torch.randn(3, 4).to(in_dtype)
    torch.testing.assert_close(fresh(x), model(x), rtol=0, atol=0)
    assert _flags(fresh) == _flags(model)


# --------------------------------------------------------------------- EMA


def _train_step(model, opt, x):
    opt.zero_grad(set_to_none=True)
    model.loss(model(x)).backward()
    opt.step()


def _ema_update_foreach(ema, live, decay):
    ema_p, live_p = list(ema.parameters()), list(live.parameters())
    torch._foreach_lerp_(ema_p, [p.detach() for p in live_p], 1.0 - decay)
    for b_ema, b in zip(ema.buffers(), live.buffers()):
        b_ema.copy_(b)


def _ema_update_loop(ema, live, decay):
    for e, p in zip(ema.parameters(), live.parameters()):
        e.mul_(decay).add_(p.detach(), alpha=1.0 - decay)
    for b_ema, b in zip(ema.buffers(), live.buffers()):
        b_ema.copy_(b)


@pytest.mark.parametrize('update', ['foreach', 'loop'])
@pytest.mark.parametrize('kind', ['native-fp16', 'native-bf16', 'legacy'])
def test_ema_copy_tracks_the_live_model(kind, update):
    if update == 'foreach' and not hasattr(torch, '_foreach_lerp_'):
        pytest.skip('torch has no fused foreach lerp (torch._foreach_lerp_) here')
    build, in_dtype, out_dtype = BUILDERS[kind]
    decay = 0.75
    live = build()
    ema = copy.deepcopy(live)
    for p in ema.parameters():
        p.requires_grad_(False)
    opt = torch.optim.SGD(live.parameters(), lr=0.1)
    # Reference EMA kept by hand, with the same arithmetic, on plain tensors.
    expected = [p.detach().clone() for p in live.parameters()]
    gen = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for _ in range(4):
            before = [e.clone() for e in ema.parameters()]
            with torch.enable_grad():
                _train_step(live, opt, torch.randn(6, 4, generator=gen).to(in_dtype))
            # The live step alone does not move the EMA copy.
            assert all(torch.equal(e, b) for e, b in zip(ema.parameters(), before))
            if update == 'foreach':
                _ema_update_foreach(ema, live, decay)
                expected = [torch.lerp(e, p, 1.0 - decay)
                            for e, p in zip(expected, live.parameters())]
            else:
                _ema_update_loop(ema, live, decay)
                expected = [e * decay + p * (1.0 - decay)
                            for e, p in zip(expected, live.parameters())]
    for (name, e), ref, p in zip(ema.named_parameters(), expected, live.parameters()):
        assert e.dtype == p.dtype, name
        torch.testing.assert_close(e, ref, rtol=0, atol=0, msg=name)
    # It lags behind the live weights.
    assert not all(torch.equal(e, p) for e, p in zip(ema.parameters(), live.parameters()))

    # The EMA copy is a working mixed-precision model of its own.
    assert _flags(ema) == _flags(live)
    x = torch.randn(3, 4).to(in_dtype)
    ema.eval()
    live.eval()
    out = ema(x)
    assert out.dtype == out_dtype
    assert ema.loss(out).dtype == torch.float32
    assert not torch.equal(out, live(x))
    # Its output is the output of the live model given the EMA weights.
    swapped = copy.deepcopy(live)
    swapped.load_state_dict(ema.state_dict())
    torch.testing.assert_close(swapped(x), out, rtol=0, atol=0)
