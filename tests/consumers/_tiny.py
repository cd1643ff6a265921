"""Tiny data sets and configs for the consumer tier: real mmdet / mmseg code paths, small sizes.

The images are 64x64 PNG files with one or two filled rectangles, written with
OpenCV; detection annotations are a COCO json file, segmentation maps are PNG
label images. The configs are those of the codebases' own RetinaNet and
EncoderDecoder models, shrunk (ResNet-18 with 8 base channels), as plain dicts
that :func:`write_config` turns into a config file for ``tools/train.py``.
"""

from __future__ import annotations

import copy
import json
import pprint
from pathlib import Path
from typing import Any, Dict, Optional

import numpy as np

SIZE = 64
NORM = dict(mean=[123.675, 116.28, 103.53], std=[58.395, 57.12, 57.375], to_rgb=True)


def _boxes(i: int) -> list:
    """One or two boxes per image, in different places for different images."""
    rng = np.random.default_rng(i)
    boxes = []
    for label in range(1 + i % 2):
        w, h = rng.integers(16, 32, size=2)
        x, y = rng.integers(0, SIZE - w), rng.integers(0, SIZE - h)
        boxes.append((int(x), int(y), int(w), int(h), label))
    return boxes


def make_coco(root: Path, n: int = 4) -> Dict[str, str]:
    """``n`` images with boxes of 2 classes and their COCO annotation file."""
    import cv2

    images_dir = root / 'images'
    images_dir.mkdir(parents=True, exist_ok=True)
    images, annotations = [], []
    for i in range(n):
        img = np.full((SIZE, SIZE, 3), 40, np.uint8)
        for x, y, w, h, label in _boxes(i):
            img[y:y + h, x:x + w] = (200, 60, 60) if label == 0 else (60, 200, 60)
            annotations.append(dict(id=len(annotations) + 1, image_id=i + 1, category_id=label + 1,
                                    bbox=[x, y, w, h], area=w * h, iscrowd=0))
        name = f'{i:03d}.png'
        cv2.imwrite(str(images_dir / name), img)
        images.append(dict(id=i + 1, file_name=name, width=SIZE, height=SIZE))
    ann_file = root / 'train.json'
    ann_file.write_text(json.dumps(dict(
        images=images, annotations=annotations,
        categories=[dict(id=1, name='red'), dict(id=2, name='green')])))
    return dict(ann_file=str(ann_file), img_prefix=str(images_dir) + '/')


def make_seg(root: Path, n: int = 4) -> Dict[str, str]:
    """``n`` images and their label maps (0 background, 1 rectangle)."""
    import cv2

    img_dir, ann_dir = root / 'img', root / 'ann'
    img_dir.mkdir(parents=True, exist_ok=True)
    ann_dir.mkdir(parents=True, exist_ok=True)
    for i in range(n):
        img = np.full((SIZE, SIZE, 3), 40, np.uint8)
        seg = np.zeros((SIZE, SIZE), np.uint8)
        for x, y, w, h, _ in _boxes(i):
            img[y:y + h, x:x + w] = (200, 200, 60)
            seg[y:y + h, x:x + w] = 1
        cv2.imwrite(str(img_dir / f'{i:03d}.png'), img)
        cv2.imwrite(str(ann_dir / f'{i:03d}.png'), seg)
    return dict(img_dir=str(img_dir), ann_dir=str(ann_dir))


def _runtime(work_dir: str, by_epoch: bool, lr: float = 0.01) -> Dict[str, Any]:
    return dict(
        optimizer=dict(type='SGD', lr=lr, momentum=0.9, weight_decay=0.0001),
        optimizer_config=dict(grad_clip=dict(max_norm=35, norm_type=2)),
        lr_config=dict(policy='fixed', by_epoch=by_epoch),
        checkpoint_config=dict(interval=1 if by_epoch else 4, by_epoch=by_epoch),
        log_config=dict(interval=1, hooks=[dict(type='TextLoggerHook', by_epoch=by_epoch)]),
        log_level='INFO', dist_params=dict(backend='gloo'), load_from=None, resume_from=None,
        workflow=[('train', 1)], work_dir=work_dir, gpu_ids=[0], seed=0, device='cpu',
        opencv_num_threads=0, mp_start_method='fork')


def retinanet(data: Dict[str, str], work_dir: str, max_epochs: int = 3,
              fp16: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """mmdet's RetinaNet (ResNet + FPN + RetinaHead), tiny; EpochBasedRunner."""
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations', with_bbox=True),
        dict(type='Resize', img_scale=(SIZE, SIZE), keep_ratio=True),
        dict(type='RandomFlip', flip_ratio=0.0),
        dict(type='Normalize', **NORM),
        dict(type='Pad', size_divisor=32),
        dict(type='DefaultFormatBundle'),
        dict(type='Collect', keys=['img', 'gt_bboxes', 'gt_labels']),
    ]
    train = dict(type='CocoDataset', classes=('red', 'green'), pipeline=pipeline, **data)
    cfg = dict(
        model=dict(
            type='RetinaNet',
            backbone=dict(type='ResNet', depth=18, base_channels=8, num_stages=4,
                          out_indices=(0, 1, 2, 3), frozen_stages=-1,
                          norm_cfg=dict(type='BN', requires_grad=True), norm_eval=False,
                          style='pytorch'),
            # num_outs=4: no conv on a 1x1 map (torch 2.13's CPU bfloat16 convolution gives
            # non-finite weight gradients for a 1x1 input at stride 2 now and then).
            neck=dict(type='FPN', in_channels=[8, 16, 32, 64], out_channels=16, start_level=1,
                      add_extra_convs='on_input', num_outs=4),
            bbox_head=dict(
                type='RetinaHead', num_classes=2, in_channels=16, stacked_convs=1,
                feat_channels=16,
                anchor_generator=dict(type='AnchorGenerator', octave_base_scale=4,
                                      scales_per_octave=3, ratios=[0.5, 1.0, 2.0],
                                      strides=[8, 16, 32, 64]),
                bbox_coder=dict(type='DeltaXYWHBBoxCoder', target_means=[.0, .0, .0, .0],
                                target_stds=[1.0, 1.0, 1.0, 1.0]),
                loss_cls=dict(type='FocalLoss', use_sigmoid=True, gamma=2.0, alpha=0.25,
                              loss_weight=1.0),
                # SmoothL1, not RetinaNet's L1: the gradient of L1 flips sign at 0, where
                # rounding decides it, and the float32 comparison would measure that.
                loss_bbox=dict(type='SmoothL1Loss', beta=0.11, loss_weight=1.0)),
            train_cfg=dict(assigner=dict(type='MaxIoUAssigner', pos_iou_thr=0.5,
                                         neg_iou_thr=0.4, min_pos_iou=0, ignore_iof_thr=-1),
                           allowed_border=-1, pos_weight=-1, debug=False),
            test_cfg=dict(nms_pre=100, min_bbox_size=0, score_thr=0.05,
                          nms=dict(type='nms', iou_threshold=0.5), max_per_img=10)),
        dataset_type='CocoDataset',
        data=dict(samples_per_gpu=2, workers_per_gpu=0, train=train, val=train, test=train),
        runner=dict(type='EpochBasedRunner', max_epochs=max_epochs),
        auto_scale_lr=dict(enable=False, base_batch_size=16),
        **_runtime(work_dir, by_epoch=True, lr=0.02))
    if fp16 is not None:
        cfg['fp16'] = dict(fp16)
    return cfg


def segmentor(data: Dict[str, str], work_dir: str, head: str = 'FCNHead', max_iters: int = 8,
              optimizer_config: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """mmseg's EncoderDecoder (ResNetV1c + a decode head), tiny; IterBasedRunner."""
    norm_cfg = dict(type='BN', requires_grad=True)
    common = dict(channels=16, num_classes=2, norm_cfg=norm_cfg, align_corners=False,
                  dropout_ratio=0.1,
                  loss_decode=dict(type='CrossEntropyLoss', use_sigmoid=False, loss_weight=1.0))
    heads = {
        'FCNHead': dict(type='FCNHead', in_channels=64, in_index=3, num_convs=1,
                        concat_input=False, **common),
        'ASPPHead': dict(type='ASPPHead', in_channels=64, in_index=3, dilations=(1, 2, 3),
                         **common),
        'UPerHead': dict(type='UPerHead', in_channels=[8, 16, 32, 64], in_index=[0, 1, 2, 3],
                         pool_scales=(1, 2, 3), **common),
    }
    pipeline = [
        dict(type='LoadImageFromFile'),
        dict(type='LoadAnnotations'),
        dict(type='Resize', img_scale=(SIZE, SIZE), keep_ratio=True),
        dict(type='RandomFlip', prob=0.0),
        dict(type='Normalize', **NORM),
        dict(type='Pad', size=(SIZE, SIZE), pad_val=0, seg_pad_val=255),
        dict(type='DefaultFormatBundle'),
        dict(type='Collect', keys=['img', 'gt_semantic_seg']),
    ]
    cfg = dict(
        norm_cfg=norm_cfg,
        model=dict(
            type='EncoderDecoder', pretrained=None,
            backbone=dict(type='ResNetV1c', depth=18, stem_channels=8, base_channels=8,
                          num_stages=4, out_indices=(0, 1, 2, 3), dilations=(1, 1, 1, 1),
                          strides=(1, 2, 2, 2), norm_cfg=norm_cfg, norm_eval=False,
                          style='pytorch', contract_dilation=True),
            decode_head=heads[head],
            train_cfg=dict(), test_cfg=dict(mode='whole')),
        data=dict(samples_per_gpu=2, workers_per_gpu=0, persistent_workers=False,
                  train=dict(type='CustomDataset', img_suffix='.png', seg_map_suffix='.png',
                             classes=('background', 'box'), palette=[[0, 0, 0], [255, 255, 0]],
                             pipeline=pipeline, **data)),
        runner=dict(type='IterBasedRunner', max_iters=max_iters),
        **_runtime(work_dir, by_epoch=False))
    cfg['optimizer_config'] = dict(optimizer_config or dict(type='Fp16OptimizerHook',
                                                            loss_scale=512.))
    return cfg


def write_config(cfg: Dict[str, Any], path: Path) -> Path:
    """Write ``cfg`` as a Python config file (one ``name = value`` line per key)."""
    text = ''.join(f'{key} = {pprint.pformat(value, width=100)}\n' for key, value in cfg.items())
    path.write_text(text)
    return path


def with_changes(cfg: Dict[str, Any], **changes: Any) -> Dict[str, Any]:
    """A deep copy of ``cfg`` with top-level keys replaced."""
    new = copy.deepcopy(cfg)
    new.update(changes)
    return new
