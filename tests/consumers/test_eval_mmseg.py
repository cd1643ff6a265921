"""mmsegmentation 0.30 evaluates an FCN in half precision: tools/test.py and the inference API.

``fp16utils run tools/test.py CONFIG CHECKPOINT --eval mIoU`` on mmseg's own script
and a config with ``fp16 = dict()`` (as mmseg's fp16 configs have it): the model runs
in float16 (recorded from inside the run by ``_eval_probe``) on both backends, and
its probabilities stay within ``EVAL_TOL`` of the float32 evaluation of the same
checkpoint; a pixel changes class only where float32 itself hesitates. By hand:
``init_segmentor`` + ``fp16utils.wrap_fp16_model`` (a module kept by
``fp32_modules``) + ``inference_segmentor``.
"""

from __future__ import annotations

import copy

import _consumers
import _tiny
import pytest

_consumers.require()

import mmcv  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _evaluation import (  # noqa: E402
    BF16,
    EVAL_TOL,
    F16,
    abs_err,
    finished,
    run_all,
    save_float32_checkpoint,
    segmentor,
)
from mmseg.apis import inference_segmentor, init_segmentor  # noqa: E402

import fp16utils  # noqa: E402

F32 = torch.float32


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp('eval_mmseg')
    data = _tiny.make_seg(root / 'seg', n=4)
    fp16_cfg = segmentor(data, str(root / 'work'))
    float32_cfg = segmentor(data, str(root / 'work'), fp16=False)
    configs = dict(fp16=_tiny.write_config(fp16_cfg, root / 'fcn_fp16.py'),
                   float32=_tiny.write_config(float32_cfg, root / 'fcn.py'))
    # Seed 7: about half the pixels of each class (seed 0 labels every pixel 'box').
    checkpoint = save_float32_checkpoint(float32_cfg, root / 'float32.pth', seed=7)
    images = sorted(str(p) for p in (root / 'seg' / 'img').glob('*.png'))
    return dict(root=root, configs=configs, checkpoint=checkpoint, images=images,
                cfg=float32_cfg)


@pytest.fixture(scope='module')
def runs(setup):
    def job(name, config, *options):
        return dict(codebase='mmseg', config=setup['configs'][config],
                    checkpoint=setup['checkpoint'], folder=setup['root'] / name,
                    fp16utils_options=options)

    return run_all(dict(float32=job('float32', 'float32'), float16=job('float16', 'fp16'),
                        legacy=job('legacy', 'fp16', '--backend', 'legacy')))


def probabilities(logits):
    """mmseg's ``inference`` returns softmax probabilities (N, classes, H, W)."""
    return [p for batch in logits for p in batch]


def assert_close_to_float32(logits, logits32, labels, labels32, dtype):
    """Probabilities within the tolerance; labels equal wherever float32 is clear."""
    tol = EVAL_TOL[dtype]['prob']
    probs, probs32 = probabilities(logits), probabilities(logits32)
    assert abs_err(probs, probs32) <= tol
    for prob32, label, label32 in zip(probs32, labels, labels32):
        top2 = prob32.topk(2, dim=0).values
        clear = (top2[0] - top2[1] > 2 * tol).numpy()  # no rounding within tol flips these
        assert clear.mean() > 0.2  # the check is not empty
        assert np.array_equal(np.asarray(label)[clear], np.asarray(label32)[clear])
        assert 0 < np.asarray(label32).mean() < 1  # both classes are predicted


@pytest.mark.parametrize('run', ['float16', 'legacy'])
def test_test_py_runs_a_config_with_fp16_in_float16(runs, run):
    reference, record = finished(runs['float32']), finished(runs[run])
    assert 'mIoU' in runs[run].proc.stdout  # the evaluation ran to its metrics
    assert {m['input'] for m in reference['modules'].values()} == {F32}
    modules = record['modules']
    legacy = run == 'legacy'
    stem = modules['backbone.stem.0']
    assert (stem['input'], stem['output']) == (F16, F16)
    assert stem['weight'] == (F16 if legacy else F32) and stem['autocast'] is not legacy
    assert modules['backbone.stem.1']['weight'] == F32  # the stem's BatchNorm
    assert modules['decode_head.conv_seg']['output'] == F16
    assert_close_to_float32(record['logits'], reference['logits'], results(record),
                            results(reference), F16)


def results(record):
    return [seg for call in record['results'] for seg in call]


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('dtype', [F16, BF16], ids=['fp16', 'bf16'])
def test_inference_segmentor_on_a_wrapped_model_matches_float32(setup, dtype, backend):
    config = mmcv.Config(copy.deepcopy(setup['cfg']))
    reference = init_segmentor(config, str(setup['checkpoint']), device='cpu')
    logits32, labels32 = infer(reference, setup['images'])
    model = init_segmentor(config, str(setup['checkpoint']), device='cpu')
    fp16utils.wrap_fp16_model(model, dtype, backend=backend,
                              fp32_modules=['decode_head.conv_seg'])
    seen = []
    model.backbone.stem[0].register_forward_pre_hook(lambda m, args: seen.append(args[0].dtype))
    model.decode_head.conv_seg.register_forward_hook(
        lambda m, args, out: seen.append((m.weight.dtype, out.dtype)))
    logits, labels = infer(model, setup['images'])
    assert seen[0] == dtype
    # Kept by fp32_modules: float32 weights; native: float32 out under autocast.
    assert seen[-1] == (F32, dtype if backend == 'legacy' else F32)
    assert_close_to_float32(logits, logits32, labels, labels32, dtype)


def infer(model, images):
    """inference_segmentor on ``images``: the probabilities (float32 copies) and the labels."""
    logits = []
    inference = model.inference

    def recording(*args, **kwargs):
        out = inference(*args, **kwargs)
        logits.append(out.float())
        return out

    model.inference = recording
    with torch.no_grad():
        labels = inference_segmentor(model, images)
    del model.inference
    return logits, labels
