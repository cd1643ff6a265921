"""Interrupted iterations: an exception at every point of a step, then training goes on.

Every point of an iteration (the forward under ``optim_context``, the backward,
the unscale, the clip, the optimizer step, the scale update after a clean and
after a skipped step) x both backends x three training styles (``update_params``,
``backward`` + ``step``, the hooks on a runner) x with and without gradient
accumulation x ``KeyboardInterrupt`` (not an ``Exception``) and an ordinary
error. The contract (the step state, ``fp16utils.engine.StepState``):

- before the optimizer applied the update, the iteration leaves the wrapper or
  hook exactly as before it (parameters, optimizer state, scaler state and its
  per-iteration stage, counters, last result), and its gradients are never
  applied: the window's gradients are discarded before the next backward;
- once the update is applied, the step is completed (counted once, the scale
  updated once) and the exception goes on.

So the run equals, bit for bit, a run without the interruption whose iteration
is replaced by that effect: dropped (and the window's gradients discarded), or
completed. In the ``backward`` + ``step`` style the caller zeroes the gradients
after a ``step()`` that raised, as after any step (a step that raised before it
changed them may also be retried: see below).
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional

import _caps
import _runner as R
import pytest
import torch

from fp16utils import (
    AmpOptimWrapper,
    Fp16OptimizerHook,
    GradientCumulativeFp16OptimizerHook,
    LossScaler,
    _torch,
)
from fp16utils.engine import legacy as legacy_engine

F16 = torch.float16
#: Grows every 2 clean steps: the completed steps cross a growth.
SCALE = dict(init_scale=1024.0, growth_interval=2)
CLIP = dict(max_norm=100.0)
AT = 3  # the interrupted iteration (a window's last one when accumulating 2)
AFTER = 3  # iterations after it

#: Points where the optimizer has not applied the update yet: the iteration is dropped.
DROPPED = ['forward', 'backward', 'unscale', 'clip', 'optimizer-step', 'update-after-skip']
#: The point after the update: the step is completed.
COMPLETED = ['update']
POINTS = DROPPED + COMPLETED
STYLES = ['update_params', 'backward+step', 'hook']
EXCEPTIONS = {'KeyboardInterrupt': KeyboardInterrupt, 'RuntimeError': RuntimeError}


class Injected:
    """Raises ``exc`` once, at the armed point; otherwise lets the real code run."""

    def __init__(self, exc: type) -> None:
        self.exc = exc
        self.armed = False
        self.fired = 0

    def fire(self) -> None:
        if self.armed:
            self.armed = False
            self.fired += 1
            raise self.exc('injected interruption')


def _inject(point: str, backend: str, model: torch.nn.Module, optimizer: Any,
            inj: Injected, mp: pytest.MonkeyPatch) -> None:
    """Put ``inj`` at ``point`` (it fires only while armed)."""
    if point == 'forward':
        model.fc2.register_forward_pre_hook(lambda *a: inj.fire())
    elif point == 'backward':
        def grad_hook(grad: torch.Tensor) -> torch.Tensor:
            inj.fire()
            return grad
        model.fc1.weight.register_hook(grad_hook)  # fc2's gradients are in by then
    elif point == 'unscale':
        if backend == 'native':
            real = torch.amp.GradScaler.unscale_

            def unscale_(self: Any, opt: Any) -> None:
                inj.fire()
                real(self, opt)
            mp.setattr(torch.amp.GradScaler, 'unscale_', unscale_)
        else:
            real_check = legacy_engine.non_finite_check_

            def check(*args: Any, **kwargs: Any) -> bool:
                inj.fire()
                return real_check(*args, **kwargs)
            mp.setattr(legacy_engine, 'non_finite_check_', check)
    elif point == 'clip':
        real_clip = _torch.compat.clip_grad_norm_

        def clip(*args: Any, **kwargs: Any) -> Any:
            inj.fire()
            return real_clip(*args, **kwargs)
        mp.setattr(_torch.compat, 'clip_grad_norm_', clip)
    elif point == 'optimizer-step':
        real_step = optimizer.step

        def step(*args: Any, **kwargs: Any) -> Any:
            inj.fire()
            return real_step(*args, **kwargs)
        optimizer.step = step
    else:  # 'update', 'update-after-skip'
        if backend == 'native':
            real_update = torch.amp.GradScaler.update

            def update(self: Any, new_scale: Any = None) -> None:
                real_update(self, new_scale)  # the scale changes, then the interruption
                inj.fire()
            mp.setattr(torch.amp.GradScaler, 'update', update)
        else:
            real_update_scale = LossScaler.update_scale

            def update_scale(self: Any, overflow: bool) -> None:
                real_update_scale(self, overflow)
                inj.fire()
            mp.setattr(LossScaler, 'update_scale', update_scale)


class Trainer:
    """One training set-up in one style; ``iteration(batch)`` is one training iteration."""

    def __init__(self, style: str, backend: str, counts: int, dtype: torch.dtype) -> None:
        self.style, self.backend, self.counts = style, backend, counts
        self.model = R.Net(seed=0)
        self.optimizer = torch.optim.SGD(self.model.parameters(), lr=0.05, momentum=0.9)
        self.wrapper: Optional[AmpOptimWrapper] = None
        self.hook: Any = None
        if style == 'hook':
            kwargs = dict(loss_scale=dict(SCALE), backend=backend, dtype=dtype, grad_clip=CLIP)
            self.hook = (GradientCumulativeFp16OptimizerHook(cumulative_iters=counts, **kwargs)
                         if counts > 1 else Fp16OptimizerHook(**kwargs))
            self.runner = R.MiniRunner(self.model, self.optimizer, [self.hook], max_iters=100,
                                       meta={})
            self.runner.call_hook('before_run')
        else:
            self.wrapper = AmpOptimWrapper(self.optimizer, loss_scale=dict(SCALE), dtype=dtype,
                                           backend=backend, model=self.model, clip_grad=CLIP,
                                           accumulative_counts=counts)

    # -- one iteration, and what the contract replaces an interrupted one with -------------

    def iteration(self, batch: R.Batch) -> None:
        if self.style == 'hook':
            runner = self.runner
            runner.call_hook('before_train_iter')
            runner.outputs = {'loss': R.mse(self.model, batch), 'num_samples': 4}
            runner.call_hook('after_train_iter')
            runner.iter += 1
            return
        wrapper = self.wrapper
        with wrapper.optim_context(self.model):
            loss = R.mse(self.model, batch)
        if self.style == 'update_params':
            wrapper.update_params(loss)
            return
        wrapper.backward(wrapper.scale_loss(loss))
        if wrapper.should_update():
            wrapper.step()
            wrapper.zero_grad()

    def discard(self) -> None:
        """Zero the gradients (what happens to an interrupted iteration's window)."""
        if self.wrapper is not None:
            self.wrapper.zero_grad()
        else:
            self.model.zero_grad(set_to_none=True)
            self.optimizer.zero_grad()

    def backward_only(self, batch: R.Batch) -> None:
        """``backward`` + ``step`` style: the backward of an iteration whose step failed."""
        with self.wrapper.optim_context(self.model):
            loss = R.mse(self.model, batch)
        self.wrapper.backward(self.wrapper.scale_loss(loss))

    def resume_after_interruption(self, completed: bool) -> None:
        """How training goes on: the runner re-runs (before_run), counting a completed step."""
        if self.style == 'hook':
            if completed:
                self.runner.iter += 1  # the runner would have counted the iteration
            self.runner.call_hook('before_run')

    # -- what is compared --------------------------------------------------------------------

    @property
    def owner(self) -> Any:
        return self.hook if self.style == 'hook' else self.wrapper

    def scaler_state(self) -> Dict[str, Any]:
        if self.style == 'hook':
            return dict(self.runner.meta['fp16']['loss_scaler'])
        return dict(self.wrapper.state_dict()['loss_scaler'])

    def state(self) -> Dict[str, Any]:
        owner = self.owner
        return {
            'tensors': R.snapshot(self.model, self.optimizer),
            'scaler': self.scaler_state(), 'scale': owner.loss_scale,
            'skipped': owner.skipped_steps, 'taken': owner.steps_taken,
            'history': list(owner.scale_history), 'last': owner.last_result,
            'count': self.runner.iter if self.style == 'hook' else self.wrapper.inner_count,
        }


def assert_same_state(a: Dict[str, Any], b: Dict[str, Any]) -> None:
    R.assert_identical(a['tensors'], b['tensors'])
    assert {k: v for k, v in a.items() if k != 'tensors'} == {
        k: v for k, v in b.items() if k != 'tensors'}


#: Points that exist only while a loss scale is in use (bfloat16 trains unscaled).
SCALED_POINTS = ('unscale', 'update', 'update-after-skip')


def _skip_unless_possible(backend: str, style: str, point: str) -> torch.dtype:
    if backend == 'native':
        _caps.require(F16, 'native')
        return F16
    if style == 'hook' or point in SCALED_POINTS:
        _caps.require(F16)
        return F16
    _caps.require(_caps.LEGACY_LOW)
    return _caps.LEGACY_LOW


def _batches(point: str) -> Dict[str, Any]:
    data = R.make_data(AT + AFTER + 1, seed=7)
    odd = R.overflow_batch() if point == 'update-after-skip' else data[-1]
    return {'before': data[:AT], 'interrupted': odd, 'after': data[AT:AT + AFTER]}


def _scaler_iteration_is_fresh(trainer: Trainer) -> bool:
    """The GradScaler holds no per-optimizer stage from the interrupted step."""
    scaler = trainer.owner.loss_scaler
    return not getattr(scaler, '_per_optimizer_states', {})


def _interrupted_run(style: str, backend: str, counts: int, point: str, exc: type,
                     mp: pytest.MonkeyPatch) -> Dict[str, Any]:
    dtype = _skip_unless_possible(backend, style, point)
    trainer = Trainer(style, backend, counts, dtype)
    inj = Injected(exc)
    _inject(point, backend, trainer.model, trainer.optimizer, inj, mp)
    data = _batches(point)
    for batch in data['before']:
        trainer.iteration(batch)
    before = trainer.state()
    inj.armed = True
    with pytest.raises(exc, match='injected interruption'):
        trainer.iteration(data['interrupted'])
    assert inj.fired == 1
    if point in DROPPED:
        if style == 'backward+step' and point not in ('forward', 'backward'):
            before['count'] += 1  # its backward() call returned: as before the step() call
        assert_same_state(trainer.state(), before)  # as before, exactly
        if backend == 'native' and trainer.owner.loss_scaler is not None:
            assert _scaler_iteration_is_fresh(trainer)
    if style == 'backward+step' and point not in ('forward', 'backward'):
        trainer.discard()  # the caller's zero_grad() after a step() that raised
    trainer.resume_after_interruption(point in COMPLETED)
    for batch in data['after']:
        trainer.iteration(batch)
    return trainer.state()


def _reference_run(style: str, backend: str, counts: int, point: str) -> Dict[str, Any]:
    """The same run without an interruption: the iteration dropped, or completed."""
    dtype = _skip_unless_possible(backend, style, point)
    trainer = Trainer(style, backend, counts, dtype)
    data = _batches(point)
    for batch in data['before']:
        trainer.iteration(batch)
    if point in COMPLETED:
        trainer.iteration(data['interrupted'])
        trainer.discard()  # the gradients are zeroed after a step anyway
    elif point != 'forward':
        if style == 'backward+step' and point != 'backward':
            trainer.backward_only(data['interrupted'])  # its backward was counted
        trainer.discard()  # the window's gradients are never applied
    for batch in data['after']:
        trainer.iteration(batch)
    return trainer.state()


@pytest.mark.parametrize('exc', sorted(EXCEPTIONS))
@pytest.mark.parametrize('counts', [1, 2])
@pytest.mark.parametrize('style', STYLES)
@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('point', POINTS)
def test_an_interruption_leaves_training_as_a_run_without_it(point, backend, style, counts,
                                                              exc, monkeypatch):
    got = _interrupted_run(style, backend, counts, point, EXCEPTIONS[exc], monkeypatch)
    monkeypatch.undo()
    want = _reference_run(style, backend, counts, point)
    assert got['taken'] > 0
    assert_same_state(got, want)


# ------------------------------------------------------------------ what the contract says


def _native_wrapper(**kwargs: Any) -> tuple:
    _caps.require(F16, 'native')
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(SCALE), dtype=F16, **kwargs)
    return model, optimizer, wrapper


def _loss(wrapper: AmpOptimWrapper, model: torch.nn.Module, batch: R.Batch) -> torch.Tensor:
    with wrapper.optim_context(model):
        return R.mse(model, batch)


def test_a_step_on_spent_gradients_is_refused_until_a_backward_or_zero_grad(monkeypatch):
    """After unscale_ ran, the gradients are unscaled: stepping them again would be wrong."""
    model, optimizer, wrapper = _native_wrapper()
    data = R.make_data(3)
    wrapper.backward(_loss(wrapper, model, data[0]))
    inj = Injected(KeyboardInterrupt)
    _inject('optimizer-step', 'native', model, optimizer, inj, monkeypatch)
    inj.armed = True
    with pytest.raises(KeyboardInterrupt):
        wrapper.step()
    before = R.snapshot(model, optimizer)
    with pytest.raises(RuntimeError, match=r'step\(\): the last iteration raised.*zero_grad'):
        wrapper.step()
    R.assert_identical(before, R.snapshot(model, optimizer))
    assert wrapper.steps_taken == 0
    wrapper.zero_grad()
    wrapper.backward(_loss(wrapper, model, data[1]))
    assert wrapper.step().stepped and wrapper.steps_taken == 1


def test_a_step_that_raised_before_touching_the_gradients_can_be_retried(monkeypatch):
    """The legacy backend never changes the model's gradients in its step: retry works."""
    _caps.require(_caps.LEGACY_LOW)
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    wrapper = AmpOptimWrapper(optimizer, loss_scale=dict(SCALE), dtype=_caps.LEGACY_LOW,
                              backend='legacy', model=model)
    reference = R.Net(seed=0)
    ref_wrapper = AmpOptimWrapper(torch.optim.SGD(reference.parameters(), lr=0.05),
                                  loss_scale=dict(SCALE), dtype=_caps.LEGACY_LOW,
                                  backend='legacy', model=reference)
    batch = R.make_data(1)[0]
    inj = Injected(KeyboardInterrupt)
    _inject('optimizer-step', 'legacy', model, optimizer, inj, monkeypatch)
    wrapper.backward(_loss(wrapper, model, batch))
    inj.armed = True
    with pytest.raises(KeyboardInterrupt):
        wrapper.step()
    assert wrapper.step().stepped  # the same gradients, stepped once
    ref_wrapper.backward(_loss(ref_wrapper, reference, batch))
    ref_wrapper.step()
    R.assert_identical(R.snapshot(model, optimizer),
                       R.snapshot(reference, ref_wrapper.optimizer))


def test_a_discarded_window_says_how_many_iterations_it_loses(monkeypatch):
    model, optimizer, wrapper = _native_wrapper(accumulative_counts=3)
    lines: List[str] = []
    wrapper.logger = type('Log', (), {'warning': lambda self, m: lines.append(m)})()
    data = R.make_data(4)
    wrapper.update_params(_loss(wrapper, model, data[0]))
    wrapper.update_params(_loss(wrapper, model, data[1]))
    inj = Injected(KeyboardInterrupt)
    _inject('backward', 'native', model, optimizer, inj, monkeypatch)
    inj.armed = True
    loss = _loss(wrapper, model, data[2])
    with pytest.raises(KeyboardInterrupt):
        wrapper.update_params(loss)
    assert 'pending_window' not in wrapper.state_dict()  # spent gradients are not saved
    assert wrapper.inner_count == 2
    wrapper.update_params(_loss(wrapper, model, data[3]))
    assert len(lines) == 1 and '2 earlier iteration(s)' in lines[0]
    assert wrapper.last_result.stepped and wrapper.inner_count == 3


def test_a_forward_interrupted_mid_window_keeps_the_window(monkeypatch):
    model, optimizer, wrapper = _native_wrapper(accumulative_counts=2)
    data = R.make_data(2)
    wrapper.update_params(_loss(wrapper, model, data[0]))
    grads = [p.grad.clone() for p in model.parameters()]
    state = wrapper.state_dict()
    inj = Injected(KeyboardInterrupt)
    _inject('forward', 'native', model, optimizer, inj, monkeypatch)
    inj.armed = True
    with pytest.raises(KeyboardInterrupt):
        _loss(wrapper, model, data[1])
    assert all(torch.equal(g, p.grad) for g, p in zip(grads, model.parameters()))
    assert _torch.autocast.autocast_state('cpu')[0] is False  # the context was left
    assert wrapper.state_dict()['pending_window']['iter'] == state[
        'pending_window']['iter'] == 1


def test_a_completed_step_is_counted_once_and_its_scale_grows_once(monkeypatch):
    model, optimizer, wrapper = _native_wrapper()
    data = R.make_data(2)
    wrapper.update_params(_loss(wrapper, model, data[0]))
    assert wrapper.state_dict()['loss_scaler']['_growth_tracker'] == 1
    inj = Injected(KeyboardInterrupt)
    _inject('update', 'native', model, optimizer, inj, monkeypatch)
    inj.armed = True
    with pytest.raises(KeyboardInterrupt):
        wrapper.update_params(_loss(wrapper, model, data[1]))
    state = wrapper.state_dict()['loss_scaler']
    assert (state['scale'], state['_growth_tracker']) == (2048.0, 0)
    assert wrapper.loss_scaler.get_scale() == 2048.0  # the GradScaler agrees with the mirror
    assert wrapper.steps_taken == 2 and wrapper.inner_count == 2
    assert wrapper.last_result.stepped and wrapper.last_result.scale == 1024.0
    assert not wrapper.loss_scaler._per_optimizer_states  # a fresh iteration next


def test_the_hook_drops_the_pending_window_of_an_interrupted_iteration(monkeypatch):
    _caps.require(F16, 'native')
    trainer = Trainer('hook', 'native', 3, F16)
    data = R.make_data(3)
    trainer.iteration(data[0])
    assert trainer.runner.meta['fp16']['pending_window']['iter'] == 1
    inj = Injected(RuntimeError)
    _inject('backward', 'native', trainer.model, trainer.optimizer, inj, monkeypatch)
    inj.armed = True
    with pytest.raises(RuntimeError):
        trainer.iteration(data[1])
    assert 'pending_window' not in trainer.runner.meta['fp16']  # the references are spent
    assert trainer.runner.iter == 1 and trainer.hook.steps_taken == 0

