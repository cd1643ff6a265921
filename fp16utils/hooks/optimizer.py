"""0.x-style training hooks: ``Fp16OptimizerHook`` and ``GradientCumulativeFp16OptimizerHook``.

The hooks take mmcv's arguments and drive any runner object that has
``model``, ``optimizer``, ``outputs['loss']``, ``meta`` (a dict or None),
``logger``, ``log_buffer`` (with ``update(dict, count)``), ``iter`` and
``max_iters``; the runner calls ``before_run(runner)`` once and
``after_train_iter(runner)`` after each forward.

Native backend: the hook calls ``wrap_fp16_model(runner.model)`` (the model's
``@auto_fp16`` / ``@force_fp32`` methods switch on and autocast themselves)
and scales the loss with ``torch.amp.GradScaler``. Legacy backend: the model
is converted to half, the optimizer steps float32 master copies of the
parameters, and :class:`~fp16utils.LossScaler` decides when a step is skipped.
The scaler state is kept in ``runner.meta['fp16']['loss_scaler']`` and
restored from it; on the legacy backend the float32 masters are kept in
``runner.meta['fp16']['master_params']`` too, so that a resumed run continues
from exactly the same weights.

With mmcv 1.x: the hooks are real ``mmcv.runner.Hook`` subclasses as soon as
``mmcv.runner`` is imported, before or after this module, so mmcv's
``register_hook`` and ``HOOKS`` registry take them (see
:mod:`fp16utils.hooks.base`); this module never imports mmcv.

The backward pass, the step, the records and the pending accumulation window
are the :class:`~fp16utils.engine.driver.StepDriver`'s, as in the optimizer
wrappers; the hooks add the runner and ``runner.meta``.

Example:
    >>> import torch
    >>> from torch import nn
    >>> from fp16utils import Fp16OptimizerHook
    >>> class Runner:  # the smallest runner the hook drives
    ...     def __init__(self, model):
    ...         self.model, self.meta, self.iter, self.max_iters = model, {}, 0, 1
    ...         self.optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ...         self.logger = None
    >>> runner = Runner(nn.Linear(2, 1))
    >>> hook = Fp16OptimizerHook(loss_scale='dynamic')
    >>> hook.before_run(runner)
    >>> runner.outputs = {'loss': runner.model(torch.ones(1, 2)).sum()}
    >>> hook.after_train_iter(runner)
    >>> runner.meta['fp16']['loss_scaler']['scale'], hook.skipped_steps
    (65536.0, 0)
"""

from __future__ import annotations

import logging
from typing import Any, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from .._args.keys import FP16_HOOK_ARGS, UnknownKeyError, unknown_keys_message
from .._args.spec import (
    MMCV_DYNAMIC,
    TORCH_DYNAMIC,
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
    StepEngine,
    StepResult,
    check_resume,
    flat_params,
    optimizer_device_type,
    resume_state_from_meta,
)
from ..engine.ranks import check_setting
from ..wrap import wrap_fp16_model
from .allreduce import allreduce_grads, world_size
from .api import CumulativeHookApi, OptimizerHookApi
from .base import follow_mmcv, set_base

__all__ = ['Fp16OptimizerHook', 'GradientCumulativeFp16OptimizerHook']

logger = logging.getLogger('fp16utils')


def _world_size() -> int:
    return world_size()


def _allreduce_grads(params: List[Any], coalesce: bool = True,
                     bucket_size_mb: float = -1) -> None:
    """Average the gradients of ``params`` over all processes (see :func:`allreduce_grads`)."""
    allreduce_grads(params, coalesce, bucket_size_mb, _world_size())


def _fp16_slot(runner: Any) -> Any:
    """``runner.meta['fp16']``, made (with ``runner.meta``) where it is None or absent."""
    if runner.meta is None:
        runner.meta = {}
    slot = runner.meta.get('fp16')
    if slot is None:
        slot = runner.meta['fp16'] = {}
    return slot


class Fp16OptimizerHook(Driven, OptimizerHookApi):
    """mmcv's ``Fp16OptimizerHook``: fp16 backward, scaling, clipping and the update.

    After each training iteration the hook zeroes the gradients, backwards
    ``runner.outputs['loss']`` scaled by the loss scale, unscales the
    gradients, clips them (logging ``grad_norm`` in ``runner.log_buffer``)
    and steps the optimizer, unless a gradient holds an inf or a nan: then
    the step is skipped (parameters and optimizer state untouched), the scale
    backs off and a line is logged. The scaler state is saved to
    ``runner.meta['fp16']['loss_scaler']`` and restored from it in
    :meth:`before_run`; an mmcv ``LossScaler`` state loads on both backends.

    Args:
        grad_clip: None or ``dict(max_norm=..., norm_type=2)`` (or
            ``dict(type='value', clip_value=...)``).
        coalesce: Legacy backend, distributed: all-reduce flattened buckets.
        bucket_size_mb: Legacy backend, distributed: bucket size (<= 0: one
            bucket per device and dtype).
        loss_scale: A number (a static scale), ``'dynamic'`` (GradScaler's
            defaults on the native backend, mmcv LossScaler's on the legacy
            one), or a dict of scaler arguments (GradScaler's or LossScaler's
            names). Anything else is a ValueError.
        distributed: Legacy backend: average the master gradients over
            processes when a process group with several processes is running.
        dtype: The low-precision dtype (float16 by default; bfloat16 needs no
            loss scaling and gets none).
        backend: ``'native'``, ``'legacy'`` or None for the default.
        nonfinite: ``'warn'`` (default), ``'raise'`` or ``'ignore'``: what to do
            with an inf/nan gradient when no dynamic scale can back off; see
            :class:`~fp16utils.optim.AmpOptimWrapper`.
        overflow_guard: None, or ``dict(max_consecutive=3, action='diagnose')``;
            see :class:`~fp16utils.optim.AmpOptimWrapper`. The watchers go on
            ``runner.model`` in :meth:`before_train_iter`.
        agree_across_ranks: None (default: agree on every skip when the world
            size is > 1), True, False or a process group; see
            :class:`~fp16utils.optim.AmpOptimWrapper`.

    Raises:
        UnknownKeyError: (a TypeError) for a keyword argument it does not take,
            naming it, the closest accepted one and all of them.
        ValueError: A value out of range (see each argument).

    What mmcv's hooks give their subclasses is here too, with mmcv's meaning
    (:class:`~fp16utils.hooks.api.OptimizerHookApi`): ``clip_grads``,
    ``loss_scaler``, ``_scale_update_param``, ``copy_grads_to_fp32``, ...

    Each iteration the hook puts the :class:`~fp16utils.StepResult` fields in
    ``runner.outputs['fp16']`` (a plain dict) and, when the loss is scaled,
    ``loss_scale`` (the scale of the iteration's gradients) in ``runner.log_buffer``.

    Attributes:
        skipped_steps: Steps skipped for non-finite gradients.
        scale_history: ``(iteration, scale)`` at the start and at each change
            of the scale (iterations counted from 1).

    Example:
        >>> hook = Fp16OptimizerHook(loss_scale=512., grad_clip=dict(max_norm=35))
        >>> hook.loss_scale
        512.0
    """

    #: The keyword arguments taken; another is an UnknownKeyError naming the closest.
    _ACCEPTED = FP16_HOOK_ARGS

    def __init__(self, grad_clip: Optional[Mapping[str, Any]] = None, coalesce: bool = True,
                 bucket_size_mb: float = -1,
                 loss_scale: Union[str, float, Mapping[str, Any]] = 512.,
                 distributed: bool = True, *, dtype: Union[torch.dtype, str, None] = None,
                 backend: Optional[str] = None, nonfinite: str = 'warn',
                 overflow_guard: Optional[Mapping[str, Any]] = None,
                 agree_across_ranks: Any = None, **unknown: Any) -> None:
        follow_mmcv()
        self._set_up = True  # see OptimizerHookApi.__getattr__
        owner = type(self).__name__
        if unknown:  # a misspelt config key (fp16=dict(loss_scal=...)): name it, one line
            raise UnknownKeyError(
                unknown_keys_message(owner, unknown, self._ACCEPTED)
                + ' (from the config: fp16=dict(...) or optimizer_config=dict(...))')
        self.nonfinite = check_nonfinite_policy(nonfinite, owner)
        self._driver = StepDriver(owner, AccumulationWindow(1, owner, 'cumulative_iters'),
                                  guard=OverflowGuard.parse(overflow_guard, owner))
        #: See :mod:`fp16utils.engine.ranks` (None: agree when the world size is > 1).
        self.agree_across_ranks = check_setting(agree_across_ranks, owner)
        self.grad_clip = grad_clip  # checked (see OptimizerHookApi.grad_clip)
        self.backend = versions.resolve_backend(backend)
        self.dtype = dtypes.resolve_dtype(dtype)
        dynamic = TORCH_DYNAMIC if self.backend == 'native' else MMCV_DYNAMIC
        self._spec = parse_loss_scale(loss_scale, owner, dynamic)
        #: What mmcv's hook gives ``loss_scaler.update()``: the scale when it is static.
        self._scale_update_param = self._spec.init_scale if self._spec.static else None
        self._backend_arg, self._loss_scale_arg = backend, loss_scale
        self.coalesce = bool(coalesce)
        self.bucket_size_mb = bucket_size_mb
        self.distributed = bool(distributed)
        self._engine: Optional[StepEngine] = None
        self._optimizer: Optional[torch.optim.Optimizer] = None
        self._model_only: List[nn.Parameter] = []

    # -- read-only state --------------------------------------------------------------------

    @property
    def loss_scale(self) -> float:
        """The current loss scale (no device sync)."""
        engine = self._engine
        if engine is None:
            needs = self._spec.enabled and dtypes.needs_loss_scaling(self.dtype)
            return self._spec.init_scale if needs else 1.0
        return engine.loss_scale

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because a gradient held an inf or a nan."""
        return 0 if self._engine is None else self._engine.skipped_steps

    @property
    def scale_history(self) -> List[Tuple[int, float]]:
        """``(iteration, scale)`` at the start and at each change of the loss scale."""
        return [] if self._engine is None else self._engine.scale_history

    # -- hook stages ------------------------------------------------------------------------

    def before_run(self, runner: Any) -> None:
        """Prepare the model (and the masters), then resume the scaler from ``runner.meta``."""
        owner = type(self).__name__
        optimizer = runner.optimizer
        model = runner.model
        engine = self._engine
        step = int(getattr(runner, 'iter', 0) or 0)
        fp16_meta, resume = resume_state_from_meta(runner.meta, step, owner)
        backend, spec = self.backend, self._spec
        if engine is None or optimizer is not self._optimizer:
            # Now that the device is known: legacy where native cannot run the dtype there.
            params = flat_params(optimizer)
            backend = caps.backend_for(self._backend_arg,
                                         params[0].device.type if params else 'cpu', self.dtype,
                                         model)
            if backend != self.backend:
                spec = parse_loss_scale(self._loss_scale_arg, owner, MMCV_DYNAMIC
                                        if backend == 'legacy' else TORCH_DYNAMIC)
            # All checked before the model is converted or the optimizer re-pointed.
            check_resume(resume, params, owner, masters=backend == 'legacy')
            engine = self._make_engine(optimizer, model, backend, spec, params, owner)
        self.backend, self._spec = backend, spec
        if self.backend == 'native':
            engine.clip_params = list(model.parameters())  # as mmcv clips the model's
        engine.clip_fn = self._clip_override()
        engine.agree_across_ranks = self.agree_across_ranks
        run_logger = getattr(runner, 'logger', None)
        engine.logger = logger if run_logger is None else run_logger  # one line per event
        self._engine = self._driver.engine = engine
        self._optimizer = optimizer
        held = {id(p) for p in flat_params(optimizer)}
        self._model_only = [p for p in model.parameters() if id(p) not in held]
        if step and engine.enabled and not self._spec.static and not fp16_meta.get('loss_scaler'):
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
        # Restored: the tensors leave runner.meta until the next update saves them again,
        # since mmcv's TextLoggerHook writes runner.meta to its JSON log in before_run.
        fp16_meta.pop('master_params', None)
        fp16_meta.pop('pending_window', None)

    def _make_engine(self, optimizer: Any, model: nn.Module, backend: str, spec: Any,
                     params: List[Any], owner: str) -> StepEngine:
        """The engine for ``backend``; the model is converted once the engine is made."""
        if backend == 'legacy':
            engine: StepEngine = LegacyEngine(optimizer, spec, self.dtype, owner, self.nonfinite,
                                              self._clip)
            if self.distributed:
                engine.reduce = self._reduce  # type: ignore[attr-defined]
        else:  # checks its arguments first; the model is converted below
            engine = NativeEngine(spec, self.dtype, self._param_device_type, self.nonfinite,
                                  self._clip, owner=owner)
        given = self.__dict__.get('_given_scaler')
        if given is not None:  # assigned to loss_scaler, as an mmcv-style __init__ does
            engine.adopt_scaler(given)  # type: ignore[attr-defined]
        wrap_fp16_model(model, self.dtype, backend=backend)
        return engine

    def _param_device_type(self) -> str:
        """Where the optimizer's first parameter lives (a method: the hook pickles)."""
        return optimizer_device_type(self._optimizer)

    def _grad_params(self) -> List[Any]:
        """The tensors whose ``.grad`` accumulates over a window."""
        assert self._engine is not None and self._optimizer is not None
        return self._engine.grad_params(self._optimizer)

    def _reduce(self, masters: List[nn.Parameter]) -> None:
        if _world_size() > 1:
            _allreduce_grads(masters, self.coalesce, self.bucket_size_mb)

    def _zero_grad(self, runner: Any) -> None:
        """Clear the gradients of the model and of the optimizer (as mmcv does).

        The model's parameters that the optimizer does not hold were listed
        once in :meth:`before_run`, so this costs no walk over the modules.
        """
        runner.optimizer.zero_grad()
        for p in self._model_only:
            p.grad = None
        self._driver.grads_cleared()

    def _update(self, runner: Any) -> None:
        """Unscale, clip, step (or skip), update the scale, log, save the scaler state."""
        engine = self._require_engine(runner)
        self._refresh_clip()
        engine.grad_norm = None

        def done(result: StepResult) -> None:  # also when a step raises once applied
            _fp16_slot(runner).update(engine.checkpoint())
            self._publish(runner, result)

        self._driver.step(runner.optimizer, int(runner.iter) + 1, {}, done)

    def _publish(self, runner: Any, result: StepResult) -> None:
        """Put the fields of ``result`` in ``runner.outputs['fp16']`` and log them.

        ``grad_norm`` (when clipped by norm: one sync, as mmcv logs it) and
        ``loss_scale`` (when the loss is scaled) go to ``runner.log_buffer`` as
        floats, in one update weighted by ``outputs['num_samples']``.
        """
        if getattr(runner, 'outputs', None) is None:
            runner.outputs = {}
        fields = runner.outputs['fp16'] = result.to_dict()
        logged = {}
        if fields['grad_norm'] is not None:
            logged['grad_norm'] = fields['grad_norm']
        if fields['scale'] is not None:
            logged['loss_scale'] = fields['scale']
        log_buffer = getattr(runner, 'log_buffer', None)
        if logged and log_buffer is not None:
            log_buffer.update(logged, runner.outputs.get('num_samples', 1))

    def _backward(self, runner: Any, loss: torch.Tensor, earlier: int = 0) -> None:
        """Backward ``loss`` (``earlier``: iterations of the window before this one)."""
        self._driver.backward(loss, int(runner.iter) + 1, earlier, lambda: self._zero_grad(runner))

    def before_train_iter(self, runner: Any) -> None:
        """Attach the overflow guard's watchers to ``runner.model`` when it is armed."""
        super().before_train_iter(runner)
        guard = self._driver.guard
        if guard is not None and guard.armed:
            guard.watch(runner.model)

    def _require_engine(self, runner: Any) -> StepEngine:
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

    The loss of each iteration is divided by ``cumulative_iters`` and
    backwarded; every ``cumulative_iters`` iterations (and at the last one)
    the accumulated gradients are unscaled, clipped and applied as in
    :class:`Fp16OptimizerHook`. When ``runner.max_iters`` is not a multiple
    of ``cumulative_iters``, the last, shorter window is divided by its own
    length.

    Args:
        cumulative_iters: Iterations accumulated per update (int >= 1).
        **kwargs: The arguments of :class:`Fp16OptimizerHook`.

    Example:
        >>> hook = GradientCumulativeFp16OptimizerHook(cumulative_iters=4, loss_scale='dynamic')
        >>> hook.cumulative_iters
        4
    """

    _ACCEPTED = ('cumulative_iters', *FP16_HOOK_ARGS)

    def __init__(self, cumulative_iters: int = 1, **kwargs: Any) -> None:
        window = AccumulationWindow(cumulative_iters, type(self).__name__, 'cumulative_iters')
        super().__init__(**kwargs)
        self._driver.window = window
        self.cumulative_iters = cumulative_iters

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
            self._driver.leftovers.spent = True
            if runner.meta:
                _fp16_slot(runner).pop('pending_window', None)
            raise
        if window.completes(it):
            if runner.meta:
                _fp16_slot(runner).pop('pending_window', None)
        else:
            # A checkpoint saved now keeps the window's gradients (references: the
            # checkpoint hook serialises them after this hook has run).
            _fp16_slot(runner)['pending_window'] = self._driver.pending_window(
                runner.optimizer, it + 1, copy=False)
            self._publish(runner, self._driver.accumulated())

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(cumulative_iters={self.cumulative_iters}, '
                f'backend={self.backend!r}, dtype={self.dtype}, loss_scale={self.loss_scale}, '
                f'grad_clip={self.grad_clip})')


#: The name :func:`~fp16utils.hooks.api.set_base` had here.
_set_base = set_base
