"""A real ``mmengine.runner.Runner`` trains with the plug-in's wrappers on the CPU.

Param schedulers step, ``RuntimeInfoHook`` / ``LoggerHook`` log lr and the loss
scale, ``CheckpointHook`` saves, ``resume=True`` restores the scaler state, the
val loop runs; float16 (scaled, with one injected overflow) and bfloat16.
"""

from __future__ import annotations

import json
import runpy
from importlib.util import find_spec
from pathlib import Path

import pytest
import torch
from torch import nn

_spec = find_spec('mmengine')
if _spec is None or _spec.origin is None:  # absent, or only this folder (a namespace package)
    pytest.skip('mmengine is not installed: run .ci/mmengine for this tier',
                allow_module_level=True)
from mmengine.config import Config  # noqa: E402
from mmengine.evaluator import BaseMetric  # noqa: E402
from mmengine.hooks import Hook  # noqa: E402
from mmengine.model import BaseModel  # noqa: E402
from mmengine.registry import DATASETS, HOOKS, METRICS, MODELS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

from fp16utils import convert_config  # noqa: E402

FIXTURES = Path(__file__).resolve().parents[1] / 'fixtures' / 'legacy_codebase' / 'configs'
POISON_ITER = 1  # the float16 runs overflow at this (0-based) training iteration


@MODELS.register_module(force=True)
class Fp16utilsToyModel(BaseModel):
    def __init__(self, poison_iter=-1):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)
        self.poison_iter = poison_iter
        self.calls = 0

    def forward(self, inputs, target, mode='tensor'):
        out = self.fc2(torch.relu(self.fc1(inputs)))
        if mode == 'loss':
            loss = (out.float() - target).pow(2).mean()
            if self.calls == self.poison_iter:
                loss = loss * float('inf')
            self.calls += 1
            return dict(loss=loss)
        return [dict(pred=o.float(), target=t) for o, t in zip(out, target)]


@MODELS.register_module(force=True)
class Fp16utilsToyGAN(BaseModel):
    """Two sub-models, each stepped by its own wrapper (the BigGAN layout)."""

    def __init__(self):
        super().__init__()
        self.generator = nn.Linear(8, 4)
        self.discriminator = nn.Linear(4, 1)

    def forward(self, inputs, target, mode='tensor'):
        return [dict(pred=self.generator(inputs).float(), target=target)]

    def train_step(self, data, optim_wrapper):
        data = self.data_preprocessor(data, True)
        x = data['inputs']
        with optim_wrapper['discriminator'].optim_context(self.discriminator):
            loss_d = self.discriminator(self.generator(x).detach()).float().mean()
        optim_wrapper['discriminator'].update_params(loss_d)
        with optim_wrapper['generator'].optim_context(self.generator):
            loss_g = -self.discriminator(self.generator(x)).float().mean()
        optim_wrapper['generator'].update_params(loss_g)
        return dict(loss_d=loss_d.detach(), loss_g=loss_g.detach())


@DATASETS.register_module(force=True)
class Fp16utilsToyDataset(torch.utils.data.Dataset):
    metainfo = dict()

    def __init__(self, n=8):
        g = torch.Generator().manual_seed(1)
        self.x = torch.randn(n, 8, generator=g)
        self.y = torch.randn(n, 4, generator=g)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return dict(inputs=self.x[i], target=self.y[i])


@METRICS.register_module(force=True)
class Fp16utilsToyMetric(BaseMetric):
    def process(self, data_batch, data_samples):
        self.results.extend(float((s['pred'] - s['target']).pow(2).mean()) for s in data_samples)

    def compute_metrics(self, results):
        return dict(mse=sum(results) / len(results))


@HOOKS.register_module(force=True)
class Fp16utilsRecordHook(Hook):
    """Records what the wrapper holds when training starts (after any resume)."""

    seen: dict = {}

    def before_train(self, runner):
        wrapper = runner.optim_wrapper
        Fp16utilsRecordHook.seen = dict(
            iter=runner.iter, loss_scale=getattr(wrapper, 'loss_scale', None),
            skipped=getattr(wrapper, 'skipped_steps', None), lr=wrapper.get_lr())


def write_config(path: Path, cfg: dict) -> Config:
    path.write_text(''.join(f'{key} = {value!r}\n' for key, value in cfg.items()))
    return Config.fromfile(str(path))


def loader(n=8):
    return dict(dataset=dict(type='Fp16utilsToyDataset', n=n), batch_size=2, num_workers=0,
                sampler=dict(type='DefaultSampler', shuffle=False),
                collate_fn=dict(type='default_collate'))


def runner_cfg(work_dir, optim_wrapper, max_iters, model=None, resume=False):
    return dict(
        custom_imports=dict(imports=['fp16utils.mmengine'], allow_failed_imports=False),
        model=model or dict(type='Fp16utilsToyModel'),
        work_dir=str(work_dir), train_dataloader=loader(), val_dataloader=loader(4),
        val_evaluator=dict(type='Fp16utilsToyMetric'), val_cfg=dict(),
        train_cfg=dict(by_epoch=False, max_iters=max_iters, val_interval=2),
        optim_wrapper=optim_wrapper,
        param_scheduler=[dict(type='MultiStepLR', milestones=[2], gamma=0.1, by_epoch=False)],
        default_hooks=dict(checkpoint=dict(type='CheckpointHook', interval=2, by_epoch=False),
                           logger=dict(type='LoggerHook', interval=1)),
        custom_hooks=[dict(type='Fp16utilsRecordHook')],
        log_processor=dict(by_epoch=False), resume=resume, randomness=dict(seed=0),
        env_cfg=dict(dist_cfg=dict(backend='gloo')), default_scope=None)


def history(runner, name):
    """The raw per-iteration values of ``train/<name>`` in the run's MessageHub."""
    return runner.message_hub.get_scalar(f'train/{name}').data[0].tolist()


def scalars(work_dir):
    """Every line of the run's scalars.json (the logged values per iteration)."""
    files = sorted(Path(work_dir).rglob('scalars.json'))
    return [json.loads(line) for f in files for line in f.read_text().splitlines()]


@pytest.mark.parametrize('dtype', ['float16', 'bfloat16'])
def test_runner_trains_logs_checkpoints_and_resumes(tmp_path, monkeypatch, dtype):
    # MMEngine 0.10.7 resumes with a bare torch.load, which on torch >= 2.6 refuses its
    # own MessageHub state (whatever the wrapper); torch's switch restores the old load.
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    float16 = dtype == 'float16'
    wrapper = dict(type='Fp16utilsAmpOptimWrapper', dtype=dtype,
                   loss_scale=dict(init_scale=512.0, growth_interval=1000),
                   optimizer=dict(type='SGD', lr=0.1, momentum=0.9),
                   clip_grad=dict(max_norm=10.0))
    model = dict(type='Fp16utilsToyModel', poison_iter=POISON_ITER if float16 else -1)
    cfg = write_config(tmp_path / 'cfg.py', runner_cfg(tmp_path / 'work', wrapper, 4, model))
    runner = Runner.from_cfg(cfg)
    runner.train()
    ow = runner.optim_wrapper
    assert type(ow).__name__ == 'Fp16utilsAmpOptimWrapper' and ow.dtype == getattr(torch, dtype)
    assert ow.skipped_steps == (1 if float16 else 0)
    assert ow.loss_scale == (256.0 if float16 else 1.0)
    assert ow.get_lr() == {'lr': [pytest.approx(0.01)]}   # MultiStepLR stepped at iter 2
    assert history(runner, 'loss_scale') == ([512.0, 256.0, 256.0, 256.0] if float16
                                             else [1.0] * 4)
    assert history(runner, 'lr') == pytest.approx([0.1, 0.1, 0.01, 0.01])
    norms = history(runner, 'grad_norm')  # as MMEngine: every step, the skipped one's is nan
    assert len(norms) == 4 and (norms[POISON_ITER] != norms[POISON_ITER]) is float16
    logged = [s for s in scalars(tmp_path / 'work') if 'loss' in s]
    assert len(logged) == 4 and all('loss_scale' in s and 'lr' in s for s in logged)
    log_text = _log_text(runner)
    assert 'loss_scale: ' in log_text
    assert ('update skipped; loss scale 512.0 -> 256.0' in log_text) is float16
    assert any('mse' in s for s in scalars(tmp_path / 'work'))       # the val loop ran
    ckpt = torch.load(tmp_path / 'work' / 'iter_4.pth', map_location='cpu', weights_only=False)
    saved = ckpt['optimizer']
    assert saved['fp16_stats']['skipped_steps'] == ow.skipped_steps
    if float16:
        assert saved['loss_scaler']['scale'] == 256.0

    # resume=True, two more iterations: the scale and the counters come back
    cfg = write_config(tmp_path / 'cfg2.py', runner_cfg(tmp_path / 'work', wrapper, 6,
                                                        resume=True))
    resumed = Runner.from_cfg(cfg)
    resumed.train()
    seen = Fp16utilsRecordHook.seen
    assert seen['iter'] == 4 and seen['loss_scale'] == (256.0 if float16 else 1.0)
    assert seen['skipped'] == (1 if float16 else 0)
    assert seen['lr'] == {'lr': [pytest.approx(0.01)]}
    assert resumed.optim_wrapper.loss_scale == (256.0 if float16 else 1.0)
    assert resumed.iter == 6


def test_converted_biggan_config_runs_in_the_runner(tmp_path):
    biggan = {k: v for k, v in runpy.run_path(str(FIXTURES / 'biggan_128x128_fp16.py')).items()
              if not k.startswith('__')}
    converted = convert_config(biggan, plugin=True)
    cfg = runner_cfg(tmp_path / 'work', converted['optim_wrapper'], 8,
                     model=dict(type='Fp16utilsToyGAN'))
    cfg['param_scheduler'] = None
    cfg['custom_imports'] = converted['custom_imports']
    runner = Runner.from_cfg(write_config(tmp_path / 'cfg.py', cfg))
    runner.train()
    wrappers = runner.optim_wrapper
    assert type(wrappers).__name__ == 'Fp16utilsOptimWrapperDict'
    assert {name: type(w).__name__ for name, w in wrappers.items()} == {
        'generator': 'Fp16utilsAmpOptimWrapper', 'discriminator': 'Fp16utilsAmpOptimWrapper'}
    assert [w.accumulative_counts for w in wrappers.values()] == [8, 8]
    assert [w.inner_count for w in wrappers.values()] == [8, 8]
    assert history(runner, 'generator.lr') == [1e-4] * 8
    # one update per wrapper, after the window of 8
    assert history(runner, 'generator.loss_scale') == [512.0]
    assert history(runner, 'discriminator.loss_scale') == [512.0]


def test_converted_mmdet_config_with_paramwise_cfg_matches_our_builder(tmp_path):
    from fp16utils import build_optim_wrapper
    mmdet = dict(
        optimizer=dict(type='SGD', lr=0.02, momentum=0.9, weight_decay=1e-4,
                       paramwise_cfg=dict(bias_lr_mult=2.0, bias_decay_mult=0.0,
                                          custom_keys={'fc2': dict(lr_mult=0.1)})),
        optimizer_config=dict(grad_clip=dict(max_norm=35, norm_type=2)),
        fp16=dict(loss_scale=512.0))
    converted = convert_config(mmdet, plugin=True)
    cfg = runner_cfg(tmp_path / 'work', converted['optim_wrapper'], 2)
    cfg['param_scheduler'] = None
    runner = Runner.from_cfg(write_config(tmp_path / 'cfg.py', cfg))
    runner.train()
    theirs = runner.optim_wrapper
    ours = build_optim_wrapper(Fp16utilsToyModel(), converted['optim_wrapper'])
    strip = [[(g['lr'], g['weight_decay']) for g in w.optimizer.param_groups]
             for w in (theirs, ours)]
    assert strip[0] == strip[1] == [(0.02, 1e-4), (0.04, 0.0), (0.002, 1e-4), (0.002, 1e-4)]
    assert theirs.get_lr()['base_lr'] == [0.02]
    assert theirs.loss_scale == ours.loss_scale == 512.0


def test_the_plugin_dict_reads_as_mmengine_writes_it():
    """Its repr names each entry as MMEngine's does; its errors are MMEngine's types too."""
    from fp16utils.mmengine import Fp16utilsOptimWrapper, Fp16utilsOptimWrapperDict
    sgd = torch.optim.SGD(torch.nn.Linear(1, 1).parameters(), lr=0.1)
    wrappers = Fp16utilsOptimWrapperDict(optim1=Fp16utilsOptimWrapper(sgd))
    assert repr(wrappers).startswith('name: optim1\n')
    with pytest.raises(AssertionError, match='`OptimWrapperDict` only accept'):
        Fp16utilsOptimWrapperDict(optim1=sgd)
    with pytest.raises(NotImplementedError, match='`step` should be called'):
        wrappers.step()


@pytest.mark.parametrize('native, expected', [(True, torch.bfloat16), (False, torch.float32)])
def test_plugin_resolves_auto_and_keeps_fp32_modules(tmp_path, monkeypatch, native, expected):
    from fp16utils import kept_fp32
    from fp16utils._torch import caps

    level = 'native' if native else 'emulated'
    monkeypatch.setattr(caps, 'table_level', lambda device_type, dtype, index=None: level)
    wrapper = dict(type='Fp16utilsAmpOptimWrapper', dtype='auto', fp32_modules=['fc2'],
                   optimizer=dict(type='SGD', lr=0.1))
    cfg = write_config(tmp_path / 'cfg.py', runner_cfg(tmp_path / 'work', wrapper, 2))
    runner = Runner.from_cfg(cfg)
    runner.train()
    ow = runner.optim_wrapper
    assert type(ow).__name__ == 'Fp16utilsAmpOptimWrapper' and ow.dtype == expected
    assert kept_fp32(runner.model) == ['fc2']
    log_text = _log_text(runner)
    said = "dtype='auto': neither low-precision dtype is native on cpu"
    assert log_text.count(said) == (0 if native else 1)


def _log_text(runner):
    """The text of the log file the runner's logger writes (a Runner made in the same
    second as an earlier one shares its logger, and so its file)."""
    import logging

    for handler in runner.logger.handlers:
        if isinstance(handler, logging.FileHandler):
            handler.flush()
            return Path(handler.baseFilename).read_text()
    raise AssertionError('the runner logs to no file')
