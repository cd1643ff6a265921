"""``AmpOptimWrapper``, the mixed-precision optimizer wrapper, and the deferral of the
legacy backend's model conversion (:func:`deferred_model_conversion`)."""

from __future__ import annotations

import contextlib
import functools
import threading
import uuid
from typing import Any, Callable, Dict, Iterator, List, Mapping, Optional, Tuple, Union

import torch
from torch import nn

from .._args.spec import check_cache_enabled, check_nonfinite_policy, parse_loss_scale
from .._torch import autocast, caps, dtypes, models, tracing
from ..engine import (
    LegacyEngine,
    NativeEngine,
    OverflowGuard,
    ResumeState,
    flat_params,
    optimizer_device_type,
)
from ..engine.ranks import check_setting
from ..fp32_modules import Fp32Modules, check_fp32_modules, keep_fp32, match_modules
from ..precision import auto_dtype, is_auto
from ..scaler import LossScaler
from ..wrap import wrap_fp16_model
from .contexts import CastIO, Guarded, TwoContexts
from .wrapper import OptimWrapper

__all__ = ['AmpOptimWrapper', 'resolve_cast_dtype']


class _DefaultLossScale:
    """The default of ``loss_scale``, told apart from a ``loss_scale`` given twice."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<default: 'dynamic' for float16; no scaling for bfloat16, float32, float64>"


_Tensor = torch.Tensor
_UNSET: Any = _DefaultLossScale()


def resolve_cast_dtype(dtype: Any) -> torch.dtype:
    """The dtype of an :class:`AmpOptimWrapper`'s forward, for any ``dtype`` but 'auto'."""
    try:
        return dtypes.resolve_dtype(dtype, full_precision=True)
    except ValueError:
        raise ValueError(f"Unsupported dtype {dtype!r}; expected 'float16', 'bfloat16', "
                         "'float32' or 'float64' (or the torch dtypes), 'auto' for the best "
                         'native one, or None for float16.') from None


def _bind_loss_scale(owner: str, positional: Any, optimizer: Any,
                     kwargs: Dict[str, Any]) -> Tuple[Any, Any]:
    """Bind MMEngine's order (loss_scale, dtype, use_fsdp, *, optimizer) or (optimizer, ...)."""
    keyword = kwargs.pop('loss_scale', _UNSET)
    if kwargs:
        raise TypeError(f'{owner}() got unexpected keyword argument(s) {sorted(kwargs)}.')
    if positional is not _UNSET and hasattr(positional, 'param_groups'):
        if optimizer is not None:
            raise TypeError(f'{owner}() got two optimizers: one in the first place and '
                            'optimizer=; pass it once.')
        optimizer, positional = positional, _UNSET
    if positional is not _UNSET and keyword is not _UNSET:
        raise TypeError(f"{owner}() got multiple values for argument 'loss_scale'.")
    if optimizer is None:
        raise TypeError(f'{owner}() needs the optimizer: {owner}(optimizer=torch.optim.SGD('
                        'model.parameters(), lr=0.01), loss_scale=...).')
    loss_scale = keyword if positional is _UNSET else positional
    return optimizer, 'dynamic' if loss_scale is _UNSET else loss_scale


class AmpOptimWrapper(OptimWrapper):
    """Mixed-precision :class:`OptimWrapper`: autocast forward, scaled loss, skipped overflows.

    Native backend (torch >= 1.6): :meth:`optim_context` runs the forward in
    ``torch.autocast`` on the model's device type (CPU included); the loss is
    scaled by a ``torch.amp.GradScaler`` made lazily for the parameters'
    device, gradients are unscaled before clipping, and a step with an inf or
    nan gradient is skipped (parameters and optimizer state untouched) while
    the scale backs off. A step synchronises with the device once.

    Legacy backend (older torch, or ``backend='legacy'`` for pure half
    training): ``model`` is converted with ``wrap_fp16_model(model, dtype,
    backend='legacy')``, float32 master copies replace its parameters in the
    optimizer's ``param_groups`` (the optimizer object is kept), and
    :class:`LossScaler` decides on a skip. Inside :meth:`optim_context` the
    model's float32 inputs are cast to ``dtype`` and its outputs back to float32.

    The arguments are in MMEngine's order, ``(loss_scale, dtype, use_fsdp)``
    then keywords; an optimizer given first, ``AmpOptimWrapper(optimizer,
    loss_scale=512.)``, is read as ``optimizer=``.

    Args:
        loss_scale: ``'dynamic'`` (GradScaler's defaults: 2**16, x2 every 2000
            clean steps, /2 on overflow), a number (a static scale; a
            non-finite step is still skipped), or a dict of GradScaler
            arguments (mmcv's ``init_scale``, ``mode``, ``scale_factor``,
            ``scale_window`` too).
        dtype: ``torch.float16`` (default) or ``torch.bfloat16`` (or their
            names; bfloat16 gets no loss scaling). ``'float32'`` / ``'float64'``
            run the forward without autocast or scaling. ``'auto'``: bfloat16
            where native on the parameters' device
            (:func:`fp16utils.precision_support`), else float16 where native,
            else float32, said in one log line (:attr:`auto_reason`) at the
            first :meth:`optim_context`.
        use_fsdp: The parameters are sharded across ranks (FSDP): the ranks
            agree on every skip (one all-reduce of a flag per step).
        optimizer: Optimizer built on the float32 model parameters.
        backend: ``'native'``, ``'legacy'`` or None for the process default.
        accumulative_counts: See :class:`OptimWrapper`.
        clip_grad: See :class:`OptimWrapper`.
        model: The float32 model the optimizer was built on; required by the
            legacy backend (converted in place), unused by the native one.
        nonfinite: An inf/nan gradient that no dynamic scale can back off
            (bfloat16, scaling disabled, a static scale): ``'warn'`` skips the
            update with a warning, ``'raise'`` raises ``FloatingPointError``
            before anything changes (the gradients are kept for inspection:
            :meth:`zero_grad` before training on), ``'ignore'`` applies it as
            torch would (no check, no sync). A dynamic scale always skips and
            backs off, never below ``min(1, init_scale)``.
        overflow_guard: None, or ``dict(max_consecutive=3, action='diagnose')``:
            after that many skips in a row, or a skip at the scale floor, the
            next forward and backward run under :func:`~fp16utils.find_overflow`;
            ``'diagnose'`` logs the report once per streak, ``'raise'`` raises
            ``FloatingPointError`` (report in ``.report``) before the step.
        agree_across_ranks: None (agree on every skip when torch.distributed
            runs with a world size > 1), True, False (each rank decides alone)
            or a process group to agree within; agreeing ranks must step the
            same number of times.
        fp32_modules: Submodules run in float32 under autocast, as
            :func:`fp16utils.keep_fp32` takes them: applied to ``model`` when
            given, else at the first :meth:`optim_context` (names relative to the
            model given there, DDP looked through; outside ``torch.compile``).
            On the legacy backend they keep float32 weights.

    Attributes:
        dtype: The resolved dtype (float16 for ``dtype=None``).
        cast_dtype: ``dtype`` as a torch dtype (``'auto'`` resolved, None kept), as in MMEngine.
        auto_reason: Why ``dtype='auto'`` fell back to float32, else None.

    Raises:
        ValueError: A bad ``loss_scale``, ``dtype``, ``backend`` or ``clip_grad``,
            or the legacy backend without ``model``; nothing is changed then.
        TypeError: An unknown keyword, no optimizer or two, or a wrongly typed argument.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Linear(4, 2)
        >>> wrapper = AmpOptimWrapper(torch.optim.Adam(model.parameters()),
        ...                           loss_scale=dict(init_scale=1024.), dtype='float16')
        >>> with wrapper.optim_context(model):
        ...     out = model(torch.ones(3, 4))
        >>> out.dtype, wrapper.update_params(out.float().sum()).scale
        (torch.float16, 1024.0)
    """

    def __init__(self, loss_scale: Any = _UNSET, /,
                 dtype: Union[torch.dtype, str, None] = None, use_fsdp: bool = False, *,
                 optimizer: Optional[torch.optim.Optimizer] = None,
                 backend: Optional[str] = None, accumulative_counts: int = 1,
                 clip_grad: Optional[Mapping[str, Any]] = None,
                 model: Optional[nn.Module] = None, nonfinite: str = 'warn',
                 overflow_guard: Optional[Mapping[str, Any]] = None,
                 agree_across_ranks: Any = None,
                 fp32_modules: Fp32Modules = None, **kwargs: Any) -> None:
        owner = type(self).__name__
        optimizer, loss_scale = _bind_loss_scale(owner, loss_scale, optimizer, kwargs)
        nonfinite = check_nonfinite_policy(nonfinite, owner)
        guard = OverflowGuard.parse(overflow_guard, owner)
        if not isinstance(use_fsdp, bool):
            raise TypeError(f'{owner}: use_fsdp must be True or False, got {use_fsdp!r}.')
        agree = check_setting(agree_across_ranks, owner)
        if use_fsdp and agree is False:
            raise ValueError(f'{owner}: use_fsdp=True shards the gradients, so the ranks must '
                             'agree on a skip; drop agree_across_ranks=False (or pass a '
                             'process group).')
        super().__init__(optimizer, accumulative_counts, clip_grad)
        self._guard = guard
        spec = parse_loss_scale(loss_scale, owner)
        params = flat_params(optimizer)
        self.auto_reason: Optional[str] = None
        if is_auto(dtype):
            dtype, self.auto_reason = auto_dtype(params[0].device if params else None)
        self.dtype: torch.dtype = resolve_cast_dtype(dtype)
        self.cast_dtype: Optional[torch.dtype] = None if dtype is None else self.dtype
        self.use_fsdp = use_fsdp
        if model is not None and not isinstance(model, nn.Module):
            raise TypeError(f'{owner}: model must be an nn.Module, got {type(model).__name__}.')
        check_fp32_modules(fp32_modules, f'{owner}(fp32_modules=...)')
        if model is not None:
            match_modules(model, fp32_modules, f'{owner}(fp32_modules=...)')
        self.fp32_modules = fp32_modules
        #: Marked on each model it has applied fp32_modules to (see _FP32_DONE).
        self._fp32_token = uuid.uuid4().hex
        self.backend: str = caps.backend_for(
            backend, params[0].device.type if params else 'cpu', self.dtype, model)
        self._ctx_path = models.TensorPath()
        self._model = model
        clip = self._engine.clip
        if self.backend == 'legacy':
            if model is None:
                raise ValueError(
                    f'{owner}: the legacy backend converts the model to {self.dtype} and keeps '
                    'float32 master weights, so it needs the model: pass '
                    f"{owner}(optimizer, ..., model=model) (or backend='native' on "
                    'torch >= 1.6).')
            if self.dtype not in dtypes.LOW_PRECISION or use_fsdp:
                raise ValueError(
                    f'{owner}: the legacy backend runs a float16 or bfloat16 model without '
                    f'FSDP; got dtype={self.dtype}, use_fsdp={use_fsdp}: use '
                    "backend='native'." + (f' ({self.auto_reason})' if self.auto_reason else ''))
            self._engine = LegacyEngine(optimizer, spec, self.dtype, owner, nonfinite, clip,
                                        agree_across_ranks=agree)
            convert_or_defer(model, self.dtype, fp32_modules)
            _mark_fp32_done(model, self._fp32_token)
        else:
            self._engine = NativeEngine(spec, self.dtype, self._param_device_type, nonfinite,
                                        clip, agree, owner=owner)
            if model is not None and fp32_modules is not None:  # outside any trace here
                keep_fp32(model, fp32_modules)
                _mark_fp32_done(model, self._fp32_token)
        #: See :mod:`fp16utils.engine.ranks` (None: agree when the world size is > 1).
        self.agree_across_ranks = agree

    def _param_device_type(self) -> str:
        return optimizer_device_type(self.optimizer)

    # -- read-only state --------------------------------------------------------------------

    @property
    def loss_scaler(self) -> Union[torch.amp.GradScaler, LossScaler]:
        """The ``torch.amp.GradScaler`` (native) or :class:`LossScaler` (legacy)."""
        return self._engine.scaler

    @property
    def loss_scale(self) -> float:
        """The current loss scale (1.0 when no scaling is done); reading it costs no sync."""
        return self._engine.loss_scale

    @property
    def skipped_steps(self) -> int:
        """Steps skipped because a gradient held an inf or a nan."""
        return self._engine.skipped_steps

    @property
    def scale_history(self) -> List[Tuple[int, float]]:
        """``(step, scale)`` at the start and at each change (the latest SCALE_HISTORY_LEN)."""
        return self._engine.scale_history

    @property
    def master_params(self) -> Optional[List[nn.Parameter]]:
        """The float32 master weights (legacy backend), else None."""
        return self._engine.masters

    # -- the step ---------------------------------------------------------------------------

    def optim_context(self, model: nn.Module, cache_enabled: Optional[bool] = None
                      ) -> contextlib.AbstractContextManager:
        """Context for the forward pass: autocast (native) or half inputs (legacy).

        The parent's context (no DDP gradient sync while accumulating) is
        entered first; autocast is disabled for float32 / float64. The first
        call with a model applies ``fp32_modules`` to it (and logs
        :attr:`auto_reason`, if any).

        Args:
            model: The model (or the sub-model) run inside the context.
            cache_enabled: ``torch.autocast``'s weight-cast cache: False for
                pytorch#105211 (a ``no_grad`` sub-forward before a forward that
                trains the same weights); None keeps torch's default (on). No
                effect on the legacy backend.

        Returns:
            A context manager, to be entered once.
        """
        check_cache_enabled(cache_enabled, type(self).__name__)
        if self.fp32_modules is not None or self.auto_reason is not None:
            self._first_context(model)
        if self.backend == 'native':
            device_type = self._model_device_type(model)
            if self.dtype in dtypes.LOW_PRECISION:
                inner: contextlib.AbstractContextManager = autocast.autocast_for(
                    device_type, self.dtype, cache_enabled=cache_enabled)
            else:  # float32 / float64: full precision, autocast off
                inner = autocast.autocast_for(device_type, enabled=False)
        else:
            inner = CastIO(model, self.dtype)
        context = TwoContexts(model.no_sync(), inner) if self._skips_sync(model) else inner
        guard = self._guard
        if guard is not None and guard.armed:
            return TwoContexts(Guarded(guard, model), context)
        return context

    def _first_context(self, model: nn.Module) -> None:
        """Log why 'auto' chose float32, once; apply fp32_modules to a model, once each."""
        compiling = tracing.is_compiling()  # in a trace: no log (the next eager one logs)
        if self.auto_reason is not None and not self.__dict__.get('_auto_logged') and (
                not compiling):
            self._auto_logged = True
            self.logger.warning(self.auto_reason)
        if self.fp32_modules is None or self.backend == 'legacy' or (
                self._fp32_token in model.__dict__.get(_FP32_DONE, ())):
            return
        if compiling:
            raise RuntimeError(
                f'{type(self).__name__}: fp32_modules={self.fp32_modules!r} are applied at the '
                'first optim_context(model), which cannot run inside torch.compile; build '
                'the wrapper with model=model (applied then) or enter it once before compiling.')
        inner = models.unwrap_model(model)
        keep_fp32(inner, self.fp32_modules)
        _mark_fp32_done(model, self._fp32_token)

    def _model_device_type(self, model: nn.Module) -> str:
        """The device type of ``model``'s first parameter or buffer, looked up anew each call."""
        device_type = models.module_device_type(model, None, cache=self._ctx_path)
        return self._param_device_type() if device_type is None else device_type

    # -- state ------------------------------------------------------------------------------

    def _engine_state(self) -> Dict[str, Any]:
        state = self._engine.checkpoint()
        state['fp16_stats'] = state.pop('stats')
        if 'master_params' in state:
            state['master_params'] = list(state['master_params'])
        return state

    def _resume_state(self, state: Dict[str, Any]) -> ResumeState:
        return ResumeState(scaler=state.pop('loss_scaler', None),
                           stats=state.pop('fp16_stats', None),
                           masters=state.pop('master_params', None))

    def state_dict(self) -> Dict[str, Any]:
        """The optimizer state plus ``'loss_scaler'`` (and ``'master_params'`` on legacy).

        ``'loss_scaler'`` is GradScaler's state (native) or LossScaler's, with
        mmcv's keys (legacy); either backend loads either. ``'master_params'``
        (the float32 masters, as references) resumes a half model exactly.
        """
        return super().state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a :meth:`state_dict`, all or nothing (the argument is not changed).

        Without ``'master_params'`` (a native checkpoint) the legacy backend
        re-reads its masters from the model's current weights.
        """
        super().load_state_dict(state_dict)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(optimizer={type(self.optimizer).__name__}, '
                f'backend={self.backend!r}, dtype={self.dtype}, loss_scale={self.loss_scale}, '
                f'accumulative_counts={self.accumulative_counts}, '
                f'clip_grad={self.clip_grad})')


#: Where a model lists the tokens of the wrappers that applied their fp32_modules to it
#: (a plain attribute: dynamo reads it, and a deepcopy of the model keeps it).
_FP32_DONE = '_fp16utils_fp32_done'


def _mark_fp32_done(model: nn.Module, token: str) -> None:
    model.__dict__[_FP32_DONE] = (*model.__dict__.get(_FP32_DONE, ()), token)


#: Per thread: where legacy model conversions wait while :func:`deferred_model_conversion` runs.
_deferred = threading.local()


@contextlib.contextmanager
def deferred_model_conversion() -> Iterator[List[Callable[[], Any]]]:
    """Collect the legacy backend's model conversions in the yielded list, not run them."""
    outer = getattr(_deferred, 'pending', None)
    pending: List[Callable[[], Any]] = []
    _deferred.pending = pending
    try:
        yield pending
    finally:
        _deferred.pending = outer


def convert_or_defer(model: nn.Module, dtype: torch.dtype, fp32_modules: Any = None) -> None:
    """``wrap_fp16_model(model, dtype, backend='legacy')``, or deferred inside a deferral."""
    convert = functools.partial(wrap_fp16_model, model, dtype, backend='legacy',
                                fp32_modules=fp32_modules)
    pending = getattr(_deferred, 'pending', None)
    if pending is None:
        convert()
    else:
        pending.append(convert)
