"""Evaluation in the consumer tier: test configs, float32 checkpoints, ``tools/test.py`` runs.

The configs are ``_tiny``'s RetinaNet and EncoderDecoder with the codebases' test
pipelines (``MultiScaleFlipAug``), a test set of the same images, and
``custom_imports`` of ``_eval_probe``, which records from inside the run what it
computed in. RetinaNet's test settings skip NMS (``nms=None``: mmcv's NMS is a
compiled op the tier does not have) and keep every score (``score_thr=0``), so each
image gives its 10 best boxes.
"""

from __future__ import annotations

import copy
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any, Dict, List, NamedTuple, Optional, Sequence

import _consumers
import _tiny
import torch

F16, BF16 = torch.float16, torch.bfloat16

#: How close an evaluation in half precision stays to float32 with the same checkpoint:
#: ``head`` the head's outputs (largest |difference| / largest |float32|), ``score`` the
#: detection scores sorted per image and ``prob`` the segmentation probabilities
#: (largest |difference|). Largest measured over the weights of seeds 0-7 (as
#: :func:`build` makes them), on both backends (the same to the last digit): head
#: 1.5e-3 / 1.2e-2, score 3.4e-5 / 1.7e-4, prob 6.9e-4 / 5.7e-3 (float16 / bfloat16).
#: About 3 times that:
EVAL_TOL = {F16: dict(head=5e-3, score=1.5e-4, prob=2e-3),
            BF16: dict(head=4e-2, score=6e-4, prob=1.5e-2)}
#: A segmentor's classifier is made this much larger than its initialisation (std 0.01,
#: which leaves every pixel's probabilities near 1/2): the scale training gives it, so
#: that most pixels have a clear class, of either kind.
SEG_CLASSIFIER_SCALE = 20.0


def test_pipeline(pad_to: Optional[int] = 32) -> List[Dict[str, Any]]:
    """The codebases' single-scale test pipeline at the tier's image size."""
    transforms: List[Dict[str, Any]] = [
        dict(type='Resize', keep_ratio=True), dict(type='RandomFlip'),
        dict(type='Normalize', **_tiny.NORM)]
    if pad_to:
        transforms.append(dict(type='Pad', size_divisor=pad_to))
    transforms += [dict(type='ImageToTensor', keys=['img']), dict(type='Collect', keys=['img'])]
    return [dict(type='LoadImageFromFile'),
            dict(type='MultiScaleFlipAug', img_scale=(_tiny.SIZE, _tiny.SIZE), flip=False,
                 transforms=transforms)]


def with_test_set(cfg: Dict[str, Any], pad_to: Optional[int]) -> Dict[str, Any]:
    """``cfg`` with a test set (the training images) and the probe imported."""
    cfg = copy.deepcopy(cfg)
    cfg['data']['test'] = dict(cfg['data']['train'], pipeline=test_pipeline(pad_to))
    cfg['data']['val'] = cfg['data']['test']
    cfg['custom_imports'] = dict(imports=['_eval_probe'], allow_failed_imports=False)
    return cfg


def detector(data: Dict[str, str], work_dir: str, fp16: bool = True,
             head: str = 'KeptRetinaHead') -> Dict[str, Any]:
    """RetinaNet for tools/test.py; its ``retina_reg`` kept in float32 by the head's code."""
    cfg = _tiny.retinanet(data, work_dir, fp16=dict(loss_scale=512.) if fp16 else None)
    cfg['model']['bbox_head']['type'] = head
    cfg['model']['test_cfg'].update(nms=None, score_thr=0.0)
    return with_test_set(cfg, 32)


def segmentor(data: Dict[str, str], work_dir: str, fp16: bool = True) -> Dict[str, Any]:
    """FCN for tools/test.py; ``fp16 = dict()``, as mmseg's fp16 configs set it."""
    cfg = _tiny.segmentor(data, work_dir, 'FCNHead')
    if fp16:
        cfg['fp16'] = dict()
    return with_test_set(cfg, None)


def build(cfg: Dict[str, Any], seed: int = 0) -> Any:
    """The codebase's model of ``cfg``, initialised from ``seed``, in eval mode.

    A segmentor's classifier is scaled by :data:`SEG_CLASSIFIER_SCALE`.
    """
    import mmcv

    config = mmcv.Config(cfg)
    torch.manual_seed(seed)
    if config.model.type == 'EncoderDecoder':
        from mmseg.models import build_segmentor as build_model
    else:
        from mmdet.models import build_detector as build_model
    model = build_model(config.model)
    model.init_weights()
    model.cfg = config
    if config.model.type == 'EncoderDecoder':
        with torch.no_grad():
            for tensor in model.decode_head.conv_seg.parameters():
                tensor.mul_(SEG_CLASSIFIER_SCALE)
    return model.eval()


def save_float32_checkpoint(cfg: Dict[str, Any], path: Path, seed: int = 0) -> Path:
    """A checkpoint of the float32 model of ``cfg`` (:func:`build`), with its class names."""
    from mmcv.runner import save_checkpoint

    model = build(cfg, seed)
    meta = dict(CLASSES=cfg['data']['train']['classes'])
    if 'palette' in cfg['data']['train']:
        meta['PALETTE'] = cfg['data']['train']['palette']
    save_checkpoint(model, str(path), meta=meta)
    return path


def tools_test_py(codebase: str) -> Path:
    """The codebase's own tools/test.py, as its wheel ships it."""
    module = __import__(codebase)
    return Path(module.__file__).parent / '.mim' / 'tools' / 'test.py'


class Run(NamedTuple):
    proc: subprocess.CompletedProcess
    record: Dict[str, Any]
    standin_calls: str


def run_test_py(codebase: str, config: Path, checkpoint: Path, folder: Path,
                fp16utils_options: Sequence[str] = (), test_options: Sequence[str] = ()
                ) -> Run:
    """``python -m fp16utils run [OPTIONS] tools/test.py CONFIG CHECKPOINT --eval ...``."""
    folder.mkdir(parents=True, exist_ok=True)
    record, log = folder / 'record.pt', folder / 'standins.log'
    env = dict(os.environ, FP16UTILS_STANDIN_LOG=str(log), FP16UTILS_EVAL_RECORD=str(record),
               OMP_NUM_THREADS='1', PYTHONPATH=os.pathsep.join(
                   [str(_consumers.REPO), str(_consumers.STANDINS), str(_consumers.HERE)]))
    env.pop('FP16UTILS_BACKEND', None)
    metric = 'bbox' if codebase == 'mmdet' else 'mIoU'
    argv = [sys.executable, '-m', 'fp16utils', 'run', *fp16utils_options,
            str(tools_test_py(codebase)), str(config), str(checkpoint), '--eval', metric,
            '--work-dir', str(folder / 'work'), *test_options]
    proc = subprocess.run(argv, cwd=folder, env=env, capture_output=True, text=True,
                          timeout=600)
    loaded = torch.load(record, weights_only=False) if record.exists() else {}
    return Run(proc, loaded, log.read_text() if log.exists() else '')


def run_all(jobs: Dict[str, Dict[str, Any]], parallel: int = 2) -> Dict[str, Run]:
    """Several :func:`run_test_py` at a time (each spends most of its time importing)."""
    with ThreadPoolExecutor(max_workers=parallel) as pool:
        futures = {name: pool.submit(run_test_py, **job) for name, job in jobs.items()}
        return {name: future.result() for name, future in futures.items()}


def finished(run: Run) -> Dict[str, Any]:
    """The run's record; fails with its output unless it ran to the end, no stand-in called."""
    tail = f'{run.proc.stdout[-2000:]}\n{run.proc.stderr[-3000:]}'
    assert run.proc.returncode == 0, tail
    assert run.standin_calls == '', run.standin_calls
    assert run.record.get('results'), tail
    return run.record


def rel_err(outputs: Sequence[torch.Tensor], reference: Sequence[torch.Tensor]) -> float:
    """Largest |difference| / largest |reference| over matching tensors."""
    assert len(outputs) == len(reference) and outputs
    return max(float((o - r).abs().max() / r.abs().max()) for o, r in zip(outputs, reference))


def abs_err(outputs: Sequence[Any], reference: Sequence[Any]) -> float:
    """Largest |difference| over matching tensors or arrays."""
    assert len(outputs) == len(reference) and len(outputs)
    return max(float(abs(torch.as_tensor(o) - torch.as_tensor(r)).max())
               for o, r in zip(outputs, reference))


def sorted_scores(results: Sequence[Any]) -> List[torch.Tensor]:
    """mmdet's results (per image, per class ``(n, 5)`` boxes): each image's scores, sorted."""
    return [torch.cat([torch.as_tensor(boxes[:, 4]) for boxes in image]).sort(
        descending=True).values for image in results]
