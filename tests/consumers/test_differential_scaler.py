"""Differential: ``LossScaler`` and the hooks' checkpoint state against mmcv 1.7.2's own.

``LossScaler``: random sequences of overflowing and clean steps, in both modes, with
several initial scales, factors and windows: the scale after each step and the state
are equal; a state saved by either loads in the other and both go on alike;
``has_overflow`` answers alike on gradients with infs and NaNs.

The hooks: mmcv's ``Fp16OptimizerHook`` of the current torch (``torch.cuda.amp.GradScaler``,
given the same scaler enabled on the CPU, as it runs on a GPU) against fp16utils'
native backend, and mmcv's hook of torch < 1.6 (float32 masters, ``LossScaler``)
against the legacy backend, on the same model and batches (one of which overflows):
``runner.meta['fp16']['loss_scaler']`` and the parameters are equal after each run,
and what either wrote resumes in the other.
"""

from __future__ import annotations

import itertools
import math
import random

import _consumers
import pytest

_consumers.require()

import torch  # noqa: E402
from _mmcv_ref import (  # noqa: E402
    call,
    compares,
    fp16_utils,
    mmcv_legacy_hook,
    mmcv_native_hook,
    optimizer_hooks,
    shapes,
)
from _runner import MiniRunner  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

import fp16utils  # noqa: E402

INIT = [1, 3.0, 512, 2.0**16, 2**32, 2.0**40]
FACTOR = [1, 1.5, 2.0, 2, 3.0, 4.0]  # 1: a dynamic scale that never moves
WINDOW = [1, 2, 3, 7, 1000]
MODES = ['dynamic', 'static']

shapes('LossScaler.update_scale', [f'init_scale={i!r}, mode={m}, scale_factor={f!r}, '
                                   f'scale_window={w}'
                                   for i in INIT for m in MODES for f in FACTOR for w in WINDOW])
shapes('LossScaler.load_state_dict', ['state of mmcv into fp16utils',
                                      'state of fp16utils into mmcv'])

SCALERS = st.tuples(st.sampled_from(INIT), st.sampled_from(MODES), st.sampled_from(FACTOR),
                    st.sampled_from(WINDOW))
# At most 40 steps with a factor <= 4 from <= 2**40: never past 2**127 (a difference below).
STEPS = st.lists(st.booleans(), max_size=40)
PROPERTY = settings(max_examples=150, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow])


def pair(init, mode, factor, window):
    args = dict(init_scale=init, mode=mode, scale_factor=factor, scale_window=window)
    return fp16_utils().LossScaler(**args), fp16utils.LossScaler(**args)


def run_alike(theirs, ours, steps):
    for i, overflow in enumerate(steps):
        theirs.update_scale(overflow)
        ours.update_scale(overflow)
        assert ours.loss_scale == theirs.loss_scale, f'step {i}'
        assert ours.state_dict() == theirs.state_dict(), f'step {i}'


def test_every_configuration_follows_mmcv_over_a_fixed_sequence():
    """Each (init_scale, mode, scale_factor, scale_window): 40 steps, a state round trip."""
    for i, args in enumerate(itertools.product(INIT, MODES, FACTOR, WINDOW)):
        rng = random.Random(i)
        steps = [rng.random() < 0.3 for _ in range(40)]
        theirs, ours = pair(*args)
        try:
            run_alike(theirs, ours, steps[:20])
            resumed, reloaded = pair(*args)[1], pair(*args)[0]
            resumed.load_state_dict(theirs.state_dict())
            reloaded.load_state_dict(ours.state_dict())
            run_alike(theirs, resumed, steps[20:])
            run_alike(reloaded, ours, steps[20:])
        except AssertionError as err:
            raise AssertionError(f'{args}: {err}') from None


@PROPERTY
@given(SCALERS, STEPS)
def test_random_update_sequences_give_the_same_scale_and_state(args, steps):
    theirs, ours = pair(*args)
    assert ours.state_dict() == theirs.state_dict()
    run_alike(theirs, ours, steps)


@PROPERTY
@given(SCALERS, STEPS, STEPS, SCALERS)
def test_states_load_in_the_other_and_both_go_on_alike(args, before, after, other):
    theirs, ours = pair(*args)
    run_alike(theirs, ours, before)
    # mmcv's state into a fp16utils scaler made with other arguments, and back.
    _, resumed = pair(*other)
    resumed.load_state_dict(theirs.state_dict())
    assert resumed.state_dict() == theirs.state_dict()
    reloaded, _ = pair(*other)
    reloaded.load_state_dict(ours.state_dict())
    assert reloaded.state_dict() == ours.state_dict()
    run_alike(theirs, resumed, after)
    run_alike(reloaded, ours, after)


GRADS = {
    'None': None,
    'finite float32': torch.tensor([1.0, -3.0]),
    'finite float16': torch.tensor([6e4, -6e4], dtype=torch.float16),
    'finite bfloat16': torch.tensor([1e30], dtype=torch.bfloat16),
    'inf float32': torch.tensor([1.0, math.inf]),
    '-inf float16': torch.tensor([-math.inf], dtype=torch.float16),
    'nan float32': torch.tensor([math.nan, 0.0]),
    'nan bfloat16': torch.tensor([math.nan], dtype=torch.bfloat16),
    'inf and -inf float32': torch.tensor([math.inf, -math.inf]),
    'empty float32': torch.zeros(0),
}
shapes('LossScaler.has_overflow', [f'dynamic, grads: {k}' for k in GRADS])


def params_with(grads):
    params = []
    for grad in grads:
        param = nn.Parameter(torch.zeros(grad.shape if grad is not None else 1,
                                         dtype=grad.dtype if grad is not None else torch.float32))
        param.grad = None if grad is None else grad.clone()
        params.append(param)
    return params


def test_has_overflow_answers_alike_for_each_kind_of_gradient():
    theirs, ours = pair(2.0**16, 'dynamic', 2.0, 1000)
    for name, grad in GRADS.items():
        params = params_with([grad])
        assert ours.has_overflow(params) == theirs.has_overflow(params), name
    params = params_with(list(GRADS.values()))
    assert ours.has_overflow(params) is theirs.has_overflow(params) is True


@PROPERTY
@given(st.lists(st.sampled_from(sorted(GRADS)), max_size=5))
def test_has_overflow_answers_alike_in_dynamic_mode(names):
    params = params_with([GRADS[name] for name in names])
    theirs, ours = pair(2.0**16, 'dynamic', 2.0, 1000)
    assert ours.has_overflow(params) == theirs.has_overflow(params)
    assert ours.has_overflow(iter(params)) == theirs.has_overflow(iter(params))


# -- the differences docs/reference/differences-mmcv.md lists (LossScaler) ----------------


@compares('LossScaler.has_overflow', ['difference: static mode'])
def test_difference_static_mode_reports_an_overflow():
    params = params_with([GRADS['inf float32']])
    theirs, ours = pair(512.0, 'static', 2.0, 1000)
    assert theirs.has_overflow(params) is False
    assert ours.has_overflow(params) is True
    ours.update_scale(True)
    assert ours.loss_scale == theirs.loss_scale == 512.0  # the scale itself stays, as in mmcv


@compares('LossScaler.has_overflow', ['difference: float32 sum overflows'])
def test_difference_finite_gradients_whose_float32_sum_overflows_are_no_overflow():
    params = params_with([torch.tensor([3e38, 3e38]), torch.tensor([1e300], dtype=torch.float64)])
    theirs, ours = pair(512.0, 'dynamic', 2.0, 1000)
    assert theirs.has_overflow(params[:1]) is True  # mmcv sums each gradient in float32
    assert theirs.has_overflow(params[1:]) is True
    assert ours.has_overflow(params[:1]) is False  # fp16utils looks at each element
    assert ours.has_overflow(params[1:]) is False


@compares('LossScaler.update_scale', ['dynamic scale_factor=1: a scale that never moves'])
def test_a_dynamic_factor_of_one_is_taken_and_keeps_the_scale_as_mmcvs():
    theirs, ours = pair(512.0, 'dynamic', 1, 2)
    run_alike(theirs, ours, [True, False, False, True, False, False, False])
    assert ours.loss_scale == theirs.loss_scale == 512.0
    twin = fp16utils.LossScaler()
    twin.load_state_dict(theirs.state_dict())  # mmcv's state with the factor 1 loads
    assert twin.state_dict() == theirs.state_dict()


@compares('LossScaler.update_scale', ['difference: growth past 2**127'])
def test_difference_the_scale_stops_at_2_to_the_127():
    theirs, ours = pair(2.0**126, 'dynamic', 2.0, 1)
    for _ in range(3):
        theirs.update_scale(False)
        ours.update_scale(False)
    assert theirs.loss_scale == 2.0**129
    assert ours.loss_scale == 2.0**127
    with pytest.raises(ValueError, match='init_scale'):
        fp16utils.LossScaler(init_scale=2.0**128)
    assert fp16_utils().LossScaler(init_scale=2.0**128).loss_scale == 2.0**128


@compares('LossScaler.update_scale', ['difference: overflow below a scale of 1'])
def test_difference_an_overflow_never_raises_a_scale_below_one():
    theirs, ours = pair(0.25, 'dynamic', 2.0, 1000)
    theirs.update_scale(True)
    ours.update_scale(True)
    assert theirs.loss_scale == 1  # max(0.25 / 2, 1)
    assert ours.loss_scale == 0.25


@compares('LossScaler', ['difference: int init_scale and scale_factor'])
def test_difference_numbers_are_kept_as_floats():
    theirs, ours = pair(512, 'dynamic', 2, 1000)
    assert type(theirs.loss_scale) is int and type(theirs.scale_factor) is int
    assert type(ours.loss_scale) is float and type(ours.scale_factor) is float
    assert ours.state_dict() == theirs.state_dict()  # equal values


REFUSED_ARGS = [dict(scale_factor=0.5), dict(scale_factor=0), dict(scale_window=0),
                dict(init_scale=0), dict(init_scale=-4.0), dict(init_scale=math.inf)]
shapes('LossScaler', [f'difference: {kwargs}' for kwargs in REFUSED_ARGS])


@pytest.mark.parametrize('kwargs', REFUSED_ARGS, ids=str)
def test_difference_arguments_mmcv_takes_but_cannot_use_are_refused(kwargs):
    (key, value), = kwargs.items()
    state = fp16_utils().LossScaler(**kwargs).state_dict()
    assert state['cur_scale' if key == 'init_scale' else key] == value  # taken as given
    with pytest.raises(ValueError, match=key):
        fp16utils.LossScaler(**kwargs)


@compares('LossScaler', ["difference: mode='auto'"])
def test_difference_unknown_mode_is_a_value_error():
    assert isinstance(call(fp16_utils().LossScaler, mode='auto')[1], AssertionError)
    assert isinstance(call(fp16utils.LossScaler, mode='auto')[1], ValueError)


REFUSED_STATES = [dict(extra=1), dict(cur_scale=math.nan), dict(scale_window=0),
                  dict(last_overflow_iter=9)]
shapes('LossScaler.load_state_dict', [f'difference: {change}' for change in REFUSED_STATES])


@pytest.mark.parametrize('change', REFUSED_STATES, ids=str)
def test_difference_load_state_dict_refuses_a_state_it_cannot_use(change):
    state = dict(fp16_utils().LossScaler().state_dict(), **change)
    theirs, ours = pair(512.0, 'dynamic', 2.0, 1000)
    theirs.load_state_dict(state)  # mmcv loads whatever it is given
    before = ours.state_dict()
    with pytest.raises(ValueError, match=next(iter(change))):
        ours.load_state_dict(state)
    assert ours.state_dict() == before


# -- the hooks' checkpoint state ------------------------------------------------------------

DATA_SEED, MODEL_SEED = 1, 0
OVERFLOWS_AT = 2  # the third batch's loss is inf: every gradient non-finite


def make_model():
    torch.manual_seed(MODEL_SEED)
    return nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.ReLU(), nn.Linear(4, 1))


def batches(n):
    torch.manual_seed(DATA_SEED)
    return [(torch.randn(3, 4), math.inf if i == OVERFLOWS_AT else 1.0) for i in range(n)]


def forward(model, batch):
    x, factor = batch
    return model(x.to(next(model.parameters()).dtype)).float().mean() * factor


def train(hook, iters, meta=None, weights=None, start=0):
    """Run ``hook`` over ``iters`` batches from ``start``; the runner.

    ``weights``: a state dict loaded into the new float32 model first, as a resumed run
    loads its checkpoint.
    """
    model = make_model()
    if weights is not None:
        model.load_state_dict(weights)
    runner = MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.1), [hook],
                        max_iters=start + iters, meta={} if meta is None else meta)
    runner.iter = start
    runner.run(batches(start + iters), forward)
    return runner


def ours(backend, loss_scale):
    return fp16utils.Fp16OptimizerHook(loss_scale=loss_scale, backend=backend, distributed=False)


HOOKS = {  # backend -> (mmcv's hook of the matching torch, the loss_scale forms compared)
    'native': (mmcv_native_hook, [dict(init_scale=2.0**10, growth_interval=2), 'dynamic',
                                  512.0]),
    'legacy': (mmcv_legacy_hook, [dict(init_scale=2.0**10, scale_window=2), 'dynamic']),
}
HOOK_CASES = [(backend, scale) for backend, (_, forms) in HOOKS.items() for scale in forms]
shapes('Fp16OptimizerHook', [f'{b}, loss_scale={s}, {d}' for b, s in HOOK_CASES
                             for d in ('run', 'mmcv state resumed', 'state resumed by mmcv')])


def _params(runner):
    return [p.detach().clone() for p in runner.model.parameters()]


@pytest.mark.parametrize(('backend', 'loss_scale'), HOOK_CASES,
                         ids=[f'{b}-{s}' for b, s in HOOK_CASES])
def test_hooks_write_the_same_state_and_weights_and_resume_each_other(backend, loss_scale):
    mmcv_hook = HOOKS[backend][0]
    theirs = train(mmcv_hook(loss_scale=loss_scale, distributed=False), 4)
    mine = train(ours(backend, loss_scale), 4)
    written = theirs.meta['fp16']['loss_scaler']
    assert mine.meta['fp16']['loss_scaler'] == written
    for got, expected in zip(_params(mine), _params(theirs)):
        assert got.dtype == expected.dtype and torch.equal(got, expected)

    # mmcv's state resumed by fp16utils (and fp16utils' by mmcv): two more iterations
    # each, from the same weights, end where the uninterrupted runs end.
    whole_theirs = train(mmcv_hook(loss_scale=loss_scale, distributed=False), 6)
    resumed_by_ours = train(ours(backend, loss_scale), 2, meta={'fp16': dict(theirs.meta['fp16'])},
                            weights=theirs.model.state_dict(), start=4)
    resumed_by_mmcv = train(mmcv_hook(loss_scale=loss_scale, distributed=False), 2,
                            meta={'fp16': dict(mine.meta['fp16'])},
                            weights=mine.model.state_dict(), start=4)
    final = whole_theirs.meta['fp16']['loss_scaler']
    assert resumed_by_ours.meta['fp16']['loss_scaler'] == final
    assert resumed_by_mmcv.meta['fp16']['loss_scaler'] == final
    for runner in (resumed_by_ours, resumed_by_mmcv):
        for got, expected in zip(_params(runner), _params(whole_theirs)):
            assert torch.allclose(got.float(), expected.float(), rtol=1e-3, atol=1e-4)


# -- the differences docs/reference/differences-mmcv.md lists (hooks) ---------------------


@compares('Fp16OptimizerHook', ['difference: meta keys'])
def test_difference_the_checkpoint_holds_statistics_and_masters_besides_the_scaler():
    assert set(train(mmcv_native_hook(loss_scale=512.0, distributed=False), 1).meta['fp16']
               ) == {'loss_scaler'}
    assert set(train(ours('native', 512.0), 1).meta['fp16']) == {'loss_scaler', 'stats'}
    assert set(train(ours('legacy', 'dynamic'), 1).meta['fp16']) == {
        'loss_scaler', 'stats', 'master_params'}


@compares('Fp16OptimizerHook', ['difference: legacy state in the GradScaler hook',
                                'difference: native state in the LossScaler hook'])
def test_difference_each_backend_writes_the_format_of_mmcvs_hook_for_its_torch():
    """Legacy state: LossScaler's (mmcv's hook of torch < 1.6 reads it, the GradScaler
    hook of newer torch does not); native state: GradScaler's (the other way round)."""
    legacy_state = train(ours('legacy', 'dynamic'), 1).meta['fp16']
    native_state = train(ours('native', 'dynamic'), 1).meta['fp16']
    with pytest.raises(KeyError, match='scale'):
        train(mmcv_native_hook(loss_scale='dynamic', distributed=False), 1,
              meta={'fp16': dict(legacy_state)})
    with pytest.raises(KeyError, match='cur_scale'):
        train(mmcv_legacy_hook(loss_scale='dynamic', distributed=False), 1,
              meta={'fp16': dict(native_state)})
    # fp16utils reads both formats on both backends.
    for backend, state in (('native', legacy_state), ('legacy', native_state)):
        hook = ours(backend, 'dynamic')
        train(hook, 0, meta={'fp16': dict(state)})
        scale = state['loss_scaler'].get('cur_scale', state['loss_scaler'].get('scale'))
        assert hook.loss_scale == scale


@compares('Fp16OptimizerHook', ['difference: static scale, overflow, legacy'])
def test_difference_static_scale_skips_the_overflowing_step_on_the_legacy_path():
    theirs = train(mmcv_legacy_hook(loss_scale=512.0, distributed=False), OVERFLOWS_AT + 1)
    mine = train(ours('legacy', 512.0), OVERFLOWS_AT + 1)
    assert not all(torch.isfinite(p).all() for p in theirs.model.parameters())  # applied
    assert all(torch.isfinite(p).all() for p in mine.model.parameters())  # skipped
    assert mine.hooks[0].skipped_steps == 1


@compares('Fp16OptimizerHook', ['mmcv on a cpu-only torch: empty state'])
@pytest.mark.filterwarnings('ignore:`torch.cuda.amp.GradScaler:FutureWarning')
def test_mmcvs_hook_on_a_cpu_only_torch_writes_an_empty_state_that_loads():
    """Without CUDA, mmcv's GradScaler is disabled and saves ``{}``: fp16utils starts over."""
    module = optimizer_hooks()
    with pytest.warns(UserWarning, match='CUDA is not available'):
        disabled = module.Fp16OptimizerHook(loss_scale='dynamic', distributed=False)
    written = train(disabled, 2).meta
    assert written['fp16']['loss_scaler'] == {}
    hook = ours('native', dict(init_scale=2.0**10))
    train(hook, 0, meta=written, start=2)
    assert hook.loss_scale == 2.0**10 and hook.skipped_steps == 0


def test_a_state_written_with_a_scale_policy_loads_in_mmcv():
    """mmcv's LossScaler reads its six keys from a state that also carries policy keys,
    and goes on as ours does while the policy is not in play (no overflow)."""
    ours = fp16utils.LossScaler(init_scale=64., scale_window=2, hysteresis=2, min_scale=4.)
    for overflow in (True, False, False, True):
        ours.update_scale(overflow)
    state = ours.state_dict()
    assert 'cur_hysteresis' in state
    theirs = fp16_utils().LossScaler()
    theirs.load_state_dict(dict(state))
    assert (theirs.cur_scale, theirs.cur_iter, theirs.last_overflow_iter) == (
        ours.cur_scale, ours.cur_iter, ours.last_overflow_iter)
    for _ in range(5):
        theirs.update_scale(False)
        ours.update_scale(False)
        assert theirs.cur_scale == ours.cur_scale
    # mmcv's own state loads in ours: the policy configured here stays
    ours.load_state_dict(theirs.state_dict())
    assert ours.policy.hysteresis == 2 and ours.cur_hysteresis == 2
