"""The 0.x optimizer hooks, ``Fp16OptimizerHook`` and ``GradientCumulativeFp16OptimizerHook``:
a runner's hooks around the :class:`~fp16utils.engine.StepDriver` the optimizer wrappers use."""

from __future__ import annotations

import logging
from typing import Any, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from .._args.keys import FP16_HOOK_ARGS, UnknownKeyError, unknown_keys_message
from .._args.skip_hooks import MMCV_FOLLOWED, OPTION
from .._args.spec import (
    MMCV_DYNAMIC,
    MMCV_LOSS_SCALE,
    TORCH_DYNAMIC,
    ScaleSpec,
    check_nonfinite_policy,
    parse_loss_scale,
)
from .._torch import caps, dtypes, versions
from ..engine import (
    AccumulationWindow,
    Driven,
    LegacyEngine,
    NativeEngine,
    OverflowGuard,
    StepDriver,
    check_resume,
    flat_params,
    optimizer_device_type,
    resume_state_from_meta,
)
from ..engine.ranks import check_setting
from ..wrap import wrap_fp16_model
from . import allreduce
from .api import CumulativeHookApi, OptimizerHookApi
from .base import follow_mmcv
from .base import set_base as _set_base  # noqa: F401  (tests reset the hooks' base here)
from .follow import SkipLedger, connect_0x
from .runner_state import RunLog, fp16_slot

__all__ = ['Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook']

logger = logging.getLogger('fp16utils')
_Engine = Union[LegacyEngine, NativeEngine]
#: The keyword arguments taken (the option may be listed in FP16_HOOK_ARGS already).
_HOOK_ARGS = tuple(dict.fromkeys((*FP16_HOOK_ARGS, OPTION)))


class Fp16OptimizerHook(Driven, OptimizerHookApi):
    """mmcv's ``Fp16OptimizerHook``: fp16 backward, scaling, clipping and the update.

    After each training iteration the hook zeroes the gradients, backwards
    ``runner.outputs['loss']`` scaled by the loss scale, unscales and clips the
    gradients (logging ``grad_norm`` in ``runner.log_buffer``) and steps the
    optimizer, unless a gradient holds an inf or a nan: then the step is skipped
    (parameters and optimizer state untouched), the scale backs off and a line is
    logged. It drives any runner with ``model``, ``optimizer``, ``outputs['loss']``,
    ``meta``, ``logger``, ``log_buffer``, ``iter`` and ``max_iters`` (mmcv's
    included: it becomes an ``mmcv.runner.Hook`` once mmcv's runner is imported).

    The backend is chosen in :meth:`before_run`, once the device is known: native
    (``wrap_fp16_model`` and ``torch.amp.GradScaler``) or legacy (a half model, float32
    masters, :class:`~fp16utils.LossScaler`). The scaler state is kept in
    ``runner.meta['fp16']['loss_scaler']`` (either backend loads mmcv's) and each
    iteration's :class:`~fp16utils.StepResult` fields in ``runner.outputs['fp16']``.

    Args:
        grad_clip: None or ``dict(max_norm=..., norm_type=2)`` (or
            ``dict(type='value', clip_value=...)``).
        coalesce: Legacy backend, distributed: all-reduce flattened buckets.
        bucket_size_mb: Legacy backend, distributed: bucket size (<= 0: one
            bucket per device and dtype).
        loss_scale: A number (a static scale), ``'dynamic'`` (GradScaler's
            defaults on the native backend, mmcv LossScaler's on the legacy
            one), or a dict of scaler arguments (either's names).
        distributed: Legacy backend: average the master gradients over
            processes when a process group with several processes is running.
        dtype: The low-precision dtype (float16 by default; bfloat16 gets no
            loss scaling).
        backend: ``'native'``, ``'legacy'`` or None for the default.
        nonfinite: ``'warn'`` (default), ``'raise'`` or ``'ignore'``: an inf/nan
            gradient that no dynamic scale can back off; see
            :class:`~fp16utils.optim.AmpOptimWrapper`.
        overflow_guard: None, or ``dict(max_consecutive=3, action='diagnose')``
            (see :class:`~fp16utils.optim.AmpOptimWrapper`); it watches
            ``runner.model`` from :meth:`before_train_iter`.
        agree_across_ranks: None (agree on every skip when the world size is
            > 1), True, False or a process group.
        skip_aware_hooks: False (default: mmcv's behaviour), True (the runner's LR and
            momentum updaters and EMA hooks do not advance on a skipped step) or a
            list of the hook classes to follow; see docs/how-to/schedulers-ema.md.

    Raises:
        UnknownKeyError: (a TypeError) for a keyword argument it does not take,
            naming the closest accepted one and all of them.
        ValueError: A value out of range.

    Example:
        >>> hook = Fp16OptimizerHook(loss_scale=512., grad_clip=dict(max_norm=35))
        >>> hook.loss_scale, hook.skipped_steps
        (512.0, 0)
    """

    #: The keyword arguments taken; another is an UnknownKeyError naming the closest.
    _ACCEPTED = _HOOK_ARGS

    def __init__(self, grad_clip: Optional[Mapping[str, Any]] = None, coalesce: bool = True,
                 bucket_size_mb: float = -1,
                 loss_scale: Union[str, float, Mapping[str, Any]] = MMCV_LOSS_SCALE,
                 distributed: bool = True, *, dtype: Union[torch.dtype, str, None] = None,
                 backend: Optional[str] = None, nonfinite: str = 'warn',
                 overflow_guard: Optional[Mapping[str, Any]] = None,
                 agree_across_ranks: Any = None, skip_aware_hooks: Any = False,
                 **unknown: Any) -> None:
        follow_mmcv()
        self._set_up = True  # see OptimizerHookApi.__getattr__
        owner = type(self).__name__
        if unknown:  # a misspelt config key (fp16=dict(loss_scal=...)): name it, one line
            raise UnknownKeyError(
                unknown_keys_message(owner, unknown, self._ACCEPTED)
                + ' (from the config: fp16=dict(...) or optimizer_config=dict(...))')
        self.nonfinite = check_nonfinite_policy(nonfinite, owner)
        self._skips = SkipLedger.parse(skip_aware_hooks, owner, MMCV_FOLLOWED)
        self._driver = StepDriver(owner, self._make_window(owner),
                                  guard=OverflowGuard.parse(overflow_guard, owner))
        self.agree_across_ranks = check_setting(agree_across_ranks, owner)
        self.grad_clip = grad_clip  # checked (see OptimizerHookApi.grad_clip)
        versions.resolve_backend(backend)  # checked; decided in before_run
        self._backend = backend
        self.dtype = dtypes.resolve_dtype(dtype)
        parse_loss_scale(loss_scale, owner)  # checked; parsed for the backend in before_run
        self._loss_scale = dict(loss_scale) if isinstance(loss_scale, Mapping) else loss_scale
        self.coalesce = bool(coalesce)
        self.bucket_size_mb = bucket_size_mb
        self.distributed = bool(distributed)
        self._engine: Optional[_Engine] = None
        self._optimizer: Optional[torch.optim.Optimizer] = None
        self._model_only: List[nn.Parameter] = []
        self._log = RunLog()

    def _make_window(self, owner: str) -> AccumulationWindow:
        return AccumulationWindow(1, owner, 'cumulative_iters')

    @property
    def backend(self) -> str:
        """``'native'`` or ``'legacy'``: the one :meth:`before_run` chose (before: the default)."""
        engine = self._engine
        return versions.resolve_backend(self._backend) if engine is None else engine.backend

    def _scale_spec(self, backend: str) -> ScaleSpec:
        """``loss_scale`` parsed with ``backend``'s dynamic defaults."""
        return parse_loss_scale(self._loss_scale, type(self).__name__,
                                MMCV_DYNAMIC if backend == 'legacy' else TORCH_DYNAMIC)

    @property
    def loss_scale(self) -> float:
        """The current loss scale (no device sync)."""
        engine = self._engine
        if engine is not None:
            return engine.loss_scale
        spec = self._scale_spec(self.backend)
        return spec.init_scale if spec.enabled and dtypes.needs_loss_scaling(self.dtype) else 1.0

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because a gradient held an inf or a nan."""
        return 0 if self._engine is None else self._engine.skipped_steps

    @property
    def scale_history(self) -> List[Tuple[int, float]]:
        """``(iteration, scale)`` at the start and at each change of the loss scale."""
        return [] if self._engine is None else self._engine.scale_history

    def before_run(self, runner: Any) -> None:
        """Choose the backend and prepare the model (and masters); resume from ``runner.meta``."""
        owner = type(self).__name__
        if self._skips is not None:  # the runner's schedule and EMA hooks follow the steps
            connect_0x(self._skips, runner, self)
        optimizer, model = runner.optimizer, runner.model
        engine = self._engine
        step = int(getattr(runner, 'iter', 0) or 0)
        fp16_meta, resume = resume_state_from_meta(runner.meta, step, owner)
        if engine is None or optimizer is not self._optimizer:
            params = flat_params(optimizer)
            backend = caps.backend_for(self._backend, params[0].device.type if params else 'cpu',
                                       self.dtype, model)
            # All checked before the model is converted or the optimizer re-pointed.
            check_resume(resume, params, owner, masters=backend == 'legacy')
            engine = self._make_engine(optimizer, model, backend, owner)
        self._log.runner_logger = getattr(runner, 'logger', None)
        self._engine = self._driver.engine = engine
        self._optimizer = optimizer
        held = {id(p) for p in flat_params(optimizer)}
        self._model_only = [p for p in model.parameters() if id(p) not in held]
        if step and engine.enabled and not self._scale_spec(engine.backend).static and (
                not fp16_meta.get('loss_scaler')):
            engine.logger.warning(
                '%s: the run starts at iteration %d but runner.meta holds no loss-scaler '
                "state ('fp16'); the dynamic scale starts again from %s. (mmcv's "
                'IterBasedRunner.resume does not restore runner.meta: call '
                'fp16utils.patch_mmcv() first, or start with `fp16utils run`.)',
                owner, step, engine.loss_scale)
        engine.resume(resume, step, owner, engine.grad_params(optimizer))
        self._driver.restoring(resume.pending is not None, step)
        if self._driver.guard is not None:
            self._driver.guard.stop()  # watchers left by a forward that raised
        # The tensors leave runner.meta until the next update saves them again: mmcv's
        # TextLoggerHook writes runner.meta to its JSON log in before_run.
        fp16_meta.pop('master_params', None)
        fp16_meta.pop('pending_window', None)

    def after_run(self, runner: Any) -> None:
        """Give the hooks that ``skip_aware_hooks`` followed their own stages back."""
        if self._skips is not None:
            self._skips.disconnect()

    def _make_engine(self, optimizer: Any, model: nn.Module, backend: str,
                     owner: str) -> _Engine:
        """The engine for ``backend``; the model is converted once it is made."""
        spec = self._scale_spec(backend)
        given = dict(clip_fn=self._clip_override(), logger=self._log,
                     agree_across_ranks=self.agree_across_ranks)
        engine: _Engine
        if backend == 'legacy':
            engine = LegacyEngine(optimizer, spec, self.dtype, owner, self.nonfinite, self._clip,
                                  reduce=self._reduce if self.distributed else None, **given)
        else:  # as mmcv, the model's parameters are clipped
            engine = NativeEngine(spec, self.dtype, self._param_device_type, self.nonfinite,
                                  self._clip, owner=owner, clip_params=list(model.parameters()),
                                  **given)
        scaler = self.__dict__.get('_given_scaler')
        if scaler is not None:  # assigned to loss_scaler, as an mmcv-style __init__ does
            engine.adopt_scaler(scaler)
        wrap_fp16_model(model, self.dtype, backend=backend)
        return engine

    def _param_device_type(self) -> str:
        """Where the optimizer's first parameter lives (a method: the hook pickles)."""
        return optimizer_device_type(self._optimizer)

    def _grad_params(self) -> List[Any]:
        """The tensors whose ``.grad`` accumulates over a window."""
        engine, optimizer = self._engine, self._optimizer
        return [] if engine is None or optimizer is None else engine.grad_params(optimizer)

    def _reduce(self, masters: List[nn.Parameter]) -> None:
        if allreduce.world_size() > 1:
            allreduce.allreduce_grads(masters, self.coalesce, self.bucket_size_mb)

    def _zero_grad(self, runner: Any) -> None:
        """Clear the gradients of the optimizer and of the model's other parameters."""
        runner.optimizer.zero_grad()
        for p in self._model_only:
            p.grad = None
        self._driver.grads_cleared()

    def _update(self, runner: Any) -> None:
        """Step (or skip) and publish the result; also a step that raised once applied."""
        engine = self._require_engine(runner)
        self._refresh_clip()
        engine.grad_norm = None
        driver = self._driver
        previous = driver.last_result
        try:
            driver.step(runner.optimizer, int(runner.iter) + 1, {})
        finally:
            if driver.last_result is not previous:
                fp16_slot(runner).update(engine.checkpoint())
                self._publish(runner, driver.last_result)
        if self._skips is not None and driver.last_result.skipped:
            self._skips.skipped(runner, driver.window.divisor(int(runner.iter)))

    def _publish(self, runner: Any, result: Any) -> None:
        """``runner.outputs['fp16']``; ``grad_norm`` and ``loss_scale`` to the log buffer."""
        if getattr(runner, 'outputs', None) is None:
            runner.outputs = {}
        fields = runner.outputs['fp16'] = result.to_dict()
        pairs = (('grad_norm', fields['grad_norm']), ('loss_scale', fields['scale']))
        logged = {name: value for name, value in pairs if value is not None}
        log_buffer = getattr(runner, 'log_buffer', None)
        if logged and log_buffer is not None:
            log_buffer.update(logged, runner.outputs.get('num_samples', 1))

    def _backward(self, runner: Any, loss: torch.Tensor, earlier: int = 0) -> None:
        self._driver.backward(loss, int(runner.iter) + 1, earlier, lambda: self._zero_grad(runner))

    def before_train_iter(self, runner: Any) -> None:
        """Attach the overflow guard's watchers to ``runner.model`` when it is armed."""
        super().before_train_iter(runner)
        guard = self._driver.guard
        if guard is not None and guard.armed:
            guard.watch(runner.model)

    def _require_engine(self, runner: Any) -> _Engine:
        engine = self._engine
        if engine is None or runner.optimizer is not self._optimizer:
            raise RuntimeError(
                f'{type(self).__name__}.before_run(runner) has not been called with this '
                "runner's optimizer; register the hook before the run starts, or call "
                'before_run(runner) yourself.')
        return engine

    def after_train_iter(self, runner: Any) -> None:
        """Backward the scaled loss and update the parameters (or skip on overflow)."""
        self._require_engine(runner)
        self._zero_grad(runner)
        if self.detect_anomalous_params:
            self.detect_anomalous_parameters(runner.outputs['loss'], runner)
        self._backward(runner, runner.outputs['loss'])
        self._update(runner)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(backend={self.backend!r}, dtype={self.dtype}, '
                f'loss_scale={self.loss_scale}, grad_clip={self.grad_clip})')


class GradientCumulativeFp16OptimizerHook(CumulativeHookApi, Fp16OptimizerHook):
    """mmcv's ``GradientCumulativeFp16OptimizerHook``: fp16 training with gradient accumulation.

    Each iteration's loss is divided by ``cumulative_iters`` and backwarded;
    every ``cumulative_iters`` iterations (and at the last one) the accumulated
    gradients are applied as in :class:`Fp16OptimizerHook`. A last, shorter window
    (``runner.max_iters`` not a multiple) is divided by its own length.

    Args:
        cumulative_iters: Iterations accumulated per update (int >= 1).
        **kwargs: The arguments of :class:`Fp16OptimizerHook`.

    Raises:
        ValueError: ``cumulative_iters`` is not an int >= 1, or see :class:`Fp16OptimizerHook`.

    Example:
        >>> hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=4, loss_scale='dynamic')
        >>> hook.cumulative_iters
        4
    """

    _ACCEPTED = ('cumulative_iters', *_HOOK_ARGS)

    def __init__(self, cumulative_iters: int = 1, **kwargs: Any) -> None:
        self._window = AccumulationWindow(cumulative_iters, type(self).__name__,
                                          'cumulative_iters')
        super().__init__(**kwargs)
        self.cumulative_iters = cumulative_iters

    def _make_window(self, owner: str) -> AccumulationWindow:
        return self.__dict__.pop('_window')

    def _init(self, runner: Any) -> None:
        driver = self._driver
        restored, driver.restored = driver.restored, None
        run_logger = getattr(runner, 'logger', None)
        driver.window.warn_on_start(runner.model, runner.iter, restored == runner.iter,
                                    logger if run_logger is None else run_logger,
                                    'save runner.meta with the checkpoint')
        driver.window.start(runner.max_iters)

    def before_run(self, runner: Any) -> None:
        """As :meth:`Fp16OptimizerHook.before_run`; the window bookkeeping starts afresh."""
        super().before_run(runner)
        self.initialized = False

    def after_train_iter(self, runner: Any) -> None:
        """Accumulate the scaled loss; update every ``cumulative_iters`` iterations."""
        self._require_engine(runner)
        if not self.initialized:
            self._init(runner)
        it, window = runner.iter, self._driver.window
        factor = window.divisor(it)
        loss = runner.outputs['loss']
        if factor != 1:
            loss = loss / factor
        try:
            self._backward(runner, loss, it % window.counts)
            if window.completes(it):
                self._update(runner)
                self._zero_grad(runner)
        except BaseException:  # the window's gradients are spent: no checkpoint keeps them
            self._driver.raised()
            if runner.meta:
                fp16_slot(runner).pop('pending_window', None)
            raise
        if window.completes(it):
            if runner.meta:
                fp16_slot(runner).pop('pending_window', None)
        else:
            # A checkpoint saved now keeps the window's gradients (references: the
            # checkpoint hook serialises them after this hook has run).
            fp16_slot(runner)['pending_window'] = self._driver.pending_window(
                runner.optimizer, it + 1, copy=False)
            self._publish(runner, self._driver.accumulated())

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(cumulative_iters={self.cumulative_iters}, '
                f'backend={self.backend!r}, dtype={self.dtype}, loss_scale={self.loss_scale}, '
                f'grad_clip={self.grad_clip})')
