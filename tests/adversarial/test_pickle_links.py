"""Attacks on copying objects that refer to each other: pickle, deepcopy, torch.save.

A wrapper (both backends), a wrapper dict, both 0.x hooks and ``skip_aware`` followers
are copied alone and together with what they refer to (the model, the optimizer, the
wrapper a follower follows) in one ``pickle.dumps`` of a tuple or dict, one
``copy.deepcopy`` and one ``torch.save``. Together, the copies refer to each other as the
originals did, and the copied set trains on bit-identically to the originals.
"""

from __future__ import annotations

import copy
import io
import pickle

import _caps
import _runner as R
import pytest
import torch
from torch.optim.swa_utils import AveragedModel

from fp16utils import (
    AmpOptimWrapper,
    Fp16OptimizerHook,
    GradientCumulativeFp16OptimizerHook,
    OptimWrapper,
    OptimWrapperDict,
    skip_aware,
)
from fp16utils.skip_proxy import SkipAware

F16 = torch.float16
#: torch's LR schedulers wrap optimizer.step; a pickled optimizer comes back unwrapped and
#: the scheduler says so once (its schedule is unaffected).
pytestmark = pytest.mark.filterwarnings(
    'ignore:Seems like `optimizer.step\\(\\)` has been overridden:UserWarning')


def _torch_roundtrip(obj):
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    buffer.seek(0)
    return torch.load(buffer, weights_only=False)


COPIES = {
    'pickle': lambda obj: pickle.loads(pickle.dumps(obj)),
    'pickle-protocol-2': lambda obj: pickle.loads(pickle.dumps(obj, protocol=2)),
    'deepcopy': copy.deepcopy,
    'torch.save': _torch_roundtrip,
}
KINDS = ['plain', 'native', 'legacy']


def _require(kind):
    if kind != 'plain':
        _caps.require(F16, 'native' if kind == 'native' else None)


def _wrapper(kind, model, **kwargs):
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    if kind == 'plain':
        return OptimWrapper(optimizer, **kwargs)
    return AmpOptimWrapper(optimizer, backend=kind, model=model,
                           loss_scale=dict(init_scale=256., growth_interval=1), **kwargs)


def _step(model, wrapper, batch):
    with wrapper.optim_context(model):
        loss = R.mse(model, batch)
    return wrapper.update_params(loss)


def _running_mean(averaged, current, num_averaged):
    """AveragedModel's default average, at module level so that it pickles."""
    return averaged + (current - averaged) / (num_averaged + 1)


def _default_average_pickles() -> bool:
    try:
        pickle.dumps(AveragedModel(torch.nn.Linear(1, 1)))
    except (AttributeError, pickle.PicklingError):  # torch < 2.0: a local avg_fn
        return False
    return True


#: AveragedModel's own arguments where it pickles; where its default average is a
#: local function (torch < 2.0), the same average given at module level.
EMA_KWARGS = {} if _default_average_pickles() else {'avg_fn': _running_mean}


def _set(kind, **kwargs):
    """model, wrapper, an LR scheduler and an EMA model following it; trained 3 steps."""
    model = R.Net(seed=2)
    wrapper = _wrapper(kind, model, **kwargs)
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5), wrapper)
    ema = skip_aware(AveragedModel(model, **EMA_KWARGS), wrapper)
    data = R.make_data(3)
    if kind != 'plain':
        data[1] = R.overflow_batch()
    for batch in data:
        _step(model, wrapper, batch)
        sched.step()
        ema.update_parameters(model)
    return {'model': model, 'wrapper': wrapper, 'sched': sched, 'ema': ema}


def _train_on(objs, batches):
    """Train a set; return what must come out bit-identical."""
    model, wrapper, sched, ema = objs['model'], objs['wrapper'], objs['sched'], objs['ema']
    results = []
    for batch in batches:
        results.append(_step(model, wrapper, batch))
        sched.step()
        ema.update_parameters(model)
    return {'params': [p.detach().clone() for p in model.parameters()],
            'ema': [p.detach().clone() for p in ema.module.parameters()],
            'n_averaged': int(ema.n_averaged), 'lr': sched.get_last_lr(),
            'last_epoch': sched.last_epoch, 'results': results,
            'scale': getattr(wrapper, 'loss_scale', None),
            'skipped': getattr(wrapper, 'skipped_steps', 0), 'taken': wrapper.steps_taken}


def _assert_same(a, b):
    assert a.keys() == b.keys()
    for key in a:
        if key in ('params', 'ema'):
            assert all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a[key], b[key]))
        else:
            assert a[key] == b[key], key


def _assert_linked(objs):
    model, wrapper, sched, ema = objs['model'], objs['wrapper'], objs['sched'], objs['ema']
    assert isinstance(sched, SkipAware) and isinstance(ema, SkipAware)
    assert sched._source() is wrapper and ema._source() is wrapper
    assert sched.optimizer is wrapper.optimizer
    held = {id(p) for g in wrapper.optimizer.param_groups for p in g['params']}
    if getattr(wrapper, 'backend', 'native') == 'native':
        assert held == {id(p) for p in model.parameters()}
    else:  # the masters are the optimizer's; the engine writes into this model
        assert held == {id(m) for m in wrapper.master_params}
        assert [id(p) for p in wrapper._engine.model_params] == [
            id(p) for p in model.parameters()]
        assert wrapper._model is model


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('how', COPIES)
@pytest.mark.parametrize('container', ['tuple', 'dict', 'follower-first'])
def test_a_set_copied_together_stays_linked_and_trains_on_identically(kind, how, container):
    _require(kind)
    objs = _set(kind)
    names = ['model', 'wrapper', 'sched', 'ema']
    if container == 'follower-first':
        names = names[::-1]
    packed = {n: objs[n] for n in names} if container == 'dict' else tuple(objs[n] for n in names)
    restored = COPIES[how](packed)
    copies = restored if container == 'dict' else dict(zip(names, restored))
    _assert_linked(copies)
    assert copies['wrapper'].steps_taken == objs['wrapper'].steps_taken
    batches = R.make_data(4, seed=9)
    if kind != 'plain':
        batches[2] = R.overflow_batch()
    _assert_same(_train_on(objs, batches), _train_on(copies, batches))


@pytest.mark.parametrize('kind', ['native', 'legacy'])
@pytest.mark.parametrize('how', COPIES)
def test_a_wrapper_copied_in_the_middle_of_an_accumulation_window_finishes_it(kind, how):
    _require(kind)
    model = R.Net(seed=2)
    wrapper = _wrapper(kind, model, accumulative_counts=2)
    data = R.make_data(5)
    for batch in data[:3]:
        _step(model, wrapper, batch)
    copies = COPIES[how]((model, wrapper))
    for batch in data[3:]:
        a, b = _step(model, wrapper, batch), _step(copies[0], copies[1], batch)
        assert a == b
    assert all(torch.equal(x, y) for x, y in zip(model.parameters(), copies[0].parameters()))
    assert copies[1].loss_scale == wrapper.loss_scale


@pytest.mark.parametrize('kind', KINDS)
@pytest.mark.parametrize('how', COPIES)
def test_a_wrapper_copied_alone_keeps_its_state(kind, how):
    _require(kind)
    objs = _set(kind)
    wrapper = objs['wrapper']
    clone = COPIES[how](wrapper)
    expected, got = wrapper.state_dict(), clone.state_dict()
    assert expected.keys() == got.keys()
    for key in ('loss_scaler', 'fp16_stats'):
        assert expected.get(key) == got.get(key)
    assert clone.steps_taken == wrapper.steps_taken and clone.inner_count == wrapper.inner_count


@pytest.mark.parametrize('how', COPIES)
def test_a_follower_copied_alone_forwards_but_refuses_to_advance(how):
    objs = _set('plain')
    sched = COPIES[how](objs['sched'])
    assert isinstance(sched, SkipAware) and sched.get_last_lr() == objs['sched'].get_last_lr()
    with pytest.raises(ReferenceError, match='copied or unpickled without it'):
        sched.step()


class _CopiesItself:
    """A follower-like object with its own __deepcopy__ (the proxy must not forward to it)."""

    def __init__(self):
        self.steps = 0

    def step(self):
        self.steps += 1

    def __deepcopy__(self, memo):
        clone = _CopiesItself()
        clone.steps = self.steps
        return clone


def test_a_follower_whose_object_deep_copies_itself_stays_a_linked_follower():
    model = R.Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))
    follower = skip_aware(_CopiesItself(), wrapper)
    m2, w2, f2 = copy.deepcopy((model, wrapper, follower))
    assert isinstance(f2, SkipAware) and f2._source() is w2
    assert f2.__wrapped__ is not follower.__wrapped__
    f2.step()  # no optimizer step taken yet: nothing
    w2.update_params(R.mse(m2, R.make_data(1)[0]))
    f2.step()
    follower.step()  # the original's wrapper took no step
    assert (f2.steps, follower.steps) == (1, 0)


def test_a_wrapper_dict_and_its_entries_followers_copy_together():
    gen, dis = R.Net(seed=1), R.Net(seed=2)
    wrappers = OptimWrapperDict(gen=OptimWrapper(torch.optim.SGD(gen.parameters(), lr=0.1)),
                                dis=OptimWrapper(torch.optim.SGD(dis.parameters(), lr=0.1)))
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(wrappers['gen'].optimizer, 1, 0.5),
                       wrappers['gen'])
    for how, make in COPIES.items():
        g2, d2, w2, s2 = make((gen, dis, wrappers, sched))
        assert s2._source() is w2['gen'] and s2.optimizer is w2['gen'].optimizer
        assert [id(p) for p in w2['gen'].optimizer.param_groups[0]['params']] == [
            id(p) for p in g2.parameters()], how
        batch = R.make_data(1)[0]
        for model, wrapper, follower in ((gen, wrappers, sched), (g2, w2, s2)):
            wrapper['gen'].update_params(R.mse(model, batch))
            follower.step()
        assert s2.get_last_lr() == sched.get_last_lr()
        assert all(torch.equal(a, b) for a, b in zip(gen.parameters(), g2.parameters()))


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('how', COPIES)
@pytest.mark.parametrize('cumulative', [False, True])
def test_a_hook_copied_with_its_runner_trains_on_identically(backend, how, cumulative):
    _caps.require(F16, 'native' if backend == 'native' else None)
    if cumulative:
        hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=2, backend=backend,
                                                   loss_scale=dict(init_scale=256.))
    else:
        hook = Fp16OptimizerHook(backend=backend, loss_scale=dict(init_scale=256.))
    model = R.Net(seed=3)
    runner = R.MiniRunner(model, torch.optim.Adam(model.parameters(), lr=1e-3), [hook],
                          max_iters=6, meta={})
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(runner.optimizer, 1, 0.5), hook)
    data = R.make_data(6)
    data[1] = R.overflow_batch()
    runner.run(data, R.mse, until=3)
    runner.outputs = None  # the last loss (with its graph) is not part of the state
    h2, r2, s2 = COPIES[how]((hook, runner, sched))
    assert r2.hooks[0] is h2 and s2._source() is h2 and s2.optimizer is r2.optimizer
    assert h2._optimizer is r2.optimizer and h2.loss_scale == hook.loss_scale
    for r, s in ((runner, sched), (r2, s2)):
        r.run(data, R.mse)
        s.step()
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), r2.model.parameters()))
    assert h2.scale_history == hook.scale_history and h2.steps_taken == hook.steps_taken
    assert s2.get_last_lr() == sched.get_last_lr()


@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('how', COPIES)
def test_a_cumulative_hook_copied_mid_window_finishes_the_window(backend, how):
    """Copied between two backwards of a window, the iterations go on without a new
    before_run: the gradients accumulated so far travel with the hook."""
    _caps.require(F16, 'native' if backend == 'native' else None)
    hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=3, backend=backend,
                                               loss_scale=dict(init_scale=256.))
    model = R.Net(seed=3)
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.1), [hook],
                          max_iters=6, meta={})
    data = R.make_data(6)
    runner.run(data, R.mse, until=4)  # iteration 3 opened the second window
    runner.outputs = None
    h2, r2 = COPIES[how]((hook, runner))
    for r, h in ((runner, hook), (r2, h2)):
        for it in (4, 5):
            r.iter = it
            r.outputs = {'loss': R.mse(r.model, data[it]), 'num_samples': 4}
            h.after_train_iter(r)
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), r2.model.parameters()))
    assert h2.steps_taken == hook.steps_taken == 2
