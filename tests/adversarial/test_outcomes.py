"""Attacks on the step-outcome entry points: StepResult, skip_aware, overflow_guard.

Each bad input must raise an exception that names the problem, and change nothing.
"""

from __future__ import annotations

import gc
import pickle

import _caps  # tests/ is on sys.path: see tests/conftest.py
import _runner as R
import pytest
import torch
from torch import nn

from fp16utils import (
    AmpOptimWrapper,
    Fp16OptimizerHook,
    GradientCumulativeFp16OptimizerHook,
    OptimWrapper,
    OptimWrapperDict,
    StepResult,
    build_optim_wrapper,
    skip_aware,
)

BAD_GUARDS = [
    (dict(max_consecutive=0), ValueError, 'int >= 1'),
    (dict(max_consecutive=-3), ValueError, 'int >= 1'),
    (dict(max_consecutive=1.5), ValueError, 'int >= 1'),
    (dict(max_consecutive=True), ValueError, 'int >= 1'),
    (dict(max_consecutive='3'), ValueError, 'int >= 1'),
    (dict(max_consecutive=None), ValueError, 'int >= 1'),
    (dict(action='Raise'), ValueError, "one of \\['diagnose', 'raise'\\]"),
    (dict(action=None), ValueError, "one of \\['diagnose', 'raise'\\]"),
    (dict(action='log'), ValueError, "one of \\['diagnose', 'raise'\\]"),
    (dict(max_consecutive=2, actoin='raise'), ValueError, "unknown key\\(s\\) \\['actoin'\\]"),
    (dict(type='OverflowGuard'), ValueError, 'unknown key'),
    ('raise', TypeError, 'must be a dict'),
    ([('max_consecutive', 2)], TypeError, 'must be a dict'),
    (True, TypeError, 'must be a dict'),
    (3, TypeError, 'must be a dict'),
]


@pytest.mark.parametrize('guard, exc, match', BAD_GUARDS)
def test_amp_wrapper_refuses_a_bad_overflow_guard_and_changes_nothing(guard, exc, match):
    dtype = _caps.LEGACY_LOW
    model = R.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    groups = [list(g['params']) for g in optimizer.param_groups]
    with pytest.raises(exc, match=match):
        AmpOptimWrapper(optimizer=optimizer, backend='legacy', model=model, dtype=dtype,
                        overflow_guard=guard)
    assert all(p.dtype == torch.float32 for p in model.parameters())  # not converted
    assert [list(g['params']) for g in optimizer.param_groups] == groups  # no masters


@pytest.mark.parametrize('guard, exc, match', BAD_GUARDS)
@pytest.mark.parametrize('hook_cls', [Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook])
def test_hooks_refuse_a_bad_overflow_guard(hook_cls, guard, exc, match):
    with pytest.raises(exc, match=match):
        hook_cls(overflow_guard=guard)


@pytest.mark.parametrize('guard, exc, match', BAD_GUARDS[:10])
def test_configs_refuse_a_bad_overflow_guard(guard, exc, match):
    with pytest.raises(exc, match=match):
        build_optim_wrapper(R.Net(), dict(type='AmpOptimWrapper', dtype=_caps.NAMES[_caps.LOW],
                                          optimizer=dict(type='SGD', lr=0.1),
                                          overflow_guard=guard))


def test_plain_optim_wrapper_has_no_overflow_guard():
    with pytest.raises(TypeError):
        OptimWrapper(torch.optim.SGD(R.Net().parameters(), lr=0.1),
                     overflow_guard=dict(max_consecutive=1))
    with pytest.raises(ValueError, match="belong to type='AmpOptimWrapper'|unknown key"):
        build_optim_wrapper(R.Net(), dict(optimizer=dict(type='SGD', lr=0.1),
                                          overflow_guard=dict(max_consecutive=1)))


# ------------------------------------------------------------------------ skip_aware


def _wrapper():
    model = R.Net()
    return model, OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1))


class StepAttr:
    step = 5  # an attribute named step that cannot be called


@pytest.mark.parametrize('obj', [None, 3, 'step', object(), nn.Linear(1, 1), StepAttr(),
                                 [lambda: None]],
                         ids=['None', 'int', 'str', 'object', 'module', 'step-attr', 'list'])
def test_skip_aware_refuses_objects_with_neither_method(obj):
    _, wrapper = _wrapper()
    with pytest.raises(TypeError, match='has neither'):
        skip_aware(obj, wrapper)


class FakeCounted:
    def __init__(self, steps_taken):
        self.steps_taken = steps_taken


@pytest.mark.parametrize('make, match', [
    (lambda w: None, 'got NoneType'),
    (lambda w: 'wrapper', 'got str'),
    (lambda w: FakeCounted('3'), 'got FakeCounted'),
    (lambda w: FakeCounted(True), 'got FakeCounted'),
    (lambda w: FakeCounted(1.0), 'got FakeCounted'),
    (lambda w: w.optimizer, 'got SGD'),
    (lambda w: OptimWrapperDict(gen=w), r"pass one entry, e.g. optim_wrapper\['generator'\]"),
], ids=['None', 'str', 'str-count', 'bool-count', 'float-count', 'optimizer', 'dict'])
def test_skip_aware_refuses_what_does_not_count_steps_and_changes_nothing(make, match):
    model, wrapper = _wrapper()
    sched = torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5)
    before = dict(vars(sched))
    source = make(wrapper)
    with pytest.raises(TypeError, match=match):
        skip_aware(sched, source)
    assert vars(sched) == before


def test_skip_aware_refuses_double_wrapping_and_the_wrapper_itself():
    _, wrapper = _wrapper()
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5), wrapper)
    with pytest.raises(ValueError, match='already skip-aware'):
        skip_aware(sched, wrapper)
    with pytest.raises(ValueError, match='the wrapper itself'):
        skip_aware(wrapper, wrapper)


def test_follower_used_after_the_wrapper_is_gone():
    model, wrapper = _wrapper()
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5), wrapper)
    ema = skip_aware(torch.optim.swa_utils.AveragedModel(model), wrapper)
    del wrapper
    gc.collect()
    with pytest.raises(ReferenceError, match='is gone'):
        sched.step()
    with pytest.raises(ReferenceError, match='is gone'):
        ema.update_parameters(model)
    assert sched.last_epoch == 0 and int(ema.n_averaged) == 0  # nothing advanced
    assert sched.get_last_lr() == [0.1]  # reading still works


def test_follower_pickled_alone_refuses_to_advance():
    _, wrapper = _wrapper()
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5), wrapper)
    alone = pickle.loads(pickle.dumps(sched))
    with pytest.raises(ReferenceError, match='copied or unpickled without it'):
        alone.step()


def test_follower_method_the_object_lacks_is_an_attribute_error():
    _, wrapper = _wrapper()
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5), wrapper)
    with pytest.raises(AttributeError, match="'StepLR' object has no attribute "
                                             "'update_parameters'"):
        sched.update_parameters(None)
    with pytest.raises(AttributeError):
        sched.no_such_attribute  # noqa: B018
    with pytest.raises(TypeError):
        sched(1)  # a scheduler is not callable: the error is the scheduler's


def test_follower_of_a_hook_before_its_run_counts_from_zero():
    hook = Fp16OptimizerHook()
    model = R.Net()
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(
        torch.optim.SGD(model.parameters(), lr=0.1), 1, 0.5), hook)
    sched.step()
    assert sched.last_epoch == 0 and hook.steps_taken == 0 and hook.last_result is None


# ------------------------------------------------------------------------ StepResult


@pytest.mark.parametrize('kwargs', [
    {}, dict(stepped=True, skipped=True), dict(skipped=True, accumulating=True),
    dict(stepped=True, skipped=True, accumulating=True), dict(scale=2.0)],
    ids=['none', 'stepped+skipped', 'skipped+accumulating', 'all', 'scale-only'])
def test_step_result_needs_exactly_one_outcome(kwargs):
    with pytest.raises(ValueError, match='exactly one of stepped, skipped and accumulating'):
        StepResult(**kwargs)


def test_step_result_refuses_bad_numbers_and_mutation():
    with pytest.raises(ValueError):
        StepResult(stepped=True, grad_norm='big')
    with pytest.raises(ValueError):
        StepResult(stepped=True, scale='high')
    r = StepResult(stepped=True, scale=2.0)
    for name in ('stepped', 'scale', 'grad_norm', '_norm', 'new'):
        with pytest.raises(AttributeError, match='immutable'):
            setattr(r, name, 1)
    assert r == StepResult(stepped=True, scale=2.0)


def test_last_results_of_an_empty_dict_and_of_foreign_entries():
    assert OptimWrapperDict().last_results == {}
