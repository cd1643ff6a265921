"""``OptimWrapper``: an optimizer with gradient accumulation and clipping, driven by
``update_params``; the base of the other wrappers."""

from __future__ import annotations

import contextlib
from typing import Any, Dict, List, Mapping, Optional

import torch
from torch import nn

from .._args.spec import check_cache_enabled, parse_clip_grad
from .._torch.models import has_no_sync
from ..engine import (
    AccumulationWindow,
    Driven,
    OverflowGuard,
    ResumeState,
    StepDriver,
    StepEngine,
    StepResult,
    check_optimizer_state,
    load_optimizer_state,
    pending_grads,
    read_pending_window,
    snapshot_optimizer,
)

__all__ = ['OptimWrapper']

_Tensor = torch.Tensor
_NULL_CONTEXT = contextlib.nullcontext()


def _check_optimizer(optimizer: Any, owner: str) -> None:
    if not isinstance(optimizer, torch.optim.Optimizer) and not (
            hasattr(optimizer, 'param_groups') and hasattr(optimizer, 'step')
            and hasattr(optimizer, 'zero_grad')):
        raise TypeError(
            f'{owner} wraps a torch.optim.Optimizer, got {type(optimizer).__name__}; build '
            'one first, e.g. torch.optim.SGD(model.parameters(), lr=0.01).')


class _Load:
    """A checked state, loaded in two stages (optimizer, then the rest) for all-or-nothing."""

    __slots__ = ('optimizer', 'state', 'finish', 'undo_optimizer')

    def __init__(self, optimizer: Any, state: Dict[str, Any], finish: Any) -> None:
        self.optimizer = optimizer
        self.state = state
        self.finish = finish
        self.undo_optimizer = snapshot_optimizer(optimizer)

    def load_optimizer(self) -> None:
        """Load the optimizer state (rolled back when it raises)."""
        load_optimizer_state(self.optimizer, self.state)

    def commit(self) -> None:
        """Load everything."""
        self.load_optimizer()
        self.finish()


class OptimWrapper(Driven):
    """An optimizer with gradient accumulation and clipping, driven by ``update_params``.

    ``update_params(loss)`` divides the loss by the number of iterations being
    accumulated, runs the backward pass, and every ``accumulative_counts``
    calls clips the gradients, steps the optimizer and zeroes the gradients.
    When :meth:`initialize_count_status` has set the total number of
    iterations, the last incomplete window is divided by its own length and
    stepped at the last iteration.

    Args:
        optimizer: The torch optimizer to drive.
        accumulative_counts: Iterations whose gradients are summed per update.
        clip_grad: None, ``dict(max_norm=..., norm_type=2)`` (clip by norm,
            with torch's fused kernels where the device has them) or
            ``dict(type='value', clip_value=...)``.

    Attributes:
        last_result: The :class:`~fp16utils.StepResult` of the last iteration.
        steps_taken: Optimizer steps really taken (not skipped) by this object.

    Raises:
        TypeError: ``optimizer`` is not an optimizer.
        ValueError: A bad ``accumulative_counts`` or ``clip_grad``.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Linear(2, 1)
        >>> wrapper = OptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                        accumulative_counts=2, clip_grad=dict(max_norm=1.0))
        >>> for _ in range(2):
        ...     with wrapper.optim_context(model):
        ...         loss = model(torch.ones(1, 2)).sum()
        ...     result = wrapper.update_params(loss)
        >>> wrapper.inner_count, wrapper.grad_norm is not None, result.stepped
        (2, True, True)
    """

    def __init__(self, optimizer: torch.optim.Optimizer, accumulative_counts: int = 1,
                 clip_grad: Optional[Mapping[str, Any]] = None) -> None:
        owner = type(self).__name__
        _check_optimizer(optimizer, owner)
        window = AccumulationWindow(accumulative_counts, owner, 'accumulative_counts')
        self._driver = StepDriver(owner, window, StepEngine(parse_clip_grad(clip_grad, owner)))
        self.optimizer = optimizer
        self._inner_count = 0
        #: With several param groups, MMEngine's group of the optimizer's defaults and no
        #: parameter: schedulers step its ``lr``, the ``'base_lr'`` of :meth:`get_lr`.
        self.base_param_settings: Optional[Dict[str, Any]] = None
        if len(getattr(optimizer, 'param_groups', ())) > 1:  # a stand-in may have none
            self.base_param_settings = {'params': torch.tensor([0.0]), **optimizer.defaults}

    # -- the driver's parts -----------------------------------------------------------------

    @property
    def _engine(self) -> StepEngine:
        """The step engine (float32 here; :class:`AmpOptimWrapper` sets its own)."""
        return self._driver.engine  # type: ignore[return-value]

    @_engine.setter
    def _engine(self, engine: StepEngine) -> None:
        self._driver.engine = engine

    @property
    def _guard(self) -> Optional[OverflowGuard]:
        """The overflow guard (:class:`AmpOptimWrapper`'s ``overflow_guard=``), or None."""
        return self._driver.guard

    @_guard.setter
    def _guard(self, guard: Optional[OverflowGuard]) -> None:
        self._driver.guard = guard

    # -- counters ---------------------------------------------------------------------------

    @property
    def accumulative_counts(self) -> int:
        """Iterations accumulated per update."""
        return self._driver.window.counts

    @property
    def inner_count(self) -> int:
        """Backward passes so far (the iteration count, restored on resume)."""
        return self._inner_count

    @property
    def max_counts(self) -> int:
        """Total iterations as set by :meth:`initialize_count_status` (-1: unknown)."""
        return self._driver.window.max_counts

    @property
    def clip_grad(self) -> Optional[Dict[str, Any]]:
        """The validated clipping settings (a new dict), or None."""
        clip = self._engine.clip
        return None if clip is None else {'type': clip[0], **clip[1]}

    @property
    def grad_norm(self) -> Optional[_Tensor]:
        """The total norm of the last norm-clipped step (0-dim tensor: float() syncs), or None."""
        return self._engine.grad_norm

    @grad_norm.setter
    def grad_norm(self, value: Optional[_Tensor]) -> None:
        self._engine.grad_norm = value

    @property
    def logger(self) -> Any:
        """Where skipped steps and resume warnings go: the ``fp16utils`` logger unless set."""
        return self._engine.logger

    @logger.setter
    def logger(self, value: Any) -> None:
        self._engine.logger = value

    def initialize_count_status(self, model: nn.Module, init_counts: int,
                                max_counts: int) -> None:
        """Set the iteration counter (on resume) and the total number of iterations.

        Args:
            model: The model being trained (checked for BatchNorm, which makes
                accumulated small batches differ from one large batch).
            init_counts: Iterations already done.
            max_counts: Total iterations; the last ``max_counts %
                accumulative_counts`` are accumulated as a shorter window.
        """
        driver = self._driver
        restored, driver.restored = driver.restored, None
        self._inner_count = int(init_counts)
        if restored is not None and restored != self._inner_count:
            for p in self._engine.grad_params(self.optimizer):
                p.grad = None  # they belong to another iteration: drop them
        driver.window.warn_on_start(model, self._inner_count, restored == self._inner_count,
                                    self._engine.logger,
                                    "save the wrapper's state_dict() with the checkpoint")
        driver.window.start(max_counts)

    def should_update(self) -> bool:
        """Whether the optimizer steps after the current backward pass."""
        return self._driver.window.completes(self._inner_count - 1)

    def should_sync(self) -> bool:
        """Whether the next backward pass must all-reduce gradients (DDP)."""
        return self._driver.window.completes(self._inner_count)

    # -- the step ---------------------------------------------------------------------------

    def scale_loss(self, loss: _Tensor) -> _Tensor:
        """Divide ``loss`` by the number of iterations accumulated in this window."""
        if self._driver.window.counts == 1:
            return loss
        return loss / self._driver.window.divisor(self._inner_count)

    def update_params(self, loss: _Tensor, step_kwargs: Optional[Dict[str, Any]] = None,
                      zero_kwargs: Optional[Dict[str, Any]] = None) -> StepResult:
        """Backward ``loss``; step and zero the gradients when the window is complete.

        Args:
            loss: The loss of this iteration (not yet divided for accumulation).
            step_kwargs: Keyword arguments for :meth:`step`.
            zero_kwargs: Keyword arguments for :meth:`zero_grad`.

        Returns:
            The :class:`~fp16utils.StepResult` (stepped, skipped or accumulating), also
            in :attr:`last_result`. An iteration that raises (``KeyboardInterrupt``
            too) leaves the wrapper as before it, or completes a step already applied.
        """
        driver = self._driver
        count, previous = self._inner_count, driver.last_result
        try:
            self.backward(self.scale_loss(loss))
            if self.should_update():
                result = self.step(**(step_kwargs or {}))
                self.zero_grad(**(zero_kwargs or {}))
                return result
        except BaseException:  # its gradients are in place (partly): never applied
            if driver.last_result is previous:  # nothing applied: the iteration did not happen
                self._inner_count = count
            driver.raised()
            raise
        return driver.accumulated()

    def backward(self, loss: _Tensor, **kwargs: Any) -> None:
        """Backward ``loss`` (scaled, where the wrapper scales) and count the iteration."""
        driver, count = self._driver, self._inner_count
        driver.backward(loss, count + 1, count % driver.window.counts,
                        lambda: self._engine.zero_grad(self.optimizer), **kwargs)
        self._inner_count += 1

    def step(self, **kwargs: Any) -> StepResult:
        """Clip the gradients (if configured) and step, or skip a bad step: a StepResult."""
        return self._driver.step(self.optimizer, self._inner_count, kwargs)

    def zero_grad(self, **kwargs: Any) -> None:
        """Zero the optimizer's gradients (``set_to_none`` and friends pass through)."""
        self._engine.zero_grad(self.optimizer, **kwargs)
        self._driver.grads_cleared()

    def optim_context(self, model: nn.Module, cache_enabled: Optional[bool] = None
                      ) -> contextlib.AbstractContextManager:
        """Context for the forward pass: no DDP gradient sync while accumulating.

        Args:
            model: The model (or the sub-model this wrapper optimizes).
            cache_enabled: None, True or False, as :class:`AmpOptimWrapper`
                takes it; no effect here (no autocast).

        Returns:
            ``model.no_sync()`` when the next backward pass only accumulates and
            the model has it, else a no-op context.
        """
        check_cache_enabled(cache_enabled, type(self).__name__)
        if self._skips_sync(model):
            return model.no_sync()
        return _NULL_CONTEXT

    def _skips_sync(self, model: nn.Module) -> bool:
        """Whether :meth:`optim_context` enters ``model.no_sync()`` (a test dynamo traces)."""
        return has_no_sync(model) and not self.should_sync()

    # -- optimizer passthrough --------------------------------------------------------------

    @property
    def param_groups(self) -> List[Dict[str, Any]]:
        """The optimizer's ``param_groups``, plus :attr:`base_param_settings` when set."""
        if self.base_param_settings is None:
            return self.optimizer.param_groups
        return self.optimizer.param_groups + [self.base_param_settings]

    @property
    def defaults(self) -> Dict[str, Any]:
        """The optimizer's ``defaults``."""
        return self.optimizer.defaults

    def get_lr(self) -> Dict[str, List[float]]:
        """The learning rate of each param group, as ``{'lr': [...]}``.

        With several groups, ``'base_lr'`` comes first: the scheduled learning
        rate without the per-group multipliers (see :attr:`base_param_settings`).
        """
        lrs = [group['lr'] for group in self.optimizer.param_groups]
        if self.base_param_settings is None:
            return {'lr': lrs}
        return {'base_lr': [self.base_param_settings['lr']], 'lr': lrs}

    def get_momentum(self) -> Dict[str, List[float]]:
        """The momentum of each group (``betas[0]`` for Adam-like), as ``{'momentum': [...]}``."""
        return {'momentum': [g['momentum'] if 'momentum' in g else g['betas'][0] if 'betas' in g
                             else 0 for g in self.optimizer.param_groups]}

    # -- state ------------------------------------------------------------------------------

    def _engine_state(self) -> Dict[str, Any]:
        """What the engine adds to :meth:`state_dict` (nothing for plain float32)."""
        return {}

    def _resume_state(self, state: Dict[str, Any]) -> ResumeState:
        """Take the engine's entries out of ``state`` (the optimizer's state remains)."""
        return ResumeState()

    def state_dict(self) -> Dict[str, Any]:
        """The optimizer's state dict, plus ``'pending_window'`` when saved mid-window.

        ``'pending_window'`` is ``{'iter': ..., 'grads': [...]}`` as the 0.x hooks write
        it (``'inner_count'`` for ``'iter'`` loads too): a resumed run continues the
        window. With several param groups it holds ``'base_param_settings'`` too.
        """
        state = self.optimizer.state_dict()
        if self.base_param_settings is not None:
            state['base_param_settings'] = self.base_param_settings
        state.update(self._engine_state())
        pending = self._driver.pending_window(self.optimizer, self._inner_count, copy=True)
        if pending is not None:
            state['pending_window'] = pending
        return state

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Load a :meth:`state_dict`, all or nothing (the argument is not changed).

        Everything is checked before anything is loaded, and an optimizer that
        refuses its state halfway is rolled back: a state that does not fit
        raises and leaves the wrapper, its optimizer and its counters as they were.
        """
        self._prepare_load(state_dict).commit()

    def _prepare_load(self, state_dict: Any) -> _Load:
        """Check ``state_dict`` completely; return what loads it (see :class:`_Load`)."""
        owner = type(self).__name__
        if not isinstance(state_dict, Mapping):
            raise TypeError(f'{owner}.load_state_dict() takes a dict as written by '
                            f'state_dict(), got {type(state_dict).__name__}.')
        state = dict(state_dict)
        pending = state.pop('pending_window', None)
        base = state.pop('base_param_settings', None)
        resume = self._resume_state(state)
        inner_count = None
        if pending is not None:  # this version's format, or an older one's
            inner_count, grads = read_pending_window(pending, 'the saved pending_window', owner)
            resume = resume._replace(pending=grads)
        if base is not None and not isinstance(base, Mapping):
            raise ValueError(f'{owner}: the saved base_param_settings must be a dict (the '
                             f'optimizer defaults), got {type(base).__name__} {base!r}.')
        check_optimizer_state(self.optimizer, state, owner)
        finish = self._engine.prepare_resume(resume, self._inner_count, owner,
                                             self._engine.grad_params(self.optimizer),
                                             reread_masters=True)

        def rest() -> None:
            finish()
            if base is not None:
                self.base_param_settings = dict(base)
            self._driver.restoring(inner_count is not None, inner_count or 0)
            if inner_count is not None:
                self._inner_count = inner_count

        return _Load(self.optimizer, state, rest)

    def __getstate__(self) -> Dict[str, Any]:
        # Tensors pickle without their .grad: keep the accumulated ones (as references).
        state = self.__dict__.copy()
        state['_grads'] = pending_grads(self._engine.grad_params(self.optimizer), copy=False)
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        grads = state.pop('_grads', None)
        self.__dict__.update(state)
        if grads is not None:
            for p, grad in zip(self._engine.grad_params(self.optimizer), grads):
                p.grad = grad

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(optimizer={type(self.optimizer).__name__}, '
                f'accumulative_counts={self._driver.window.counts}, '
                f'clip_grad={self.clip_grad})')

