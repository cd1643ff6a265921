"""The host mirror of the scale, the GradScaler the native engine makes, one sync per step."""

from __future__ import annotations

import copy
import importlib.util
import io
import pickle
import re
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch

from fp16utils import AmpOptimWrapper, Fp16OptimizerHook, _torch
from fp16utils._args.spec import MAX_LOSS_SCALE, TORCH_DYNAMIC
from fp16utils._torch import state as _state
from fp16utils.engine.native import HostScale

_spec = importlib.util.spec_from_file_location('_runner', Path(__file__).with_name('_runner.py'))
R = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(R)

INF = float('inf')
PLAIN = type(_torch.factory.make_grad_scaler('cpu', enabled=False))


def _require_cpu_grad_scaler():
    if not _torch.caps.grad_scaler_supports('cpu'):
        pytest.skip('torch has no GradScaler for cpu here (torch.amp.GradScaler(device))')


def _torch_steps(scaler, overflows):
    """Drive a GradScaler through clean (False) and overflowing (True) steps; yield its state."""
    p = torch.nn.Parameter(torch.ones(1))
    optimizer = torch.optim.SGD([p], lr=0.0)
    scaler.scale(torch.ones(1))  # make its scale tensor
    for overflow in overflows:
        p.grad = torch.full((1,), INF if overflow else 1.0)
        scaler.unscale_(optimizer)
        scaler.update()
        state = scaler.state_dict()
        yield state['scale'], state['_growth_tracker']


# ------------------------------------------------------------- the mirror's arithmetic


@pytest.mark.parametrize('init, growth, backoff, interval', [
    (2.0**16, 2.0, 0.5, 3), (30.0, 1.1, 0.7, 2), (1000.0, 1.5, 0.9, 1), (2.0**20, 4.0, 0.25, 2)])
def test_the_mirror_moves_as_grad_scaler_does(init, growth, backoff, interval):
    _require_cpu_grad_scaler()
    pattern = [False, False, True, False, False, False, False, True, True, False] * 3
    spec = TORCH_DYNAMIC._replace(init_scale=init, growth_factor=growth, backoff_factor=backoff,
                                  growth_interval=interval)
    host = HostScale(spec)
    scaler = _torch.factory.make_grad_scaler('cpu', init_scale=init, growth_factor=growth,
                                     backoff_factor=backoff, growth_interval=interval)
    seen = set()
    for overflow, (scale, tracker) in zip(pattern, _torch_steps(scaler, pattern)):
        if overflow:
            host.back_off()
        else:
            host.count_clean()
        assert (host.scale, host.tracker) == (scale, tracker)
        seen.add(scale)
    assert len(seen) >= 3  # the sequence grew and backed off


def test_the_ceiling_is_2_127_and_a_float32_overflow_keeps_the_scale_as_grad_scaler_does():
    _require_cpu_grad_scaler()
    for init, factor, kept in [(2.0**126, 2.0, False), (2.0**126, 8.0, True),
                               (2.0**126, 3.0, False)]:
        spec = TORCH_DYNAMIC._replace(init_scale=init, growth_factor=factor, growth_interval=1)
        host = HostScale(spec)
        scaler = _torch.factory.make_grad_scaler('cpu', init_scale=init, growth_factor=factor,
                                         growth_interval=1)
        for scale, _ in _torch_steps(scaler, [False, False]):
            host.count_clean()
            # torch keeps a scale whose growth is inf in float32, and may go past 2**127
            # (3 * 2**126 is finite); the mirror never does.
            assert host.scale == min(scale, MAX_LOSS_SCALE)
        assert host.scale == (init if kept else MAX_LOSS_SCALE)


def test_the_floor_stops_the_backoff_at_1_or_at_a_lower_initial_scale():
    host = HostScale(TORCH_DYNAMIC._replace(init_scale=4.0))
    assert [host.back_off() for _ in range(4)] == [2.0, 1.0, 1.0, 1.0]
    low = HostScale(TORCH_DYNAMIC._replace(init_scale=0.25))
    assert [low.back_off(), low.back_off()] == [0.25, 0.25]  # never raised, never lower
    _require_cpu_grad_scaler()
    scaler = _torch.factory.make_grad_scaler('cpu', init_scale=4.0)
    assert [s for s, _ in _torch_steps(scaler, [True] * 4)] == [2.0, 1.0, 0.5, 0.25]


def test_the_mirror_saves_restores_and_round_trips_a_grad_scaler_state():
    host = HostScale(TORCH_DYNAMIC._replace(init_scale=64.0, growth_interval=2))
    saved = host.save()
    host.count_clean()
    host.count_clean()
    assert (host.scale, host.tracker) == (128.0, 0)
    host.restore(saved)
    assert (host.scale, host.tracker) == (64.0, 0)
    state = dict(host.state_dict(), scale=8.0, _growth_tracker=1)
    host.load_state_dict(state)
    assert host.state_dict() == state


# ------------------------------------------------------------- the GradScaler made here


def _trained(init_scale=1024.0, **loss_scale):
    _caps.require(torch.float16, 'native')
    model = R.Net()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.01),
                              loss_scale=dict(init_scale=init_scale, **loss_scale))
    _train(wrapper, model, R.make_data(1))
    return model, wrapper


def _train(wrapper, model, batches):
    for batch in batches:
        with wrapper.optim_context(model):
            loss = R.mse(model, batch)
        wrapper.update_params(loss)


def test_the_engines_grad_scaler_is_a_grad_scaler_subclass_that_counts_outside_changes():
    model, wrapper = _trained()
    scaler = wrapper.loss_scaler
    assert isinstance(scaler, _state.ObservedGradScaler) and isinstance(scaler, PLAIN)
    before = _state.grad_scaler_changes(scaler)
    _train(wrapper, model, R.make_data(2))  # its own updates are not outside changes
    assert _state.grad_scaler_changes(scaler) == before
    scaler.load_state_dict(dict(scaler.state_dict(), scale=32.0))
    scaler.update(16.0)
    assert _state.grad_scaler_changes(scaler) == before + 2
    assert wrapper.loss_scale == 16.0 and wrapper.state_dict()['loss_scaler']['scale'] == 16.0


def test_the_engines_grad_scaler_pickles_deep_copies_and_saves_weights_only():
    model, wrapper = _trained(init_scale=128.0)
    scaler = wrapper.loss_scaler
    for clone in (pickle.loads(pickle.dumps(scaler)), copy.deepcopy(scaler)):
        assert type(clone) is PLAIN and clone.get_scale() == 128.0
        assert clone.state_dict() == scaler.state_dict()
    buffer = io.BytesIO()
    torch.save(scaler.state_dict(), buffer)
    buffer.seek(0)
    assert torch.load(buffer, weights_only=True) == scaler.state_dict()
    # A copied wrapper watches its own copy: an outside change to it is seen there only.
    twin = copy.deepcopy(wrapper)
    assert isinstance(twin.loss_scaler, _state.ObservedGradScaler)
    assert twin.loss_scaler is not scaler
    twin.loss_scaler.load_state_dict(dict(twin.loss_scaler.state_dict(), scale=8.0))
    assert (twin.loss_scale, wrapper.loss_scale) == (8.0, 128.0)


def test_an_observed_grad_scaler_made_directly_checks_before_it_applies():
    _require_cpu_grad_scaler()
    refused = []

    def check(state):
        if state['scale'] > 100:
            refused.append(state['scale'])
            raise ValueError(f"scale={state['scale']} refused")

    scaler = _state.make_observed_grad_scaler('cpu', check, init_scale=8.0)
    with pytest.raises(ValueError, match='scale=512'):
        scaler.load_state_dict(dict(scaler.state_dict(), scale=512.0))
    assert scaler.get_scale() == 8.0 and _state.grad_scaler_changes(scaler) == 0
    _state.quiet_grad_scaler_load(scaler, dict(scaler.state_dict(), scale=4.0))
    assert scaler.get_scale() == 4.0 and _state.grad_scaler_changes(scaler) == 0
    assert refused == [512.0]


# ------------------------------------------------------------- a GradScaler given from outside


def _hook_with(scaler, backend='native'):
    hook = Fp16OptimizerHook(loss_scale=dict(init_scale=256.0), backend=backend)
    hook.loss_scaler = scaler
    model = R.Net()
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.01), [hook],
                          max_iters=4, meta={})
    return hook, runner


def test_a_given_grad_scaler_is_kept_as_it_is_and_its_outside_changes_are_seen():
    _caps.require(torch.float16, 'native')
    given = PLAIN('cpu', init_scale=64.0, growth_interval=1000)
    hook, runner = _hook_with(given)
    runner.run(R.make_data(2), R.mse, until=2)
    assert hook.loss_scaler is given and type(given) is PLAIN  # not swapped, not wrapped
    assert hook.loss_scale == 64.0
    given.load_state_dict(dict(given.state_dict(), scale=8.0, _growth_tracker=5))
    assert hook.loss_scale == 8.0
    given.update(4.0)  # as a 0.x hook's own after_train_iter sets a static scale
    assert hook.loss_scale == 4.0
    runner.outputs = {'loss': R.mse(runner.model, R.make_data(1)[0])}
    hook.after_train_iter(runner)
    assert runner.meta['fp16']['loss_scaler']['scale'] == 4.0
    assert runner.meta['fp16']['loss_scaler']['_growth_tracker'] == 6
    assert given.state_dict() == runner.meta['fp16']['loss_scaler']


def test_an_unusable_state_put_into_a_given_grad_scaler_is_refused_and_undone():
    _caps.require(torch.float16, 'native')
    given = PLAIN('cpu', init_scale=64.0)
    hook, runner = _hook_with(given)
    runner.run(R.make_data(1), R.mse, until=1)
    before = given.state_dict()
    given.update(INF)
    with pytest.raises(ValueError, match=r'scale=inf.*last usable state was put back'):
        hook.loss_scale  # noqa: B018
    assert given.state_dict() == before and hook.loss_scale == 64.0


def test_something_that_is_not_a_grad_scaler_is_refused_naming_what_to_give():
    _caps.require(torch.float16, 'native')
    hook, runner = _hook_with(None)
    runner.run(R.make_data(1), R.mse, until=1)
    scaler = hook.loss_scaler
    with pytest.raises(TypeError, match="Give a GradScaler.*backend='legacy'"):
        hook.loss_scaler = object()
    assert hook.loss_scaler is scaler


# ------------------------------------------------------------- device syncs per step


class _SyncCounter:
    """Counts the host reads of device values: ``item``, ``bool``, ``float``, ``tolist``."""

    def __init__(self, monkeypatch):
        self.count = 0
        for name in ('item', '__bool__', '__float__', '__int__', 'tolist'):
            original = getattr(torch.Tensor, name)
            monkeypatch.setattr(torch.Tensor, name, self._counting(original))

    def _counting(self, original):
        def counted(tensor, *args, **kwargs):
            self.count += 1
            return original(tensor, *args, **kwargs)
        return counted


@pytest.mark.parametrize('kind', ['clean', 'skipped', 'growth'])
def test_a_step_reads_the_device_once(kind, monkeypatch):
    model, wrapper = _trained(init_scale=1024.0, growth_interval=2)
    # The step before: clean, so the next clean step is a growth (interval 2).
    if kind == 'clean':
        _train(wrapper, model, R.make_data(1, seed=3))
    batch = R.overflow_batch() if kind == 'skipped' else R.make_data(1, seed=2)[0]
    with wrapper.optim_context(model):
        loss = R.mse(model, batch)
    scale = wrapper.loss_scale
    counter = _SyncCounter(monkeypatch)
    wrapper.update_params(loss)
    syncs = counter.count
    monkeypatch.undo()
    expected = {'clean': scale, 'skipped': scale / 2, 'growth': scale * 2}[kind]
    assert wrapper.loss_scale == expected
    assert wrapper.loss_scaler.get_scale() == expected  # the device holds what the host says
    assert wrapper.skipped_steps == (1 if kind == 'skipped' else 0)
    assert syncs == 1, f'{syncs} device reads in a {kind} step'


# ------------------------------------------------------------- no class swapped anywhere


def test_no_object_has_its_class_reassigned_in_the_package():
    root = Path(__file__).resolve().parents[1] / 'fp16utils'
    pattern = re.compile(r'\.__class__\s*=(?!=)')
    found = [f'{path.relative_to(root.parent)}:{number}'
             for path in sorted(root.rglob('*.py'))
             for number, line in enumerate(path.read_text(encoding='utf-8').splitlines(), 1)
             if pattern.search(line) or '__class__ =' in line]
    assert found == []
