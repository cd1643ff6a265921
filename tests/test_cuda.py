"""The CUDA paths: autocast on the tensors' device, fused checks, both backends.

Skipped (with the reason) where no CUDA device is present.
"""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from fp16utils import AmpOptimWrapper, LossScaler, auto_fp16, force_fp32, wrap_fp16_model

pytestmark = [
    pytest.mark.cuda,
    pytest.mark.skipif(not torch.cuda.is_available(),
                       reason='needs a CUDA device; none is visible to torch here'),
]

DTYPES = [torch.float16, torch.bfloat16]


def _supported(dtype: torch.dtype) -> None:
    if dtype == torch.bfloat16 and not torch.cuda.is_bf16_supported():
        pytest.skip('this CUDA device has no bfloat16 support')


class Net(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(8, 8)
        self.fp16_enabled = False
        self.seen: dict = {}

    @auto_fp16()
    def forward(self, x):
        self.seen['cuda'] = torch.is_autocast_enabled('cuda')
        self.seen['cpu'] = torch.is_autocast_enabled('cpu')
        return self.fc(x)

    @force_fp32()
    def loss(self, y):
        self.seen['loss_cuda'] = torch.is_autocast_enabled('cuda')
        return y.pow(2).mean()


@pytest.mark.parametrize('dtype', DTYPES)
def test_decorators_autocast_on_the_cuda_device(dtype):
    _supported(dtype)
    net = wrap_fp16_model(Net().cuda(), dtype=dtype)
    y = net(torch.randn(4, 8, device='cuda'))
    assert y.is_cuda and y.dtype == dtype
    assert net.seen['cuda'] is True and net.seen['cpu'] is False  # only the tensors' device
    loss = net.loss(y)
    assert loss.dtype == torch.float32 and net.seen['loss_cuda'] is False
    assert not torch.is_autocast_enabled('cuda')  # restored afterwards


def test_force_fp32_switches_off_an_outer_cuda_autocast():
    net = wrap_fp16_model(Net().cuda())
    with torch.autocast('cuda', dtype=torch.float16):
        y = net(torch.randn(4, 8, device='cuda'))
        loss = net.loss(y)
        assert torch.is_autocast_enabled('cuda')
    assert net.seen['loss_cuda'] is False
    assert loss.dtype == torch.float32


def test_overflow_check_across_devices_is_one_answer():
    # A half parameter on the GPU (its gradient is half too), a float one on the CPU.
    on_gpu = nn.Parameter(torch.ones(4, device='cuda', dtype=torch.float16))
    on_cpu = nn.Parameter(torch.ones(4))
    on_gpu.grad = torch.ones(4, device='cuda', dtype=torch.float16)
    on_cpu.grad = torch.ones(4)
    scaler = LossScaler(init_scale=4.0)
    assert scaler.has_overflow([on_gpu, on_cpu]) is False
    on_gpu.grad[2] = math.inf
    assert scaler.has_overflow([on_gpu, on_cpu]) is True
    on_gpu.grad.fill_(8.0)
    assert scaler.unscale_([on_gpu, on_cpu]) is False
    assert torch.equal(on_gpu.grad, torch.full((4,), 2.0, device='cuda', dtype=torch.float16))
    assert torch.equal(on_cpu.grad, torch.full((4,), 0.25))


def _data(steps: int):
    gen = torch.Generator().manual_seed(0)
    return [(torch.randn(16, 8, generator=gen).cuda(), torch.randn(16, 8, generator=gen).cuda())
            for _ in range(steps)]


def test_amp_wrapper_on_cuda_matches_the_hand_written_loop():
    data = _data(6)
    torch.manual_seed(0)
    ref_model = nn.Linear(8, 8).cuda()
    ref_opt = torch.optim.SGD(ref_model.parameters(), lr=0.1)
    scaler = torch.amp.GradScaler('cuda', init_scale=1024.0)
    for x, y in data:
        with torch.autocast('cuda', dtype=torch.float16):
            out = ref_model(x)
        scaler.scale((out.float() - y).pow(2).mean()).backward()
        scaler.step(ref_opt)
        scaler.update()
        ref_opt.zero_grad()
    torch.manual_seed(0)
    model = nn.Linear(8, 8).cuda()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
                              loss_scale=dict(init_scale=1024.0))
    for x, y in data:
        with wrapper.optim_context(model):
            out = model(x)
        assert out.dtype == torch.float16
        wrapper.update_params((out.float() - y).pow(2).mean())
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)
    assert wrapper.loss_scale == scaler.get_scale()


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_amp_wrapper_on_cuda_skips_an_overflow_bit_identically(backend):
    torch.manual_seed(0)
    model = nn.Linear(8, 8).cuda()
    wrapper = AmpOptimWrapper(torch.optim.Adam(model.parameters(), lr=1e-2),
                              loss_scale=dict(init_scale=1024.0), backend=backend, model=model)
    data = _data(3)
    for x, y in data[:2]:
        with wrapper.optim_context(model):
            out = model(x)
        wrapper.update_params((out.float() - y).pow(2).mean())
    before = [p.detach().clone() for p in model.parameters()]
    state = [v.clone() for s in wrapper.optimizer.state.values() for v in s.values()
             if torch.is_tensor(v)]
    x, y = data[2]
    with wrapper.optim_context(model):
        out = model(x * math.inf)
    wrapper.update_params((out.float() - y).pow(2).mean())
    assert wrapper.skipped_steps == 1 and wrapper.loss_scale == 512.0
    for a, b in zip(model.parameters(), before):
        assert torch.equal(a, b)
    after = [v for s in wrapper.optimizer.state.values() for v in s.values()
             if torch.is_tensor(v)]
    assert len(state) == len(after) > 0
    assert all(torch.equal(a, b) for a, b in zip(state, after))
    if backend == 'legacy':
        assert all(p.dtype == torch.float16 for p in model.parameters())
        assert all(m.dtype == torch.float32 and m.is_cuda for m in wrapper.master_params)
