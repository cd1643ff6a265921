"""mmsegmentation 0.30: EncoderDecoder trains through ``train_segmentor``, unchanged.

mmseg configs name the hook in ``optimizer_config``, so mmcv's ``HOOKS`` registry
builds it; mmseg trains on mmcv's ``IterBasedRunner``, whose own ``resume`` keeps
no ``runner.meta`` (and asks CUDA for a device): the patch brings the loss scale back.

The float32 comparisons use fixed initial weights, BatchNorm in eval mode and no
dropout; the tolerances are ``_consumers.TOL``.
"""

from __future__ import annotations

import copy
from pathlib import Path

import _consumers
import _tiny
import pytest

_consumers.require()

import mmcv  # noqa: E402
import mmcv.runner  # noqa: E402
import torch  # noqa: E402
from _consumers import PROBE, TOL, iters, load_meta, loss_grads_outputs, mean, run_fp16utils, train  # noqa: E402
from mmseg.models import build_segmentor  # noqa: E402

import fp16utils  # noqa: E402
import fp16utils.mmcv  # noqa: E402


@pytest.fixture(scope='module')
def seg_data(tmp_path_factory):
    return _tiny.make_seg(tmp_path_factory.mktemp('seg'), n=16)  # 8 iterations a pass


def test_fcn_trains_on_the_iter_runner_and_resumes_the_scale(seg_data, tmp_path, probe):
    hook_cfg = dict(type='Fp16OptimizerHook',
                    loss_scale=dict(init_scale=2.**10, growth_interval=2))
    cfg = _tiny.segmentor(seg_data, str(tmp_path), 'FCNHead', max_iters=8,
                          optimizer_config=hook_cfg)
    cfg['custom_hooks'] = PROBE
    train(cfg)
    run = iters(probe)
    hook = run[0]['hook']
    assert type(hook) is fp16utils.mmcv.Fp16OptimizerHook  # from the HOOKS registry
    assert isinstance(hook, mmcv.runner.Hook)
    assert [r['scale'] for r in run] == [1024., 2048., 2048., 4096., 4096., 8192., 8192.,
                                         16384.]
    assert [r['skipped'] for r in run] == [0] * 8
    assert {r['loss_dtype'] for r in run} == {torch.float32}
    assert mean([r['loss'] for r in run[-3:]]) < mean([r['loss'] for r in run[:3]])
    saved = load_meta(tmp_path / 'iter_4.pth')['fp16']['loss_scaler']
    assert saved['scale'] == 4096.

    probe.clear()
    train(_tiny.with_changes(cfg, resume_from=str(tmp_path / 'iter_4.pth'),
                             work_dir=str(tmp_path / 'resumed')))
    # mmcv's IterBasedRunner writes iter_4.pth with meta['iter'] == 3 and so runs the
    # fourth iteration again; the scale is the one saved after it, growth tracker too.
    assert probe[0]['iter'] == 3 and probe[0]['scale'] == 4096.
    assert [r['scale'] for r in iters(probe)] == [4096., 8192., 8192., 16384., 16384.]


def test_mmcvs_iter_runner_resume_alone_loses_the_scale(seg_data, tmp_path, probe, caplog):
    """Why the patch wraps IterBasedRunner.resume: without it the hook starts over, and says so."""
    hook_cfg = dict(type='Fp16OptimizerHook',
                    loss_scale=dict(init_scale=2.**10, growth_interval=2))
    cfg = _tiny.segmentor(seg_data, str(tmp_path), 'FCNHead', max_iters=4,
                          optimizer_config=hook_cfg)
    train(cfg)
    iter_runner = mmcv.runner.IterBasedRunner
    wrapped = iter_runner.resume
    original = wrapped.__fp16utils_original__
    mmcv_resume = lambda self, checkpoint, **kw: original(self, checkpoint,  # noqa: E731
                                                          map_location='cpu')
    iter_runner.resume = mmcv_resume
    try:
        cfg['custom_hooks'] = PROBE
        train(_tiny.with_changes(cfg, resume_from=str(tmp_path / 'iter_4.pth'),
                                 runner=dict(type='IterBasedRunner', max_iters=5),
                                 work_dir=str(tmp_path / 'resumed')))
    finally:
        iter_runner.resume = wrapped
    assert load_meta(tmp_path / 'iter_4.pth')['fp16']['loss_scaler']['scale'] == 4096.
    assert probe[0]['iter'] == 3 and probe[0]['scale'] == 1024.
    assert any('holds no loss-scaler state' in r.getMessage() for r in caplog.records)


def test_gradient_cumulative_hook_bfloat16_legacy_updates_every_second_iteration(
        seg_data, tmp_path, probe):
    hook_cfg = dict(type='GradientCumulativeFp16OptimizerHook', cumulative_iters=2,
                    loss_scale=512., dtype='bfloat16', backend='legacy')
    cfg = _tiny.segmentor(seg_data, str(tmp_path), 'ASPPHead', max_iters=8,
                          optimizer_config=hook_cfg)
    cfg['custom_hooks'] = PROBE
    model = train(cfg)
    start, run = probe[0], iters(probe)
    assert type(start['hook']) is fp16utils.mmcv.GradientCumulativeFp16OptimizerHook
    assert {r['param_dtype'] for r in run} == {torch.bfloat16}
    assert model.backbone.stem[1].weight.dtype == torch.float32  # BatchNorm stays float32
    assert {r['scale'] for r in run} == {1.0}
    assert [r['skipped'] for r in run] == [0] * 8
    sums = [start['param_sum']] + [r['param_sum'] for r in run]
    changed = [after != before for before, after in zip(sums, sums[1:])]
    assert changed == [False, True] * 4  # one update per two iterations
    assert mean([r['loss'] for r in run[-4:]]) < mean([r['loss'] for r in run[:4]])


# -- the decorated modules themselves -------------------------------------------------------


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16], ids=['fp16', 'bf16'])
@pytest.mark.parametrize('head', ['FCNHead', 'ASPPHead', 'UPerHead'])
def test_encoder_decoder_keeps_the_decorator_contract_and_matches_float32(
        seg_data, tmp_path, head, dtype, backend):
    cfg = mmcv.Config(_tiny.segmentor(seg_data, str(tmp_path), head))
    cfg.model.decode_head.dropout_ratio = 0.0
    torch.manual_seed(0)
    reference = build_segmentor(cfg.model)
    reference.init_weights()
    reference.eval()
    low = copy.deepcopy(reference)
    torch.manual_seed(0)
    img = torch.randn(2, 3, 64, 64)
    metas = [dict(img_shape=(64, 64, 3), pad_shape=(64, 64, 3), ori_shape=(64, 64, 3),
                  scale_factor=1.0, flip=False)] * 2
    seg = torch.randint(0, 2, (2, 1, 64, 64))
    seen = {}

    def loss_grads_logits(model):
        loss, grads, logits = loss_grads_outputs(model, model.decode_head.conv_seg, img, metas,
                                                 gt_semantic_seg=seg)
        return loss, grads, logits[0]

    loss32, grads32, logits32 = loss_grads_logits(reference)
    assert logits32.dtype == torch.float32

    fp16utils.wrap_fp16_model(low, dtype, backend=backend)

    def first_conv_input(mod, args):
        seen.setdefault('backbone input', args[0].dtype)

    def loss_input(mod, args):
        seen.setdefault('loss input', args[0].dtype)
        seen.setdefault('autocast in loss', torch.is_autocast_enabled('cpu'))

    low.backbone.stem[0].register_forward_pre_hook(first_conv_input)
    low.decode_head.loss_decode.register_forward_pre_hook(loss_input)
    loss, grads, logits = loss_grads_logits(low)
    # BaseSegmentor.forward: @auto_fp16(apply_to=('img',)); BaseDecodeHead.losses:
    # @force_fp32(apply_to=('seg_logit',)).
    assert seen['backbone input'] == dtype
    assert logits.dtype == dtype
    assert seen['loss input'] == torch.float32 and seen['autocast in loss'] is False
    assert loss.dtype == torch.float32
    tol = TOL[dtype]
    assert abs(loss - loss32) <= tol['loss'] * abs(loss32)
    assert (grads - grads32).norm() <= tol['grad'] * grads32.norm()
    assert (logits.float() - logits32).abs().max() <= tol['out'] * logits32.abs().max()


# -- no edit at all: fp16utils run on mmseg's own tools/train.py ---------------------------


def test_fp16utils_run_trains_and_resumes_mmseg_tools_train_py(seg_data, tmp_path):
    import mmseg

    train_py = Path(mmseg.__file__).parent / '.mim' / 'tools' / 'train.py'
    # A 0.x fp16 config as mmseg writes them: the hook by name (here a dynamic scale).
    hook_cfg = dict(type='Fp16OptimizerHook', loss_scale=dict(init_scale=2.**10,
                                                              growth_interval=2))
    cfg = _tiny.segmentor(seg_data, str(tmp_path / 'work'), 'UPerHead', max_iters=4,
                          optimizer_config=hook_cfg)
    config = _tiny.write_config(cfg, tmp_path / 'upernet_fp16.py')
    log = tmp_path / 'standins.log'
    proc = run_fp16utils(str(train_py), str(config), '--seed', '0', '--no-validate',
                         cwd=tmp_path, log=log)
    assert proc.returncode == 0, proc.stderr[-3000:]
    fp16 = load_meta(tmp_path / 'work' / 'iter_4.pth')['fp16']
    assert fp16['loss_scaler']['scale'] == 4096.  # 1024, grown twice: float16
    assert fp16['stats']['skipped_steps'] == 0

    longer = _tiny.with_changes(cfg, runner=dict(type='IterBasedRunner', max_iters=6),
                                work_dir=str(tmp_path / 'resumed'))
    config = _tiny.write_config(longer, tmp_path / 'upernet_fp16_longer.py')
    # Seeded as the first run: unseeded, the data order differs and a float16 overflow
    # (a skipped step, the scale halved) can happen at these scales.
    proc = run_fp16utils(str(train_py), str(config), '--resume-from',
                         str(tmp_path / 'work' / 'iter_4.pth'), '--seed', '0', '--no-validate',
                         cwd=tmp_path, log=log)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert 'resumed from epoch' in proc.stderr + proc.stdout
    assert 'holds no loss-scaler state' not in proc.stderr + proc.stdout
    # Three updates after the restored 4096 (mmcv runs the fourth iteration again): one
    # growth. Started afresh it would have been 2048.
    resumed = load_meta(tmp_path / 'resumed' / 'iter_6.pth')['fp16']
    assert resumed['stats']['skipped_steps'] == 0, resumed['stats']
    assert resumed['loss_scaler']['scale'] == 8192., resumed
    assert not log.exists(), log.read_text()


def test_fp16utils_run_exit_codes_with_real_mmcv(tmp_path):
    crash = tmp_path / 'crash.py'
    crash.write_text('import mmcv.runner, sys\n'
                     'assert mmcv.runner.HOOKS.get("Fp16OptimizerHook").__module__ == '
                     '"fp16utils.mmcv"\n'
                     'raise SystemExit(3) if sys.argv[1:] == ["exit"] else 1 / 0\n')
    log = tmp_path / 'standins.log'
    assert run_fp16utils(str(crash), 'exit', cwd=tmp_path, log=log).returncode == 3
    proc = run_fp16utils(str(crash), cwd=tmp_path, log=log)
    assert proc.returncode == 1 and 'ZeroDivisionError' in proc.stderr
    assert 'crash.py' in proc.stderr and 'runpy' not in proc.stderr
    proc = run_fp16utils(str(tmp_path / 'missing.py'), cwd=tmp_path, log=log)
    assert proc.returncode == 2 and 'missing.py: no such file' in proc.stderr
