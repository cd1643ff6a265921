"""``skip_aware_hooks=True`` on mmcv 1.7.2's own runners, LR / momentum updaters and EMA hook.

Some iterations get a loss multiplied by inf, so ``Fp16OptimizerHook`` skips their steps.
With the option, mmcv's ``LrUpdaterHook`` (step; cosine annealing with a linear warm-up),
``MomentumUpdaterHook`` (cyclic; step with a warm-up) and ``EMAHook`` end exactly as in a
run on the same schedule in which those iterations never happened: the same learning
rate, momentum, weights and EMA weights, bit for bit. Without it they advance as mmcv
makes them (the reference: each hook computed at every ``runner.iter``).
"""

from __future__ import annotations

import logging
import time

import _consumers

_consumers.require()

import mmcv.runner  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402
from mmcv.runner import EMAHook, EpochBasedRunner, Hook, IterBasedRunner  # noqa: E402
from torch import nn  # noqa: E402

from fp16utils import (  # noqa: E402
    Fp16OptimizerHook,
    GradientCumulativeFp16OptimizerHook,
    auto_fp16,
)
from fp16utils._args.skip_hooks import record  # noqa: E402
from fp16utils.hooks.follow import META_KEY, STAGES  # noqa: E402

N = 10
BAD = (2, 5)  # the iterations (0-based) whose loss is multiplied by inf
LOG = logging.getLogger('skip_aware_mmcv')
STEP = dict(policy='step', step=[4, 8], gamma=0.1)
COSINE = dict(policy='CosineAnnealing', min_lr_ratio=0.01, warmup='linear', warmup_iters=3,
              warmup_ratio=0.1)
CYCLIC = dict(policy='cyclic', target_ratio=(0.8, 1.0), cyclic_times=1, step_ratio_up=0.4)
EMA = dict(type='EMAHook', momentum=0.5, warm_up=10, priority=49)  # after the step


@pytest.fixture(autouse=True)
def _no_sleep(monkeypatch):
    """mmcv's runners sleep 1-2 s at each epoch change and at the end; not here."""
    monkeypatch.setattr(time, 'sleep', lambda seconds: None)


class ToyNet(nn.Module):
    """A tiny MLP with an ``@auto_fp16`` forward and mmcv's ``train_step``."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.fp16_enabled = False
        self.fc1 = nn.Linear(8, 16)
        self.fc2 = nn.Linear(16, 4)

    @auto_fp16()
    def forward(self, x):
        return self.fc2(torch.relu(self.fc1(x)))

    def train_step(self, data, optimizer):
        loss = (self(data['x']).float() - data['y']).pow(2).mean()
        if data['bad']:
            loss = loss * float('inf')  # every gradient non-finite: the step is skipped
        return dict(loss=loss, num_samples=len(data['x']))


class Loader:
    """The batches, in order, as a data loader (mmcv reads its length and sampler)."""

    sampler = None

    def __init__(self, batches):
        self.batches = batches

    def __iter__(self):
        return iter(self.batches)

    def __len__(self):
        return len(self.batches)


class Record(Hook):
    """What the run holds after each iteration: lr, momentum, weights and EMA buffers."""

    def __init__(self):
        self.states = []

    def after_train_iter(self, runner):
        group = runner.optimizer.param_groups[0]
        self.states.append(dict(lr=group['lr'], momentum=group['momentum'], model={
            key: value.detach().clone() for key, value in runner.model.state_dict().items()}))


def good(n, seed=1):
    g = torch.Generator().manual_seed(seed)
    return [dict(x=torch.randn(4, 8, generator=g) * 0.5, y=torch.randn(4, 4, generator=g) * 0.5,
                 bad=False) for _ in range(n)]


def with_bad(n=N, bad=BAD):
    """``n`` batches, inf losses at ``bad``; the good ones are ``good(n)``'s first, in order."""
    clean = iter(good(n))
    return [dict(x=torch.zeros(4, 8), y=torch.zeros(4, 4), bad=True) if i in bad
            else next(clean) for i in range(n)]


def train(runner_cls, batches, lr, momentum, follow, hook_cls=Fp16OptimizerHook, ema=EMA,
          record=True, work_dir=None, checkpoint=None, max_iters=N, max_epochs=None, **kwargs):
    model = ToyNet()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    runner = runner_cls(model, optimizer=optimizer, work_dir=work_dir, logger=LOG, meta={},
                        max_epochs=max_epochs)
    hook = hook_cls(loss_scale=512., skip_aware_hooks=follow, **kwargs)
    runner.register_training_hooks(lr_config=dict(lr), optimizer_config=hook,
                                   momentum_config=dict(momentum),
                                   checkpoint_config=checkpoint,
                                   custom_hooks_config=[dict(ema)] if ema else None)
    runner.record = Record()
    if record:
        runner.register_hook(runner.record, priority='LOWEST')
    if runner_cls is IterBasedRunner:
        runner.run([Loader(batches)], [('train', 1)], max_iters=max_iters)
    else:
        runner.run([Loader(batches)], [('train', 1)])
    return runner


def assert_same(a, b):
    assert (a['lr'], a['momentum']) == (b['lr'], b['momentum'])
    assert a['model'].keys() == b['model'].keys() and any('ema_' in k for k in a['model'])
    for key in a['model']:
        assert torch.equal(a['model'][key], b['model'][key]), key


def hook_of(runner, cls):
    return next(h for h in runner.hooks if isinstance(h, cls))


@pytest.mark.parametrize('lr', [STEP, COSINE], ids=['step', 'cosine-warmup'])
def test_iter_based_hooks_end_as_without_the_skipped_iterations(lr):
    reference = train(IterBasedRunner, good(N), lr, CYCLIC, follow=False).record.states
    followed = train(IterBasedRunner, with_bad(), lr, CYCLIC, follow=True)
    assert hook_of(followed, Fp16OptimizerHook).skipped_steps == len(BAD)
    assert followed.meta['fp16'][META_KEY] == record(len(BAD), BAD[-1], 1)
    # after its 10 iterations, as the run without the 2 skipped ones after its 8
    assert_same(followed.record.states[-1], reference[N - len(BAD) - 1])
    # the followed hooks have their own stages back
    for cls in (mmcv.runner.LrUpdaterHook, mmcv.runner.MomentumUpdaterHook, EMAHook):
        assert not set(STAGES) & set(vars(hook_of(followed, cls)))

    plain = train(IterBasedRunner, with_bad(), lr, CYCLIC, follow=False)
    last = plain.record.states[-1]
    assert (last['lr'], last['momentum']) == (reference[-1]['lr'], reference[-1]['momentum'])
    assert last['lr'] != reference[N - len(BAD) - 1]['lr']
    assert META_KEY not in plain.meta['fp16']


def test_epoch_based_hooks_end_as_with_shorter_epochs():
    """Epochs of 5 batches, 2 of them skipped, against epochs of the 3 good ones."""
    lr = dict(policy='step', step=[1, 2], gamma=0.5, warmup='linear', warmup_iters=4,
              warmup_ratio=0.1)
    momentum = dict(policy='step', step=[2], gamma=0.9, warmup='linear', warmup_iters=5,
                    warmup_ratio=0.5)
    epoch = with_bad(5, bad=(1, 3))
    followed = train(EpochBasedRunner, epoch, lr, momentum, follow=True, max_epochs=3)
    reference = train(EpochBasedRunner, good(3), lr, momentum, follow=False, max_epochs=3)
    assert hook_of(followed, Fp16OptimizerHook).skipped_steps == 6
    assert followed.meta['fp16'][META_KEY] == record(6, 13, 1)
    assert_same(followed.record.states[-1], reference.record.states[-1])
    final = {k: v.clone() for k, v in followed.model.state_dict().items()}
    assert all(torch.equal(final[k], v) for k, v in reference.model.state_dict().items())

    plain = train(EpochBasedRunner, epoch, lr, momentum, follow=False, max_epochs=3)
    ema = [k for k in final if k.startswith('ema_')]
    assert any(not torch.equal(plain.model.state_dict()[k], final[k]) for k in ema)


def test_a_skipped_window_of_the_cumulative_hook_counts_all_its_iterations():
    """LR and momentum follow; the window's batches never happened in the reference."""
    bad_window = (4, 5)  # iteration 5's loss is inf: the window of iterations 4 and 5 skips
    batches = with_bad(bad=(5,))
    clean = good(N)
    reference_batches = clean[:4] + clean[5:9] + good(2, seed=9)  # without that window
    followed = train(IterBasedRunner, batches, STEP, CYCLIC, follow=True, ema=None,
                     hook_cls=GradientCumulativeFp16OptimizerHook, cumulative_iters=2)
    reference = train(IterBasedRunner, reference_batches, STEP, CYCLIC, follow=False, ema=None,
                      hook_cls=GradientCumulativeFp16OptimizerHook, cumulative_iters=2)
    assert followed.meta['fp16'][META_KEY] == record(2, 5, 2)
    a, b = followed.record.states[-1], reference.record.states[N - len(bad_window) - 1]
    assert (a['lr'], a['momentum']) == (b['lr'], b['momentum'])
    assert all(torch.equal(a['model'][k], b['model'][k]) for k in a['model'])


def test_the_count_is_checkpointed_and_a_resumed_run_ends_the_same(tmp_path):
    """EMAHook(resume_from=...) resumes in its before_run, after the optimizer hook's."""
    whole = train(IterBasedRunner, with_bad(), COSINE, CYCLIC, follow=True, work_dir=str(tmp_path),
                  checkpoint=dict(interval=6, by_epoch=False))
    saved = torch.load(tmp_path / 'iter_6.pth', map_location='cpu', weights_only=False)
    # mmcv writes iter_6.pth in iteration 5 (a skipped one) with meta['iter'] == 5, and a
    # resumed run repeats iteration 5: its skip is counted again when it is skipped again
    assert saved['meta']['fp16'][META_KEY] == record(2, 5, 1) and saved['meta']['iter'] == 5
    resumed = train(IterBasedRunner, with_bad()[5:], COSINE, CYCLIC, follow=True,
                    ema=dict(EMA, resume_from=str(tmp_path / 'iter_6.pth')))
    assert resumed.iter == N and len(resumed.record.states) == N - 5
    assert resumed.meta['fp16'][META_KEY] == record(2, 5, 1)
    assert_same(resumed.record.states[-1], whole.record.states[-1])


def test_an_ema_hook_before_the_optimizer_hook_is_refused_before_anything_changes():
    model = ToyNet()
    runner = IterBasedRunner(model, optimizer=torch.optim.SGD(model.parameters(), lr=0.05),
                             logger=LOG, meta={}, max_iters=N)
    hook = Fp16OptimizerHook(loss_scale=512., skip_aware_hooks=True)
    runner.register_training_hooks(lr_config=dict(STEP), optimizer_config=hook,
                                   custom_hooks_config=[dict(EMA, priority='HIGH')])
    with pytest.raises(ValueError, match=r'Fp16OptimizerHook: skip_aware_hooks: EMAHook '
                                         r'\(priority 30\) acts after each iteration before '
                                         r'Fp16OptimizerHook \(priority 40\) has stepped'):
        runner.run([Loader(with_bad())], [('train', 1)])
    assert runner.meta == {} and hook.loss_scaler is None and not model.fp16_enabled
    assert not any(set(STAGES) & set(vars(h)) for h in runner.hooks)


def test_a_list_follows_only_the_hooks_it_names():
    followed = train(IterBasedRunner, with_bad(), STEP, CYCLIC, follow=['LrUpdaterHook'])
    reference = train(IterBasedRunner, good(N), STEP, CYCLIC, follow=False).record.states
    plain = train(IterBasedRunner, with_bad(), STEP, CYCLIC, follow=False).record.states
    last = followed.record.states[-1]
    assert last['lr'] == reference[N - len(BAD) - 1]['lr']  # followed
    assert last['momentum'] == plain[-1]['momentum']  # mmcv's
    assert last['momentum'] != reference[N - len(BAD) - 1]['momentum']
