"""``skip_aware_hooks=True`` on the plug-in's wrappers in MMEngine 0.10's own Runner.

Some iterations get a loss multiplied by inf, so the wrapper skips their steps. With
the option, MMEngine's ``ParamSchedulerHook`` (``LinearLR``, ``MultiStepLR``,
``CosineAnnealingLR``; by iteration, and by epoch beside a per-iteration warm-up) and
``EMAHook`` (``ExponentialMovingAverage``, ``begin_iter``; ``MomentumAnnealingEMA``) end
exactly as in a run on the same schedule in which those iterations never happened: the
same learning rate, scheduler states, weights and EMA weights, bit for bit. Without it
they advance at every iteration, as MMEngine makes them.
"""

from __future__ import annotations

from importlib.util import find_spec

import pytest
import torch
from torch import nn

_spec = find_spec('mmengine')
if _spec is None or _spec.origin is None:  # absent, or only this folder (a namespace package)
    pytest.skip('mmengine is not installed: run .ci/mmengine for this tier',
                allow_module_level=True)
from mmengine.hooks import EMAHook, Hook  # noqa: E402
from mmengine.model import BaseModel  # noqa: E402
from mmengine.registry import DATASETS, HOOKS, MODELS  # noqa: E402
from mmengine.runner import Runner  # noqa: E402

import fp16utils.mmengine  # noqa: E402,F401  (registers the plug-in)
from fp16utils._args.skip_hooks import record  # noqa: E402
from fp16utils.hooks import runner_bridge  # noqa: E402
from fp16utils.hooks.follow import STAGES  # noqa: E402
from fp16utils.mmengine import Fp16utilsAmpOptimWrapper  # noqa: E402

N = 10
BAD = (2, 5)  # the iterations (0-based) whose loss is multiplied by inf
ORIGINAL_CALL_HOOK = Runner.__dict__['call_hook']


@pytest.fixture(autouse=True)
def _bridge_off_afterwards():
    """Each test starts with MMEngine's own ``Runner.call_hook``, as a fresh process has."""
    runner_bridge.uninstall(Runner)
    yield
    runner_bridge.uninstall(Runner)


@MODELS.register_module(force=True)
class Fp16utilsSkipToyModel(BaseModel):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    def forward(self, inputs, target, bad, mode='tensor'):
        out = self.fc2(torch.relu(self.fc1(inputs)))
        loss = (out.float() - target).pow(2).mean()
        if bool(bad.any()):
            loss = loss * float('inf')  # every gradient non-finite: the step is skipped
        return dict(loss=loss)


@MODELS.register_module(force=True)
class Fp16utilsSkipToyGAN(BaseModel):
    """Two sub-models, each stepped by its own wrapper; a bad batch spoils the generator's."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.generator = nn.Linear(8, 4)
        self.discriminator = nn.Linear(4, 1)

    def forward(self, inputs, target, bad, mode='tensor'):
        return self.generator(inputs)

    def train_step(self, data, optim_wrapper):
        data = self.data_preprocessor(data, True)
        x, bad = data['inputs'], bool(data['bad'].any())
        with optim_wrapper['discriminator'].optim_context(self.discriminator):
            loss_d = self.discriminator(self.generator(x).detach()).float().pow(2).mean()
        optim_wrapper['discriminator'].update_params(loss_d)
        with optim_wrapper['generator'].optim_context(self.generator):
            loss_g = (self.generator(x).float() - data['target']).pow(2).mean()
        optim_wrapper['generator'].update_params(loss_g * float('inf') if bad else loss_g)
        return dict(loss_d=loss_d.detach(), loss_g=loss_g.detach())


@DATASETS.register_module(force=True)
class Fp16utilsSkipToyDataset(torch.utils.data.Dataset):
    """``batches`` batches of 2 samples; those at ``bad`` are marked (their loss is inf).

    The good batches are the same, in the same order, whatever ``bad`` is.
    """

    metainfo = dict()

    def __init__(self, batches=N, bad=(), seed=1):
        g = torch.Generator().manual_seed(seed)
        self.items = []
        for i in range(batches):
            if i in bad:
                self.items += [dict(inputs=torch.zeros(8), target=torch.zeros(4),
                                    bad=torch.tensor(True))] * 2
            else:
                self.items += [dict(inputs=torch.randn(8, generator=g) * 0.5,
                                    target=torch.randn(4, generator=g) * 0.5,
                                    bad=torch.tensor(False)) for _ in range(2)]

    def __len__(self):
        return len(self.items)

    def __getitem__(self, i):
        return self.items[i]


@HOOKS.register_module(force=True)
class Fp16utilsSkipRecordHook(Hook):
    """What the run holds after each iteration: lr, schedulers, weights, the EMA model."""

    priority = 'LOWEST'

    def __init__(self):
        self.states = []

    def after_train_iter(self, runner, batch_idx, data_batch=None, outputs=None):
        ema = next((h for h in runner.hooks if isinstance(h, EMAHook)), None)
        schedulers = runner.param_schedulers
        if isinstance(schedulers, dict):
            schedulers = [s for value in schedulers.values() for s in value]
        self.states.append(dict(
            iter=runner.iter, lr=runner.optim_wrapper.get_lr(),
            schedulers=[dict(s.state_dict()) for s in schedulers],
            model={k: v.detach().clone() for k, v in runner.model.state_dict().items()},
            ema=None if ema is None else {
                k: v.detach().clone() for k, v in ema.ema_model.state_dict().items()}))


def wrapper_cfg(follow, **kwargs):
    return dict(type='Fp16utilsAmpOptimWrapper', dtype='float16', loss_scale=512.,
                optimizer=dict(type='SGD', lr=0.1, momentum=0.9), skip_aware_hooks=follow,
                **kwargs)


ITER_SCHEDULERS = [
    dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=3),
    dict(type='MultiStepLR', milestones=[4, 7], gamma=0.5, by_epoch=False),
    dict(type='CosineAnnealingLR', T_max=N, eta_min=1e-3, by_epoch=False, begin=3, end=N)]
#: begin_iter reads runner.iter: the run without the skipped iterations starts the EMA at
#: its iteration 3, which is iteration 4 here (iteration 2 is skipped).
EMA = dict(type='EMAHook', ema_type='ExponentialMovingAverage', momentum=0.2, begin_iter=4)


def train(tmp_path, name, follow, bad=BAD, batches=N, max_iters=N, schedulers=ITER_SCHEDULERS,
          ema=EMA, by_epoch=False, max_epochs=None, model='Fp16utilsSkipToyModel',
          optim_wrapper=None, checkpoint=None, load_from=None):
    train_cfg = (dict(by_epoch=True, max_epochs=max_epochs) if by_epoch
                 else dict(by_epoch=False, max_iters=max_iters))
    runner = Runner(
        model=dict(type=model), work_dir=str(tmp_path / name),
        train_dataloader=dict(dataset=dict(type='Fp16utilsSkipToyDataset', batches=batches,
                                           bad=bad),
                              batch_size=2, num_workers=0,
                              sampler=dict(type='DefaultSampler', shuffle=False),
                              collate_fn=dict(type='default_collate')),
        train_cfg=train_cfg, optim_wrapper=optim_wrapper or wrapper_cfg(follow),
        param_scheduler=[dict(s) for s in schedulers],
        default_hooks=dict(checkpoint=checkpoint, logger=dict(type='LoggerHook', interval=5)),
        custom_hooks=([dict(ema)] if ema else []) + [dict(type='Fp16utilsSkipRecordHook')],
        log_processor=dict(by_epoch=by_epoch), randomness=dict(seed=0), default_scope=None,
        load_from=load_from, resume=load_from is not None,
        env_cfg=dict(dist_cfg=dict(backend='gloo')), experiment_name=f'skip_{tmp_path.name}_{name}')
    runner.train()
    runner.record = next(h for h in runner.hooks if isinstance(h, Fp16utilsSkipRecordHook))
    return runner


def assert_same(a, b):
    assert a['lr'] == b['lr']
    assert a['schedulers'] == b['schedulers']
    for part in ('model', 'ema'):
        if a[part] is None:
            assert b[part] is None
            continue
        assert a[part].keys() == b[part].keys()
        for key in a[part]:
            assert torch.equal(a[part][key], b[part][key]), (part, key)


def test_iteration_schedulers_and_ema_end_as_without_the_skipped_iterations(tmp_path):
    reference = train(tmp_path, 'reference', False, bad=()).record.states
    followed = train(tmp_path, 'followed', True)
    wrapper = followed.optim_wrapper
    assert wrapper.skipped_steps == len(BAD) and wrapper.steps_taken == N - len(BAD)
    assert followed.message_hub.get_info(runner_bridge.HUB_KEY) == record(2, 5, 1)
    assert_same(followed.record.states[-1], reference[N - len(BAD) - 1])
    assert followed.record.states[-1]['ema']['steps'] == N - len(BAD) - 3  # begin_iter=4
    # after the run: the hooks have their own stages back, the wrapper is followed no more
    assert not any(set(STAGES) & set(vars(h)) for h in followed.hooks)
    assert not runner_bridge.connected(wrapper)

    plain = train(tmp_path, 'plain', False)
    last = plain.record.states[-1]
    assert last['lr'] == reference[-1]['lr'] != reference[N - len(BAD) - 1]['lr']
    assert [s['last_step'] for s in last['schedulers']] == [
        s['last_step'] for s in reference[-1]['schedulers']]
    assert last['ema']['steps'] == N - 3
    assert runner_bridge.HUB_KEY not in plain.message_hub.runtime_info


def test_epoch_schedulers_step_per_epoch_and_iteration_ones_follow(tmp_path):
    """Epochs of 5 batches, 2 of them skipped, against epochs of the 3 good ones."""
    schedulers = [dict(type='LinearLR', start_factor=0.1, by_epoch=False, begin=0, end=4),
                  dict(type='MultiStepLR', milestones=[1, 2], gamma=0.5, by_epoch=True)]
    ema = dict(type='EMAHook', ema_type='MomentumAnnealingEMA', momentum=0.01, gamma=4)
    kwargs = dict(schedulers=schedulers, ema=ema, by_epoch=True, max_epochs=3)
    followed = train(tmp_path, 'followed', True, bad=(1, 3), batches=5, **kwargs)
    reference = train(tmp_path, 'reference', False, bad=(), batches=3, **kwargs)
    assert followed.optim_wrapper.skipped_steps == 6
    assert_same(followed.record.states[-1], reference.record.states[-1])
    plain = train(tmp_path, 'plain', False, bad=(1, 3), batches=5, **kwargs)
    assert plain.record.states[-1]['schedulers'] != reference.record.states[-1]['schedulers']


def test_the_record_is_checkpointed_and_a_resumed_run_ends_the_same(tmp_path, monkeypatch):
    # MMEngine 0.10.7 resumes with a bare torch.load, which on torch >= 2.6 refuses its
    # own MessageHub state; torch's switch restores the old load.
    monkeypatch.setenv('TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD', '1')
    checkpoint = dict(type='CheckpointHook', interval=6, by_epoch=False)
    # the record hook follows too: it records the iteration as the followed hooks see it
    follow = ['ParamSchedulerHook', 'EMAHook', 'Fp16utilsSkipRecordHook']
    whole = train(tmp_path, 'whole', follow, checkpoint=checkpoint)
    assert [s['iter'] for s in whole.record.states] == list(range(N - len(BAD)))
    path = tmp_path / 'whole' / 'iter_6.pth'
    saved = torch.load(path, map_location='cpu', weights_only=False)
    assert saved['message_hub']['runtime_info'][runner_bridge.HUB_KEY] == record(2, 5, 1)
    resumed = train(tmp_path, 'resumed', follow, load_from=str(path))
    assert resumed.iter == N and [s['iter'] for s in resumed.record.states] == [4, 5, 6, 7]
    assert_same(resumed.record.states[-1], whole.record.states[-1])


def test_each_entry_of_a_dict_follows_its_own_schedulers(tmp_path):
    """The generator's steps skip at BAD, the discriminator's never: only the generator's
    schedulers stay; the run's iteration is not one that was skipped."""
    entry = dict(wrapper_cfg(True), optimizer=dict(type='SGD', lr=0.1))
    optim_wrapper = dict(constructor='Fp16utilsMultiOptimWrapperConstructor',
                         generator=dict(entry), discriminator=dict(entry))
    schedulers = [dict(type='MultiStepLR', milestones=[3, 6], gamma=0.5, by_epoch=False)]
    runner = train(tmp_path, 'gan', True, model='Fp16utilsSkipToyGAN', ema=None,
                   schedulers=schedulers, optim_wrapper=optim_wrapper)
    wrappers = runner.optim_wrapper
    assert wrappers['generator'].skipped_steps == len(BAD)
    assert wrappers['discriminator'].skipped_steps == 0
    steps = {name: [s._global_step for s in value]  # the steps each scheduler was given
             for name, value in runner.param_schedulers.items()}
    assert steps == {'generator': [N - len(BAD)], 'discriminator': [N]}
    assert runner.message_hub.get_info(runner_bridge.HUB_KEY) == record()


def test_a_dict_whose_entries_disagree_is_refused_naming_them(tmp_path):
    optim_wrapper = dict(constructor='Fp16utilsMultiOptimWrapperConstructor',
                         generator=wrapper_cfg(True), discriminator=wrapper_cfg(False))
    with pytest.raises(ValueError, match=r"Fp16utilsAmpOptimWrapper: skip_aware_hooks follows "
                                         r"the runner's hooks for the whole OptimWrapperDict, "
                                         r'so every entry must be an fp16utils wrapper with the '
                                         r'same setting; got generator: True, discriminator: '
                                         r'False'):
        train(tmp_path, 'gan', True, model='Fp16utilsSkipToyGAN', ema=None,
              schedulers=[], optim_wrapper=optim_wrapper)


@pytest.mark.parametrize('value, error', [(1, TypeError), ('two words', ValueError),
                                          ([], ValueError)])
def test_a_bad_value_is_refused_by_the_wrapper(value, error):
    model = nn.Linear(2, 1)
    with pytest.raises(error, match='Fp16utilsAmpOptimWrapper: skip_aware_hooks must be False'):
        Fp16utilsAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                 skip_aware_hooks=value)
    assert Runner.__dict__['call_hook'] is ORIGINAL_CALL_HOOK


def test_the_runner_is_left_alone_until_a_wrapper_asks(tmp_path):
    model = nn.Linear(2, 1)
    off = Fp16utilsAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1))
    assert off.skip_aware_hooks is False and Runner.__dict__['call_hook'] is ORIGINAL_CALL_HOOK
    on = Fp16utilsAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                  skip_aware_hooks=['EMAHook'])
    assert Runner.__dict__['call_hook'] is not ORIGINAL_CALL_HOOK
    assert on.skip_aware_hooks == ['EMAHook']
    assert runner_bridge.uninstall(Runner) and Runner.__dict__['call_hook'] is ORIGINAL_CALL_HOOK


def test_a_wrapper_asking_outside_a_runner_refuses_to_step():
    model = nn.Linear(2, 1)
    wrapper = Fp16utilsAmpOptimWrapper(optimizer=torch.optim.SGD(model.parameters(), lr=0.1),
                                       skip_aware_hooks=True)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(RuntimeError, match=r"skip_aware_hooks=True\): no MMEngine Runner follows "
                                           r"this wrapper's steps.*fp16utils.skip_aware"):
        wrapper.update_params(model(torch.ones(1, 2)).sum())
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    assert wrapper.inner_count == 0 and all(p.grad is None for p in model.parameters())
