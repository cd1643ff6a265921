"""mmcv 1.7.2's compiled CPU ops in float16 and bfloat16, and what fixes them.

Three things are checked on the real kernels (mmcv-full built by .ci/mmcvops):

- what ``fp16utils scan`` reads from the installed csrc predicts the kernels: an op
  whose CPU kernel lacks a dtype (no instance in its dispatch macro, or a kernel that
  reads float only) fails on tensors all in that dtype, with the error the
  troubleshooting pages quote; one whose kernel has it runs;
- under autocast (float16 activations next to float32 weights and boxes) and on the
  legacy backend (a half model), each op fails without help as shown, and runs with
  ``fp32_modules`` / ``keep_fp32`` (modules) or ``fp32_function`` (functions), its
  outputs and gradients close to float32's;
- ``fp16utils scan`` on mmdet's own DCN configs reports ``type='DCN'`` from the
  installed sources.

The precision doctor on mmdet's DCN detectors is in test_doctor_dcn.py.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path

import _mmcvops
import pytest

_mmcvops.require()

import torch  # noqa: E402
from mmcv import ops  # noqa: E402
from torch import nn  # noqa: E402

from fp16utils import fp32_function, keep_fp32, scan, wrap_fp16_model  # noqa: E402
from fp16utils.migrate import half_kernels  # noqa: E402
from fp16utils.migrate._csrc import FIXED_FLOAT  # noqa: E402

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
NAMES = {F16: 'Half', BF16: 'BFloat16'}
LOW = {F16: 'float16', BF16: 'bfloat16'}
TABLE = half_kernels.kernel_table()
#: Relative error (L2) allowed against float32, for outputs and gradients, with the op
#: itself in float32. Largest measured: 1.6e-2 (float16) and 2.3e-2 (bfloat16), both on
#: the gradients of the deformable convolution's offsets (their sum cancels: a bias
#: gradient small next to its terms).
TOL = {F16: 3e-2, BF16: 6e-2}


def rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.detach().double(), b.detach().double()
    return ((a - b).norm() / b.norm().clamp_min(1e-12)).item()


def gen(seed: int = 0) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


def boxes(n: int = 6, size: float = 32.) -> torch.Tensor:
    xy = torch.rand(n, 2, generator=gen(1)) * size / 2
    wh = 4 + torch.rand(n, 2, generator=gen(2)) * size / 2
    return torch.cat([xy, xy + wh], 1)


def rotated(n: int = 6) -> torch.Tensor:
    b = boxes(n)
    centre, wh = (b[:, :2] + b[:, 2:]) / 2, b[:, 2:] - b[:, :2]
    return torch.cat([centre, wh, torch.rand(n, 1, generator=gen(3))], 1)


def scores(n: int = 6) -> torch.Tensor:
    return torch.rand(n, generator=gen(4))


def rois(n: int = 4) -> torch.Tensor:
    return torch.cat([torch.zeros(n, 1), boxes(n, 16.)], 1)


# ------------------------------------------- the table predicts the compiled kernels

def _all_in(dtype: torch.dtype, through: torch.dtype = F32) -> dict:
    """Each op called with every tensor in ``dtype`` (no mixed dtypes): name -> thunk.

    Tensors and weights are rounded to ``through`` first: the float32 reference of a
    half run sees the same values.
    """
    def t(x: torch.Tensor) -> torch.Tensor:
        return x.to(through).to(dtype)

    torch.manual_seed(0)
    x = torch.randn(2, 4, 8, 8, generator=gen())
    feat = torch.randn(1, 4, 16, 16, generator=gen())
    dcn = ops.DeformConv2dPack(4, 4, 3, padding=1).to(through).to(dtype)
    mdcn = ops.ModulatedDeformConv2dPack(4, 4, 3, padding=1).to(through).to(dtype)
    rboxes = torch.cat([torch.zeros(4, 1), rotated(4)], 1)
    return {
        'DeformConv2dPack': lambda: dcn(t(x)),
        'ModulatedDeformConv2dPack': lambda: mdcn(t(x)),
        'RoIAlign': lambda: ops.RoIAlign(4, 1.0, 2)(t(feat), t(rois())),
        'RoIAlignRotated': lambda: ops.RoIAlignRotated(4, 1.0, 2)(t(feat), t(rboxes)),
        'nms': lambda: ops.nms(t(boxes()), t(scores()), 0.5),
        'nms_rotated': lambda: ops.nms_rotated(t(rotated()), t(scores()), 0.5),
        'box_iou_rotated': lambda: ops.box_iou_rotated(t(rotated()), t(rotated())),
    }


CASES = sorted(_all_in(F32))


def _expected_error(op: half_kernels.OpKernels, dtype: torch.dtype) -> str:
    cpu = [k for k in op.lacking(LOW[dtype]) if k.device == 'cpu']
    if any(k.dispatch == FIXED_FLOAT for k in cpu):
        return f'expected scalar type Float but found {NAMES[dtype]}'
    return f"not implemented for '{NAMES[dtype]}'"


def test_the_table_is_read_from_the_installed_sources():
    assert TABLE.from_sources and TABLE.version == '1.7.2'
    assert "read from mmcv 1.7.2's csrc at" in TABLE.source


@pytest.mark.parametrize('dtype', [F16, BF16], ids=['float16', 'bfloat16'])
@pytest.mark.parametrize('name', CASES)
def test_the_csrc_evidence_predicts_the_cpu_kernel(name, dtype):
    op = TABLE.op(name)
    assert op is not None and 'cpu' in {k.device for k in op.kernels}
    reference = _all_in(F32, through=dtype)[name]()
    call = _all_in(dtype)[name]
    if 'cpu' in op.devices_lacking(LOW[dtype]):
        with pytest.raises(RuntimeError) as raised:  # NotImplementedError is one
            call()
        assert _expected_error(op, dtype) in str(raised.value)
    else:
        out = call()
        out, reference = (out[0], reference[0]) if isinstance(out, tuple) else (out, reference)
        # The kernel computes in the low dtype (RoIAlignRotated's sampling points too:
        # 13% in float16): the same op, not float32's accuracy.
        assert out.dtype == dtype and torch.isfinite(out).all()
        assert rel(out, reference) < 0.25


def test_the_cases_cover_each_kind_of_evidence():
    """A macro with the dtype, a macro without it, a kernel that reads float only."""
    dispatches = {k.dispatch for name in CASES for k in TABLE.op(name).kernels
                  if k.device == 'cpu'}
    assert {'AT_DISPATCH_FLOATING_TYPES_AND_HALF', 'AT_DISPATCH_FLOATING_TYPES',
            FIXED_FLOAT} <= dispatches


# ------------------------------------------ modules: fail, then fp32_modules fixes them

class DeformNet(nn.Module):
    """A convolution, an mmcv deformable convolution (v1 or v2), a convolution."""

    def __init__(self, modulated: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        dcn = ops.ModulatedDeformConv2dPack if modulated else ops.DeformConv2dPack
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.dcn = dcn(4, 4, 3, padding=1)
        self.head = nn.Conv2d(4, 2, 1)
        # Offsets that move the samples off the grid (zero at init: every sample on a
        # pixel, where the bilinear weights' gradient jumps and rounding picks a side).
        with torch.no_grad():
            self.dcn.conv_offset.weight.normal_(0, 0.01, generator=gen(5))

    def forward(self, x):
        return self.head(torch.relu(self.dcn(torch.relu(self.stem(x)))))


class RoINet(nn.Module):
    """A convolution, mmcv's RoIAlign on float32 boxes (as a detector's are), a linear."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.stem = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = ops.RoIAlign(4, 1.0, 2)
        self.fc = nn.Linear(64, 3)

    def forward(self, x, boxes):
        return self.fc(self.pool(self.stem(x), boxes).flatten(1))


def _inputs(model: nn.Module) -> tuple:
    x = torch.randn(2, 3, 16, 16, generator=gen(6))
    return (x, rois()) if isinstance(model, RoINet) else (x,)


def _run(model: nn.Module, args: tuple, dtype=None, legacy: bool = False) -> tuple:
    """(output as float32, the first input's gradient, the parameters' gradients)."""
    x = args[0].to(dtype).requires_grad_() if legacy else args[0].clone().requires_grad_()
    if dtype is None or legacy:
        out = model(x, *args[1:])
    else:
        with torch.autocast('cpu', dtype=dtype):
            out = model(x, *args[1:])
    out.float().square().mean().backward()
    grads = {n: p.grad.float() for n, p in model.named_parameters() if p.grad is not None}
    return out.float(), x.grad.float(), grads


def _close(got: tuple, want: tuple, dtype: torch.dtype) -> None:
    (out, gx, grads), (out32, gx32, grads32) = got, want
    assert rel(out, out32) < TOL[dtype]
    assert rel(gx, gx32) < TOL[dtype]
    assert grads.keys() == grads32.keys()
    for name in grads32:
        assert rel(grads[name], grads32[name]) < TOL[dtype], name


MODULES = [
    # (model, class to keep, dtype, backend, the error without help; None: it runs)
    (DeformNet, 'DeformConv2dPack', BF16, 'native',
     '"deformable_im2col_cpu" not implemented for \'BFloat16\''),
    (DeformNet, 'DeformConv2dPack', BF16, 'legacy',
     '"deformable_im2col_cpu" not implemented for \'BFloat16\''),
    (DeformNet, 'DeformConv2dPack', F16, 'native', None),
    (DeformNet, 'DeformConv2dPack', F16, 'legacy', None),
    (lambda: DeformNet(modulated=True), 'ModulatedDeformConv2dPack', BF16, 'native',
     '"modulated_deformable_im2col_cpu" not implemented for \'BFloat16\''),
    (lambda: DeformNet(modulated=True), 'ModulatedDeformConv2dPack', BF16, 'legacy',
     '"modulated_deformable_im2col_cpu" not implemented for \'BFloat16\''),
    (RoINet, 'RoIAlign', F16, 'native', 'expected scalar type Half but found Float'),
    (RoINet, 'RoIAlign', F16, 'legacy', 'expected scalar type Half but found Float'),
    (RoINet, 'RoIAlign', BF16, 'native', '"ROIAlign_forward" not implemented for \'BFloat16\''),
]


def _id(case: tuple) -> str:
    return f'{case[1]}-{LOW[case[2]]}-{case[3]}'


@pytest.mark.parametrize('make, keep, dtype, backend, error', MODULES,
                         ids=[_id(c) for c in MODULES])
def test_a_module_fails_without_help(make, keep, dtype, backend, error):
    model = make()
    args = _inputs(model)
    if backend == 'legacy':
        wrap_fp16_model(model, dtype=dtype, backend='legacy')
    if error is None:  # the kernel has this dtype and mmcv casts the weight to the input's
        out = _run(model, args, dtype, legacy=backend == 'legacy')[0]
        assert torch.isfinite(out).all()
        return
    with pytest.raises(RuntimeError) as raised:
        _run(model, args, dtype, legacy=backend == 'legacy')
    assert str(raised.value).splitlines()[0] == error


@pytest.mark.parametrize('make, keep, dtype, backend, error', MODULES,
                         ids=[_id(c) for c in MODULES])
def test_fp32_modules_runs_it_with_gradients_close_to_float32(make, keep, dtype, backend,
                                                              error):
    model = make()
    args = _inputs(model)
    reference = _run(copy.deepcopy(model), args)
    if backend == 'legacy':
        wrap_fp16_model(model, dtype=dtype, backend='legacy', fp32_modules=[keep])
    else:
        keep_fp32(model, [keep])
    kept = next(m for m in model.modules() if type(m).__name__ == keep)
    assert all(p.dtype == F32 for p in kept.parameters())
    got = _run(model, args, dtype, legacy=backend == 'legacy')
    _close(got, reference, dtype)


# ------------------------------------------------------ functions: fp32_function

def test_roi_align_function_in_float32_for_half_features():
    feat = torch.randn(1, 4, 16, 16, generator=gen(7))
    want = ops.roi_align(feat, rois(), 4, 1.0, 2)
    for dtype in (F16, BF16):
        half = feat.to(dtype).requires_grad_()
        with pytest.raises(RuntimeError):
            ops.roi_align(half, rois(), 4, 1.0, 2)
        out = fp32_function(ops.roi_align, cast_output=True)(half, rois(), 4, 1.0, 2)
        assert out.dtype == dtype and rel(out, want) < TOL[dtype]
        out.float().sum().backward()
        assert half.grad.dtype == dtype and half.grad.abs().sum() > 0


@pytest.mark.parametrize('dtype', [F16, BF16], ids=['float16', 'bfloat16'])
def test_nms_in_float32_keeps_what_float32_keeps(dtype):
    want_dets, want_keep = ops.nms(boxes(), scores(), 0.3)
    with pytest.raises(RuntimeError, match=f'expected scalar type Float but found {NAMES[dtype]}'):
        ops.nms(boxes().to(dtype), scores().to(dtype), 0.3)
    dets, keep = fp32_function(ops.nms, cast_output=True)(boxes().to(dtype),
                                                          scores().to(dtype), 0.3)
    assert keep.dtype == torch.int64 and keep.tolist() == want_keep.tolist()
    assert dets.dtype == dtype and torch.equal(dets, want_dets.to(dtype))


@pytest.mark.parametrize('dtype', [F16, BF16], ids=['float16', 'bfloat16'])
def test_nms_rotated_in_float32(dtype):
    want_dets, want_keep = ops.nms_rotated(rotated(), scores(), 0.3)
    with pytest.raises(RuntimeError, match=f'"nms_rotated" not implemented for '
                                           f"'{NAMES[dtype]}'"):
        ops.nms_rotated(rotated().to(dtype), scores().to(dtype), 0.3)
    dets, keep = fp32_function(ops.nms_rotated)(rotated().to(dtype), scores().to(dtype), 0.3)
    assert keep.tolist() == want_keep.tolist() and dets.dtype == F32


# ------------------------------------------------------ scan on mmdet's own configs

def test_scan_reports_the_dcn_type_of_mmdets_configs():
    import mmdet

    configs = Path(mmdet.__file__).parent / '.mim' / 'configs' / 'dcn'
    found = [f for f in scan(configs) if f.kind == 'half-kernel']
    assert found, 'no half-kernel finding in mmdet/.mim/configs/dcn'
    text = {Path(f.path).name: f for f in found}
    dcn = text['mask_rcnn_r50_fpn_dconv_c3-c5_1x_coco.py']
    source = dcn.path and Path(dcn.path).read_text().splitlines()[dcn.line - 1]
    assert "type='DCN'" in source
    assert dcn.message.startswith("config type='DCN' (mmcv.ops.DeformConv2dPack): "
                                  'no bfloat16 kernel on cpu or cuda; evidence: ')
    assert 'pytorch/cpu/deform_conv.cpp AT_DISPATCH_FLOATING_TYPES_AND_HALF' in dcn.message
    assert "read from mmcv 1.7.2's csrc at" in dcn.message
    assert "fp32_modules=['DeformConv2dPack']" in dcn.suggestion
    assert re.search(r'not-implemented-for-half\.md$', dcn.suggestion)


# ---------------------------------------- the troubleshooting pages quote these kernels

PAGES = Path(__file__).resolve().parents[2] / 'docs' / 'troubleshooting'


def _raised(fn) -> str:
    with pytest.raises(RuntimeError) as caught:
        fn()
    return f'{type(caught.value).__name__}: {str(caught.value).splitlines()[0]}'


def _page(name: str) -> str:
    return ' '.join((PAGES / name).read_text().split())


def test_the_troubleshooting_pages_quote_mmcvs_own_errors():
    x = torch.randn(1, 4, 8, 8, generator=gen(8))
    dcn = _raised(lambda: ops.DeformConv2dPack(4, 4, 3, padding=1).to(BF16)(x.to(BF16)))
    assert dcn == 'NotImplementedError: "deformable_im2col_cpu" not implemented for \'BFloat16\''
    not_implemented = (PAGES / 'not-implemented-for-half.md').read_text()
    assert f'```text\n{dcn}\n```' in not_implemented  # the page's first block
    roi = _raised(lambda: ops.RoIAlign(4, 1.0, 2)(x.to(BF16), rois().to(BF16)))
    rotated_nms = _raised(lambda: ops.nms_rotated(rotated().to(F16), scores().to(F16), 0.5))
    for said in (roi, rotated_nms):
        assert f'`{said.split(": ", 1)[1]}`' in _page('not-implemented-for-half.md')
    model = RoINet()
    with torch.autocast('cpu', dtype=F16):
        mixed = _raised(lambda: model(*_inputs(model)))
    assert f'```text\n{mixed}\n```' in (PAGES / 'expected-scalar-type.md').read_text()
    carafe = _raised(lambda: ops.CARAFEPack(4, 2)(x.to(F16)))
    assert f'```text\n{carafe}\n```' in (PAGES / 'input-type-bias-type.md').read_text()
    assert 'CARAFE upsampler (`CARAFEPack`) raises the first line' in _page(
        'input-type-bias-type.md')
