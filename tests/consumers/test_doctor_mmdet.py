"""``fp16utils doctor CONFIG.py`` on mmdet 2.28 and mmseg 0.30 configs, and its fix in training.

The configs are the tier's tiny RetinaNet and EncoderDecoder (``_tiny``); the model
is built through the codebase's registry and fed a synthetic training batch of the
config's size. A neck registered here adds FPN's first level into a float32 buffer
with ``index_add_``, as custom ops written for float32 do: torch raises in float16,
the doctor names the neck, and mmdet's own ``train_detector`` then trains with the
neck kept in float32 as the report's 0.x line says.
"""

from __future__ import annotations

import io
import json
import random
from pathlib import Path

import _consumers
import _tiny
import pytest

_consumers.require()

import mmcv  # noqa: E402
import numpy as np  # noqa: E402
import torch  # noqa: E402
from _consumers import PROBE, iters  # noqa: E402
from mmdet.models.builder import NECKS  # noqa: E402
from mmdet.models.necks import FPN  # noqa: E402

from fp16utils import keep_fp32  # noqa: E402
from fp16utils.tools import cli  # noqa: E402

UNUSED_DATA = dict(ann_file='unused.json', img_prefix='unused/')


@NECKS.register_module(force=True)
class ScatterFPN(FPN):
    """FPN whose first level goes through a float32 buffer with ``index_add_``."""

    def forward(self, inputs):
        outs = super().forward(inputs)
        first = outs[0].flatten(1)
        buffer = torch.zeros(first.shape, device=first.device)
        buffer.index_add_(0, torch.arange(first.shape[0], device=first.device), first)
        return (buffer.view_as(outs[0]), *outs[1:])


def doctor(*args):
    out = io.StringIO()
    code = cli.main(['doctor', *map(str, args), '--json'], out=out)
    return code, json.loads(out.getvalue())


def scatter_retinanet(data, work_dir, **changes):
    cfg = _tiny.retinanet(data, str(work_dir), **changes)
    cfg['model']['neck']['type'] = 'ScatterFPN'
    return cfg


@pytest.mark.parametrize('dtype, backend', [('float16', 'native'), ('bfloat16', 'native'),
                                            ('float16', 'legacy')])
def test_a_retinanet_config_runs_clean_and_says_where_its_input_comes_from(
        tmp_path, dtype, backend):
    path = _tiny.write_config(_tiny.retinanet(UNUSED_DATA, str(tmp_path)), tmp_path / 'r.py')
    code, report = doctor(path, '--dtype', dtype, '--backend', backend)
    assert code == 0 and report['ok'] and report['problems'] == []
    assert report['verified'] and report['backward'] == 'ran'  # from the dict of losses
    assert report['output_error'] < report['tolerance']
    assert report['input'] == (
        '2 random images 3x64x64 from img_scale (64, 64) of data.test.pipeline (w, h), '
        'padded to a multiple of 32; 3 random gt_bboxes per image over 2 classes; the '
        "model's default initialisation (no checkpoint), train mode")


def test_an_input_shape_replaces_the_configs_size(tmp_path):
    path = _tiny.write_config(_tiny.retinanet(UNUSED_DATA, str(tmp_path)), tmp_path / 'r.py')
    code, report = doctor(path, '--input-shape', '1,3,96,64')
    assert code == 0 and report['input'].startswith(
        '1 random images 3x96x64 from --input-shape; 3 random gt_bboxes')


def test_a_segmentor_config_is_built_by_mmseg(tmp_path):
    data = dict(data_root=str(tmp_path), img_dir='i', ann_dir='a')
    path = _tiny.write_config(_tiny.segmentor(data, str(tmp_path)), tmp_path / 's.py')
    code, report = doctor(path, '--dtype', 'bfloat16')
    assert code == 0 and report['verified'] and report['backward'] == 'ran'
    assert report['input'].startswith('2 random images 3x64x64 from img_scale (64, 64) of '
                                      'data.train.pipeline (w, h)')
    assert 'gt_semantic_seg random over 2 classes' in report['input']


def test_the_neck_that_raises_in_float16_is_named_and_the_fix_verified(tmp_path):
    path = _tiny.write_config(scatter_retinanet(UNUSED_DATA, tmp_path), tmp_path / 'r.py')
    code, report = doctor(path)
    assert code == 1
    assert [(p['name'], p['module_type'], p['kind']) for p in report['problems']] == [
        ('neck', 'ScatterFPN', 'dtype-error')]
    assert report['problems'][0]['detail'] == (
        'RuntimeError: index_add_(): self (Float) and source (Half) must have the same '
        'scalar type')
    assert report['fp32_modules'] == ['neck'] and report['verified']
    assert report['code_0x'] == "keep_fp32(model, ['neck'])"
    # FPN's forward is @auto_fp16: wrap_fp16_model leaves its flag off inside the island.
    assert report['notes'] == []


def test_on_the_legacy_backend_the_kept_neck_keeps_its_auto_fp16_off_and_verifies(tmp_path):
    path = _tiny.write_config(scatter_retinanet(UNUSED_DATA, tmp_path), tmp_path / 'r.py')
    code, report = doctor(path, '--backend', 'legacy')
    assert code == 1 and report['verified'] and report['fp32_modules'] == ['neck']
    assert [(p['name'], p['kind']) for p in report['problems']] == [('neck', 'dtype-error')]
    assert report['unfixable'] == []


def test_mmdets_train_detector_trains_with_the_doctors_fix(tmp_path, probe):
    from mmdet.apis import train_detector
    from mmdet.datasets import build_dataset
    from mmdet.models import build_detector

    data = _tiny.make_coco(tmp_path / 'coco', n=4)
    cfg_dict = scatter_retinanet(data, tmp_path / 'work', max_epochs=2,
                                 fp16=dict(loss_scale=dict(init_scale=2.**10)))
    cfg_dict['custom_hooks'] = PROBE
    path = _tiny.write_config(cfg_dict, tmp_path / 'r.py')
    fix = doctor(path)[1]['fp32_modules']
    cfg = mmcv.Config(cfg_dict)
    for seed in (random.seed, np.random.seed, torch.manual_seed):
        seed(0)
    model = build_detector(cfg.model)
    model.init_weights()
    keep_fp32(model, fix)  # the report's 0.x line, after building the model
    train_detector(model, [build_dataset(cfg.data.train)], cfg, timestamp='doctor', meta={})
    run = iters(probe)
    assert len(run) == 4 and all(np.isfinite(r['loss']) for r in run)
    assert run[-1]['skipped'] == 0


def test_without_the_fix_mmdets_training_raises_torchs_error(tmp_path):
    from mmdet.apis import train_detector
    from mmdet.datasets import build_dataset
    from mmdet.models import build_detector

    data = _tiny.make_coco(tmp_path / 'coco', n=2)
    cfg = mmcv.Config(scatter_retinanet(data, tmp_path / 'work', max_epochs=1,
                                        fp16=dict(loss_scale=512.)))
    model = build_detector(cfg.model)
    with pytest.raises(RuntimeError, match='must have the same scalar type'):
        train_detector(model, [build_dataset(cfg.data.train)], cfg, timestamp='bare', meta={})


def test_a_config_of_no_codebase_is_one_line(tmp_path, capsys):
    path = Path(tmp_path / 'x.py')
    path.write_text("model = dict(type='NoSuchModel')\n")
    assert cli.main(['doctor', str(path)]) == 1
    err = capsys.readouterr().err
    assert err == (f"fp16utils: error: {path}: model type 'NoSuchModel' is neither an mmdet 2.x "
                   'detector nor an mmseg 0.x segmentor\n')
