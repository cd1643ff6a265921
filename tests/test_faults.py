"""Faults injected into training: every non-finite step is skipped and nothing is lost.

The matrix: a fault (inf / nan in a gradient, in the loss, or in a forward
activation) at one chosen iteration, for both styles (1.x ``AmpOptimWrapper``,
0.x ``Fp16OptimizerHook`` on a minimal runner) and both backends. Then: long
runs of overflows (the scale floor), and non-finite losses where no loss scaling
is done (bfloat16, scaling disabled, a static scale).
"""

from __future__ import annotations

import logging
import math

import _caps  # tests/ is on sys.path: see conftest.py
import _runner as R
import pytest
import torch

from fp16utils import AmpOptimWrapper, Fp16OptimizerHook, _torch

STYLES = ['wrapper', 'hook']
BACKENDS = ['native', 'legacy']
KINDS = ['grad-inf', 'grad-nan', 'loss-inf', 'loss-nan', 'activation-inf']
INF, NAN = float('inf'), float('nan')

#: The same schedule in each style's vocabulary: start at 1024, back off by 4, no growth.
WRAPPER_SCALE = dict(init_scale=1024.0, growth_factor=4.0, backoff_factor=0.25,
                     growth_interval=1000)
HOOK_SCALE = dict(init_scale=1024.0, mode='dynamic', scale_factor=4.0, scale_window=1000)

FAULT_ITER = 3  # 0-based: the 4th update is the faulted one (step 4 in the logs)
STEPS = 8
BATCH = R.make_data(1, seed=3)[0]  # one batch, trained on again and again


pytestmark = pytest.mark.usefixtures('one_thread')


class Trainer:
    """Either style on a tiny model, with a fault armed at chosen iterations.

    ``kind`` is one of :data:`KINDS` (or None); ``fault_at`` a set of 0-based
    iterations. Gradient faults are a tensor hook on ``fc1.weight`` (it runs in
    backward, before the gradient is accumulated); activation faults a forward
    hook multiplying ``fc1``'s output by inf; loss faults multiply the loss.
    """

    def __init__(self, style, backend, kind=None, fault_at=(), loss_scale=None,
                 dtype=None, **extra):
        _caps.require(_torch.dtypes.resolve_dtype(dtype), 'native' if backend == 'native' else None,
                      scaled=loss_scale is None or not isinstance(loss_scale, dict)
                      or loss_scale.get('enabled', True))
        self.style, self.kind, self.fault_at = style, kind, set(fault_at)
        self.model = R.Net(seed=0)
        self.optimizer = torch.optim.Adam(self.model.parameters(), lr=1e-2)
        self._iter = 0
        if style == 'wrapper':
            scale = WRAPPER_SCALE if loss_scale is None else loss_scale
            self.owner = AmpOptimWrapper(self.optimizer, loss_scale=scale, backend=backend,
                                         model=self.model, dtype=dtype, **extra)
        else:
            scale = HOOK_SCALE if loss_scale is None else loss_scale
            self.owner = Fp16OptimizerHook(loss_scale=scale, backend=backend, dtype=dtype,
                                           **extra)
            self.runner = R.MiniRunner(self.model, self.optimizer, [self.owner],
                                       max_iters=10**6, meta={})
            self.owner.before_run(self.runner)  # converts the model (legacy) first
        self._arm()

    @property
    def iter(self):
        """The 0-based iteration being run (the runner's, for the hook)."""
        return self.runner.iter if self.style == 'hook' else self._iter

    def _faulty(self):
        return self.iter in self.fault_at

    def _arm(self):
        kind = self.kind
        if kind in ('grad-inf', 'grad-nan'):
            value = INF if kind == 'grad-inf' else NAN

            def poison(grad):
                if not self._faulty():
                    return grad
                grad = grad.clone()
                grad.view(-1)[5] = value
                return grad

            self.model.fc1.weight.register_hook(poison)
        elif kind == 'activation-inf':
            self.model.fc1.register_forward_hook(
                lambda module, args, out: out * INF if self._faulty() else None)

    def _loss(self, out, y):
        loss = (out.float() - y).pow(2).mean()
        if self._faulty() and self.kind in ('loss-inf', 'loss-nan'):
            # A product, so that the gradients are non-finite too (loss + nan would
            # leave them finite: d(loss + c)/dw = dloss/dw).
            loss = loss * (INF if self.kind == 'loss-inf' else NAN)
        return loss

    def step(self, n=1):
        """Train ``n`` iterations (the hook: one ``runner.run`` call, as a runner would)."""
        if self.style == 'hook':
            stop = self.iter + n
            self.runner.run([BATCH] * stop,
                            lambda model, batch: self._loss(model(batch[0]), batch[1]),
                            until=stop)
            return
        x, y = BATCH
        for _ in range(n):
            with self.owner.optim_context(self.model):
                out = self.model(x)
            self.owner.update_params(self._loss(out, y))
            self._iter += 1

    def snapshot(self):
        return R.snapshot(self.model, self.optimizer)

    def weights(self):
        """The float32 weights being trained: the masters (legacy) or the model's."""
        return [p.detach().clone() for g in self.optimizer.param_groups for p in g['params']]

    def eval_loss(self):
        """The float32 loss of a float32 copy of the trained weights on the batch."""
        net = R.Net(seed=0)
        with torch.no_grad():
            for p, w in zip(net.parameters(), self.weights()):
                p.copy_(w)
            return R.mse(net, BATCH).item()


def fp16utils_lines(caplog):
    """The lines logged about skipped steps: the wrapper's logger, or the runner's (hooks)."""
    return [r.getMessage() for r in caplog.records if r.name in ('fp16utils', 'mini_runner')]


# ------------------------------------------------------------------------ the matrix


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
@pytest.mark.parametrize('kind', KINDS)
def test_a_fault_skips_the_step_and_loses_nothing(kind, style, backend, caplog):
    faulty = Trainer(style, backend, kind, fault_at={FAULT_ITER})
    faulty.step(FAULT_ITER)
    assert faulty.owner.skipped_steps == 0 and faulty.owner.loss_scale == 1024.0
    before = faulty.snapshot()
    keys = {k.rsplit('.', 1)[-1] for k in before if k.startswith('opt.') and k.count('.') == 3}
    assert keys == {'step', 'exp_avg', 'exp_avg_sq'}  # Adam state exists and is compared
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        faulty.step()
    # Skipped: parameters, masters and every optimizer state tensor bit-identical.
    R.assert_identical(before, faulty.snapshot())
    assert faulty.owner.skipped_steps == 1
    assert faulty.owner.loss_scale == 1024.0 * 0.25  # the configured backoff
    assert faulty.owner.scale_history == [(0, 1024.0), (FAULT_ITER + 1, 256.0)]
    lines = fp16utils_lines(caplog)
    assert len(lines) == 1, lines
    assert f'step {FAULT_ITER + 1}:' in lines[0] and '1024.0 -> 256.0' in lines[0]
    # Training goes on and reaches what a run without the fault reaches with as many updates.
    faulty.step(STEPS - FAULT_ITER - 1)
    assert faulty.owner.skipped_steps == 1
    assert faulty.owner.scale_history == [(0, 1024.0), (FAULT_ITER + 1, 256.0)]
    clean = Trainer(style, backend)
    start = clean.eval_loss()
    clean.step(STEPS - 1)
    assert clean.owner.skipped_steps == 0
    assert clean.eval_loss() < 0.8 * start  # the comparison is not between two idle runs
    assert faulty.eval_loss() == pytest.approx(clean.eval_loss(), rel=1e-3)
    for p, q in zip(faulty.weights(), clean.weights()):
        assert torch.isfinite(p).all()
        torch.testing.assert_close(p, q, rtol=0, atol=1e-3)


# ------------------------------------------------------------------------ long overflow runs


@pytest.mark.parametrize('style', STYLES)
def test_legacy_overflow_run_stops_at_the_scale_floor_of_one(style, caplog):
    runs = 12
    trainer = Trainer(style, 'legacy', 'activation-inf', fault_at=range(1, 1 + runs),
                      loss_scale=dict(init_scale=64.0, mode='dynamic', scale_factor=2.0))
    trainer.step()
    before = trainer.snapshot()
    scales = []
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        for _ in range(runs):
            trainer.step()
            scales.append(trainer.owner.loss_scale)
    assert scales == [32.0, 16.0, 8.0, 4.0, 2.0] + [1.0] * (runs - 5)
    assert trainer.owner.skipped_steps == runs
    assert len(fp16utils_lines(caplog)) == runs  # one line per skipped step
    # One entry per change (steps 2..7), none once the floor is reached.
    assert trainer.owner.scale_history == [(0, 64.0)] + [
        (step, 64.0 / 2**(step - 1)) for step in range(2, 8)]
    R.assert_identical(before, trainer.snapshot())
    trainer.step()  # the fault is gone: a normal update at scale 1
    after = trainer.snapshot()
    assert trainer.owner.skipped_steps == runs and trainer.owner.loss_scale == 1.0
    assert not torch.equal(after['model.fc1.weight'], before['model.fc1.weight'])
    assert all(torch.isfinite(t.float()).all() for t in after.values())


@pytest.mark.parametrize('style', STYLES)
def test_native_overflow_run_stops_at_the_floor_without_raising(style):
    """The native scale backs off to min(1, init_scale) and stays there, as LossScaler does."""
    runs = 12
    trainer = Trainer(style, 'native', 'activation-inf', fault_at=range(1, 1 + runs),
                      loss_scale=dict(init_scale=64.0, growth_factor=2.0,
                                      backoff_factor=0.5, growth_interval=1000))
    trainer.step()
    before = trainer.snapshot()
    trainer.step(runs)
    assert trainer.owner.loss_scale == 1.0  # 64 / 2**6; the next 6 backoffs hit the floor
    assert trainer.owner.scale_history[-1][1] == 1.0
    assert trainer.owner.skipped_steps == runs
    R.assert_identical(before, trainer.snapshot())
    trainer.step()
    after = trainer.snapshot()
    assert trainer.owner.skipped_steps == runs
    assert not torch.equal(after['model.fc1.weight'], before['model.fc1.weight'])
    assert all(torch.isfinite(t).all() for t in after.values())


@pytest.mark.parametrize('style', STYLES)
def test_native_scale_never_collapses_into_a_nan_update(style):
    runs = 160
    trainer = Trainer(style, 'native', 'activation-inf', fault_at=range(runs),
                      loss_scale=dict(init_scale=1.0, growth_factor=2.0, backoff_factor=0.5,
                                      growth_interval=1000))
    trainer.step(runs + 1)  # the last iteration is clean
    assert trainer.owner.skipped_steps == runs
    state = trainer.snapshot()
    assert all(torch.isfinite(t).all() for t in state.values()), 'NaN update after the run'
    assert trainer.owner.loss_scale > 0
    # The scaler state of this run can be saved and loaded.
    fresh = Trainer(style, 'native')
    if style == 'wrapper':
        fresh.owner.load_state_dict(trainer.owner.state_dict())
    else:
        fresh.runner.meta = trainer.runner.meta
        fresh.owner.before_run(fresh.runner)
    assert fresh.owner.loss_scale == trainer.owner.loss_scale


# ------------------------------------------------ non-finite losses where nothing is scaled


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_static_scale_still_skips_a_nan_loss(style, backend, caplog):
    scale = 128.0
    trainer = Trainer(style, backend, 'loss-nan', fault_at={2}, loss_scale=scale)
    trainer.step(2)
    before = trainer.snapshot()
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        trainer.step()
    R.assert_identical(before, trainer.snapshot())
    assert trainer.owner.skipped_steps == 1
    assert trainer.owner.loss_scale == scale and trainer.owner.scale_history == [(0, scale)]
    lines = fp16utils_lines(caplog)
    assert len(lines) == 1 and 'step 3:' in lines[0]


UNSCALED = {
    'bfloat16': dict(dtype=torch.bfloat16),
    'float16-scaling-disabled': dict(loss_scale_enabled=False),
}


def unscaled_trainer(style, backend, how, **extra):
    kwargs = dict(UNSCALED[how])
    if kwargs.pop('loss_scale_enabled', True) is False:
        kwargs['loss_scale'] = dict(enabled=False)
    trainer = Trainer(style, backend, 'loss-nan', fault_at={2}, **kwargs, **extra)
    assert trainer.owner.loss_scale == 1.0  # no loss scaling is done
    return trainer


@pytest.mark.parametrize('how', list(UNSCALED))
@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_nan_loss_without_scaling_is_skipped_and_reported(style, backend, how, caplog):
    trainer = unscaled_trainer(style, backend, how)
    trainer.step(2)
    before = trainer.snapshot()
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        trainer.step()
    assert all(torch.isfinite(t.float()).all() for t in trainer.snapshot().values()), (
        'the NaN loss was applied to the parameters')
    R.assert_identical(before, trainer.snapshot())
    assert trainer.owner.skipped_steps == 1
    lines = fp16utils_lines(caplog)
    assert len(lines) == 1 and 'step 3' in lines[0]


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_nan_loss_without_scaling_can_raise(style, backend):
    trainer = unscaled_trainer(style, backend, 'bfloat16', nonfinite='raise')
    trainer.step(2)
    before = trainer.snapshot()
    with pytest.raises(FloatingPointError, match=r'step 3\b.*(inf|nan)'):
        trainer.step()
    R.assert_identical(before, trainer.snapshot())


def test_nan_loss_with_finite_gradients_is_not_a_skipped_step():
    """Observed: only non-finite *gradients* skip a step; a NaN added to the loss does not.

    d(loss + nan)/dw is dloss/dw, so the update is finite and correct; the NaN
    shows only in the logged loss value.
    """
    trainer = Trainer('wrapper', 'native', dtype=_caps.train_dtype('native'))
    x, y = BATCH
    with trainer.owner.optim_context(trainer.model):
        out = trainer.model(x)
    loss = (out.float() - y).pow(2).mean() + NAN
    assert math.isnan(loss.item())
    trainer.owner.update_params(loss)
    assert trainer.owner.skipped_steps == 0
    assert all(torch.isfinite(t).all() for t in trainer.snapshot().values())


@pytest.mark.parametrize('make', [
    lambda: AmpOptimWrapper(torch.optim.SGD(R.Net().parameters(), lr=0.1), nonfinite='skip'),
    lambda: Fp16OptimizerHook(nonfinite=True),
])
def test_bad_nonfinite_policy_is_a_clear_error(make):
    with pytest.raises(ValueError, match=r"nonfinite must be one of \('warn', 'raise', 'ignore'\)"):
        make()


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_nonfinite_ignore_applies_the_update_as_plain_torch_would(style, backend):
    """The opt-out is real: no check, no skip, the NaN goes into the weights."""
    trainer = unscaled_trainer(style, backend, 'bfloat16', nonfinite='ignore')
    trainer.step(3)
    assert trainer.owner.skipped_steps == 0
    assert not all(torch.isfinite(t).all() for t in trainer.snapshot().values())


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_static_scale_can_raise_and_training_goes_on(style, backend):
    trainer = Trainer(style, backend, 'grad-nan', fault_at={2}, loss_scale=256.0,
                      nonfinite='raise')
    trainer.step(2)
    before = trainer.snapshot()
    with pytest.raises(FloatingPointError, match=r'step 3\b.*static loss scale 256'):
        trainer.step()
    R.assert_identical(before, trainer.snapshot())
    assert trainer.owner.loss_scale == 256.0
    if style == 'wrapper':
        trainer.owner.zero_grad()
    trainer.fault_at = set()  # the raise left the iteration counter where it was
    trainer.step()  # the scaler is ready for the next step
    after = trainer.snapshot()
    assert all(torch.isfinite(t).all() for t in after.values())
    assert not torch.equal(after['model.fc1.weight'], before['model.fc1.weight'])


def test_build_optim_wrapper_passes_the_nonfinite_policy():
    from fp16utils import build_optim_wrapper

    model = R.Net()
    wrapper = build_optim_wrapper(model, dict(
        type='AmpOptimWrapper', optimizer=dict(type='SGD', lr=0.1), dtype='bfloat16',
        nonfinite='raise'))
    with wrapper.optim_context(model):
        out = model(BATCH[0])
    with pytest.raises(FloatingPointError):
        wrapper.update_params((out.float() - BATCH[1]).pow(2).mean() * NAN)
    with pytest.raises(ValueError, match='nonfinite'):
        build_optim_wrapper(model, dict(type='AmpOptimWrapper',
                                        optimizer=dict(type='SGD', lr=0.1), nonfinite='loud'))
