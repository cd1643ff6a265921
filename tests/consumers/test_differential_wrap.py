"""Differential: ``wrap_fp16_model``, ``patch_norm_fp32``, ``patch_forward_method`` against mmcv's.

Real models of the codebases (mmdet's RetinaNet: ResNet-18 with BatchNorm, FPN, a
RetinaHead with GroupNorm; mmseg's EncoderDecoder: ResNetV1c with BatchNorm and a
UPerHead with GroupNorm), each wrapped by mmcv 1.7.2 and by fp16utils from the same
weights:

- the native backend against mmcv's ``wrap_fp16_model`` on the current torch, which
  only sets the flags: the same flags, float32 everywhere, the same outputs;
- the legacy backend against mmcv's ``wrap_fp16_model`` as it runs on torch < 1.6
  (``model.half()``, then ``patch_norm_fp32``, then the flags): the same dtype for
  every parameter and buffer, module by module, the same patched norms, the same
  outputs within the float16 tolerance of the tier.

The decorated methods of both models are fp16utils' (the patch is in place before
mmdet and mmseg are imported); mmcv's own decorators are compared in
``test_differential_decorators.py``.
"""

from __future__ import annotations

import copy
import logging
import pickle

import _consumers
import pytest

_consumers.require()

import mmcv  # noqa: E402
import torch  # noqa: E402
from _mmcv_ref import OLD_TORCH, call, compares, fp16_utils, shapes  # noqa: E402
from _same import difference  # noqa: E402
from mmdet.models import build_detector  # noqa: E402
from mmseg.models import build_segmentor  # noqa: E402
from torch import nn  # noqa: E402
from torch.nn.modules.batchnorm import _BatchNorm  # noqa: E402

import fp16utils  # noqa: E402

F32, F16 = torch.float32, torch.float16
GN = dict(type='GN', num_groups=4, requires_grad=True)
BN = dict(type='BN', requires_grad=True)


def _metas():
    meta = dict(img_shape=(64, 64, 3), pad_shape=(64, 64, 3), ori_shape=(64, 64, 3),
                scale_factor=1.0, flip=False, batch_input_shape=(64, 64))
    return [meta, dict(meta)]


def retinanet():
    """RetinaNet, its training forward (the losses) and the module whose output is watched."""
    head = dict(type='RetinaHead', num_classes=2, in_channels=16, stacked_convs=1,
                feat_channels=16, norm_cfg=GN,
                anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4,
                                      scales_per_octave=3, ratios=[0.5, 1.0, 2.0],
                                      strides=[8, 16, 32, 64]),
                bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[0.0] * 4,
                                target_stds=[1.0] * 4),
                loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0, alpha=0.25),
                loss_bbox=dict(type='SmoothL1Loss', beta=0.11))
    model = build_detector(mmcv.ConfigDict(
        type='RetinaNet',
        backbone=dict(type='ResNet', depth=18, base_channels=8, num_stages=4,
                      out_indices=(0, 1, 2, 3), norm_cfg=BN, style='pytorch'),
        neck=dict(type='FPN', in_channels=[8, 16, 32, 64], out_channels=16, start_level=1,
                  add_extra_convs='on_input', num_outs=4),
        bbox_head=head,
        train_cfg=dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.5, neg_iou_thr=0.4,
                                     min_pos_iou=0, ignore_iof_thr=-1),
                       allowed_border=-1, pos_weight=-1, debug=False)))
    boxes = [torch.tensor([[5., 5., 30., 40.]]),
             torch.tensor([[10., 20., 50., 60.], [0., 0., 20., 20.]])]
    labels = [torch.tensor([0]), torch.tensor([1, 0])]

    def forward(m, img):
        return m(img, _metas(), gt_bboxes=boxes, gt_labels=labels)

    return model, forward, 'bbox_head.retina_cls'


def encoder_decoder():
    """mmseg's EncoderDecoder with a UPerHead, its training forward, the watched module."""
    model = build_segmentor(mmcv.ConfigDict(
        type='EncoderDecoder',
        backbone=dict(type='ResNetV1c', depth=18, stem_channels=8, base_channels=8,
                      num_stages=4, out_indices=(0, 1, 2, 3), norm_cfg=BN, style='pytorch'),
        decode_head=dict(type='UPerHead', in_channels=[8, 16, 32, 64], in_index=[0, 1, 2, 3],
                         pool_scales=(1, 2, 3), channels=16, num_classes=2, norm_cfg=GN,
                         align_corners=False,
                         loss_decode=dict(type='CrossEntropyLoss', loss_weight=1.0)),
        train_cfg=dict(), test_cfg=dict(mode='whole')))
    seg = torch.zeros(2, 1, 64, 64, dtype=torch.long)
    seg[:, :, 10:40, 20:50] = 1

    def forward(m, img):
        return m(img, _metas(), gt_semantic_seg=seg)

    return model, forward, 'decode_head.conv_seg'


MODELS = {'mmdet RetinaNet': retinanet, 'mmseg EncoderDecoder UPerHead': encoder_decoder}
shapes('wrap_fp16_model', [f'{name}, {backend}' for name in MODELS
                           for backend in ('native', 'legacy')])
shapes('patch_norm_fp32', list(MODELS))


@pytest.fixture(scope='module', params=list(MODELS))
def built(request):
    """(a float32 model in eval mode, ``run(model) -> (losses, watched outputs)``)."""
    torch.manual_seed(0)
    model, forward, watched = MODELS[request.param]()
    for module in model.modules():  # batch statistics that are not 0 and 1
        if isinstance(module, _BatchNorm):
            module.running_mean.uniform_(-0.5, 0.5)
            module.running_var.uniform_(0.5, 2.0)
    model.eval()
    img = torch.randn(2, 3, 64, 64)

    def run(m):
        outputs = []
        handle = m.get_submodule(watched).register_forward_hook(
            lambda mod, args, out: outputs.append(out.detach()))
        with torch.no_grad():
            losses = forward(m, img)
        handle.remove()
        return [t for key in sorted(losses) for t in flat(losses[key])], outputs

    return model, run


def dtypes(model):
    """module name -> {tensor name: dtype} of its own parameters and buffers."""
    return {name: {n: t.dtype for n, t in [*module.named_parameters(recurse=False),
                                             *module.named_buffers(recurse=False)]}
            for name, module in model.named_modules()}


def flagged(model):
    return sorted(name for name, module in model.named_modules()
                  if getattr(module, 'fp16_enabled', False) is True)


def patched(model):
    """Names of the modules that have a forward of their own (a patched one)."""
    return sorted(name for name, module in model.named_modules() if 'forward' in vars(module))


def flat(outputs):
    if isinstance(outputs, torch.Tensor):
        return [outputs]
    return [t for item in outputs for t in flat(item)]


def test_native_backend_matches_mmcvs_wrap_on_this_torch(built):
    model, run = built
    theirs, mine = copy.deepcopy(model), copy.deepcopy(model)
    assert call(fp16_utils().wrap_fp16_model, theirs) == ('ok', None)
    fp16utils.wrap_fp16_model(mine, backend='native')
    assert flagged(mine) == flagged(theirs) != []
    assert dtypes(mine) == dtypes(theirs) == dtypes(model)  # float32 throughout
    assert patched(mine) == patched(theirs) == []
    (losses, outputs), (expected_losses, expected_outputs) = run(mine), run(theirs)
    assert len(losses) == len(expected_losses) and len(outputs) == len(expected_outputs) > 0
    for got, expected in zip(losses + outputs, expected_losses + expected_outputs):
        assert got.dtype == expected.dtype and torch.equal(got, expected)


def test_legacy_backend_matches_mmcvs_wrap_before_autocast(built):
    model, run = built
    theirs, mine = copy.deepcopy(model), copy.deepcopy(model)
    assert call(fp16_utils(OLD_TORCH).wrap_fp16_model, theirs) == ('ok', None)
    fp16utils.wrap_fp16_model(mine, backend='legacy')
    assert flagged(mine) == flagged(theirs) != []
    found = dtypes(mine)
    assert found == dtypes(theirs)
    assert {d for entry in found.values() for d in entry.values()} == {F32, F16, torch.int64}
    norms = sorted(name for name, m in model.named_modules() if isinstance(m, nn.GroupNorm))
    assert norms and patched(mine) == patched(theirs) == norms  # GroupNorm, not BatchNorm
    (losses, outputs), (expected_losses, expected_outputs) = run(mine), run(theirs)
    reference_losses, reference_outputs = run(model)
    tol = _consumers.TOL[F16]
    for got, expected, reference in zip(losses, expected_losses, reference_losses):
        assert got.dtype == expected.dtype == F32  # @force_fp32 losses
        assert abs(got - expected) <= tol['loss'] * abs(reference) + 1e-6
    assert len(outputs) == len(expected_outputs) > 0
    for got, expected, reference in zip(outputs, expected_outputs, reference_outputs):
        assert got.dtype == expected.dtype == F16
        assert (got.float() - expected.float()).abs().max() <= tol['out'] * reference.abs().max()


def test_patch_norm_fp32_matches_mmcvs(built):
    model, _ = built
    theirs, mine = copy.deepcopy(model).half(), copy.deepcopy(model).half()
    assert fp16_utils().patch_norm_fp32(theirs) is theirs
    assert fp16utils.patch_norm_fp32(mine) is mine
    assert dtypes(mine) == dtypes(theirs)
    assert patched(mine) == patched(theirs) != []
    torch.manual_seed(1)
    for (name, a), (_, b) in zip(mine.named_modules(), theirs.named_modules()):
        if isinstance(a, (nn.GroupNorm, _BatchNorm)):
            x = torch.randn(2, a.num_features if isinstance(a, _BatchNorm) else a.num_channels,
                            4, 4).half()
            with torch.no_grad():
                out_a, out_b = a(x), b(x)
            assert out_a.dtype == out_b.dtype and torch.equal(out_a, out_b), name


def _echo(*args, **kwargs):
    return args, kwargs


FORWARD_CASES = [(F16, F32, True), (F16, F32, False), (F32, F16, True), (F32, torch.bfloat16,
                                                                            False)]
shapes('patch_forward_method', [str(case) for case in FORWARD_CASES])


@pytest.mark.parametrize(('src', 'dst', 'convert'), FORWARD_CASES)
def test_patch_forward_method_matches_mmcvs(src, dst, convert):
    args = (torch.ones(2, dtype=src), [torch.ones(1, dtype=src), torch.arange(2), 'a'],
            {'k': torch.ones(1, dtype=dst)})
    kwargs = {'x': torch.ones(3, dtype=src), 'n': None}
    expected = fp16_utils().patch_forward_method(_echo, src, dst, convert)(*args, **kwargs)
    got = fp16utils.patch_forward_method(_echo, src, dst, convert)(*args, **kwargs)
    assert difference(got, expected) is None


# -- the differences docs/reference/differences-mmcv.md lists -----------------------------


@compares('wrap_fp16_model', ['difference: return value and recorded attributes'])
def test_difference_wrap_returns_the_model_and_records_its_dtype_and_backend():
    class Net(nn.Linear):
        fp16_enabled = False

    theirs, mine = Net(2, 2), Net(2, 2)
    assert fp16_utils().wrap_fp16_model(theirs) is None
    assert fp16utils.wrap_fp16_model(mine, backend='native') is mine
    assert set(vars(mine)) - set(vars(theirs)) == {'fp16_dtype', '_fp16_autocast'}
    assert (mine.fp16_dtype, mine._fp16_autocast) == (F16, True)


@compares('patch_norm_fp32', ['difference: deepcopy', 'difference: pickle'])
def test_difference_patched_group_norm_survives_deepcopy_and_pickle():
    def half_group_norm():
        torch.manual_seed(0)
        return nn.Sequential(nn.GroupNorm(2, 4)).half()

    x = torch.randn(1, 4, 3).half()
    for lib, copies_own_weights in ((fp16_utils(), False), (fp16utils, True)):
        model = lib.patch_norm_fp32(half_group_norm())
        duplicate = copy.deepcopy(model)
        with torch.no_grad():
            duplicate[0].weight.fill_(3.0)
            runs_copy = not torch.equal(duplicate(x), model(x))
        assert runs_copy is copies_own_weights  # mmcv's copy runs the original's weights
        status, _ = call(pickle.dumps, model)
        assert status == ('ok' if copies_own_weights else 'raises')


@compares('wrap_fp16_model', ['difference: scripted norm, legacy'])
@compares('patch_norm_fp32', ['difference: scripted norm'])
def test_difference_a_scripted_norm_is_refused(script):
    def model():
        return nn.Sequential(nn.Conv2d(2, 2, 1), script(nn.GroupNorm(1, 2))).half()

    theirs = fp16_utils().patch_norm_fp32(model())
    assert {p.dtype for p in theirs[1].parameters()} == {F16}  # left in half, silently
    mine = model()
    with pytest.raises(TypeError, match="TorchScript norm '1'"):
        fp16utils.patch_norm_fp32(mine)
    assert {p.dtype for p in mine.parameters()} == {F16}  # nothing changed
    with pytest.raises(TypeError, match='TorchScript'):
        fp16utils.wrap_fp16_model(nn.Sequential(script(nn.GroupNorm(1, 2))),
                                  backend='legacy')


UNCHECKED = [(None, None), (torch.int64, F32)]
shapes('patch_forward_method', [f'difference: {src}, {dst}' for src, dst in UNCHECKED])


@pytest.mark.parametrize(('src', 'dst'), UNCHECKED)
def test_difference_patch_forward_method_checks_its_dtypes(src, dst):
    out = fp16_utils().patch_forward_method(_echo, src, dst, False)(torch.arange(2))
    assert out[0][0].dtype == (dst or torch.int64)
    with pytest.raises(TypeError, match='floating-point torch dtypes'):
        fp16utils.patch_forward_method(_echo, src, dst)


logging.getLogger('mmcv').setLevel(logging.WARNING)
