"""``skip_aware_hooks``: a runner's schedule and EMA hooks do not advance on a skipped step.

The option's checks and error paths, and its mechanism on the minimal runner of
``_runner.py`` with two stand-in hooks written as mmcv's are (an LR updater that reads
``runner.iter`` before each iteration, an EMA that warms its momentum up with
``runner.iter`` after each one). The real mmcv and MMEngine hooks are in the consumer
and MMEngine tiers (tests/consumers/test_skip_aware_mmcv.py,
tests/mmengine/test_skip_aware_mmengine.py).
"""

from __future__ import annotations

import copy
import logging
import pickle

import _caps  # tests/ is on sys.path: see conftest.py
import _runner as R
import pytest
import torch

from fp16utils import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook
from fp16utils._args.keys import UnknownKeyError
from fp16utils._args.skip_hooks import (
    MMCV_FOLLOWED,
    MMENGINE_FOLLOWED,
    check_skip_aware_hooks,
    follows,
    record,
)
from fp16utils.hooks.follow import META_KEY, STAGES, RunnerView, SkipLedger

N = 10
BAD = (2, 5)  # the iterations (0-based) whose loss is multiplied by inf


class Hook:
    """Every stage the minimal runner calls, doing nothing (as mmcv's ``Hook``)."""

    def before_run(self, runner):
        pass

    def after_run(self, runner):
        pass

    def before_train_iter(self, runner):
        pass

    def after_train_iter(self, runner):
        pass


class IterLr(Hook):
    """Sets the learning rate from ``runner.iter`` before each iteration (as mmcv's)."""

    def __init__(self):
        self.seen = []

    def before_train_iter(self, runner):
        self.seen.append(runner.iter)
        for group in runner.optimizer.param_groups:
            group['lr'] = 0.05 * 0.5 ** (runner.iter // 3)


class IterEma(Hook):
    """An EMA of the weights after each iteration, its momentum warmed up by ``runner.iter``."""

    def __init__(self, ema=None):
        self.ema, self.updates = ema, 0  # ema: the state a checkpoint of it held

    def before_run(self, runner):
        if self.ema is None:
            self.ema = {k: v.detach().float().clone()
                        for k, v in runner.model.state_dict().items()}

    def after_train_iter(self, runner):
        momentum = min(0.5, (1 + runner.iter) / (4 + runner.iter))
        for key, value in runner.model.state_dict().items():
            self.ema[key].mul_(1 - momentum).add_(value.detach().float(), alpha=momentum)
        self.updates += 1


def loss_of(model, batch):
    """``R.mse`` of ``(x, y)``, times inf when the batch is marked bad (its step is skipped)."""
    x, y, bad = batch
    loss = R.mse(model, (x, y))
    return loss * float('inf') if bad else loss


def batches(bad=BAD, n=N):
    """``n`` batches with inf losses at ``bad``; the good ones in the same order as clean()."""
    good = iter(R.make_data(n))
    out = []
    for i in range(n):
        if i in bad:
            out.append((torch.zeros(4, 8), torch.zeros(4, 4), True))
        else:
            x, y = next(good)
            out.append((x, y, False))
    return out


def clean(n=N):
    return [(x, y, False) for x, y in R.make_data(n)]


def make_hook(cls=Fp16OptimizerHook, **kwargs):
    _caps.require(_caps.LOW, 'native')
    return cls(loss_scale=512., dtype=_caps.LOW, backend='native', **kwargs)


def run(data, until=None, follow=True, hook=None, meta=None, runner=None, **kwargs):
    """Train the minimal runner ([IterLr, optimizer hook, IterEma]) on ``data``."""
    if runner is None:
        hook = hook or make_hook(skip_aware_hooks=[IterLr, IterEma] if follow else False,
                                 **kwargs)
        model = R.Net(seed=0)
        runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                              [IterLr(), hook, IterEma()], max_iters=N,
                              meta={} if meta is None else meta)
    runner.run(data, loss_of, until=until)
    return runner


def outcome(runner):
    lr_hook, hook, ema_hook = runner.hooks
    return dict(lr=runner.optimizer.param_groups[0]['lr'], ema=ema_hook.ema,
                params=dict(runner.model.state_dict()),
                momentum=[runner.optimizer.state[p]['momentum_buffer']
                          for p in runner.model.parameters()])


def assert_same(a, b):
    assert a['lr'] == b['lr']
    for key in a['ema']:
        assert torch.equal(a['ema'][key], b['ema'][key]), key
    for key in a['params']:
        assert torch.equal(a['params'][key], b['params'][key]), key
    assert all(torch.equal(x, y) for x, y in zip(a['momentum'], b['momentum']))


# -- the option's values ---------------------------------------------------------------------


def test_off_true_and_a_list_read_as_documented():
    assert check_skip_aware_hooks(False, 'H', MMCV_FOLLOWED) is None
    assert check_skip_aware_hooks(None, 'H', MMCV_FOLLOWED) is None
    assert check_skip_aware_hooks(True, 'H', MMCV_FOLLOWED) == MMCV_FOLLOWED
    assert check_skip_aware_hooks(True, 'W', MMENGINE_FOLLOWED) == MMENGINE_FOLLOWED
    assert check_skip_aware_hooks('EMAHook', 'H', ()) == ('EMAHook',)
    assert check_skip_aware_hooks(IterLr, 'H', ()) == (IterLr,)
    assert check_skip_aware_hooks(['a.b.C', IterEma], 'H', ()) == ('a.b.C', IterEma)
    assert Fp16OptimizerHook().skip_aware_hooks is False
    assert Fp16OptimizerHook(skip_aware_hooks=True).skip_aware_hooks == MMCV_FOLLOWED
    assert GradientCumulativeFp16OptimizerHook(
        cumulative_iters=2, skip_aware_hooks=['EMAHook']).skip_aware_hooks == ('EMAHook',)


@pytest.mark.parametrize('value, error, words', [
    (1, TypeError, "got 1 (int)"),
    ('yes please', ValueError, "'yes please' is not a class name"),
    ([], ValueError, 'got an empty list (pass False to follow none)'),
    ((IterLr, 3), TypeError, '3 (int) is neither a class nor a class name'),
    ({'EMAHook'}, TypeError, "got {'EMAHook'} (set)"),
    (['EMAHook', ''], ValueError, "'' is not a class name"),
])
def test_a_bad_value_is_refused_naming_it_and_what_is_taken(value, error, words):
    with pytest.raises(error) as info:
        Fp16OptimizerHook(skip_aware_hooks=value)
    message = str(info.value)
    assert message.startswith('Fp16OptimizerHook: skip_aware_hooks must be False')
    assert words in message
    with pytest.raises(error, match='GradientCumulativeFp16OptimizerHook: skip_aware_hooks'):
        GradientCumulativeFp16OptimizerHook(cumulative_iters=2, skip_aware_hooks=value)


def test_a_misspelt_option_is_named_with_the_right_one():
    with pytest.raises(UnknownKeyError, match="'skip_aware_hook' .did you mean 'skip_aware_hooks'"):
        Fp16OptimizerHook(skip_aware_hook=True)


def test_classes_match_along_the_mro_by_name_qualified_name_or_identity():
    class MyEma(IterEma):
        pass

    assert follows(MyEma, ('IterEma',)) and follows(MyEma, (IterEma,))
    assert follows(MyEma, (f'{IterEma.__module__}.IterEma',))
    assert not follows(MyEma, ('IterLr',)) and not follows(MyEma, ('other.module.IterEma',))


# -- the mechanism on the minimal runner -----------------------------------------------------


def test_followed_hooks_end_as_in_a_run_without_the_skipped_iterations(caplog):
    with caplog.at_level(logging.INFO, logger='mini_runner'):
        followed = run(batches())
    assert ('Fp16OptimizerHook: skip_aware_hooks: following IterLr, IterEma (they do not '
            'advance on a skipped step)' in caplog.text)
    hook = followed.hooks[1]
    assert hook.skipped_steps == len(BAD)
    assert followed.meta['fp16'][META_KEY] == record(len(BAD), BAD[-1], 1)
    reference = run(clean(), until=N - len(BAD), follow=False)  # same schedule, 8 iterations
    assert_same(outcome(followed), outcome(reference))
    assert followed.hooks[2].updates == N - len(BAD)
    # the LR hook saw the iterations of the run without them: each skipped one repeated
    assert followed.hooks[0].seen == [0, 1, 2, 2, 3, 4, 4, 5, 6, 7]


def test_without_the_option_the_hooks_advance_at_every_iteration():
    plain = run(batches(), follow=False)
    assert plain.hooks[1].skipped_steps == len(BAD) and META_KEY not in plain.meta['fp16']
    assert plain.hooks[0].seen == list(range(N)) and plain.hooks[2].updates == N
    assert plain.optimizer.param_groups[0]['lr'] == 0.05 * 0.5 ** ((N - 1) // 3)
    reference = run(clean(), until=N - len(BAD), follow=False)
    assert plain.optimizer.param_groups[0]['lr'] != reference.optimizer.param_groups[0]['lr']


def test_the_count_survives_a_checkpoint_and_the_resumed_run_ends_the_same():
    data = batches()
    first = run(data, until=6)
    assert first.meta['fp16'][META_KEY] == record(2, 5, 1)
    checkpoint = first.save_checkpoint()

    hook = make_hook(skip_aware_hooks=[IterLr, IterEma])
    model = R.Net(seed=0)
    ema = IterEma({k: v.clone() for k, v in first.hooks[2].ema.items()})
    resumed = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9),
                           [IterLr(), hook, ema], max_iters=N, meta={})
    resumed.resume(checkpoint)
    resumed.run(data, loss_of)
    assert resumed.hooks[0].seen == [4, 5, 6, 7]
    assert_same(outcome(resumed), outcome(run(data)))


def test_a_resumed_run_without_the_count_warns_and_counts_from_there(caplog):
    data = batches()
    runner = run(data, until=4, follow=False)
    runner.meta['fp16'].pop(META_KEY, None)
    hook = make_hook(skip_aware_hooks=[IterLr, IterEma])
    runner.hooks[1] = hook
    with caplog.at_level(logging.WARNING, logger='mini_runner'):
        runner.run(data, loss_of, until=5)
    assert ('skip_aware_hooks: the run starts at iteration 4, but '
            "runner.meta['fp16']['skip_aware_hooks'] holds no record of skipped iterations"
            in caplog.text)
    assert runner.meta['fp16'][META_KEY] == record(0, -1, 0)
    assert runner.hooks[0].seen[-1] == 4  # counted from there


@pytest.mark.parametrize('saved', [2, record(-1, 5, 0), record(2, 0, 1), record(1, 5, 2),
                                   dict(record(), extra=1), {'skipped_iters': 2.5,
                                                             'last_skipped': 3, 'last_count': 1}])
def test_a_bad_saved_record_is_refused_and_nothing_is_followed(saved):
    hook = make_hook(skip_aware_hooks=[IterLr, IterEma])
    model = R.Net(seed=0)
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.05),
                          [IterLr(), hook, IterEma()], max_iters=N,
                          meta={'fp16': {META_KEY: saved}})
    runner.iter = 6
    with pytest.raises(ValueError) as info:
        hook.before_run(runner)
    assert str(info.value) == (
        "Fp16OptimizerHook: runner.meta['fp16']['skip_aware_hooks'] must be the record of the "
        "skipped iterations that skip_aware_hooks saves, a dict of whole numbers "
        "{'skipped_iters': 2, 'last_skipped': 5, 'last_count': 1} (skipped_iters, "
        'last_skipped, last_count: skipped so far, the last one, its length); got '
        f'{saved!r}.')
    assert runner.meta == {'fp16': {META_KEY: saved}} and hook._engine is None
    assert not any(stage in vars(h) for h in runner.hooks for stage in STAGES)


def test_a_hook_that_acts_after_an_iteration_before_the_step_is_refused():
    hook = make_hook(skip_aware_hooks=[IterLr, IterEma])
    model = R.Net(seed=0)
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.05),
                          [IterLr(), IterEma(), hook], max_iters=N, meta={})
    with pytest.raises(ValueError, match=r'Fp16OptimizerHook: skip_aware_hooks: IterEma '
                                         r'\(priority None\) acts after each iteration before '
                                         r'Fp16OptimizerHook .* cannot know whether the step '
                                         r'is skipped; register it with a lower priority'):
        hook.before_run(runner)
    assert runner.meta == {} and hook._engine is None
    assert not any(stage in vars(h) for h in runner.hooks for stage in STAGES)


def test_a_listed_class_the_runner_lacks_is_refused_naming_its_hooks():
    hook = make_hook(skip_aware_hooks=['IterLr', 'EMAHook'])
    model = R.Net(seed=0)
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.05),
                          [IterLr(), hook], max_iters=N, meta={})
    with pytest.raises(ValueError, match="skip_aware_hooks names EMAHook, which none of the "
                                         "runner's hooks is; its hooks are IterLr, "
                                         'Fp16OptimizerHook'):
        hook.before_run(runner)


def test_true_follows_nothing_on_a_runner_without_mmcvs_hooks(caplog):
    with caplog.at_level(logging.INFO, logger='mini_runner'):
        runner = run(batches(), hook=make_hook(skip_aware_hooks=True))
    assert ("skip_aware_hooks: following no hook (none of the runner's hooks is "
            'LrUpdaterHook, MomentumUpdaterHook, EMAHook, BaseEMAHook)' in caplog.text)
    assert runner.hooks[0].seen == list(range(N))  # not an mmcv hook: not followed
    assert runner.meta['fp16'][META_KEY]['skipped_iters'] == len(BAD)


def test_after_the_run_the_hooks_have_their_own_stages_back():
    runner = run(batches())
    lr_hook, hook, ema_hook = runner.hooks
    assert not any(stage in vars(h) for h in (lr_hook, ema_hook) for stage in STAGES)
    assert hook._skips.hooks == [] and hook._skips.runner is None


def test_a_followed_hook_called_by_another_runner_sees_that_runner():
    followed = run(batches(), until=3)
    lr_hook = followed.hooks[0]
    ledger = followed.hooks[1]._skips
    ledger.connect(followed, followed.hooks, followed.hooks[1])
    other = R.MiniRunner(R.Net(), torch.optim.SGD(R.Net().parameters(), lr=1.0))
    other.iter = 7
    lr_hook.before_train_iter(other)
    assert lr_hook.seen[-1] == 7
    lr_hook.before_train_iter(followed)
    assert lr_hook.seen[-1] == followed.iter - 1  # one skip before iteration 3
    ledger.disconnect()


def test_a_skipped_window_counts_all_its_iterations():
    hook = make_hook(GradientCumulativeFp16OptimizerHook, cumulative_iters=2,
                     skip_aware_hooks=[IterLr])
    data = batches(bad=(3,))  # in the window of iterations 2 and 3
    runner = run(data, hook=hook)
    assert hook.skipped_steps == 1 and runner.meta['fp16'][META_KEY] == record(2, 3, 2)
    assert runner.hooks[0].seen == [0, 1, 2, 3, 2, 3, 4, 5, 6, 7]


def test_the_hook_with_its_ledger_copies_and_pickles_after_a_run():
    runner = run(batches())
    hook = runner.hooks[1]
    for copied in (copy.deepcopy(hook), pickle.loads(pickle.dumps(hook))):
        assert copied._skips.followed == (IterLr, IterEma)
        assert copied._skips.runner is None and copied._skips.hooks == []
        assert copied._skips.skipped_iters == len(BAD)


def test_the_view_reads_and_writes_through_to_the_runner():
    runner = R.MiniRunner(R.Net(), torch.optim.SGD(R.Net().parameters(), lr=1.0), max_iters=9)
    runner.iter = 7
    view = RunnerView(runner, 5, {'param_schedulers': {'gen': []}})
    assert view.iter == 5 and view.max_iters == 9 and view.param_schedulers == {'gen': []}
    assert isinstance(view, R.MiniRunner) and 'iter=5' in repr(view)
    view.outputs = {'loss': 1}
    assert runner.outputs == {'loss': 1}


@pytest.mark.parametrize('start, expected', [(6, 2), (5, 1), (9, 2)])
def test_a_saved_record_counts_the_skips_before_the_iteration_the_run_starts_at(start, expected):
    """mmcv's IterBasedRunner resumes at the iteration its checkpoint was written in: the
    skip recorded there is decided again, so it is not counted."""
    ledger = SkipLedger.parse([IterLr], 'Fp16OptimizerHook', ())
    runner = R.MiniRunner(R.Net(), torch.optim.SGD(R.Net().parameters(), lr=1.0))
    runner.iter = start
    ledger.take(runner, record(2, 5, 1), 'meta')
    assert ledger.skipped_iters == expected


def test_a_record_with_more_skips_than_iterations_is_clamped_with_a_warning(caplog):
    ledger = SkipLedger.parse([IterLr], 'Fp16OptimizerHook', ())
    runner = R.MiniRunner(R.Net(), torch.optim.SGD(R.Net().parameters(), lr=1.0))
    runner.iter = 3
    with caplog.at_level(logging.WARNING, logger='mini_runner'):
        ledger.take(runner, record(6, 9, 1), 'meta')
    assert ledger.skipped_iters == 3
    assert 'meta counts 5 skipped iterations, more than the 3 the run starts after' in caplog.text
