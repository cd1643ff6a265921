"""Operators without a half kernel: a C++ extension built here, and torchvision's ops.

The extension's CPU kernels dispatch float and double only (``AT_DISPATCH_FLOATING_TYPES``),
as many users' extensions and older compiled ops do. Each test shows the real error in
float16/bfloat16, then the fix: ``fp32_function`` on the autograd Function, or
``keep_fp32``/``fp32_modules`` on the module, under the native backend (autocast,
``AmpOptimWrapper``) and the legacy one (a half model).
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import sys
import tempfile
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
import torch.nn.functional as F
from test_docs_troubleshooting import blocks, run, scripts
from torch import nn

from fp16utils import AmpOptimWrapper, fp32_function, keep_fp32, kept_fp32, wrap_fp16_model

pytestmark = pytest.mark.usefixtures('no_backend_env')

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
NAMES = {F16: 'Half', BF16: 'BFloat16', F32: 'Float'}
C = 4

# y[n, c, ...] = x[n, c, ...] * w[c]: one kernel family, three dispatch choices.
SOURCE = r'''
#include <torch/extension.h>
#include <vector>

template <typename scalar_t>
static void scale(const torch::Tensor& x, const torch::Tensor& w, torch::Tensor& out) {
  const int64_t channels = w.numel();
  const int64_t inner = x.numel() / (x.size(0) * channels);
  const scalar_t* px = x.data_ptr<scalar_t>();
  const scalar_t* pw = w.data_ptr<scalar_t>();  // w must have x's dtype
  scalar_t* po = out.data_ptr<scalar_t>();
  for (int64_t i = 0; i < x.numel(); ++i) po[i] = px[i] * pw[(i / inner) % channels];
}

torch::Tensor channel_scale_forward(torch::Tensor x, torch::Tensor w) {
  TORCH_CHECK(x.dim() >= 2 && x.size(1) == w.numel(), "channel_scale: x is (N, C, ...)");
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "channel_scale_forward", [&] {
    scale<scalar_t>(xc, w.contiguous(), out);
  });
  return out;
}

// The same kernel with half and bfloat16 instances: it still needs one dtype for both.
torch::Tensor channel_scale_forward_lowp(torch::Tensor x, torch::Tensor w) {
  auto xc = x.contiguous();
  auto out = torch::empty_like(xc);
  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16,
                                  xc.scalar_type(), "channel_scale_forward_lowp", [&] {
    scale<scalar_t>(xc, w.contiguous(), out);
  });
  return out;
}

std::vector<torch::Tensor> channel_scale_backward(torch::Tensor grad, torch::Tensor x,
                                                  torch::Tensor w) {
  auto g = grad.contiguous(), xc = x.contiguous(), wc = w.contiguous();
  auto gx = torch::empty_like(xc);
  auto gw = torch::zeros_like(wc);
  const int64_t channels = wc.numel();
  const int64_t inner = xc.numel() / (xc.size(0) * channels);
  AT_DISPATCH_FLOATING_TYPES(xc.scalar_type(), "channel_scale_backward", [&] {
    const scalar_t* pg = g.data_ptr<scalar_t>();
    const scalar_t* px = xc.data_ptr<scalar_t>();
    const scalar_t* pw = wc.data_ptr<scalar_t>();
    scalar_t* pgx = gx.data_ptr<scalar_t>();
    scalar_t* pgw = gw.data_ptr<scalar_t>();
    for (int64_t i = 0; i < xc.numel(); ++i) {
      const int64_t c = (i / inner) % channels;
      pgx[i] = pg[i] * pw[c];
      pgw[c] += pg[i] * px[i];
    }
  });
  return {gx, gw};
}
'''
FUNCTIONS = ['channel_scale_forward', 'channel_scale_forward_lowp', 'channel_scale_backward']


def _build_dir() -> Path:
    """One folder per torch and Python: torch rebuilds only when the source changes."""
    tag = f'torch{torch.__version__}-py{sys.version_info[0]}{sys.version_info[1]}'
    root = os.environ.get('FP16UTILS_EXT_CACHE') or Path(tempfile.gettempdir()) / 'fp16utils-ext'
    path = Path(root) / tag.replace('+', '_')
    path.mkdir(parents=True, exist_ok=True)
    return path


@pytest.fixture(scope='module')
def ext():
    """The extension, built once per session run (the first build takes ~20-60 s)."""
    from torch.utils import cpp_extension

    compiler = os.environ.get('CXX', 'c++')
    if shutil.which(compiler) is None:
        pytest.skip(f'no C++ compiler ({compiler}) to build the test extension')
    if not cpp_extension.is_ninja_available():
        pytest.skip('ninja is not installed: torch.utils.cpp_extension cannot build')
    return cpp_extension.load_inline(
        'fp16utils_channel_scale', cpp_sources=SOURCE, functions=FUNCTIONS,
        build_directory=str(_build_dir()), extra_cflags=['-O1'], verbose=False)


def functions(ext):
    """(plain Function, Function with fp32_function on forward and backward) for ``ext``."""

    class ChannelScaleFn(torch.autograd.Function):
        @staticmethod
        def forward(ctx, x, w):
            ctx.save_for_backward(x, w)
            return ext.channel_scale_forward(x, w)

        @staticmethod
        def backward(ctx, grad):
            x, w = ctx.saved_tensors
            return tuple(ext.channel_scale_backward(grad, x, w))

    class Fp32ChannelScaleFn(torch.autograd.Function):
        @staticmethod
        @fp32_function(cast_output=True)
        def forward(ctx, x, w):
            assert x.dtype == w.dtype == F32 and not _caps.autocast_now('cpu')[0]
            ctx.save_for_backward(x, w)
            return ext.channel_scale_forward(x, w)

        @staticmethod
        @fp32_function
        def backward(ctx, grad):
            assert grad.dtype == F32
            x, w = ctx.saved_tensors
            return tuple(ext.channel_scale_backward(grad, x, w))

    return ChannelScaleFn, Fp32ChannelScaleFn


class ChannelScale(nn.Module):
    def __init__(self, op):
        super().__init__()
        self.weight = nn.Parameter(torch.linspace(0.5, 1.5, C))
        self.op = op

    def forward(self, x):
        return self.op(x, self.weight)


class Net(nn.Module):
    def __init__(self, op):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(C, C)
        self.scale = ChannelScale(op)
        self.fc2 = nn.Linear(C, 2)

    def forward(self, x):
        return self.fc2(self.scale(self.fc1(x)))


def data(n=8):
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, C, generator=g), torch.randn(n, 2, generator=g)


def grads(model):
    return {n: p.grad.float() for n, p in model.named_parameters()}


def reference_grads(op):
    """The gradients of one float32 step (the extension's float kernels)."""
    model = Net(op)
    x, y = data()
    F.mse_loss(model(x), y).backward()
    return grads(model)


def assert_close_grads(got, want, dtype):
    tol = 2e-2 if dtype == F16 else 6e-2
    assert sorted(got) == sorted(want)
    for name in want:
        err = ((got[name] - want[name]).norm() / want[name].norm()).item()
        assert err < tol, (name, err)


def ops(ext, how):
    """The op given to ChannelScale: the Function wrapped as ``how`` says."""
    plain, decorated = functions(ext)
    if how == 'apply':
        return fp32_function(plain.apply, cast_output=True)
    if how == 'forward':
        return decorated.apply
    return plain.apply  # 'none' and 'keep_fp32': the module does it


# ------------------------------------------------------------------ the errors


@pytest.mark.parametrize('dtype', [F16, BF16], ids=['float16', 'bfloat16'])
def test_the_kernel_has_no_half_instance_and_says_so(ext, dtype):
    x, w = torch.ones(2, C, dtype=dtype), torch.ones(C, dtype=dtype)
    with pytest.raises(RuntimeError) as caught:
        ext.channel_scale_forward(x, w)
    assert str(caught.value) == f'"channel_scale_forward" not implemented for \'{NAMES[dtype]}\''
    out = fp32_function(ext.channel_scale_forward, cast_output=True)(x, w)
    assert out.dtype == dtype and torch.equal(out, x)


@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES, ids=lambda d: _caps.NAMES[d])
def test_under_autocast_a_float32_weight_meets_a_half_input(ext, dtype):
    """Autocast does not know the extension: the module's float32 weight meets the half
    output of the Linear before it."""
    plain, _ = functions(ext)
    model = Net(plain.apply)
    with torch.autocast('cpu', dtype=dtype), pytest.raises(RuntimeError) as caught:
        model(data()[0])
    assert str(caught.value) == f'"channel_scale_forward" not implemented for \'{NAMES[dtype]}\''
    # A kernel that has half instances reads the float32 weight as half: the other text.
    x, w = torch.ones(2, C, dtype=dtype), torch.ones(C)
    with pytest.raises(RuntimeError) as caught:
        ext.channel_scale_forward_lowp(x, w)
    assert str(caught.value) == f'expected scalar type {NAMES[dtype]} but found Float'
    with torch.autocast('cpu', dtype=dtype):
        out = fp32_function(ext.channel_scale_forward_lowp)(x, w)
    assert out.dtype == F32 and torch.equal(out, torch.ones(2, C))


def test_the_legacy_backend_fails_in_the_half_model(ext):
    low = _caps.LEGACY_LOW
    plain, _ = functions(ext)
    model = wrap_fp16_model(Net(plain.apply), dtype=low, backend='legacy')
    with pytest.raises(RuntimeError, match=f"not implemented for '{NAMES[low]}'"):
        model(data()[0].to(low))


def test_a_float32_layer_in_a_half_model_needs_its_input_cast():
    """The third text: a layer kept in float32 by hand, fed the half model's output."""
    low = _caps.LEGACY_LOW
    conv = nn.Conv2d(2, 2, 1)
    x = torch.randn(1, 2, 3, 3)
    with pytest.raises(RuntimeError) as caught:
        conv(x.to(low))
    assert str(caught.value) == (f'Input type (c10::{NAMES[low]}) and bias type (float) '
                                 'should be the same')
    kept = keep_fp32(nn.Sequential(conv), '0')  # a module: keep_fp32
    want = F.conv2d(x.to(low).float(), conv.weight, conv.bias)
    assert torch.equal(kept(x.to(low)), want)
    out = fp32_function(F.conv2d, cast_output=True)(x.to(low), conv.weight, conv.bias)
    assert out.dtype == low and torch.equal(out, want.to(low))


# ------------------------------------------------------------------ the fixes


@pytest.mark.parametrize('how', ['apply', 'forward', 'keep_fp32'])
@pytest.mark.parametrize('dtype', _caps.LOW_DTYPES, ids=lambda d: _caps.NAMES[d])
def test_native_backend_runs_the_op_in_float32_with_close_gradients(ext, how, dtype):
    model = Net(ops(ext, how))
    if how == 'keep_fp32':
        keep_fp32(model, 'ChannelScale')
    seen = []
    model.scale.register_forward_hook(lambda m, i, o: seen.append((i[0].dtype, o.dtype)))
    x, y = data()
    with torch.autocast('cpu', dtype=dtype):
        out = model(x)
    # keep_fp32 hands float32 on; the Function wrapped with cast_output gives the input's.
    assert seen == [(dtype, F32 if how == 'keep_fp32' else dtype)] and out.dtype == dtype
    F.mse_loss(out.float(), y).backward()
    assert model.scale.weight.grad.dtype == F32
    assert_close_grads(grads(model), reference_grads(functions(ext)[0].apply), dtype)


@pytest.mark.parametrize('how', ['apply', 'forward', 'keep_fp32'])
def test_legacy_backend_runs_the_op_in_float32_with_close_gradients(ext, how):
    low = _caps.LEGACY_LOW
    model = Net(ops(ext, how))
    kept = ['ChannelScale'] if how == 'keep_fp32' else None
    wrap_fp16_model(model, dtype=low, backend='legacy', fp32_modules=kept)
    assert model.scale.weight.dtype == (F32 if kept else low)
    assert kept_fp32(model) == (['scale'] if kept else [])
    x, y = data()
    out = model(x.to(low))
    assert out.dtype == low
    F.mse_loss(out.float(), y).backward()
    assert model.scale.weight.grad.dtype == model.scale.weight.dtype
    assert model.fc1.weight.grad.dtype == low
    assert_close_grads(grads(model), reference_grads(functions(ext)[0].apply), low)


def train(model, wrapper, steps=3):
    x, y = data()
    losses = []
    for _ in range(steps):
        with wrapper.optim_context(model):
            loss = F.mse_loss(model(x).float(), y)
        wrapper.update_params(loss)
        losses.append(loss.item())
    return losses


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('how', ['apply', 'keep_fp32'])
def test_amp_optim_wrapper_trains_through_the_op_as_float32_does(ext, backend, how):
    dtype = _caps.LOW if backend == 'native' else _caps.LEGACY_LOW
    ref = Net(functions(ext)[0].apply)
    ref_losses = train(ref, _Sgd(ref))
    model = Net(ops(ext, how))
    kept = ['ChannelScale'] if how == 'keep_fp32' else None
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype=dtype,
                              backend=backend, model=model, fp32_modules=kept,
                              loss_scale=dict(init_scale=1.))
    losses = train(model, wrapper)
    assert losses[-1] < losses[0] and ref_losses[-1] < ref_losses[0]
    assert model.scale.weight.dtype == (dtype if backend == 'legacy' and not kept else F32)
    assert model.fc1.weight.dtype == (dtype if backend == 'legacy' else F32)
    got = {n: p.detach().float() for n, p in model.named_parameters()}
    want = {n: p.detach() for n, p in ref.named_parameters()}
    tol = 1e-2 if dtype == F16 else 3e-2
    for name in want:
        err = ((got[name] - want[name]).norm() / want[name].norm()).item()
        assert err < tol, (name, err)


class _Sgd:
    """The float32 reference: plain SGD with the wrapper's two calls."""

    def __init__(self, model):
        self.opt = torch.optim.SGD(model.parameters(), lr=0.1)

    def optim_context(self, model):
        return contextlib.nullcontext()

    def update_params(self, loss):
        loss.backward()
        self.opt.step()
        self.opt.zero_grad()


# ------------------------------------------------------------ torchvision's ops


@pytest.fixture(scope='module')
def tv_ops():
    """torchvision.ops, or a skip saying why it does not load next to this torch."""
    try:
        import torchvision.ops
    except Exception as err:  # noqa: BLE001 - ImportError, or a build for another torch
        line = str(err).strip().splitlines()[-1] if str(err).strip() else ''
        pytest.skip(f'torchvision does not load here ({type(err).__name__}: {line}); '
                    'its compiled ops need the torchvision built for this torch')
    return torchvision.ops


def test_roi_align_in_float32_for_half_features(tv_ops):
    g = torch.Generator().manual_seed(0)
    feat = torch.randn(1, C, 8, 8, generator=g)
    rois = torch.tensor([[0, 0.5, 0.5, 6.0, 6.0], [0, 2.0, 1.0, 7.5, 5.0]])
    want = tv_ops.roi_align(feat, rois, output_size=2, spatial_scale=1.0, sampling_ratio=2)
    roi_align = fp32_function(tv_ops.roi_align, cast_output=True)
    half = feat.to(_caps.LEGACY_LOW).requires_grad_()
    out = roi_align(half, rois.to(_caps.LEGACY_LOW), output_size=2, spatial_scale=1.0,
                    sampling_ratio=2)
    exact = tv_ops.roi_align(half.detach().float(), rois.to(_caps.LEGACY_LOW).float(), 2,
                             1.0, 2)
    assert out.dtype == _caps.LEGACY_LOW and torch.equal(out, exact.to(out.dtype))
    assert torch.allclose(out.float(), want, atol=5e-2)
    out.float().sum().backward()
    assert half.grad.dtype == _caps.LEGACY_LOW and half.grad.abs().sum() > 0


def test_nms_indices_are_not_cast(tv_ops):
    boxes = torch.tensor([[0., 0, 10, 10], [1, 1, 11, 11], [20, 20, 30, 30]])
    scores = torch.tensor([0.9, 0.8, 0.7])
    nms = fp32_function(tv_ops.nms, cast_output=True)
    keep = nms(boxes.to(_caps.LEGACY_LOW), scores.to(_caps.LEGACY_LOW), 0.5)
    assert keep.dtype == torch.int64 and keep.tolist() == [0, 2]


def test_deform_conv2d_in_float32_for_half_inputs(tv_ops):
    low = _caps.LEGACY_LOW
    g = torch.Generator().manual_seed(0)
    x = torch.randn(1, 2, 5, 5, generator=g)
    offset = torch.randn(1, 18, 5, 5, generator=g) * 0.5
    weight = torch.randn(3, 2, 3, 3, generator=g)
    deform = fp32_function(tv_ops.deform_conv2d, cast_output=True)
    half = x.to(low).requires_grad_()
    out = deform(half, offset.to(low), weight, padding=(1, 1))
    want = tv_ops.deform_conv2d(half.detach().float(), offset.to(low).float(), weight,
                                padding=(1, 1))
    assert out.dtype == low and torch.equal(out, want.to(low))
    out.float().sum().backward()
    assert half.grad.dtype == low


# ------------------------------------------------ docs/troubleshooting/no-half-kernel.md

PAGE = 'no-half-kernel.md'


def _said(block):
    """What the comments of the block's ``print(...)`` lines say they print."""
    return [c.strip() for c in re.findall(r'^\s*print\(.*\)\s+# (.+)$', block, re.M)]


def test_the_page_prints_what_its_comments_say(tmp_path, monkeypatch):
    ran = 0
    for body in scripts(PAGE):
        _, printed = run(body, PAGE, tmp_path, monkeypatch)
        said = _said(body)
        assert len(printed) == len(said)
        for line, comment in zip(printed, said):
            assert comment.startswith(line), (line, comment)
        ran += bool(said)
    assert ran == 3


def test_the_three_headings_are_the_errors_quoted_below_them(ext):
    """Each error heading is the start of the real message the block under it quotes."""
    text = (Path(__file__).resolve().parents[1] / 'docs' / 'troubleshooting' / PAGE).read_text()
    quoted = [b.strip() for lang, b in blocks(PAGE) if lang == 'text']
    headings = re.findall(r'^## (.+)$', text, re.M)[:3]
    assert headings == ['"..." not implemented for \'Half\'',
                        'expected scalar type Half but found Float',
                        'Input type (c10::Half) and bias type (float) should be the same']
    x, w = torch.ones(2, C, dtype=F16), torch.ones(C)
    with pytest.raises(RuntimeError) as no_kernel:
        ext.channel_scale_forward(x, w)
    with pytest.raises(RuntimeError) as mixed:
        ext.channel_scale_forward_lowp(x, w)
    with pytest.raises(RuntimeError) as layer:
        nn.Conv2d(1, 1, 1)(torch.ones(1, 1, 2, 2, dtype=F16))
    # (torch < 2 raised the first as a RuntimeError, of which NotImplementedError is one)
    assert [q.split(': ', 1)[1] for q in quoted] == [str(e.value) for e in (no_kernel, mixed,
                                                                             layer)]
    if isinstance(no_kernel.value, NotImplementedError):
        assert quoted[0].startswith('NotImplementedError: ')
    # The first heading stands for any kernel name: the quoted one's, with '...'.
    assert re.sub(r'"[^"]+"', '"..."', str(no_kernel.value)) == headings[0]
    assert headings[1:] == [str(mixed.value), str(layer.value)]
