"""Tests for fp16utils.hooks.optimizer: the 0.x optimizer hooks, driven by a minimal runner."""

from __future__ import annotations

import logging
import math
import os
import sys

import _caps  # tests/ is on sys.path: see conftest.py
import _runner as R
import pytest
import torch
import torch.distributed as dist
from hypothesis import given, settings
from hypothesis import strategies as st
from torch import nn

import fp16utils
from fp16utils import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook, LossScaler
from fp16utils.hooks import allreduce as allreduce_mod

BACKENDS = ['native', 'legacy']


def make_runner(hook, max_iters, opt_cls=torch.optim.Adam, lr=1e-2, meta=None, seed=0):
    """A runner for ``hook``; skips the test where the CPU cannot train in the hook's dtype."""
    _caps.require(hook.dtype, 'native' if hook.backend == 'native' else None)
    model = R.Net(seed=seed)
    optimizer = opt_cls(model.parameters(), lr=lr)
    return R.MiniRunner(model, optimizer, [hook], max_iters=max_iters,
                        meta={} if meta is None else meta)


def params(runner, hook):
    """The float32 weights being trained: the masters (legacy) or the model's."""
    if hook.backend == 'legacy':
        return [p.detach().clone() for g in runner.optimizer.param_groups for p in g['params']]
    return [p.detach().clone() for p in runner.model.parameters()]


# ------------------------------------------------------------------------ native


def test_native_hook_matches_a_hand_written_amp_loop():
    data = R.make_data(4)
    hook = Fp16OptimizerHook(loss_scale='dynamic', backend='native')
    runner = make_runner(hook, 4)
    runner.run(data, R.mse)
    assert runner.model.fp16_enabled is True

    ref = R.Net()
    optimizer = torch.optim.Adam(ref.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler('cpu')
    for x, y in data:
        optimizer.zero_grad()
        with torch.autocast('cpu', dtype=torch.float16):
            out = ref(x)
        scaler.scale((out.float() - y).pow(2).mean()).backward()
        scaler.step(optimizer)
        scaler.update()
    for p, q in zip(runner.model.parameters(), ref.parameters()):
        assert torch.equal(p, q)
    assert runner.meta['fp16']['loss_scaler'] == scaler.state_dict()
    assert runner.meta['fp16']['loss_scaler'] == hook.loss_scaler.state_dict()
    assert 'master_params' not in runner.meta['fp16']


@pytest.mark.parametrize('backend', BACKENDS)
def test_grad_norm_is_logged_with_the_sample_count(backend):
    hook = Fp16OptimizerHook(grad_clip=dict(max_norm=0.1, norm_type=2), loss_scale=256.0,
                             backend=backend, dtype=_caps.train_dtype(backend))
    runner = make_runner(hook, 3)
    data = R.make_data(3, batch_size=5)
    runner.run(data, R.mse)
    records = runner.log_buffer.records
    assert len(records) == 3 and all(count == 5 for _, count in records)
    scaled = hook.dtype == torch.float16  # loss_scale is logged when the loss is scaled
    assert all(set(v) == ({'grad_norm', 'loss_scale'} if scaled else {'grad_norm'})
               and v['grad_norm'] > 0.1 and v.get('loss_scale', 256.0) == 256.0
               for v, _ in records)


@pytest.mark.parametrize('backend', BACKENDS)
def test_skipped_step_leaves_everything_bit_identical(backend, caplog):
    hook = Fp16OptimizerHook(loss_scale=dict(init_scale=512.0), backend=backend,
                             grad_clip=dict(max_norm=10.0))
    runner = make_runner(hook, 6)
    data = R.make_data(6)
    data[3] = R.overflow_batch()
    runner.run(data, R.mse, until=3)
    assert R.state_tensors(runner.optimizer) > 0
    before = R.snapshot(runner.model, runner.optimizer)
    with caplog.at_level(logging.WARNING):
        runner.run(data, R.mse, until=4)
    R.assert_identical(before, R.snapshot(runner.model, runner.optimizer))
    assert hook.skipped_steps == 1
    assert hook.loss_scale == 256.0
    assert hook.scale_history == [(0, 512.0), (4, 256.0)]
    ours = [r.getMessage() for r in caplog.records if r.name == 'fp16utils']
    theirs = [r.getMessage() for r in caplog.records if r.name == 'mini_runner']
    # One line per event, in the runner's log (where an mmcv user reads it).
    assert ours == []
    assert len(theirs) == 1 and 'step 4' in theirs[0] and '512.0 -> 256.0' in theirs[0]
    runner.run(data, R.mse)
    after = R.snapshot(runner.model, runner.optimizer)
    assert not torch.equal(after['model.fc1.weight'], before['model.fc1.weight'])
    assert hook.skipped_steps == 1


@pytest.mark.parametrize('backend', BACKENDS)
def test_static_loss_scale_stays_fixed(backend):
    hook = Fp16OptimizerHook(loss_scale=512.0, backend=backend)
    runner = make_runner(hook, 5)
    data = R.make_data(5)
    data[1] = R.overflow_batch()
    runner.run(data, R.mse)
    assert hook.skipped_steps == 1
    assert hook.loss_scale == 512.0 and hook.scale_history == [(0, 512.0)]
    state = runner.meta['fp16']['loss_scaler']
    if backend == 'native':
        assert hook.loss_scaler.get_scale() == 512.0 == state['scale']
    else:
        assert state['mode'] == 'static' and state['cur_scale'] == 512.0


@pytest.mark.parametrize('backend, loss_scale, expected', [
    ('native', 'dynamic', dict(scale=2.0**16, growth_factor=2.0, backoff_factor=0.5,
                               growth_interval=2000)),
    ('native', dict(init_scale=128.0, growth_factor=4.0, backoff_factor=0.25,
                    growth_interval=10), dict(scale=128.0, growth_factor=4.0,
                                              backoff_factor=0.25, growth_interval=10)),
    ('native', 64, dict(scale=64.0)),
    ('legacy', 'dynamic', dict(cur_scale=2.0**32, scale_factor=2.0, scale_window=1000,
                               mode='dynamic')),
    ('legacy', dict(init_scale=128.0, mode='dynamic', scale_factor=4.0, scale_window=10),
     dict(cur_scale=128.0, scale_factor=4.0, scale_window=10)),
    ('legacy', 512.0, dict(cur_scale=512.0, mode='static')),
])
def test_loss_scale_follows_mmcv_rules(backend, loss_scale, expected):
    hook = Fp16OptimizerHook(loss_scale=loss_scale, backend=backend)
    runner = make_runner(hook, 1)
    hook.before_run(runner)
    scaler = hook.loss_scaler
    state = scaler.state_dict()
    assert {k: state[k] for k in expected} == expected
    assert isinstance(scaler, torch.amp.GradScaler if backend == 'native' else LossScaler)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('loss_scale', ['auto', None, -4.0, math.nan, [1.0], {'scale': 4.0}])
def test_bad_loss_scale_is_a_value_error(backend, loss_scale):
    with pytest.raises(ValueError, match='Fp16OptimizerHook: loss_scale must be'):
        Fp16OptimizerHook(loss_scale=loss_scale, backend=backend)
    with pytest.raises(ValueError, match='GradientCumulativeFp16OptimizerHook: loss_scale'):
        GradientCumulativeFp16OptimizerHook(cumulative_iters=2, loss_scale=loss_scale,
                                            backend=backend)


def test_bad_arguments():
    with pytest.raises(ValueError, match='clip_grad must be'):
        Fp16OptimizerHook(grad_clip=dict(norm_type=2))
    with pytest.raises(ValueError, match='cumulative_iters must be an int >= 1'):
        GradientCumulativeFp16OptimizerHook(cumulative_iters=0)
    hook = Fp16OptimizerHook(dtype=_caps.train_dtype('native'))
    runner = make_runner(hook, 1)
    runner.outputs = {'loss': R.mse(runner.model, R.make_data(1)[0])}
    with pytest.raises(RuntimeError, match=r'before_run\(runner\) has not been called'):
        hook.after_train_iter(runner)


def test_meta_none_and_no_log_buffer_are_fine():
    hook = Fp16OptimizerHook(grad_clip=dict(max_norm=1.0), loss_scale=128.0)
    runner = make_runner(hook, 2)
    runner.meta = None
    del runner.log_buffer
    runner.run(R.make_data(2), R.mse)
    assert runner.meta['fp16']['loss_scaler']['scale'] == 128.0


# ------------------------------------------------------------------------ legacy


def test_legacy_hook_keeps_float32_masters():
    low = _caps.LEGACY_LOW
    hook = Fp16OptimizerHook(loss_scale=128.0, backend='legacy', dtype=low)
    runner = make_runner(hook, 2)
    model, optimizer = runner.model, runner.optimizer
    R.mse(model, R.make_data(1)[0]).backward()
    optimizer.step()  # some state before the run, keyed by the model's parameters
    optimizer.zero_grad()
    runner.run(R.make_data(2), R.mse)
    assert runner.optimizer is optimizer
    masters = optimizer.param_groups[0]['params']
    assert all(p.dtype == low for p in model.parameters())
    assert all(m.dtype == torch.float32 for m in masters)
    assert all(optimizer.state[m]['step'].item() == 3 for m in masters)
    assert runner.meta['fp16']['master_params'] is hook._engine.masters
    for m, p in zip(masters, model.parameters()):
        assert torch.equal(m.to(low), p)


@pytest.mark.parametrize('coalesce, bucket_size_mb, calls', [
    (True, -1, 1), (True, 1e-4, 4), (False, -1, 5)])
def test_legacy_hook_averages_master_gradients_when_distributed(
        monkeypatch, coalesce, bucket_size_mb, calls):
    reduced = []

    def fake_all_reduce(tensor, *args, **kwargs):  # two ranks holding the same gradients
        reduced.append(tensor.numel())
        tensor.mul_(2)

    monkeypatch.setattr(allreduce_mod, 'world_size', lambda: 2)
    monkeypatch.setattr(dist, 'all_reduce', fake_all_reduce)
    data = R.make_data(2)
    results = []
    for distributed in (True, False):
        hook = Fp16OptimizerHook(loss_scale=128.0, backend='legacy', coalesce=coalesce,
                                 bucket_size_mb=bucket_size_mb, distributed=distributed,
                                 dtype=_caps.LEGACY_LOW)
        runner = make_runner(hook, 2)
        runner.run(data, R.mse)
        results.append(params(runner, hook))
    assert len(reduced) == 2 * calls
    # The gradients plus one "has a gradient" flag per parameter, per step.
    net_params = list(R.Net().parameters())
    assert sum(reduced) == 2 * (sum(p.numel() for p in net_params) + len(net_params))
    for a, b in zip(*results):
        assert torch.equal(a, b)


def test_allreduce_grads_reduces_the_same_buffers_on_every_rank(monkeypatch):
    seen = []
    monkeypatch.setattr(allreduce_mod, 'world_size', lambda: 4)
    # As if the other 3 ranks had no gradient for any parameter: the sum is this rank's.
    monkeypatch.setattr(dist, 'all_reduce', lambda t, *a, **k: seen.append(t.clone()))
    a, b, c = (nn.Parameter(torch.ones(2)) for _ in range(3))
    a.grad = torch.full((2,), 8.0)
    c.requires_grad_(False)
    c.grad = torch.ones(2)
    allreduce_mod.allreduce_grads([a, b, c], coalesce=False)
    # a's gradient, zeros standing in for b's, and the flags [a has one, b has none]
    assert [t.tolist() for t in seen] == [[2.0, 2.0], [0.0, 0.0], [1.0, 0.0]]
    assert a.grad.tolist() == [2.0, 2.0]
    assert b.grad is None  # no rank had one
    assert c.grad.tolist() == [1.0, 1.0]  # not reduced: it does not require a gradient
    seen.clear()
    allreduce_mod.allreduce_grads([a, b], coalesce=True)
    assert len(seen) == 1  # one bucket: both gradients and the flags
    assert seen[0].tolist() == [2.0, 2.0, 0.0, 0.0, 1.0, 0.0]
    assert b.grad is None


def test_allreduce_grads_is_a_no_op_without_a_process_group():
    p = nn.Parameter(torch.ones(3))
    p.grad = torch.full((3,), 5.0)
    assert not dist.is_initialized()
    allreduce_mod.allreduce_grads([p], coalesce=True, bucket_size_mb=1)
    assert p.grad.tolist() == [5.0, 5.0, 5.0]


def _gloo_worker(rank, world_size, init_file, out_dir):
    dist.init_process_group('gloo', init_method=f'file://{init_file}', rank=rank,
                            world_size=world_size)
    try:
        ps = [nn.Parameter(torch.zeros(3)), nn.Parameter(torch.zeros(2, 2))]
        for p in ps:
            p.grad = torch.full_like(p, float(rank + 1))
        allreduce_mod.allreduce_grads(ps, coalesce=True)
        q = nn.Parameter(torch.zeros(2))
        q.grad = torch.full((2,), float(rank * 4))
        allreduce_mod.allreduce_grads([q], coalesce=False)
        result = [p.grad.flatten().tolist() for p in ps] + [q.grad.tolist()]
        out = os.path.join(out_dir, f'rank{rank}.pt')
        torch.save(result, out + '.tmp')
        os.replace(out + '.tmp', out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    # Exit without the interpreter's teardown, which races gloo's threads (they outlive
    # destroy_process_group) and can abort a worker whose work is done (see _dist_worker).
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@pytest.mark.multiprocess
def test_allreduce_grads_with_two_real_processes(tmp_path, monkeypatch):
    if not dist.is_available():
        pytest.skip('torch.distributed is not available')
    import torch.multiprocessing as mp

    # Results come back in files: a multiprocessing Manager would fork this process,
    # which may hold gloo threads of an earlier in-process group.
    monkeypatch.setenv('GLOO_SOCKET_IFNAME', os.environ.get('GLOO_SOCKET_IFNAME', 'lo'))
    mp.spawn(_gloo_worker, args=(2, str(tmp_path / 'init'), str(tmp_path)), nprocs=2,
             join=True)
    expected = [[1.5] * 3, [1.5] * 4, [2.0, 2.0]]
    assert [torch.load(tmp_path / f'rank{r}.pt') for r in range(2)] == [expected, expected]


def test_old_torch_makes_the_hook_legacy(monkeypatch):
    monkeypatch.delenv(fp16utils._torch.versions.BACKEND_ENV, raising=False)
    monkeypatch.setattr(fp16utils._torch.versions, 'TORCH_VERSION', '1.5.0')
    fp16utils._torch.decisions.refresh()
    try:
        hook = Fp16OptimizerHook(loss_scale=dict(init_scale=256.0, mode='dynamic'))
        assert hook.backend == 'legacy'
        runner = make_runner(hook, 4)
        data = R.make_data(4)
        data[2] = R.overflow_batch()
        runner.run(data, R.mse, until=2)
        before = R.snapshot(runner.model, runner.optimizer)
        runner.run(data, R.mse, until=3)
        R.assert_identical(before, R.snapshot(runner.model, runner.optimizer))
        runner.run(data, R.mse)
        assert hook.skipped_steps == 1 and hook.loss_scale == 128.0
        assert next(runner.model.parameters()).dtype == torch.float16
    finally:
        monkeypatch.undo()
        fp16utils._torch.decisions.refresh()


# ------------------------------------------------------------------------ mmcv states


@pytest.mark.parametrize('backend', BACKENDS)
@settings(max_examples=12, deadline=None)
@given(cur_iter=st.integers(0, 30), gap=st.integers(1, 30), window=st.integers(1, 4),
       overflows=st.lists(st.booleans(), min_size=1, max_size=7),
       static=st.booleans())
def test_an_mmcv_scaler_state_resumes_exactly_as_mmcv_would(
        backend, cur_iter, gap, window, overflows, static):
    last_overflow = cur_iter - gap
    state = {'cur_scale': 1024.0, 'cur_iter': cur_iter, 'mode': 'static' if static else 'dynamic',
             'last_overflow_iter': last_overflow, 'scale_factor': 2.0, 'scale_window': window}
    mmcv = LossScaler()
    mmcv.load_state_dict(dict(state))
    hook = Fp16OptimizerHook(loss_scale='dynamic', backend=backend)
    runner = make_runner(hook, len(overflows), opt_cls=torch.optim.SGD,
                         meta={'fp16': {'loss_scaler': dict(state)}})
    data = [R.overflow_batch() if flag else batch
            for flag, batch in zip(overflows, R.make_data(len(overflows)))]
    hook.before_run(runner)
    runner.hooks = []  # drive the iterations by hand: before_run was called above
    for i, batch in enumerate(data):
        runner.iter = i
        runner.outputs = {'loss': R.mse(runner.model, batch)}
        hook.after_train_iter(runner)
        mmcv.update_scale(overflows[i])
        assert hook.loss_scale == mmcv.loss_scale
    assert hook.skipped_steps == sum(overflows)


def test_mmcv_state_maps_onto_grad_scaler_state():
    state = {'cur_scale': 2.0**20, 'cur_iter': 4000, 'mode': 'dynamic',
             'last_overflow_iter': 3517, 'scale_factor': 2.0, 'scale_window': 1000}
    hook = Fp16OptimizerHook(backend='native')
    runner = make_runner(hook, 1, meta={'fp16': {'loss_scaler': state}})
    hook.before_run(runner)
    assert hook.loss_scaler.state_dict() == {
        'scale': 2.0**20, 'growth_factor': 2.0, 'backoff_factor': 0.5,
        'growth_interval': 1000, '_growth_tracker': 482}


def test_bad_scaler_state_in_meta_names_the_keys():
    hook = Fp16OptimizerHook(backend='native')
    runner = make_runner(hook, 1, meta={'fp16': {'loss_scaler': {'cur_scale': 8.0}}})
    with pytest.raises(KeyError, match='missing'):
        hook.before_run(runner)


# ------------------------------------------------------------------------ accumulation


@pytest.mark.parametrize('backend', BACKENDS)
def test_cumulative_hook_equals_large_batches_with_a_short_last_window(backend):
    small = R.make_data(6, batch_size=2)
    windows = [small[:4], small[4:]]
    large = [(torch.cat([b[0] for b in w]), torch.cat([b[1] for b in w])) for w in windows]
    dtype = _caps.train_dtype(backend)
    hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=4, loss_scale=256.0,
                                               backend=backend, dtype=dtype)
    runner = make_runner(hook, 6, opt_cls=torch.optim.SGD, lr=0.1)
    steps = []
    original_step = runner.optimizer.step

    def counting_step(*args, **kwargs):
        steps.append(runner.iter)
        return original_step(*args, **kwargs)

    runner.optimizer.step = counting_step
    runner.run(small, R.mse)
    assert steps == [3, 5]
    assert hook.divisible_iters == 4 and hook.remainder_iters == 2
    ref_hook = Fp16OptimizerHook(loss_scale=256.0, backend=backend, dtype=dtype)
    ref = make_runner(ref_hook, 2, opt_cls=torch.optim.SGD, lr=0.1)
    ref.run(large, R.mse)
    atol = 2e-3 if dtype == torch.float16 else 2e-2
    for p, q in zip(params(runner, hook), params(ref, ref_hook)):
        torch.testing.assert_close(p, q, rtol=0, atol=atol)
    # Cleared as torch's optimizer.zero_grad() clears by default: to None, or to zeros.
    assert all(p.grad is None or not p.grad.any() for p in runner.model.parameters())


def test_cumulative_hook_warns_on_an_unaligned_resume(caplog):
    hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=4, loss_scale=64.0,
                                               dtype=_caps.train_dtype('native'))
    runner = make_runner(hook, 8)
    runner.model.bn = nn.BatchNorm1d(2)
    runner.iter = 3
    with caplog.at_level(logging.WARNING, logger='mini_runner'):
        runner.run(R.make_data(8), R.mse)
    assert 'not a multiple of cumulative_iters=4' in caplog.text
    assert 'BatchNorm' in caplog.text


# ------------------------------------------------------------------------ resume


@pytest.mark.parametrize('cumulative', [1, 2])
@pytest.mark.parametrize('backend', BACKENDS)
def test_resume_from_a_checkpoint_is_bit_identical(backend, cumulative):
    def make_hook():
        return GradientCumulativeFp16OptimizerHook(
            cumulative_iters=cumulative, backend=backend, grad_clip=dict(max_norm=1.0),
            loss_scale=dict(init_scale=512.0, growth_interval=2))

    data = R.make_data(8)
    data[1] = R.overflow_batch()
    full_hook = make_hook()
    full = make_runner(full_hook, 8)
    full.run(data, R.mse)

    first = make_runner(make_hook(), 8)
    first.run(data, R.mse, until=4)
    checkpoint = first.save_checkpoint()

    resumed_hook = make_hook()
    resumed = make_runner(resumed_hook, 8, seed=99)
    resumed.resume(checkpoint)
    resumed.run(data, R.mse)
    R.assert_identical(R.snapshot(full.model, full.optimizer),
                       R.snapshot(resumed.model, resumed.optimizer))
    assert resumed_hook.loss_scale == full_hook.loss_scale
    assert full_hook.skipped_steps == 1


def test_before_run_twice_keeps_the_same_masters():
    hook = Fp16OptimizerHook(loss_scale=64.0, backend='legacy', dtype=_caps.LEGACY_LOW)
    assert hook.loss_scaler is None and hook.skipped_steps == 0 and hook.scale_history == []
    runner = make_runner(hook, 4)
    runner.run(R.make_data(4), R.mse, until=2)
    masters = list(runner.optimizer.param_groups[0]['params'])
    runner.run(R.make_data(4), R.mse)
    assert runner.optimizer.param_groups[0]['params'] == masters
    assert all(m.dtype == torch.float32 for m in masters)
    assert "Fp16OptimizerHook(backend='legacy'" in repr(hook)


@pytest.mark.parametrize('cls, extra', [(Fp16OptimizerHook, ''),
                                        (GradientCumulativeFp16OptimizerHook, 'cumulative_iters')])
def test_a_misspelt_hook_argument_is_one_type_error_naming_the_closest(cls, extra):
    from fp16utils._args.keys import UnknownKeyError

    with pytest.raises(UnknownKeyError) as info:
        cls(loss_scal=512.)
    text = str(info.value)
    assert isinstance(info.value, TypeError) and '\n' not in text
    assert f"{cls.__name__} got the unknown key 'loss_scal' (did you mean 'loss_scale'?)" in text
    assert 'grad_clip' in text and extra in text


def test_the_backend_is_decided_once_in_before_run_and_read_from_the_engine():
    hook = Fp16OptimizerHook(loss_scale='dynamic', backend='legacy', dtype=_caps.LEGACY_LOW)
    assert hook.backend == 'legacy' and hook._scale_update_param is None
    assert hook.loss_scale == (2.0**32 if _caps.LEGACY_LOW == torch.float16 else 1.0)
    runner = make_runner(hook, 1)
    runner.run(R.make_data(1), R.mse)
    assert hook.backend == hook._engine.backend == 'legacy'
    assert hook.loss_scale == hook._engine.loss_scale
    assert set(vars(hook)) & {'backend', '_spec', '_loss_scale_arg', '_backend_arg'} == set()


class _Lines:
    def __init__(self):
        self.lines = []

    def warning(self, msg, *args):
        self.lines.append(msg % args if args else msg)


def test_the_engine_logs_to_the_logger_of_the_current_run():
    _caps.require(torch.float16, 'native')
    hook = Fp16OptimizerHook(loss_scale='dynamic', backend='native')
    first, second = _Lines(), _Lines()
    runner = make_runner(hook, 2)
    runner.logger = first
    runner.run(R.make_data(2), R.mse, until=1)
    runner.logger, runner.meta = second, {}
    hook.before_run(runner)  # the same optimizer: the engine is kept, the logger followed
    assert first.lines == [] and len(second.lines) == 1
    assert 'runner.meta holds no loss-scaler state' in second.lines[0]
    assert allreduce_mod.world_size() == 1  # no process group


@pytest.mark.parametrize('backend', BACKENDS)
def test_a_module_kept_in_float32_before_the_run_stays_float32(backend):
    # The 0.x route to fp32_modules: keep_fp32 in the script, then the hook wraps the model.
    from fp16utils import keep_fp32
    hook = Fp16OptimizerHook(loss_scale=128.0, backend=backend, dtype=_caps.LEGACY_LOW)
    runner = make_runner(hook, 3, opt_cls=torch.optim.SGD)
    keep_fp32(runner.model, ['fc2'])
    runner.run(R.make_data(3), R.mse)
    model = runner.model
    assert model.fc2.weight.dtype == torch.float32 and model.fc2.bias.dtype == torch.float32
    assert model.fc1.weight.dtype == (_caps.LEGACY_LOW if backend == 'legacy' else torch.float32)
    assert hook.skipped_steps == 0 and all(torch.isfinite(p).all() for p in model.parameters())
