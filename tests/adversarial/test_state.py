"""Attacks on saved state: every refused load leaves everything exactly as it was.

Each case takes a real state of a trained wrapper, spoils one field, loads it
and checks that the load is refused with an error naming the field, and that
parameters, gradients, the optimizer state, the scaler and every counter are
bit-identical to before. Then the wrapper must still load the good state.
"""

from __future__ import annotations

import copy

import _caps
import pytest
import torch
from _state_attacks import (
    INF,
    MMCV_STATE,
    NAN,
    TORCH_STATE,
    assert_same,
    deleter,
    require_f16,
    setter,
    snap,
    trained,
    weights_only_roundtrip,
)

from fp16utils import AmpOptimWrapper, LossScaler, OptimWrapper, OptimWrapperDict

BACKENDS = ['native', 'legacy']



def _torch(key, value):
    return setter(['loss_scaler'], lambda _: {**TORCH_STATE, key: value})


# (id, mutation, exception, what the message must contain)
TORCH_SCALER = [
    (f'scale={v!r}', _torch('scale', v), ValueError, 'scale=')
    for v in (INF, -INF, NAN, 0.0, -1.0, True, '8', None, 1e308, 2.0**128)
] + [
    (f'{k}={v!r}', _torch(k, v), ValueError, f'{k}=')
    for k, v in (('growth_factor', 1.0), ('growth_factor', 0.5), ('growth_factor', INF),
                 ('growth_factor', '2'), ('backoff_factor', 1.0), ('backoff_factor', 1.5),
                 ('backoff_factor', 0.0), ('backoff_factor', NAN), ('growth_interval', 0),
                 ('growth_interval', -3), ('growth_interval', 2.5), ('growth_interval', True),
                 ('_growth_tracker', -1), ('_growth_tracker', 10**6), ('_growth_tracker', 0.5),
                 ('_growth_tracker', None))
] + [
    ('scaler-missing-key', setter(['loss_scaler'], lambda _: {
        k: v for k, v in TORCH_STATE.items() if k != 'growth_interval'}), KeyError, 'missing'),
    ('scaler-extra-key', _torch('enabled', True), ValueError, "'enabled'"),
    ('scaler-a-list', setter(['loss_scaler'], [1.0]), TypeError, 'must be a dict'),
]


def _mmcv(key, value):
    return setter(['loss_scaler'], lambda _: {**MMCV_STATE, key: value})


MMCV_SCALER = [
    (f'mmcv-{k}={v!r}', _mmcv(k, v), ValueError, f'{k}=')
    for k, v in (('cur_scale', INF), ('cur_scale', 0), ('cur_scale', True), ('mode', 'bogus'),
                 ('scale_factor', 1.0), ('scale_factor', NAN), ('scale_window', 0),
                 ('scale_window', 1.5), ('cur_iter', -1), ('cur_iter', '3'),
                 ('last_overflow_iter', 11), ('last_overflow_iter', None))
] + [
    ('mmcv-missing-key', setter(['loss_scaler'], lambda _: {
        k: v for k, v in MMCV_STATE.items() if k != 'scale_window'}), KeyError, 'missing'),
    ('mmcv-extra-key', setter(['loss_scaler'], lambda _: {**MMCV_STATE, 'x': 1}),
     ValueError, "'x'"),
]

STATS = [
    ('stats-a-str', setter(['fp16_stats'], 'x'), ValueError, 'statistics'),
    ('stats-negative', setter(['fp16_stats', 'skipped_steps'], -1), ValueError, 'skipped_steps'),
    ('stats-str-count', setter(['fp16_stats', 'skipped_steps'], '2'), ValueError,
     'skipped_steps'),
    ('stats-bool-count', setter(['fp16_stats', 'skipped_steps'], True), ValueError,
     'skipped_steps'),
    ('stats-inf-history', setter(['fp16_stats', 'scale_history'], [(0, INF)]), ValueError,
     'scale_history'),
    ('stats-short-pair', setter(['fp16_stats', 'scale_history'], [(0,)]), ValueError,
     'scale_history'),
    ('stats-history-int', setter(['fp16_stats', 'scale_history'], 5), ValueError,
     'scale_history'),
    ('stats-missing-key', deleter(['fp16_stats', 'scale_history']), ValueError, 'statistics'),
    ('stats-extra-key', setter(['fp16_stats', 'x'], 1), ValueError, 'statistics'),
]

PENDING = [
    ('pending-a-str', setter(['pending_window'], 'x'), ValueError, 'pending_window'),
    ('pending-negative-count', setter(['pending_window', 'iter'], -1), ValueError,
     'pending_window'),
    ('pending-str-count', setter(['pending_window', 'iter'], '3'), ValueError,
     'pending_window'),
    ('pending-bool-count', setter(['pending_window', 'iter'], True), ValueError,
     'pending_window'),
    ('pending-no-grads', deleter(['pending_window', 'grads']), ValueError, 'pending_window'),
    ('pending-one-short', setter(['pending_window', 'grads'], lambda g: g[:-1]), ValueError,
     'pending gradients'),
    ('pending-wrong-shape', setter(['pending_window', 'grads', 0], torch.ones(3)), ValueError,
     'pending gradients'),
    ('pending-int-tensor', setter(['pending_window', 'grads', 0],
                                  lambda g: g.to(torch.int64)), ValueError, 'pending gradients'),
    ('pending-meta', setter(['pending_window', 'grads', 0], lambda g: g.to('meta')), ValueError,
     'pending gradients'),
    ('pending-a-str-grad', setter(['pending_window', 'grads', 0], 'g'), ValueError,
     'pending gradients'),
    ('pending-grads-a-str', setter(['pending_window', 'grads'], 'g'), ValueError,
     'pending gradients'),
]

BASE = [
    ('base-a-list', setter(['base_param_settings'], [1, 2]), ValueError, 'base_param_settings'),
    ('base-a-str', setter(['base_param_settings'], 'lr'), ValueError, 'base_param_settings'),
]

OPTIMIZER = [
    ('groups-one-less', setter(['param_groups'], lambda g: g[:1]), ValueError, 'param groups'),
    ('group-one-param-less', setter(['param_groups', 1, 'params'], lambda p: p[:1]),
     ValueError, 'param group 1'),
    ('group-params-a-str', setter(['param_groups', 0, 'params'], 'p'), ValueError,
     'param group 0'),
    ('group-a-str', setter(['param_groups', 0], 'g'), ValueError, 'param group 0'),
    ('groups-a-str', setter(['param_groups'], 'g'), ValueError, "'param_groups'"),
    ('state-missing', deleter(['state']), ValueError, "'state'"),
    ('state-a-list', setter(['state'], []), ValueError, "'state'"),
    ('state-unknown-index', setter(['state', 99], {}), ValueError, 'index 99'),
    ('state-not-a-dict', setter(['state', 0], 5), ValueError, 'index 0'),
    ('param-index-twice', setter(['param_groups', 1, 'params'],
                                 lambda p: [0] * len(p)), ValueError, 'twice'),
]

MASTERS = [
    ('masters-one-short', setter(['master_params'], lambda m: m[:-1]), ValueError,
     'master weights'),
    ('masters-wrong-shape', setter(['master_params', 0], torch.ones(2)), ValueError,
     'master weights'),
    ('masters-int', setter(['master_params', 0], lambda m: m.to(torch.int32)), ValueError,
     'master weights'),
    ('masters-none-entry', setter(['master_params', 0], None), ValueError, 'master weights'),
    ('masters-a-str', setter(['master_params'], 'm'), ValueError, 'master weights'),
]

COMMON = TORCH_SCALER + MMCV_SCALER + STATS + PENDING + BASE + OPTIMIZER


def _attack(backend, mutate, exc, match):
    wrapper, model = trained(backend)
    good = weights_only_roundtrip(wrapper.state_dict())
    bad = mutate(weights_only_roundtrip(good))
    before = snap(wrapper, model)
    with pytest.raises(exc) as info:
        wrapper.load_state_dict(bad)
    assert match in str(info.value)
    assert_same(before, snap(wrapper, model))
    wrapper.load_state_dict(good)  # still usable: the good state loads
    assert wrapper.inner_count == good['pending_window']['iter']


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize(('case', 'mutate', 'exc', 'match'), COMMON, ids=[c[0] for c in COMMON])
def test_a_refused_wrapper_load_changes_nothing(backend, case, mutate, exc, match):
    _attack(backend, mutate, exc, match)


@pytest.mark.parametrize(('case', 'mutate', 'exc', 'match'), MASTERS, ids=[c[0] for c in MASTERS])
def test_a_refused_legacy_master_load_changes_nothing(case, mutate, exc, match):
    _attack('legacy', mutate, exc, match)


def test_mutations_start_from_a_state_that_loads_and_restores_exactly():
    for backend in BACKENDS:
        wrapper, model = trained(backend)
        state = weights_only_roundtrip(wrapper.state_dict())
        before = snap(wrapper, model)
        twin, twin_model = trained(backend)
        twin.load_state_dict(state)
        twin_model.load_state_dict(model.state_dict())
        after = snap(twin, twin_model)
        for key in ('inner_count', 'skipped', 'history', 'loss_scale', 'scaler', 'optimizer'):
            assert_same(before[key], after[key], key)
        assert_same(before['wrapper_state']['pending_window'],
                    after['wrapper_state']['pending_window'])


@pytest.mark.parametrize('backend', BACKENDS)
def test_an_mmcv_state_loads(backend):
    require_f16(backend)
    wrapper, _ = trained(backend)
    wrapper.load_state_dict({**wrapper.state_dict(), 'loss_scaler': dict(MMCV_STATE)})
    assert wrapper.loss_scale == 1024.0


class _RefusingAdam(torch.optim.Adam):
    """An optimizer that changes its state, then refuses it (torch failing halfway)."""

    refuse = True

    def load_state_dict(self, state_dict):
        super().load_state_dict(state_dict)
        if self.refuse:
            raise RuntimeError('refused halfway')


@pytest.mark.parametrize('backend', BACKENDS)
def test_an_optimizer_refusing_halfway_is_rolled_back(backend):
    wrapper, model = trained(backend, opt_cls=_RefusingAdam)
    state = wrapper.state_dict()
    other, _ = trained(backend)
    other_state = weights_only_roundtrip(other.state_dict())
    for group in other_state['param_groups']:
        group['lr'] = 0.5
    before = snap(wrapper, model)
    with pytest.raises(RuntimeError, match='refused halfway'):
        wrapper.load_state_dict(other_state)
    assert_same(before, snap(wrapper, model))
    assert [g['lr'] for g in wrapper.optimizer.param_groups] == [1e-3, 2e-3]
    wrapper.optimizer.refuse = False
    wrapper.load_state_dict(state)


def test_load_state_dict_takes_a_dict():
    wrapper, model = trained('native')
    before = snap(wrapper, model)
    for bad in (None, [1], 'state'):
        with pytest.raises(TypeError, match='takes a dict'):
            wrapper.load_state_dict(bad)
    assert_same(before, snap(wrapper, model))


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_state_from_another_model_is_refused(backend):
    wrapper, model = trained(backend)
    other_model = torch.nn.Sequential(torch.nn.Linear(8, 3), torch.nn.Linear(3, 4))
    other = AmpOptimWrapper(torch.optim.Adam(other_model.parameters()), dtype=wrapper.dtype,
                            backend=backend, model=other_model)
    before = snap(wrapper, model)
    with pytest.raises(ValueError, match='param groups'):
        wrapper.load_state_dict(other.state_dict())
    assert_same(before, snap(wrapper, model))


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_state_saved_by_the_other_backend_loads(backend):
    wrapper, model = trained(backend)
    other_backend = 'legacy' if backend == 'native' else 'native'
    other, _ = trained(other_backend)
    state = weights_only_roundtrip(other.state_dict())
    wrapper.load_state_dict(state)
    assert wrapper.loss_scale == other.loss_scale
    assert wrapper.skipped_steps == other.skipped_steps
    assert wrapper.inner_count == other.inner_count


# ---------------------------------------------------------------------------- the dict


def _gan(backend, opt_cls=torch.optim.Adam):
    gen, _ = trained(backend)
    disc, disc_model = trained(backend, opt_cls=opt_cls)
    return OptimWrapperDict(generator=gen, discriminator=disc), disc_model


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('case', ['scaler', 'pending', 'optimizer', 'not-a-dict'])
def test_a_dict_load_refused_by_a_later_entry_changes_no_entry(backend, case):
    wrappers, _ = _gan(backend)
    gen_model = wrappers['generator']._model
    disc_model = wrappers['discriminator']._model
    state = weights_only_roundtrip(wrappers.state_dict())
    fresh = weights_only_roundtrip(state)
    for group in fresh['generator']['param_groups']:
        group['lr'] = 0.5  # the first entry would change if it were loaded
    fresh['generator']['fp16_stats']['skipped_steps'] = 7
    bad = fresh['discriminator']
    if case == 'scaler':
        bad['loss_scaler'] = {**MMCV_STATE, 'cur_scale': INF}
    elif case == 'pending':
        bad['pending_window']['grads'] = bad['pending_window']['grads'][:1]
    elif case == 'optimizer':
        bad['param_groups'] = bad['param_groups'][:1]
    else:
        fresh['discriminator'] = [1]
    before = (snap(wrappers['generator'], gen_model),
              snap(wrappers['discriminator'], disc_model))
    with pytest.raises((ValueError, TypeError)) as info:
        wrappers.load_state_dict(fresh)
    assert "entry 'discriminator'" in str(info.value)
    after = (snap(wrappers['generator'], gen_model),
             snap(wrappers['discriminator'], disc_model))
    assert_same(before, after)
    wrappers.load_state_dict(state)


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_dict_entry_refusing_halfway_rolls_back_the_entries_loaded_before(backend):
    wrappers, disc_model = _gan(backend, opt_cls=_RefusingAdam)
    gen_model = wrappers['generator']._model
    state = weights_only_roundtrip(wrappers.state_dict())
    for entry in state.values():
        for group in entry['param_groups']:
            group['lr'] = 0.5
    before = (snap(wrappers['generator'], gen_model),
              snap(wrappers['discriminator'], disc_model))
    with pytest.raises(RuntimeError, match='refused halfway'):
        wrappers.load_state_dict(state)
    after = (snap(wrappers['generator'], gen_model),
             snap(wrappers['discriminator'], disc_model))
    assert_same(before, after)
    assert [g['lr'] for g in wrappers['generator'].optimizer.param_groups] == [1e-3, 2e-3]


def test_a_dict_load_takes_a_dict_and_known_names():
    wrappers, _ = _gan('native')
    with pytest.raises(TypeError, match='takes {name: state}'):
        wrappers.load_state_dict([('generator', {})])
    with pytest.raises(KeyError, match='critic'):
        wrappers.load_state_dict({'critic': {}})


# ---------------------------------------------------------------------------- the scale


def _overflow_step(wrapper, model):
    with wrapper.optim_context(model):
        loss = R_mse(model, _overflow_batch())
    wrapper.update_params(loss)


def R_mse(model, batch):
    import _runner

    return _runner.mse(model, batch)


def _overflow_batch():
    import _runner

    return _runner.overflow_batch()


def _clean_step(wrapper, model):
    import _runner

    with wrapper.optim_context(model):
        loss = _runner.mse(model, _runner.make_data(1)[0]) * 0.0
    wrapper.update_params(loss)


def _fresh(backend, **loss_scale):
    import _runner

    require_f16(backend)
    model = _runner.Net(seed=1)
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype='float16',
                              backend=backend, model=model, loss_scale=loss_scale)
    return wrapper, model


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('init_scale', [0.5, 2.0**-10, 1.0, 4.0])
def test_an_overflow_never_raises_the_scale(backend, init_scale):
    wrapper, model = _fresh(backend, init_scale=init_scale)
    for _ in range(3):
        old = wrapper.loss_scale
        _overflow_step(wrapper, model)
        assert wrapper.loss_scale <= old
    assert wrapper.skipped_steps == 3
    assert wrapper.loss_scale == min(init_scale, 1.0)


@pytest.mark.parametrize('backend', BACKENDS)
def test_an_overflow_below_the_floor_after_a_load_keeps_the_scale(backend):
    wrapper, model = _fresh(backend, init_scale=0.5)
    wrapper.load_state_dict({**wrapper.state_dict(),
                             'loss_scaler': {**MMCV_STATE, 'cur_scale': 0.125}})
    _overflow_step(wrapper, model)
    assert wrapper.loss_scale == 0.125  # the floor (0.5) is above it: no raise


@pytest.mark.parametrize('backend', BACKENDS)
def test_the_scale_stops_at_a_finite_ceiling(backend):
    wrapper, model = _fresh(backend, init_scale=2.0**126, growth_interval=1)
    for _ in range(4):
        _clean_step(wrapper, model)
    assert wrapper.skipped_steps == 0
    assert wrapper.loss_scale == 2.0**127
    assert wrapper.state_dict()['loss_scaler'][
        'scale' if backend == 'native' else 'cur_scale'] == 2.0**127
    if backend == 'native':
        assert wrapper.loss_scaler.get_scale() == 2.0**127
    assert [s for _, s in wrapper.scale_history] == [2.0**126, 2.0**127]


@pytest.mark.parametrize('loss_scale', [
    INF, NAN, 0, -1, True, 1e308, 'bogus', dict(init_scale=INF), dict(init_scale=NAN),
    dict(init_scale=0), dict(init_scale=-1.0), dict(init_scale=True), dict(init_scale=1e300),
    dict(mode='bogus'), dict(scale_factor=1), dict(scale_window=0), dict(growth_interval=-1),
    dict(growth_interval=2.5), dict(growth_factor=0.5), dict(backoff_factor=1.0),
])
@pytest.mark.parametrize('backend', BACKENDS)
def test_a_bad_loss_scale_is_refused_by_the_wrapper_and_nothing_changes(backend, loss_scale):
    import _runner

    model = _runner.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    groups = [list(g['params']) for g in optimizer.param_groups]
    with pytest.raises(ValueError, match='loss_scale'):
        AmpOptimWrapper(optimizer, loss_scale=loss_scale, backend=backend, model=model,
                        dtype=_caps.LEGACY_LOW)
    assert [list(g['params']) for g in optimizer.param_groups] == groups
    assert all(p.dtype == torch.float32 for p in model.parameters())


# ---------------------------------------------------------------------------- GradScaler


def _native_scaler():
    wrapper, model = _fresh('native', init_scale=64.0)
    _clean_step(wrapper, model)
    return wrapper, model, wrapper.loss_scaler


@pytest.mark.parametrize(('key', 'value'), [
    ('scale', INF), ('scale', NAN), ('scale', 0.0), ('scale', -2.0), ('growth_factor', 1.0),
    ('backoff_factor', 2.0), ('growth_interval', 0), ('_growth_tracker', -1)])
def test_the_handed_out_grad_scaler_refuses_a_bad_state(key, value):
    wrapper, model, scaler = _native_scaler()
    before = (snap(wrapper, model), scaler.state_dict())
    with pytest.raises(ValueError, match=key):
        scaler.load_state_dict({**scaler.state_dict(), key: value})
    assert_same(before, (snap(wrapper, model), scaler.state_dict()))


def test_the_handed_out_grad_scaler_refuses_an_mmcv_state_and_a_bad_update():
    wrapper, model, scaler = _native_scaler()
    before = (snap(wrapper, model), scaler.state_dict())
    with pytest.raises(KeyError, match="mmcv LossScaler's"):
        scaler.load_state_dict(dict(MMCV_STATE))
    for bad in (INF, NAN, 0.0, torch.tensor([INF])):
        with pytest.raises(ValueError, match='scale='):
            scaler.update(bad)
    assert_same(before, (snap(wrapper, model), scaler.state_dict()))
    scaler.load_state_dict({**scaler.state_dict(), 'scale': 8.0})  # a good one is followed
    assert wrapper.loss_scale == 8.0


def test_the_handed_out_grad_scaler_still_pickles_and_deep_copies():
    import pickle

    _, _, scaler = _native_scaler()
    for clone in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert clone.get_scale() == scaler.get_scale()
        clone.load_state_dict({**clone.state_dict(), 'scale': INF})  # a plain GradScaler


# ---------------------------------------------------------------------------- LossScaler


@pytest.mark.parametrize(('kwargs', 'name'), [
    (dict(init_scale=INF), 'init_scale'), (dict(init_scale=NAN), 'init_scale'),
    (dict(init_scale=0), 'init_scale'), (dict(init_scale=-1), 'init_scale'),
    (dict(init_scale=True), 'init_scale'), (dict(init_scale=1e308), 'init_scale'),
    (dict(init_scale='8'), 'init_scale'), (dict(mode='bogus'), 'mode'),
    (dict(scale_factor=0.5), 'scale_factor'), (dict(scale_factor=INF), 'scale_factor'),
    (dict(scale_window=0), 'scale_window'), (dict(scale_window=2.5), 'scale_window'),
    (dict(scale_window=True), 'scale_window'),
])
def test_loss_scaler_refuses_bad_arguments_naming_them(kwargs, name):
    with pytest.raises(ValueError, match=name):
        LossScaler(**kwargs)


@pytest.mark.parametrize(('key', 'value', 'exc'), [
    ('cur_scale', INF, ValueError), ('cur_scale', NAN, ValueError), ('cur_scale', 0, ValueError),
    ('cur_scale', -1.0, ValueError), ('cur_scale', True, ValueError),
    ('cur_scale', '1', ValueError), ('cur_scale', 1e308, ValueError),
    ('mode', 'bogus', ValueError), ('scale_factor', 0.5, ValueError),
    ('scale_factor', True, ValueError),
    ('scale_window', 0, ValueError), ('scale_window', -1, ValueError),
    ('scale_window', 1.5, ValueError), ('cur_iter', -1, ValueError),
    ('cur_iter', 2.0, ValueError), ('last_overflow_iter', 11, ValueError),
    ('extra', 1, ValueError),
])
def test_loss_scaler_load_refuses_degenerate_states(key, value, exc):
    scaler = LossScaler(init_scale=64.0, scale_window=3)
    scaler.update_scale(True)
    before = scaler.state_dict()
    with pytest.raises(exc, match=key):
        scaler.load_state_dict({**MMCV_STATE, key: value})
    assert scaler.state_dict() == before


def test_loss_scaler_load_refuses_missing_keys_and_a_grad_scaler_state():
    scaler = LossScaler()
    with pytest.raises(KeyError, match='missing'):
        scaler.load_state_dict({k: v for k, v in MMCV_STATE.items() if k != 'mode'})
    with pytest.raises(KeyError, match='missing'):
        scaler.load_state_dict({'scale': 2.0})
    assert scaler.state_dict() == LossScaler().state_dict()


def test_a_static_mmcv_state_with_scale_factor_one_loads_everywhere():
    state = {**MMCV_STATE, 'mode': 'static', 'scale_factor': 1.0}
    scaler = LossScaler()
    scaler.load_state_dict(state)
    assert scaler.loss_scale == 1024.0
    wrapper, _ = _fresh('native', init_scale=4.0)
    wrapper.load_state_dict({**wrapper.state_dict(), 'loss_scaler': state})
    saved = wrapper.state_dict()  # a state the same wrapper loads back
    wrapper.load_state_dict(weights_only_roundtrip(saved))
    assert wrapper.loss_scale == 1024.0


def test_loss_scaler_stops_at_the_ceiling_and_never_raises_on_overflow():
    scaler = LossScaler(init_scale=2.0**126, scale_window=1)
    for _ in range(5):
        scaler.update_scale(False)
    assert scaler.loss_scale == 2.0**127
    low = LossScaler(init_scale=0.25)
    low.update_scale(True)
    assert low.loss_scale == 0.25
    mid = LossScaler(init_scale=1.5)
    mid.update_scale(True)
    assert mid.loss_scale == 1.0


# ---------------------------------------------------------------------------- wrong order


@pytest.mark.parametrize('backend', BACKENDS)
def test_step_before_any_backward_changes_nothing(backend):
    wrapper, model = _fresh(backend, init_scale=64.0)
    before = snap(wrapper, model)
    wrapper.step()
    wrapper.zero_grad()
    after = snap(wrapper, model)
    for key in ('model', 'optimizer', 'loss_scale', 'skipped', 'masters'):
        assert_same(before[key], after[key], key)


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_load_mid_window_then_training_matches_an_uninterrupted_run(backend):
    wrapper, model = trained(backend)
    state = weights_only_roundtrip(wrapper.state_dict())
    weights = copy.deepcopy(model.state_dict())
    twin, twin_model = trained(backend)
    twin_model.load_state_dict(weights)
    twin.load_state_dict(state)
    for w, m in ((wrapper, model), (twin, twin_model)):
        _clean_step(w, m)
    assert_same(snap(wrapper, model)['model'], snap(twin, twin_model)['model'])
    assert wrapper.inner_count == twin.inner_count


def test_a_plain_wrapper_refuses_malformed_state_too():
    import _runner

    model = _runner.Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2)
    before = snap(wrapper, model)
    state = wrapper.state_dict()
    with pytest.raises(ValueError, match='param groups'):
        wrapper.load_state_dict({**state, 'param_groups': []})
    with pytest.raises(ValueError, match='pending_window'):
        wrapper.load_state_dict({**state, 'pending_window': {'inner_count': 'x'}})
    assert_same(before, snap(wrapper, model))


# ---------------------------------------------------------------------------- added groups


def _legacy_with_added(dtype):
    import _runner

    require_f16('legacy')
    model = _runner.Net(seed=2)
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=256., dtype='float16', backend='legacy',
                              model=model)
    extra = torch.nn.Parameter(torch.full((3,), 2.0, dtype=dtype))
    optimizer.add_param_group({'params': [extra], 'lr': 0.5})
    return wrapper, model, extra


def _loss_with(model, extra):
    import _runner

    # d loss / d extra = (1, 2, 3), whatever the model does
    weights = torch.tensor([1.0, 2.0, 3.0], dtype=extra.dtype)
    return _runner.mse(model, _runner.make_data(1)[0]) + (extra * weights).sum().float()


def test_a_float32_group_added_after_wrapping_is_adopted_with_masters():
    wrapper, model, extra = _legacy_with_added(torch.float32)
    count = len(wrapper.master_params)
    with wrapper.optim_context(model):
        loss = _loss_with(model, extra)
    wrapper.update_params(loss)
    assert wrapper.skipped_steps == 0
    assert len(wrapper.master_params) == count + 1
    assert extra.dtype == torch.float32
    # unscaled: 2 - 0.5 * (1, 2, 3), exactly (the scale is a power of two)
    assert extra.tolist() == [1.5, 1.0, 0.5]
    assert wrapper.master_params[-1].tolist() == [1.5, 1.0, 0.5]
    assert wrapper.optimizer.param_groups[-1]['params'][0] is wrapper.master_params[-1]
    state = weights_only_roundtrip(wrapper.state_dict())
    assert len(state['master_params']) == count + 1


def test_an_overflow_in_an_adopted_group_skips_the_step():
    wrapper, model, extra = _legacy_with_added(torch.float32)
    with wrapper.optim_context(model):
        loss = _loss_with(model, extra) + extra.sum() * float('inf')
    before = snap(wrapper, model)
    wrapper.update_params(loss)
    assert wrapper.skipped_steps == 1
    assert extra.tolist() == [2.0, 2.0, 2.0]
    assert_same(before['model'], snap(wrapper, model)['model'])


@pytest.mark.parametrize('dtype', [torch.float16, torch.bfloat16])
def test_a_half_group_added_after_wrapping_is_refused_before_anything_changes(dtype):
    wrapper, model, extra = _legacy_with_added(dtype)
    with wrapper.optim_context(model):
        loss = _loss_with(model, extra)
    wrapper.backward(loss)
    before = snap(wrapper, model)
    extra_before = extra.detach().clone()
    with pytest.raises(ValueError, match=r'added to the optimizer after wrapping.*float32'):
        wrapper.step()
    assert_same(before, snap(wrapper, model))
    assert torch.equal(extra, extra_before)
    wrapper.optimizer.param_groups.pop()  # the fix the message suggests: remove the group
    wrapper.step()
    assert wrapper.skipped_steps == 0


def test_a_group_re_adding_a_model_parameter_is_refused():
    require_f16('legacy')
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4))
    optimizer = torch.optim.SGD(model[0].parameters(), lr=1.0)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=256., dtype='float16', backend='legacy',
                              model=model)
    optimizer.add_param_group({'params': list(model[1].parameters())})  # float32 norm: fine
    wrapper.step()
    optimizer.add_param_group({'params': [model[1].weight]})  # held through its master now
    with pytest.raises(ValueError, match='does not hold yet'):
        wrapper.step()


# ---------------------------------------------------------------------------- odd inputs


def test_meta_parameters_are_refused_by_the_legacy_backend():
    model = torch.nn.Linear(2, 1, device='meta')
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(ValueError, match='meta device'):
        AmpOptimWrapper(optimizer, backend='legacy', model=model, dtype='float16')
    assert model.weight.dtype == torch.float32
    assert optimizer.param_groups[0]['params'][0] is model.weight


@pytest.mark.parametrize('backend', BACKENDS)
def test_sparse_gradients_train_on_both_backends(backend):
    require_f16(backend)
    emb = torch.nn.Embedding(5, 3, sparse=True)
    with torch.no_grad():
        emb.weight.fill_(1.0)
    wrapper = AmpOptimWrapper(torch.optim.SGD(emb.parameters(), lr=0.5), backend=backend,
                              model=emb, loss_scale=512., dtype='float16')
    with wrapper.optim_context(emb):
        loss = emb(torch.tensor([1, 2])).float().sum()
    wrapper.update_params(loss)
    assert wrapper.skipped_steps == 0
    assert emb.weight.float()[1:3].eq(0.5).all() and emb.weight.float()[0].eq(1.0).all()


def test_frozen_parameters_stay_unchanged_on_the_legacy_backend():
    import _runner

    require_f16('legacy')
    model = _runner.Net(seed=4)
    model.fc1.requires_grad_(False)
    frozen = model.fc1.weight.detach().clone()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.fc2.parameters(), lr=0.1),
                              backend='legacy', model=model, loss_scale=64., dtype='float16')
    _clean_step(wrapper, model)
    with wrapper.optim_context(model):
        loss = _runner.mse(model, _runner.make_data(1)[0])
    wrapper.update_params(loss)
    assert torch.equal(model.fc1.weight.float(), frozen.half().float())
    assert wrapper.skipped_steps == 0


@pytest.mark.parametrize('optimizer', [None, [1], 'SGD', torch.nn.Linear(1, 1)])
def test_a_wrapper_needs_an_optimizer(optimizer):
    with pytest.raises(TypeError):
        AmpOptimWrapper(optimizer=optimizer)
    with pytest.raises(TypeError):
        OptimWrapper(optimizer)


def test_an_optimizer_emptied_after_wrapping_does_not_break_backward():
    wrapper, model = _fresh('native', init_scale=8.0)
    wrapper.optimizer.param_groups[0]['params'] = []
    with wrapper.optim_context(model):
        loss = R_mse(model, _overflow_batch()) * 0.0
    wrapper.update_params(loss)
    assert wrapper.skipped_steps == 0 and wrapper.loss_scale == 8.0


# ---------------------------------------------------------------------------- re-entrancy


@pytest.mark.parametrize('backend', BACKENDS)
def test_loading_a_wrapper_s_own_state_mid_window_changes_nothing(backend):
    wrapper, model = trained(backend)
    before = snap(wrapper, model)
    wrapper.load_state_dict(wrapper.state_dict())
    after = snap(wrapper, model)
    for key in ('model', 'grads', 'optimizer', 'inner_count', 'skipped', 'history',
                'loss_scale', 'masters'):
        assert_same(before[key], after[key], key)


@pytest.mark.parametrize('backend', BACKENDS)
def test_nested_optim_contexts_run_the_forward_once_cast(backend):
    import _runner

    wrapper, model = trained(backend)
    batch = _runner.make_data(1)[0]
    with wrapper.optim_context(model):
        single = _runner.mse(model, batch)
    with wrapper.optim_context(model):
        with wrapper.optim_context(model):
            nested = _runner.mse(model, batch)
    assert nested.dtype == single.dtype and torch.equal(nested, single)


def test_a_load_inside_the_optim_context_then_a_step():
    # Native only: the legacy backend's load writes the masters into the model's
    # weights, which the pending forward graph still needs (torch's autograd refuses).
    import _runner

    wrapper, model = trained('native')
    state = weights_only_roundtrip(wrapper.state_dict())
    with wrapper.optim_context(model):
        loss = _runner.mse(model, _runner.make_data(1)[0])
        wrapper.load_state_dict(state)
    wrapper.update_params(loss)  # completes the restored window
    assert wrapper.inner_count == state['pending_window']['iter'] + 1
    assert all(p.grad is None or not p.grad.any() for p in model.parameters())  # stepped
