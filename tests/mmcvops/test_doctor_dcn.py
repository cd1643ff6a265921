"""The precision doctor on mmdet 2.28.2's own DCN detectors, with mmcv's real kernels.

The models are built by mmdet's registry from the configs mmdet ships
(``mmdet/.mim/configs/dcn``): Mask R-CNN and Faster R-CNN, ResNet-50 with deformable
convolutions in stages c3-c5 (13 ``DeformConv2dPack``), default initialisation, one
random 128x128 image (the smallest size whose last stage still covers the 3x3
deformable kernel). mmcv 1.7.2's CPU deformable convolution has float16 kernels and
no bfloat16 ones: in bfloat16 the doctor names the 13 modules, and with its
``fp32_modules`` the detector takes training steps in bfloat16 and float16.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import _mmcvops
import pytest

_mmcvops.require()

import mmcv  # noqa: E402
import mmdet  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from mmdet.core import BitmapMasks  # noqa: E402
from mmdet.models import build_detector  # noqa: E402

from fp16utils import AmpOptimWrapper, diagnose_precision  # noqa: E402
from fp16utils.tools import cli  # noqa: E402

CONFIGS = Path(mmdet.__file__).parent / '.mim' / 'configs' / 'dcn'
MASK_RCNN = CONFIGS / 'mask_rcnn_r50_fpn_dconv_c3-c5_1x_coco.py'
FASTER_RCNN = CONFIGS / 'faster_rcnn_r50_fpn_dconv_c3-c5_1x_coco.py'
SIZE = 128
DCN = [f'backbone.layer{stage}.{block}.conv2'
       for stage, blocks in ((2, 4), (3, 6), (4, 3)) for block in range(blocks)]
NO_BFLOAT16 = 'NotImplementedError: "deformable_im2col_cpu" not implemented for \'BFloat16\''


def mask_rcnn() -> torch.nn.Module:
    cfg = mmcv.Config.fromfile(str(MASK_RCNN))
    torch.manual_seed(0)
    model = build_detector(cfg.model, train_cfg=cfg.get('train_cfg'),
                           test_cfg=cfg.get('test_cfg'))
    return model.train()


def batch() -> tuple:
    """One random image with three boxes, their labels and their masks."""
    img = torch.randn(1, 3, SIZE, SIZE, generator=torch.Generator().manual_seed(0))
    hw3 = (SIZE, SIZE, 3)
    metas = [dict(img_shape=hw3, ori_shape=hw3, pad_shape=hw3, batch_input_shape=(SIZE, SIZE),
                  scale_factor=np.ones(4, dtype=np.float32), flip=False, flip_direction=None)]
    boxes = torch.tensor([[10., 12, 70, 80], [40, 30, 120, 100], [5, 60, 50, 120]])
    masks = np.zeros((3, SIZE, SIZE), np.uint8)
    for i, (x1, y1, x2, y2) in enumerate(boxes.int().tolist()):
        masks[i, y1:y2, x1:x2] = 1
    return img, dict(img_metas=metas, gt_bboxes=[boxes], gt_labels=[torch.tensor([1, 2, 3])],
                     gt_masks=[BitmapMasks(masks, SIZE, SIZE)])


@pytest.fixture(scope='module')
def bfloat16_report():
    img, kwargs = batch()
    return diagnose_precision(mask_rcnn(), img, dtype='bfloat16', **kwargs)


def test_the_doctor_names_the_deformable_convolutions_in_bfloat16(bfloat16_report):
    errors = [p for p in bfloat16_report.problems if p.kind == 'dtype-error']
    assert [(p.name, p.module_type, p.detail) for p in errors] == [
        (name, 'DeformConv2dPack', NO_BFLOAT16) for name in DCN]
    # Every DeformConv2dPack of the model is named: the fix keeps the class.
    assert 'DeformConv2dPack' in bfloat16_report.fp32_modules
    kept = set(bfloat16_report.fp32_modules) - {'DeformConv2dPack'}
    assert all(p.kind == 'drift' for p in bfloat16_report.problems if p.name in kept)


@pytest.mark.parametrize('dtype', ['bfloat16', 'float16'])
def test_with_the_doctors_fp32_modules_mask_rcnn_trains(bfloat16_report, dtype):
    model = mask_rcnn()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01), dtype=dtype,
                              loss_scale=dict(init_scale=2.**8), model=model,
                              fp32_modules=bfloat16_report.fp32_modules)
    img, kwargs = batch()
    with wrapper.optim_context(model):  # one step: float16 convolutions are slow on a CPU
        loss, _ = model._parse_losses(model(img, return_loss=True, **kwargs))
    assert torch.isfinite(loss)
    wrapper.update_params(loss)
    assert wrapper.skipped_steps == 0 and wrapper.last_result.stepped
    for name in DCN:
        dcn = model.get_submodule(name)
        assert dcn.weight.dtype == torch.float32
        assert not torch.equal(dcn.weight, before[f'{name}.weight'])  # trained


def test_without_the_fix_a_bfloat16_step_raises_the_kernels_error():
    model = mask_rcnn()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01), dtype='bfloat16')
    img, kwargs = batch()
    with pytest.raises(NotImplementedError) as raised:
        with wrapper.optim_context(model):
            model(img, return_loss=True, **kwargs)
    assert f'{type(raised.value).__name__}: {raised.value}' == NO_BFLOAT16
    assert wrapper.skipped_steps == 0 and not any(
        p.grad is not None for p in model.parameters())


def test_the_doctor_command_on_the_faster_rcnn_config_finds_nothing_in_float16():
    """mmcv 1.7.2's CPU deformable convolution has float16 kernels, and mmdet's RoI
    extractor runs RoIAlign in float32 (``@force_fp32``)."""
    out = io.StringIO()
    code = cli.main(['doctor', str(FASTER_RCNN), '--dtype', 'float16', '--input-shape',
                     f'1,3,{SIZE},{SIZE}', '--json'], out=out)
    report = json.loads(out.getvalue())
    assert code == 0 and report['ok'] and report['problems'] == []
    assert report['verified'] and report['backward'] == 'ran'
    assert report['input'].startswith(f'1 random images 3x{SIZE}x{SIZE} from --input-shape')


def test_the_doctor_command_builds_mask_rcnn_with_masks_and_names_the_dcn_layers():
    """``fp16utils doctor CONFIG`` gives a mask head its gt_masks (boxes filled), so the
    float32 reference runs, and names the deformable convolutions in bfloat16."""
    out = io.StringIO()
    code = cli.main(['doctor', str(MASK_RCNN), '--dtype', 'bfloat16', '--input-shape',
                     f'1,3,{SIZE},{SIZE}', '--json'], out=out)
    report = json.loads(out.getvalue())
    assert code == 1 and report['float32_error'] is None
    assert 'gt_masks filling them' in report['input']
    assert 'DeformConv2dPack' in report['fp32_modules']
    named = {p['name'] for p in report['problems'] if p['kind'] == 'dtype-error'}
    assert named and all(n.startswith('backbone.layer') and n.endswith('.conv2') for n in named)
