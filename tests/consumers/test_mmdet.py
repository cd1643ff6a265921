"""mmdet 2.28: RetinaNet trains through ``train_detector`` with fp16 configs, unchanged.

The float32 comparisons use fixed initial weights and BatchNorm in eval mode (so they
do not hang on batch statistics over two images); the tolerances are
``_consumers.TOL``.
"""

from __future__ import annotations

import copy
import sys
from pathlib import Path

import _consumers
import _tiny
import pytest

_consumers.require()

import mmcv  # noqa: E402
import mmcv.runner  # noqa: E402
import torch  # noqa: E402
from _consumers import PROBE, TOL, iters, load_meta, loss_grads_outputs, mean, run_fp16utils, train  # noqa: E402
from mmdet.models import build_detector  # noqa: E402

import fp16utils  # noqa: E402
import fp16utils.mmcv  # noqa: E402

#: The loss-scaler state saved by a run that scaled nothing, configured with loss_scale=512.
UNSCALED_512 = dict(scale=512.0, growth_factor=2.0, backoff_factor=0.5, growth_interval=2000,
                    _growth_tracker=0)


@pytest.fixture(scope='module')
def coco(tmp_path_factory):
    return _tiny.make_coco(tmp_path_factory.mktemp('coco'), n=6)  # 3 iterations an epoch


def went_down(run):
    """The last epoch's mean loss is below the first's (the same images, shuffled)."""
    return mean([r['loss'] for r in run[-3:]]) < mean([r['loss'] for r in run[:3]])


def resumed_from(cfg, checkpoint, work_dir, epochs=2):
    return _tiny.with_changes(cfg, resume_from=str(checkpoint), work_dir=str(work_dir),
                              runner=dict(type='EpochBasedRunner', max_epochs=epochs))


def test_retinanet_trains_with_a_dynamic_scale_and_resumes_it(coco, tmp_path, probe):
    loss_scale = dict(init_scale=2.**10, growth_interval=2)
    cfg = _tiny.retinanet(coco, str(tmp_path), max_epochs=3, fp16=dict(loss_scale=loss_scale))
    cfg['custom_hooks'] = PROBE
    train(cfg)
    run = iters(probe)
    hook = run[0]['hook']
    # mmdet's train_detector built the hook from `fp16 = dict(...)`: ours, a real mmcv Hook.
    assert type(hook) is fp16utils.mmcv.Fp16OptimizerHook
    assert isinstance(hook, mmcv.runner.Hook)
    assert hook.priority == mmcv.runner.get_priority('ABOVE_NORMAL')
    assert [r['scale'] for r in run] == [1024., 2048., 2048., 4096., 4096., 8192., 8192.,
                                         16384., 16384.]
    assert [r['skipped'] for r in run] == [0] * 9
    assert {r['loss_dtype'] for r in run} == {torch.float32}  # @force_fp32 on the loss
    assert {r['param_dtype'] for r in run} == {torch.float32}  # native: float32 weights
    assert went_down(run)
    saved = load_meta(tmp_path / 'epoch_1.pth')['fp16']
    assert saved['loss_scaler']['scale'] == 2048. and saved['loss_scaler']['_growth_tracker'] == 1

    probe.clear()
    train(resumed_from(cfg, tmp_path / 'epoch_1.pth', tmp_path / 'resumed'))
    start = probe[0]
    assert start['stage'] == 'before_run' and start['iter'] == 3
    assert start['scale'] == saved['loss_scaler']['scale'] == 2048.
    # The growth tracker came back too: the scale goes on exactly as without the stop.
    assert [r['scale'] for r in iters(probe)] == [r['scale'] for r in run[3:6]]


def test_retinanet_legacy_backend_half_weights_masters_and_resume(coco, tmp_path, probe):
    loss_scale = dict(init_scale=2.**9, mode='dynamic', scale_window=2)
    cfg = _tiny.retinanet(coco, str(tmp_path), max_epochs=3,
                          fp16=dict(loss_scale=loss_scale, backend='legacy'))
    cfg['custom_hooks'] = PROBE
    model = train(cfg)
    run = iters(probe)
    assert {r['param_dtype'] for r in run} == {torch.float16}  # the model itself is half
    assert model.backbone.conv1.weight.dtype == torch.float16
    assert model.backbone.bn1.weight.dtype == torch.float32  # norms stay float32
    assert {r['loss_dtype'] for r in run} == {torch.float32}
    assert sum(r['skipped'] for r in run) == 0
    assert went_down(run)
    saved = load_meta(tmp_path / 'epoch_1.pth')['fp16']
    assert set(saved['loss_scaler']) >= {'cur_scale', 'cur_iter', 'mode', 'scale_window'}
    assert saved['loss_scaler']['cur_scale'] == run[2]['scale'] > 512.
    assert all(m.dtype == torch.float32 for m in saved['master_params'])

    probe.clear()
    train(resumed_from(cfg, tmp_path / 'epoch_1.pth', tmp_path / 'resumed'))
    assert probe[0]['scale'] == saved['loss_scaler']['cur_scale']
    assert [r['scale'] for r in iters(probe)] == [r['scale'] for r in run[3:6]]


def test_retinanet_bfloat16_trains_without_loss_scaling(coco, tmp_path, probe):
    # Four epochs: bfloat16's coarser rounding makes three short epochs too noisy to rank.
    cfg = _tiny.retinanet(coco, str(tmp_path), max_epochs=4,
                          fp16=dict(loss_scale=512., dtype='bfloat16'))
    cfg['custom_hooks'] = PROBE
    train(cfg)
    run = iters(probe)
    assert run[0]['hook'].dtype == torch.bfloat16
    assert {r['scale'] for r in run} == {1.0}  # bfloat16 has float32's range
    assert went_down(run)
    # Nothing scaled, and the state saved is what a scaled run would start from, in
    # GradScaler's keys (mmcv's own hook on a GPU refuses an empty one).
    assert load_meta(tmp_path / 'epoch_4.pth')['fp16']['loss_scaler'] == UNSCALED_512


def test_resumes_a_checkpoint_written_by_mmcvs_own_hook(coco, tmp_path, probe, monkeypatch):
    """mmcv's Fp16OptimizerHook writes the checkpoint (its GradScaler on the CPU), ours resumes.

    Then a state in mmcv's LossScaler format, on the legacy backend.
    """
    fp16utils.unpatch_mmcv()
    optimizer_module = sys.modules['mmcv.runner.hooks.optimizer']
    monkeypatch.setattr(optimizer_module, 'GradScaler',
                        lambda **kwargs: torch.amp.GradScaler('cpu', **kwargs))
    loss_scale = dict(init_scale=2.**10, growth_interval=2)
    mmcv_cfg = _tiny.retinanet(coco, str(tmp_path), max_epochs=1)
    mmcv_cfg['optimizer_config'] = dict(type='Fp16OptimizerHook', loss_scale=loss_scale)
    mmcv_cfg['custom_hooks'] = PROBE
    train(mmcv_cfg)
    assert probe[0]['hook'] is None  # mmcv's own hook ran (the registry's, unpatched)
    written = load_meta(tmp_path / 'epoch_1.pth')['fp16']['loss_scaler']
    assert written['scale'] == 2048. and 'stats' not in load_meta(tmp_path / 'epoch_1.pth')['fp16']

    fp16utils.patch_mmcv()
    probe.clear()
    ours = resumed_from(mmcv_cfg, tmp_path / 'epoch_1.pth', tmp_path / 'ours')
    train(ours)
    assert type(probe[0]['hook']) is fp16utils.mmcv.Fp16OptimizerHook
    assert probe[0]['scale'] == 2048.
    assert [r['scale'] for r in iters(probe)] == [4096., 4096., 8192.]

    # mmcv's LossScaler state (what its legacy hook saved), loaded on our legacy backend.
    fp16utils.unpatch_mmcv()
    mmcv_scaler = mmcv.runner.fp16_utils.LossScaler(init_scale=2.**8, scale_window=1)
    mmcv_scaler.update_scale(False)
    fp16utils.patch_mmcv()
    checkpoint = torch.load(tmp_path / 'epoch_1.pth', map_location='cpu', weights_only=False)
    checkpoint['meta']['fp16'] = {'loss_scaler': mmcv_scaler.state_dict()}
    torch.save(checkpoint, tmp_path / 'mmcv_legacy.pth')
    probe.clear()
    legacy = resumed_from(ours, tmp_path / 'mmcv_legacy.pth', tmp_path / 'legacy')
    legacy['optimizer_config'] = dict(type='Fp16OptimizerHook', backend='legacy',
                                      loss_scale=dict(mode='dynamic', scale_window=1))
    train(legacy)
    assert probe[0]['scale'] == mmcv_scaler.loss_scale == 512.
    assert probe[0]['hook'].backend == 'legacy'


# -- the decorated modules themselves, with the same weights as float32 ------------------


def _batch():
    torch.manual_seed(0)
    img = torch.randn(2, 3, 64, 64)
    meta = dict(img_shape=(64, 64, 3), pad_shape=(64, 64, 3), ori_shape=(64, 64, 3),
                scale_factor=1.0, flip=False, batch_input_shape=(64, 64))
    boxes = [torch.tensor([[5., 5., 30., 40.]]), torch.tensor([[10., 20., 50., 60.],
                                                               [0., 0., 20., 20.]])]
    return img, [meta, meta], boxes, [torch.tensor([0]), torch.tensor([1, 0])]


def _loss_grads_outputs(model):
    img, metas, boxes, labels = _batch()
    loss, grads, outputs = loss_grads_outputs(model, model.bbox_head.retina_cls, img, metas,
                                              gt_bboxes=boxes, gt_labels=labels)
    return loss, grads, [out.float() for out in outputs]


def _record_input(module, seen, key):
    """Record the dtype of ``module``'s first input, once."""

    def pre_hook(mod, args):
        seen.setdefault(key, args[0].dtype)

    module.register_forward_pre_hook(pre_hook)


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_retinanet_modules_keep_the_decorator_contract_and_match_float32(coco, tmp_path,
                                                                         dtype, backend):
    cfg = mmcv.Config(_tiny.retinanet(coco, str(tmp_path)))
    torch.manual_seed(0)
    reference = build_detector(cfg.model)
    reference.init_weights()
    reference.eval()  # BatchNorm from running statistics: a stable comparison
    low = copy.deepcopy(reference)
    loss32, grads32, outputs32 = _loss_grads_outputs(reference)
    assert {o.dtype for o in outputs32} == {torch.float32}  # fp16_enabled False: untouched

    fp16utils.wrap_fp16_model(low, dtype, backend=backend)
    seen = {}
    _record_input(low.backbone.conv1, seen, 'backbone input')
    _record_input(low.neck.lateral_convs[0].conv, seen, 'FPN input')
    loss_single = low.bbox_head.loss_single

    def recording_loss_single(cls_score, bbox_pred, *args, **kwargs):
        seen.setdefault('loss input', (cls_score.dtype, bbox_pred.dtype))
        seen.setdefault('autocast in loss', torch.is_autocast_enabled('cpu'))
        return loss_single(cls_score, bbox_pred, *args, **kwargs)

    low.bbox_head.loss_single = recording_loss_single
    loss, grads, outputs = _loss_grads_outputs(low)
    # BaseDetector.forward is @auto_fp16(apply_to=('img',)), FPN.forward @auto_fp16(),
    # AnchorHead.loss @force_fp32(apply_to=('cls_scores', 'bbox_preds')):
    assert seen['backbone input'] == dtype
    assert seen['FPN input'] == dtype
    assert seen['loss input'] == (torch.float32, torch.float32)
    assert seen['autocast in loss'] is False
    assert loss.dtype == torch.float32
    assert {o.dtype for o in outputs} == {torch.float32}  # recorded as float; computed low
    tol = TOL[dtype]
    assert abs(loss - loss32) <= tol['loss'] * abs(loss32)
    assert (grads - grads32).norm() <= tol['grad'] * grads32.norm()
    for out, out32 in zip(outputs, outputs32):
        assert (out - out32).abs().max() <= tol['out'] * out32.abs().max()


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
def test_rpn_and_bbox_head_losses_take_float32_and_match(dtype):
    from mmdet.models.dense_heads import RPNHead
    from mmdet.models.roi_heads.bbox_heads import BBoxHead

    torch.manual_seed(0)
    bbox_head = BBoxHead(with_avg_pool=True, roi_feat_size=7, in_channels=16, num_classes=2)
    bbox_head.init_weights()
    feats = torch.randn(6, 16, 7, 7)
    rois = torch.cat([torch.zeros(6, 1), torch.rand(6, 4) * 32], dim=1)
    labels = torch.tensor([0, 1, 2, 0, 1, 2])
    targets = (labels, torch.ones(6), torch.randn(6, 4), torch.ones(6, 4))
    cls32, reg32 = bbox_head(feats)
    losses32 = bbox_head.loss(cls32, reg32, rois, *targets)
    fp16utils.wrap_fp16_model(bbox_head, dtype)
    cls, reg = bbox_head(feats)  # BBoxHead.forward: @auto_fp16()
    assert cls.dtype == reg.dtype == dtype
    losses = bbox_head.loss(cls, reg, rois, *targets)  # @force_fp32: float32 inside
    tol = TOL[dtype]['loss']
    for key in ('loss_cls', 'loss_bbox'):
        assert losses[key].dtype == torch.float32
        assert abs(losses[key] - losses32[key]) <= tol * abs(losses32[key]) + 1e-6

    rpn = RPNHead(
        in_channels=16, feat_channels=16,
        anchor_generator=dict(type='AnchorGenerator', scales=[8], ratios=[0.5, 1.0, 2.0],
                              strides=[8, 16]),
        train_cfg=mmcv.ConfigDict(
            assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.7, neg_iou_thr=0.3,
                          min_pos_iou=0.3, match_low_quality=True, ignore_iof_thr=-1),
            sampler=dict(type='RandomSampler', num=64, pos_fraction=0.5, neg_pos_ub=-1,
                         add_gt_as_proposals=False),
            allowed_border=-1, pos_weight=-1, debug=False))
    rpn.init_weights()
    feats = [torch.randn(2, 16, 8, 8), torch.randn(2, 16, 4, 4)]
    img, metas, boxes, _ = _batch()
    scores32, deltas32 = rpn(feats)
    torch.manual_seed(1)  # the same anchors sampled in both
    rpn_losses32 = rpn.loss(scores32, deltas32, boxes, metas)
    half = [[t.to(dtype) for t in group] for group in (scores32, deltas32)]
    fp16utils.wrap_fp16_model(rpn, dtype)
    torch.manual_seed(1)
    rpn_losses = rpn.loss(*half, boxes, metas)  # AnchorHead.loss: @force_fp32
    for key in ('loss_rpn_cls', 'loss_rpn_bbox'):
        for value, value32 in zip(rpn_losses[key], rpn_losses32[key]):
            assert value.dtype == torch.float32
            assert abs(value - value32) <= TOL[dtype]['out'] * abs(value32) + 1e-6


# -- no edit at all: fp16utils run on mmdet's own tools/train.py ---------------------------


def test_fp16utils_run_trains_mmdet_tools_train_py_in_bfloat16(coco, tmp_path):
    import mmdet

    train_py = Path(mmdet.__file__).parent / '.mim' / 'tools' / 'train.py'
    cfg = _tiny.retinanet(coco, str(tmp_path / 'work'), max_epochs=1,
                          fp16=dict(loss_scale=512.))  # a plain 0.x fp16 config
    config = _tiny.write_config(cfg, tmp_path / 'retinanet_fp16.py')
    log = tmp_path / 'standins.log'
    proc = run_fp16utils('--dtype', 'bfloat16', str(train_py), str(config), '--seed', '0',
                         '--no-validate', cwd=tmp_path, log=log)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fp16 = load_meta(tmp_path / 'work' / 'epoch_1.pth')['fp16']
    assert fp16['loss_scaler'] == UNSCALED_512  # bfloat16: no loss scaling, whatever the
    # config says; the state is what a float16 run of the config would start from
    assert fp16['stats']['skipped_steps'] == 0  # 'stats': written by fp16utils' hook only
    assert not log.exists(), log.read_text()


def test_fp16utils_run_names_a_misspelt_fp16_key_of_a_real_config_in_one_line(coco, tmp_path):
    import mmdet

    train_py = Path(mmdet.__file__).parent / '.mim' / 'tools' / 'train.py'
    cfg = _tiny.retinanet(coco, str(tmp_path / 'work'), max_epochs=1,
                          fp16=dict(loss_scal=512.))  # the typo a newcomer makes
    config = _tiny.write_config(cfg, tmp_path / 'retinanet_fp16.py')
    proc = run_fp16utils(str(train_py), str(config), '--seed', '0', '--no-validate',
                         cwd=tmp_path, log=tmp_path / 'standins.log')
    assert proc.returncode == 1 and 'Traceback' not in proc.stderr, proc.stderr[-3000:]
    last = proc.stderr.strip().splitlines()[-1]
    assert last.startswith("fp16utils: error: Fp16OptimizerHook got the unknown key "
                           "'loss_scal' (did you mean 'loss_scale'?)"), last
    assert not (tmp_path / 'work' / 'epoch_1.pth').exists()
