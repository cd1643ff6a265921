"""mmdet 2.28 evaluates RetinaNet in half precision: tools/test.py and the inference API.

``fp16utils run tools/test.py CONFIG CHECKPOINT --eval bbox``, on mmdet's own script
and a config that sets ``fp16``: the script calls ``wrap_fp16_model`` (fp16utils'),
and the model really runs in the half dtype (recorded from inside the run by
``_eval_probe``), the box regression that the head's code keeps in float32 runs in
float32, ``@force_fp32`` ``get_bboxes`` gets float32, and the outputs stay within
``EVAL_TOL`` of the float32 evaluation of the same checkpoint. By hand:
``init_detector`` + ``fp16utils.wrap_fp16_model`` + ``inference_detector``, on both
backends.
"""

from __future__ import annotations

import copy

import _consumers
import _tiny
import pytest

_consumers.require()

import _eval_probe  # noqa: E402, F401  (registers KeptRetinaHead)
import mmcv  # noqa: E402
import torch  # noqa: E402
from _evaluation import (  # noqa: E402
    BF16,
    EVAL_TOL,
    F16,
    abs_err,
    detector,
    finished,
    rel_err,
    run_all,
    save_float32_checkpoint,
    sorted_scores,
)
from mmdet.apis import inference_detector, init_detector  # noqa: E402

import fp16utils  # noqa: E402
from fp16utils.evaluation import keeping_weight_dtypes  # noqa: E402

F32 = torch.float32


@pytest.fixture(scope='module')
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp('eval_mmdet')
    data = _tiny.make_coco(root / 'coco', n=4)
    fp16_cfg = detector(data, str(root / 'work'))
    float32_cfg = detector(data, str(root / 'work'), fp16=False)
    configs = dict(fp16=_tiny.write_config(fp16_cfg, root / 'retinanet_fp16.py'),
                   float32=_tiny.write_config(float32_cfg, root / 'retinanet.py'))
    checkpoint = save_float32_checkpoint(float32_cfg, root / 'float32.pth')
    images = sorted(str(p) for p in (root / 'coco' / 'images').glob('*.png'))
    # By hand: mmdet's own RetinaHead (the same weights), kept by fp32_modules instead.
    plain = detector(data, str(root / 'work'), fp16=False, head='RetinaHead')
    return dict(root=root, configs=configs, checkpoint=checkpoint, images=images, cfg=plain)


@pytest.fixture(scope='module')
def runs(setup):
    """tools/test.py under fp16utils run: float32, float16 (both backends), bfloat16."""
    def job(name, config, *options):
        return dict(codebase='mmdet', config=setup['configs'][config],
                    checkpoint=setup['checkpoint'], folder=setup['root'] / name,
                    fp16utils_options=options)

    return run_all(dict(float32=job('float32', 'float32'), float16=job('float16', 'fp16'),
                        legacy=job('legacy', 'fp16', '--backend', 'legacy'),
                        bfloat16=job('bfloat16', 'fp16', '--dtype', 'bfloat16')))


def results(record):
    return [image for call in record['results'] for image in call]


def assert_close_to_float32(record, reference, dtype):
    tol = EVAL_TOL[dtype]
    for name in ('bbox_head.retina_cls', 'bbox_head.retina_reg'):
        assert rel_err(record['outputs'][name], reference['outputs'][name]) <= tol['head'], name
    assert abs_err(sorted_scores(results(record)), sorted_scores(results(reference))) <= (
        tol['score'])


def test_test_py_runs_a_config_with_fp16_in_float16(runs):
    reference, record = finished(runs['float32']), finished(runs['float16'])
    # The config without fp16: float32 throughout (what the config's fp16 changes).
    assert {m['input'] for m in reference['modules'].values()} == {F32}
    assert 'bbox_mAP' in runs['float16'].proc.stdout  # the evaluation ran to its metrics
    modules = record['modules']
    for name in ('backbone.conv1', 'neck.lateral_convs.0.conv', 'bbox_head.retina_cls'):
        assert (modules[name]['input'], modules[name]['output']) == (F16, F16), name
        assert modules[name]['weight'] == F32 and modules[name]['autocast'], name  # native
    # Kept in float32 by KeptRetinaHead's code (keep_fp32): float32 out under autocast.
    assert (modules['bbox_head.retina_reg']['weight'],
            modules['bbox_head.retina_reg']['output']) == (F32, F32)
    # AnchorHead.get_bboxes is @force_fp32: float32, autocast off, inside it.
    assert {(c['dtype'], c['autocast']) for c in record['force_fp32']} == {(F32, False)}
    assert len(results(record)) == len(results(reference)) == 4
    assert_close_to_float32(record, reference, F16)


def test_test_py_legacy_backend_runs_the_half_model(runs):
    reference, record = finished(runs['float32']), finished(runs['legacy'])
    modules = record['modules']
    assert (modules['backbone.conv1']['weight'], modules['backbone.conv1']['input']) == (F16, F16)
    assert modules['backbone.bn1']['weight'] == F32  # norms stay float32
    assert not any(m['autocast'] for m in modules.values())
    # The kept convolution: float32 weights (half inputs would not run), output cast back.
    assert (modules['bbox_head.retina_reg']['weight'],
            modules['bbox_head.retina_reg']['output']) == (F32, F16)
    assert {(c['dtype'], c['autocast']) for c in record['force_fp32']} == {(F32, False)}
    assert_close_to_float32(record, reference, F16)


def test_test_py_runs_bfloat16_with_fp16utils_run_dtype(runs):
    reference, record = finished(runs['float32']), finished(runs['bfloat16'])
    assert record['modules']['backbone.conv1']['input'] == BF16
    assert record['modules']['bbox_head.retina_reg']['output'] == F32
    assert {c['dtype'] for c in record['force_fp32']} == {F32}
    assert_close_to_float32(record, reference, BF16)


# -- by hand: init_detector, wrap_fp16_model, inference_detector ---------------------------


def infer(model, images):
    """inference_detector on ``images``; the head's outputs (float32 copies) and results."""
    outputs = {}

    def recorder(name):
        def record(module, args, out):
            outputs.setdefault(name, []).append(out.float())
        return record

    handles = [getattr(model.bbox_head, name).register_forward_hook(recorder(name))
               for name in ('retina_cls', 'retina_reg')]
    with torch.no_grad():
        found = inference_detector(model, images)
    for handle in handles:
        handle.remove()
    return outputs, found


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('dtype', [F16, BF16], ids=['fp16', 'bf16'])
def test_inference_detector_on_a_wrapped_model_matches_float32(setup, dtype, backend):
    config = mmcv.Config(copy.deepcopy(setup['cfg']))
    reference = init_detector(config, str(setup['checkpoint']), device='cpu')
    outputs32, results32 = infer(reference, setup['images'])
    model = init_detector(config, str(setup['checkpoint']), device='cpu')
    fp16utils.wrap_fp16_model(model, dtype, backend=backend, fp32_modules=['bbox_head.retina_reg'])
    seen = []
    model.backbone.conv1.register_forward_pre_hook(
        lambda m, args: seen.append((args[0].dtype, m.weight.dtype)))
    model.bbox_head.retina_reg.register_forward_hook(
        lambda m, args, out: seen.append(('retina_reg', m.weight.dtype, out.dtype)))
    outputs, found = infer(model, setup['images'])
    assert seen[0] == (dtype, dtype if backend == 'legacy' else F32)
    # Kept by fp32_modules: float32 weights; native: float32 out under autocast.
    assert seen[-1] == ('retina_reg', F32, dtype if backend == 'legacy' else F32)
    tol = EVAL_TOL[dtype]
    for name in outputs:
        assert rel_err(outputs[name], outputs32[name]) <= tol['head'], name
    assert abs_err(sorted_scores(found), sorted_scores(results32)) <= tol['score']


def test_fusing_conv_and_bn_keeps_the_half_models_dtypes(setup):
    """tools/test.py --fuse-conv-bn on the legacy backend: mmcv's fuse makes float32 convs."""
    from mmcv.cnn import fuse_conv_bn

    # mmcv's own function, also where patch_mmcv() wrapped it in this process
    fuse_conv_bn = getattr(fuse_conv_bn, '__wrapped__', fuse_conv_bn)
    config = mmcv.Config(copy.deepcopy(setup['cfg']))
    reference = init_detector(config, str(setup['checkpoint']), device='cpu')
    _, results32 = infer(reference, setup['images'][:2])

    plain = fp16utils.wrap_fp16_model(init_detector(config, str(setup['checkpoint']),
                                                    device='cpu'), backend='legacy')
    fuse_conv_bn(plain)
    assert plain.backbone.conv1.weight.dtype == F32  # half conv x float32 BN
    with pytest.raises(RuntimeError, match='should be the same'):
        infer(plain, setup['images'][:1])

    model = fp16utils.wrap_fp16_model(init_detector(config, str(setup['checkpoint']),
                                                    device='cpu'), backend='legacy')
    keeping_weight_dtypes(fuse_conv_bn)(model)
    assert model.backbone.conv1.weight.dtype == F16
    assert isinstance(model.backbone.bn1, torch.nn.Identity)  # fused
    _, found = infer(model, setup['images'][:2])
    assert abs_err(sorted_scores(found), sorted_scores(results32)) <= EVAL_TOL[F16]['score']


def test_test_py_fuses_conv_and_bn_on_the_legacy_backend(setup, runs):
    """``--backend legacy ... --fuse-conv-bn``: mmcv's fuse_conv_bn, as patch_mmcv wraps it."""
    from mmcv import cnn

    if getattr(cnn.fuse_conv_bn, '__wrapped__', None) is None:
        pytest.skip('patch_mmcv() does not put keeping_weight_dtypes(fuse_conv_bn) in '
                    'mmcv.cnn here: --fuse-conv-bn fails on the legacy backend')
    fused = run_all(dict(fused=dict(
        codebase='mmdet', config=setup['configs']['fp16'], checkpoint=setup['checkpoint'],
        folder=setup['root'] / 'fused', fp16utils_options=('--backend', 'legacy'),
        test_options=('--fuse-conv-bn',))))
    record, reference = finished(fused['fused']), finished(runs['float32'])
    assert record['modules']['backbone.conv1']['weight'] == F16  # fused, still half
    assert record['modules']['backbone.bn1']['weight'] is None  # an Identity now
    assert_close_to_float32(record, reference, F16)
