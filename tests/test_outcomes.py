"""Step outcomes (StepResult), skip-aware followers and the overflow guard."""

from __future__ import annotations

import copy
import pickle

import _caps  # tests/ is on sys.path: see conftest.py
import _runner as R
import pytest
import torch
from torch import nn
from torch.optim.swa_utils import AveragedModel

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

F16, BF16 = _caps.F16, _caps.BF16
INF = float('inf')


class Net(nn.Module):
    """fc1 -> relu -> fault -> fc2; ``fault.on`` makes the forward emit inf."""

    def __init__(self, seed: int = 0) -> None:
        super().__init__()
        torch.manual_seed(seed)
        self.fc1 = nn.Linear(8, 16)
        self.fault = Fault()
        self.fc2 = nn.Linear(16, 4)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(self.fault(torch.relu(self.fc1(x))))


class Fault(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.on = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * INF if self.on else x


class Log:
    """A logger that keeps its warnings."""

    def __init__(self) -> None:
        self.lines: list = []

    def warning(self, message: str) -> None:
        self.lines.append(message)


class After:
    """A runner hook that calls ``fn(runner)`` after each training iteration."""

    def __init__(self, fn):
        self.fn = fn

    def after_train_iter(self, runner):
        self.fn(runner)

    def __getattr__(self, name):  # every other stage: nothing
        return lambda runner: None


def amp(model, dtype=None, opt=None, **kwargs):
    dtype = _caps.LOW if dtype is None else dtype
    _caps.require(dtype, 'native')
    optimizer = opt(model.parameters()) if opt else torch.optim.Adam(model.parameters(), lr=1e-2)
    wrapper = AmpOptimWrapper(optimizer=optimizer, dtype=dtype, **kwargs)
    wrapper.logger = Log()
    return wrapper


def train(wrapper, model, batch, fault=False):
    model.fault.on = fault
    with wrapper.optim_context(model):
        loss = R.mse(model, batch)
    model.fault.on = False
    return wrapper.update_params(loss)


def snapshot(model, wrapper):
    return R.snapshot(model, wrapper.optimizer)


# ------------------------------------------------------------------------ StepResult


def test_step_result_fields_equality_hash_pickle_and_repr():
    r = StepResult(skipped=True, scale=512)
    assert (r.stepped, r.skipped, r.accumulating, r.scale, r.grad_norm) == (
        False, True, False, 512.0, None)
    assert isinstance(r.scale, float)
    same = StepResult(skipped=True, scale=512.0)
    assert r == same and hash(r) == hash(same) and r != StepResult(skipped=True, scale=256.)
    assert r != StepResult(stepped=True, scale=512.0) and r != 'skipped'
    assert pickle.loads(pickle.dumps(r)) == r and copy.deepcopy(r) == r
    assert repr(r) == ('StepResult(stepped=False, skipped=True, accumulating=False, '
                       'scale=512.0, grad_norm=None)')
    with pytest.raises(AttributeError, match='immutable'):
        r.skipped = False
    with pytest.raises(AttributeError, match='immutable'):
        del r.scale
    assert r.skipped and not hasattr(r, '__dict__')


def test_step_result_reads_the_norm_tensor_once_and_caches_the_float():
    norm = torch.tensor(3.0)
    r = StepResult(stepped=True, grad_norm=norm)
    assert r._norm is norm  # kept as the tensor: making the result costs no sync
    assert r.grad_norm == 3.0 and type(r._norm) is float
    norm.fill_(5.0)
    assert r.grad_norm == 3.0
    assert pickle.loads(pickle.dumps(StepResult(stepped=True, grad_norm=norm))).grad_norm == 5.0


def test_plain_wrapper_results_under_accumulation_with_a_short_last_window():
    model = Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), accumulative_counts=2,
                           clip_grad=dict(max_norm=100.0))
    wrapper.initialize_count_status(model, 0, 5)
    data = R.make_data(5)
    results = [train(wrapper, model, b) for b in data]
    assert type(results[1]._norm) is torch.Tensor  # returned unread: no sync yet
    assert [(r.stepped, r.accumulating) for r in results] == [
        (False, True), (True, False), (False, True), (True, False), (True, False)]
    assert all(r.scale is None and not r.skipped for r in results)
    assert [r.grad_norm is None for r in results] == [True, False, True, False, False]
    assert results[-1].grad_norm == float(wrapper.grad_norm)
    assert wrapper.last_result is results[-1] and wrapper.steps_taken == 3


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_amp_results_say_stepped_skipped_and_the_scale_of_the_gradients(backend):
    dtype = _caps.train_dtype(backend)
    if dtype != F16:
        pytest.skip('float16 training with loss scaling is not available on cpu here')
    model = Net()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), dtype=dtype,
                              backend=backend, model=model if backend == 'legacy' else None,
                              loss_scale=dict(init_scale=1024.0))
    wrapper.logger = Log()
    data = R.make_data(3)
    clean = train(wrapper, model, data[0])
    before = snapshot(model, wrapper)
    skipped = train(wrapper, model, data[1], fault=True)
    R.assert_identical(before, snapshot(model, wrapper))
    after = train(wrapper, model, data[2])
    assert clean == StepResult(stepped=True, scale=1024.0)
    assert skipped == StepResult(skipped=True, scale=1024.0)  # the scale it was multiplied by
    assert after == StepResult(stepped=True, scale=512.0)
    assert wrapper.steps_taken == 2 and wrapper.skipped_steps == 1


def test_bfloat16_skip_has_no_scale():
    _caps.require(BF16, 'native', scaled=False)
    model = Net()
    wrapper = amp(model, dtype=BF16)
    data = R.make_data(2)
    assert train(wrapper, model, data[0], fault=True) == StepResult(skipped=True)
    assert train(wrapper, model, data[1]) == StepResult(stepped=True)
    assert wrapper.steps_taken == 1


def _fused_or_foreach():
    out = []
    for cls in (torch.optim.Adam, torch.optim.AdamW, torch.optim.SGD):
        for flag in ('fused', 'foreach'):
            out.append(pytest.param(cls, flag, id=f'{cls.__name__}-{flag}'))
    return out


@pytest.mark.parametrize('opt_cls, flag', _fused_or_foreach())
def test_fused_and_foreach_optimizers_report_skips_and_steps(opt_cls, flag):
    _caps.require(F16, 'native')
    model = Net()
    try:
        optimizer = opt_cls(model.parameters(), lr=1e-2, **{flag: True})
        p = nn.Parameter(torch.ones(2))
        probe = opt_cls([p], lr=1e-2, **{flag: True})
        p.grad = torch.ones(2)
        probe.step()
    except (RuntimeError, TypeError, ValueError) as err:
        pytest.skip(f'torch has no {flag}=True {opt_cls.__name__} on cpu here ({err})')
    wrapper = AmpOptimWrapper(optimizer=optimizer, dtype=F16, accumulative_counts=2,
                              loss_scale=dict(init_scale=256.0))
    wrapper.logger = Log()
    wrapper.initialize_count_status(model, 0, 5)
    data = R.make_data(5)
    out = [train(wrapper, model, data[0]), train(wrapper, model, data[1])]
    before = snapshot(model, wrapper)
    out += [train(wrapper, model, data[2], fault=True), train(wrapper, model, data[3])]
    R.assert_identical(before, snapshot(model, wrapper))
    out.append(train(wrapper, model, data[4]))  # the shorter last window
    acc, stepped, skipped = (StepResult(accumulating=True, scale=256.0),
                             StepResult(stepped=True, scale=256.0),
                             StepResult(skipped=True, scale=256.0))
    assert out == [acc, stepped, acc, skipped, StepResult(stepped=True, scale=128.0)]


def test_dict_keeps_refusing_update_params_and_step_but_shows_last_results():
    gen, disc = Net(0), Net(1)
    wrappers = OptimWrapperDict(gen=OptimWrapper(torch.optim.SGD(gen.parameters(), lr=0.1)),
                                disc=OptimWrapper(torch.optim.SGD(disc.parameters(), lr=0.1)))
    with pytest.raises(NotImplementedError):
        wrappers.update_params(torch.tensor(1.0))
    with pytest.raises(NotImplementedError):
        wrappers.step()
    assert wrappers.last_results == {'gen': None, 'disc': None}
    result = train(wrappers['gen'], gen, R.make_data(1)[0])
    assert wrappers.last_results == {'gen': result, 'disc': None} and result.stepped


def test_builder_passes_overflow_guard_through():
    model = Net()
    wrapper = build_optim_wrapper(model, dict(
        type='AmpOptimWrapper', dtype=_caps.NAMES[_caps.LOW],
        optimizer=dict(type='SGD', lr=0.1), overflow_guard=dict(max_consecutive=2)))
    assert wrapper._guard.max_consecutive == 2 and wrapper._guard.action == 'diagnose'
    with pytest.raises(ValueError, match='unknown key'):
        build_optim_wrapper(model, dict(type='AmpOptimWrapper', optimizer=dict(type='SGD', lr=1),
                                        overflow_guard=dict(max_consecutive=2, acton='raise')))


# ------------------------------------------------------------------------ hooks


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_hook_puts_the_outcome_in_outputs_and_the_scale_in_the_log_buffer(backend):
    hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=2, backend=backend,
                                               dtype=_caps.train_dtype(backend),
                                               loss_scale=dict(init_scale=512.0),
                                               grad_clip=dict(max_norm=100.0))
    _caps.require(hook.dtype, 'native' if backend == 'native' else None)
    model = R.Net()
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.1), [hook],
                          max_iters=3, meta={})
    seen = []
    runner.hooks.append(After(lambda r: seen.append(dict(r.outputs['fp16']))))
    runner.run(R.make_data(3, batch_size=5), R.mse)
    scaled = hook.dtype == F16
    scale = 512.0 if scaled else None
    assert [(s['stepped'], s['skipped'], s['accumulating'], s['scale']) for s in seen] == [
        (False, False, True, scale), (True, False, False, scale), (True, False, False, scale)]
    assert [s['grad_norm'] is None for s in seen] == [True, False, False]
    assert hook.last_result == StepResult(**seen[-1]) and hook.steps_taken == 2
    records = runner.log_buffer.records
    if scaled:
        assert [set(v) for v, _ in records] == [
            {'loss_scale'}, {'loss_scale', 'grad_norm'}, {'loss_scale', 'grad_norm'}]
    else:
        assert [set(v) for v, _ in records] == [{'grad_norm'}, {'grad_norm'}]
    # mmcv's TextLoggerHook formats log_buffer averages with `:.4f` when they are floats
    assert all(type(x) is float and count == 5 for v, count in records for x in v.values())


def test_hook_creates_outputs_when_none():
    hook = Fp16OptimizerHook(loss_scale=512.0, dtype=_caps.train_dtype('native'))
    model = R.Net()
    runner = R.MiniRunner(model, torch.optim.SGD(model.parameters(), lr=0.1), [hook], meta={})
    hook.before_run(runner)
    loss = R.mse(model, R.make_data(1)[0])
    runner.outputs = {'loss': loss}
    hook.after_train_iter(runner)
    assert runner.outputs['fp16']['stepped'] is True
    runner.outputs = None
    hook._publish(runner, StepResult(accumulating=True))
    assert runner.outputs == {'fp16': {'stepped': False, 'skipped': False, 'accumulating': True,
                                       'scale': None, 'grad_norm': None}}


# ------------------------------------------------------------------------ skip_aware


def _run(dtype, nonfinite, faults, counts, n, follow, use_hook=False):
    """Train ``n`` iterations; batches in ``faults`` blow up (or are left out when not follow).

    Returns the model, the scheduler, the two EMA models, and the wrapper.
    """
    data = R.make_data(n)
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    wrapper = AmpOptimWrapper(optimizer=optimizer, dtype=dtype, nonfinite=nonfinite,
                              accumulative_counts=counts, loss_scale=dict(init_scale=2.0 ** 12))
    wrapper.logger = Log()
    sched = torch.optim.lr_scheduler.StepLR(optimizer, step_size=2, gamma=0.5)
    ema = AveragedModel(model, avg_fn=lambda avg, new, num: 0.9 * avg + 0.1 * new)
    swa = AveragedModel(model)
    if follow:
        sched, ema, swa = (skip_aware(x, wrapper) for x in (sched, ema, swa))
    kept = [i for i in range(n) if follow or i not in faults]
    wrapper.initialize_count_status(model, 0, len(kept))
    for i in kept:
        result = train(wrapper, model, data[i], fault=i in faults)
        if follow or result.stepped:
            sched.step()
            ema.update_parameters(model)
            swa.update_parameters(model)
    return model, sched, ema, swa, wrapper


@pytest.mark.parametrize('dtype, nonfinite, counts', [
    (F16, 'warn', 1), (F16, 'warn', 2), (BF16, 'warn', 1), (BF16, 'warn', 2)],
    ids=['float16-scaled', 'float16-scaled-accumulate', 'bfloat16-warn',
         'bfloat16-warn-accumulate'])
def test_followers_end_equal_to_a_run_that_never_had_the_bad_batches(dtype, nonfinite, counts):
    _caps.require(dtype, 'native')
    n = 11  # with counts=2: a shorter last window of one iteration
    faults = {2, 3, 7} if counts == 1 else {2, 3, 6, 7}  # whole windows when accumulating
    a_model, a_sched, a_ema, a_swa, a_wrapper = _run(dtype, nonfinite, faults, counts, n, True)
    b_model, b_sched, b_ema, b_swa, b_wrapper = _run(dtype, nonfinite, faults, counts, n, False)
    assert a_wrapper.skipped_steps == len(faults) // counts and b_wrapper.skipped_steps == 0
    assert a_wrapper.steps_taken == b_wrapper.steps_taken > 0
    assert a_sched.last_epoch == b_sched.last_epoch
    assert a_sched.get_last_lr() == b_sched.get_last_lr()
    assert a_sched.state_dict() == b_sched.state_dict()
    R.assert_identical(R.snapshot(a_model, a_wrapper.optimizer),
                       R.snapshot(b_model, b_wrapper.optimizer))
    for a, b in ((a_ema, b_ema), (a_swa, b_swa)):
        R.assert_identical(dict(a.state_dict()), dict(b.state_dict()))


def test_follower_of_a_hook_advances_only_on_taken_steps():
    hook = Fp16OptimizerHook(loss_scale=dict(init_scale=512.0), dtype=_caps.train_dtype('native'),
                             nonfinite='warn')
    model = R.Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(optimizer, 1, 0.5), hook)
    runner = R.MiniRunner(model, optimizer, [hook, After(lambda r: sched.step())], max_iters=4,
                          meta={})
    data = R.make_data(4)
    data[1] = (torch.full((4, 8), float('nan')), data[1][1])
    runner.run(data, R.mse)
    assert hook.skipped_steps == 1 and hook.steps_taken == 3 and sched.last_epoch == 3


def test_follower_state_dict_is_the_plain_objects_and_nothing_is_planted():
    model = Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=1.0))
    plain = torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5)
    keys = set(vars(plain))
    follower = skip_aware(plain, wrapper)
    train(wrapper, model, R.make_data(1)[0])
    follower.step()
    follower.step()  # no step taken since: nothing happens
    assert set(vars(plain)) == keys and follower.state_dict() == plain.state_dict()
    assert follower.last_epoch == 1 and follower.get_last_lr() == [0.5]
    follower.base_lrs = [2.0]  # attribute writes reach the scheduler
    assert plain.base_lrs == [2.0] and follower.__wrapped__ is plain
    state = follower.state_dict()
    fresh = skip_aware(torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5), wrapper)
    fresh.load_state_dict(state)
    assert fresh.state_dict() == state
    ema = skip_aware(AveragedModel(model), wrapper)
    x = torch.ones(1, 8)
    assert torch.equal(ema(x), ema.__wrapped__(x))  # AveragedModel's forward
    assert repr(follower).startswith('skip_aware(<torch.optim.lr_scheduler.StepLR')


@pytest.mark.filterwarnings('ignore:Seems like:UserWarning')
def test_follower_survives_deepcopy_and_pickle_together_with_its_wrapper():
    model = Net()
    wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=1.0))
    sched = skip_aware(torch.optim.lr_scheduler.StepLR(wrapper.optimizer, 1, 0.5), wrapper)
    for clone in (copy.deepcopy, lambda x: pickle.loads(pickle.dumps(x))):
        model2, wrapper2, sched2 = clone((model, wrapper, sched))
        assert sched2.__wrapped__.optimizer is wrapper2.optimizer
        train(wrapper2, model2, R.make_data(1)[0])
        sched2.step()
        sched.step()
        assert sched2.last_epoch == 1 and sched.last_epoch == 0
    alone = pickle.loads(pickle.dumps(sched))
    assert alone.last_epoch == 0  # still forwards
    with pytest.raises(ReferenceError, match='is gone'):
        alone.step()


def test_mmengine_style_scheduler_and_ema_follow():
    class ParamScheduler:  # MMEngine's schedulers: step() and state_dict()
        def __init__(self):
            self.last_step = 0

        def step(self):
            self.last_step += 1

        def state_dict(self):
            return dict(vars(self))

    class EMA(nn.Module):  # MMEngine's BaseAveragedModel: update_parameters(model)
        def __init__(self):
            super().__init__()
            self.steps = 0

        def update_parameters(self, model):
            self.steps += 1

    model = Net()
    wrapper = amp(model, opt=lambda p: torch.optim.SGD(p, lr=0.1), nonfinite='warn',
                  loss_scale=dict(init_scale=64.0))
    sched, ema = skip_aware(ParamScheduler(), wrapper), skip_aware(EMA(), wrapper)
    for fault in (False, True, True, False):
        train(wrapper, model, R.make_data(1)[0], fault=fault)
        sched.step()
        ema.update_parameters(model)
    assert sched.last_step == ema.steps == 2 and sched.state_dict() == {'last_step': 2}


# ------------------------------------------------------------------------ overflow guard


class HookCounter:
    """Counts forward-hook registrations on nn.Modules (monkeypatched)."""

    def __init__(self, monkeypatch):
        self.count = 0
        original = nn.Module.register_forward_hook

        def counting(module, *args, **kwargs):
            handle = original(module, *args, **kwargs)
            self.count += 1  # registered (an old torch refuses with_kwargs first)
            return handle

        monkeypatch.setattr(nn.Module, 'register_forward_hook', counting)


def test_guard_arms_exactly_after_n_skips_and_clean_runs_attach_nothing(monkeypatch):
    model = Net()
    wrapper = amp(model, overflow_guard=dict(max_consecutive=2), nonfinite='warn')
    counter = HookCounter(monkeypatch)
    data = R.make_data(10)
    for b in data[:4]:
        train(wrapper, model, b)
    assert counter.count == 0 and not wrapper.logger.lines
    train(wrapper, model, data[4], fault=True)  # streak 1
    train(wrapper, model, data[5], fault=True)  # streak 2: arms, not yet watched
    assert counter.count == 0 and wrapper._guard.armed
    train(wrapper, model, data[6], fault=True)  # watched and diagnosed
    modules = len(list(model.modules()))
    assert counter.count == modules
    assert all(not m._forward_hooks for m in model.modules())  # removed
    reports = [line for line in wrapper.logger.lines if 'overflow guard' in line]
    assert len(reports) == 1 and "first non-finite module: 'fault'" in reports[0]
    assert 'forward-output' in reports[0]
    train(wrapper, model, data[7], fault=True)  # same streak: no second diagnosis
    assert counter.count == modules and len(
        [x for x in wrapper.logger.lines if 'overflow guard' in x]) == 1
    train(wrapper, model, data[8])  # a clean step resets the streak
    assert wrapper._guard.streak == 0 and not wrapper._guard.armed
    train(wrapper, model, data[9], fault=True)
    train(wrapper, model, data[0])
    assert counter.count == modules  # one skip, then clean: never armed again


def test_clean_guarded_step_resets_the_streak_without_a_report():
    model = Net()
    wrapper = amp(model, overflow_guard=dict(max_consecutive=1, action='raise'),
                  nonfinite='warn')
    data = R.make_data(3)
    train(wrapper, model, data[0], fault=True)
    assert wrapper._guard.armed
    result = train(wrapper, model, data[1])  # watched, finds nothing, steps
    assert result.stepped and wrapper._guard.report.ok and wrapper._guard.streak == 0
    assert not wrapper._guard.armed
    assert not [x for x in wrapper.logger.lines if 'overflow guard' in x]


def test_guard_raise_names_the_module_and_changes_nothing():
    model = Net()
    wrapper = amp(model, overflow_guard=dict(max_consecutive=1, action='raise'),
                  nonfinite='warn')
    data = R.make_data(3)
    train(wrapper, model, data[0])
    train(wrapper, model, data[1], fault=True)
    before = snapshot(model, wrapper)
    taken = wrapper.steps_taken
    with pytest.raises(FloatingPointError, match=r"'fault'.*\.report") as info:
        train(wrapper, model, data[2], fault=True)
    assert info.value.report.first_module == 'fault'
    assert info.value.report.forward.kind == 'forward-output'
    R.assert_identical(before, snapshot(model, wrapper))
    assert wrapper.steps_taken == taken and wrapper.skipped_steps == 1
    assert all(not m._forward_hooks for m in model.modules())


def test_guard_reports_parameters_a_grad_hook_made_non_finite():
    model = Net()
    wrapper = amp(model, overflow_guard=dict(max_consecutive=1, action='raise'),
                  nonfinite='warn')
    poison = {'on': False}
    model.fc1.weight.register_hook(lambda g: torch.full_like(g, INF) if poison['on'] else g)
    data = R.make_data(2)
    poison['on'] = True
    train(wrapper, model, data[0])
    with pytest.raises(FloatingPointError) as info:
        train(wrapper, model, data[1])
    report = info.value.report
    assert report.forward is None and [p.name for p in report.parameters] == ['fc1.weight']


def test_guard_arms_when_the_scale_sits_at_its_floor():
    _caps.require(F16, 'native')
    model = Net()
    wrapper = amp(model, dtype=F16, loss_scale=dict(init_scale=2.0),
                  overflow_guard=dict(max_consecutive=50))
    train(wrapper, model, R.make_data(1)[0], fault=True)
    assert wrapper.loss_scale == 1.0 and wrapper._guard.armed and wrapper._guard.streak == 1


def test_guard_removes_watchers_when_the_forward_or_backward_raises():
    model = Net()
    wrapper = amp(model, overflow_guard=dict(max_consecutive=1), nonfinite='warn')
    train(wrapper, model, R.make_data(1)[0], fault=True)
    with pytest.raises(RuntimeError, match='boom'):
        with wrapper.optim_context(model):
            model(torch.ones(1, 8))
            assert model.fc1._forward_hooks
            raise RuntimeError('boom')
    assert all(not m._forward_hooks for m in model.modules()) and not wrapper._guard.watching
    with wrapper.optim_context(model):
        loss = R.mse(model, R.make_data(1)[0])
    with pytest.raises(RuntimeError):
        wrapper.backward(loss, inputs=[])  # backward itself fails
    assert all(not m._forward_hooks for m in model.modules()) and not wrapper._guard.watching


@pytest.mark.parametrize('action', ['diagnose', 'raise'])
def test_hook_guard_watches_the_runners_model(action):
    hook = Fp16OptimizerHook(loss_scale=512.0, dtype=_caps.train_dtype('native'),
                             overflow_guard=dict(max_consecutive=2, action=action))
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    log = Log()
    runner = R.MiniRunner(model, optimizer, [hook], max_iters=4, meta={})
    runner.logger = log

    def forward(m, batch):
        m.fault.on = runner.iter >= 1
        try:
            return R.mse(m, batch)
        finally:
            m.fault.on = False

    data = R.make_data(4)
    if action == 'raise':
        with pytest.raises(FloatingPointError) as info:
            runner.run(data, forward)
        assert info.value.report.first_module == 'fault' and runner.iter == 3
        assert hook.skipped_steps == 2
    else:
        runner.run(data, forward)
        reports = [x for x in log.lines if 'overflow guard' in x]
        assert len(reports) == 1 and "'fault'" in reports[0] and hook.skipped_steps == 3
    assert all(not m._forward_hooks for m in model.modules())


def test_legacy_backend_guard_watches_the_half_model():
    dtype = _caps.LEGACY_LOW
    model = Net()
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), backend='legacy',
                              model=model, dtype=dtype, loss_scale=dict(init_scale=64.0),
                              overflow_guard=dict(max_consecutive=1, action='raise'))
    wrapper.logger = Log()
    data = R.make_data(2)
    first = train(wrapper, model, data[0], fault=True)
    assert first.skipped and wrapper._guard.armed
    masters = [m.detach().clone() for m in wrapper.master_params]
    with pytest.raises(FloatingPointError) as info:
        train(wrapper, model, data[1], fault=True)
    assert info.value.report.first_module == 'fault'
    assert all(torch.equal(a, b) for a, b in zip(masters, wrapper.master_params))
    assert all(not m._forward_hooks for m in model.modules())
