"""End to end: the 0.x hook style and the 1.x wrapper style train the same way.

The same tiny model and data go through ``Fp16OptimizerHook`` (a minimal
runner) and through ``AmpOptimWrapper`` (a hand-written 1.x ``train_step``),
on both backends; a GAN trains through ``OptimWrapperDict``; runs resume
bit-identically.
"""

from __future__ import annotations

import io

import _caps  # tests/ is on sys.path: see conftest.py
import _runner as R
import pytest
import torch
import torch.nn.functional as F
from torch import nn

import fp16utils
from fp16utils import (
    AmpOptimWrapper,
    Fp16OptimizerHook,
    GradientCumulativeFp16OptimizerHook,
    OptimWrapperDict,
    build_optim_wrapper,
)


@pytest.fixture(params=['native', 'legacy', 'torch-1.5'])
def backend(request, monkeypatch):
    """The backend to train with; 'torch-1.5' simulates an old torch (legacy by default)."""
    monkeypatch.delenv(fp16utils._torch.versions.BACKEND_ENV, raising=False)
    if request.param == 'torch-1.5':
        monkeypatch.setattr(fp16utils._torch.versions, 'TORCH_VERSION', '1.5.0')
    fp16utils._torch.decisions.refresh()
    yield None if request.param == 'torch-1.5' else request.param
    monkeypatch.undo()
    fp16utils._torch.decisions.refresh()


def float16_scaling(backend):
    """Skip unless the CPU trains float16 with ``backend`` (None: the automatic one) here."""
    _caps.require(torch.float16, 'native' if backend == 'native' else None)


def train_0x(data, backend, cumulative=1, opt_cls=torch.optim.Adam, loss_scale=512.0,
             dtype=None):
    """mmcv style: the model's @auto_fp16 forward, a runner and the optimizer hook."""
    if cumulative == 1:
        hook = Fp16OptimizerHook(loss_scale=loss_scale, backend=backend,
                                 grad_clip=dict(max_norm=5.0), dtype=dtype)
    else:
        hook = GradientCumulativeFp16OptimizerHook(
            cumulative_iters=cumulative, loss_scale=loss_scale, backend=backend,
            grad_clip=dict(max_norm=5.0), dtype=dtype)
    model = R.Net()
    runner = R.MiniRunner(model, opt_cls(model.parameters(), lr=1e-2), [hook],
                          max_iters=len(data), meta={})
    runner.run(data, R.mse)
    return model, runner.optimizer, hook


def train_1x(data, backend, cumulative=1, opt_cls=torch.optim.Adam, loss_scale=512.0,
             dtype=None):
    """MMEngine style: optim_context around the forward, update_params on the loss."""
    model = R.Net()
    wrapper = build_optim_wrapper(model, dict(
        type='AmpOptimWrapper', optimizer=dict(type=opt_cls.__name__, lr=1e-2),
        accumulative_counts=cumulative, clip_grad=dict(max_norm=5.0), loss_scale=loss_scale,
        backend=backend, dtype=dtype))
    wrapper.initialize_count_status(model, 0, len(data))
    for x, y in data:
        with wrapper.optim_context(model):
            out = model(x)
        wrapper.update_params((out.float() - y).pow(2).mean())
    return model, wrapper.optimizer, wrapper


@pytest.mark.parametrize('cumulative', [1, 3])
@pytest.mark.parametrize('opt_cls', [torch.optim.SGD, torch.optim.Adam])
def test_0x_hook_and_1x_wrapper_reach_the_same_parameters(backend, cumulative, opt_cls):
    float16_scaling(backend)
    data = R.make_data(7)
    data[2] = R.overflow_batch()  # one skipped update in each style
    model_0x, opt_0x, hook = train_0x(data, backend, cumulative, opt_cls)
    model_1x, opt_1x, wrapper = train_1x(data, backend, cumulative, opt_cls)
    assert hook.backend == wrapper.backend
    assert hook.skipped_steps == wrapper.skipped_steps == 1
    assert hook.loss_scale == wrapper.loss_scale == 512.0  # static
    weights_0x = [p for g in opt_0x.param_groups for p in g['params']]
    weights_1x = [p for g in opt_1x.param_groups for p in g['params']]
    assert all(p.dtype == torch.float32 for p in weights_0x + weights_1x)
    for a, b in zip(weights_0x, weights_1x):
        torch.testing.assert_close(a, b, rtol=0, atol=1e-3)
    for a, b in zip(model_0x.parameters(), model_1x.parameters()):
        assert a.dtype == b.dtype


def test_accumulation_equals_a_large_batch_in_both_styles(backend):
    small = R.make_data(4, batch_size=2)
    large = [(torch.cat([b[0] for b in small]), torch.cat([b[1] for b in small]))]
    dtype = _caps.train_dtype(backend)
    atol = 1e-3 if dtype == torch.float16 else 1e-2
    results = []
    for train in (train_0x, train_1x):
        _, acc_opt, _ = train(small, backend, cumulative=4, opt_cls=torch.optim.SGD,
                              dtype=dtype)
        _, big_opt, _ = train(large, backend, cumulative=1, opt_cls=torch.optim.SGD,
                              dtype=dtype)
        acc = [p for g in acc_opt.param_groups for p in g['params']]
        big = [p for g in big_opt.param_groups for p in g['params']]
        for a, b in zip(acc, big):
            torch.testing.assert_close(a, b, rtol=0, atol=atol)
        results.append(acc)
    for a, b in zip(*results):
        torch.testing.assert_close(a, b, rtol=0, atol=atol)


# ------------------------------------------------------------------------ GAN


class GAN(nn.Module):
    def __init__(self):
        super().__init__()
        torch.manual_seed(3)
        self.generator = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
        self.discriminator = nn.Sequential(nn.Linear(4, 16), nn.LeakyReLU(0.2),
                                           nn.Linear(16, 1))

    def train_step(self, batch, optim_wrapper: OptimWrapperDict, step: int):
        """One 1.x train_step: update the discriminator every step, the generator after."""
        z, real = batch
        d_wrapper, g_wrapper = optim_wrapper['discriminator'], optim_wrapper['generator']
        with torch.no_grad(), g_wrapper.optim_context(self.generator):
            fake = self.generator(z).float()
        with d_wrapper.optim_context(self.discriminator):
            d_real = self.discriminator(real).float()
            d_fake = self.discriminator(fake).float()
        loss_d = F.softplus(-d_real).mean() + F.softplus(d_fake).mean()
        d_wrapper.update_params(loss_d)

        self.discriminator.requires_grad_(False)
        with g_wrapper.optim_context(self.generator):
            fake = self.generator(z)
        with d_wrapper.optim_context(self.discriminator):
            d_fake = self.discriminator(fake.float()).float()
        g_wrapper.update_params(F.softplus(-d_fake).mean())
        self.discriminator.requires_grad_(True)
        return {'loss_d': loss_d.item()}


GAN_CFG = dict(
    constructor='MultiOptimWrapperConstructor',
    generator=dict(type='AmpOptimWrapper', accumulative_counts=2, loss_scale=256.0,
                   optimizer=dict(type='Adam', lr=1e-3, betas=(0.0, 0.999), eps=1e-6)),
    discriminator=dict(type='AmpOptimWrapper', accumulative_counts=1,
                       loss_scale=dict(init_scale=1024.0),
                       optimizer=dict(type='Adam', lr=4e-3, betas=(0.0, 0.999), eps=1e-6)))


def gan_data(n, overflow_at=None):
    gen = torch.Generator().manual_seed(7)
    data = [(torch.randn(4, 8, generator=gen), torch.randn(4, 4, generator=gen) * 0.5 + 1)
            for _ in range(n)]
    if overflow_at is not None:
        data[overflow_at] = (data[overflow_at][0], torch.full((4, 4), 1e5))
    return data


def gan_cfg(backend):
    cfg = {k: (dict(v, backend=backend) if isinstance(v, dict) else v)
           for k, v in GAN_CFG.items()}
    return cfg


def test_gan_trains_through_optim_wrapper_dict_with_its_own_counts_and_scales(backend):
    float16_scaling(backend)
    gan = GAN()
    initial = {k: v.clone() for k, v in gan.state_dict().items()}
    wrappers = build_optim_wrapper(gan, gan_cfg(backend))
    d, g = wrappers['discriminator'], wrappers['generator']
    assert isinstance(wrappers, OptimWrapperDict) and isinstance(g, AmpOptimWrapper)
    data = gan_data(6, overflow_at=3)  # the discriminator's 4th update overflows
    for step, batch in enumerate(data):
        gan.train_step(batch, wrappers, step)
    d_steps = {int(s['step']) for s in d.optimizer.state.values()}
    g_steps = {int(s['step']) for s in g.optimizer.state.values()}
    assert d_steps == {5} and g_steps == {3}
    assert d.skipped_steps == 1 and g.skipped_steps == 0
    assert d.loss_scale == 512.0 and g.loss_scale == 256.0
    assert d.scale_history == [(0, 1024.0), (4, 512.0)]
    for name, value in gan.state_dict().items():
        assert not torch.equal(value.float(), initial[name]), name
    assert set(wrappers.get_lr()) == {'generator.lr', 'discriminator.lr'}


def test_gan_resumes_bit_identically(backend):
    float16_scaling(backend)
    data = gan_data(8, overflow_at=2)

    def fresh():
        gan = GAN()
        wrappers = build_optim_wrapper(gan, gan_cfg(backend))
        wrappers.initialize_count_status(gan, 0, len(data))
        return gan, wrappers

    gan, wrappers = fresh()
    for step, batch in enumerate(data):
        gan.train_step(batch, wrappers, step)

    first, first_wrappers = fresh()
    for step, batch in enumerate(data[:4]):
        first.train_step(batch, first_wrappers, step)
    buffer = io.BytesIO()
    torch.save({'model': first.state_dict(), 'optim': first_wrappers.state_dict()}, buffer)
    buffer.seek(0)
    ckpt = torch.load(buffer)

    resumed, resumed_wrappers = fresh()
    resumed.load_state_dict(ckpt['model'])
    resumed_wrappers.load_state_dict(ckpt['optim'])
    resumed_wrappers.initialize_count_status(resumed, 4, len(data))
    for step, batch in enumerate(data[4:], start=4):
        resumed.train_step(batch, resumed_wrappers, step)

    for name in ('generator', 'discriminator'):
        R.assert_identical(
            R.snapshot(getattr(gan, name), wrappers[name].optimizer),
            R.snapshot(getattr(resumed, name), resumed_wrappers[name].optimizer))
        assert wrappers[name].loss_scale == resumed_wrappers[name].loss_scale
