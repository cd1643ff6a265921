"""``AmpOptimWrapper``: the mixed-precision optimizer wrapper (autocast, loss scaling).

Example:
    >>> import torch
    >>> from torch import nn
    >>> model = nn.Linear(4, 2)
    >>> wrapper = AmpOptimWrapper(torch.optim.Adam(model.parameters()), dtype='bfloat16')
    >>> with wrapper.optim_context(model):
    ...     out = model(torch.ones(2, 4))
    >>> out.dtype, wrapper.loss_scale  # bfloat16 needs no loss scaling
    (torch.bfloat16, 1.0)
"""

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
from ..precision import AUTO, auto_dtype
from ..scaler import LossScaler
from ..wrap import wrap_fp16_model
from .contexts import Both, CastIO, Guarded
from .wrapper import OptimWrapper

__all__ = ['AmpOptimWrapper', 'resolve_cast_dtype']


class _DefaultLossScale:
    """The default of ``loss_scale``, told apart from a ``loss_scale`` given twice."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<default: 'dynamic' for float16; no scaling for bfloat16, float32, float64>"


_Tensor = torch.Tensor
_UNSET: Any = _DefaultLossScale()
_LOW_PRECISION = (torch.float16, torch.bfloat16)
#: Full precision dtypes MMEngine accepts: the forward then runs without autocast.
_FULL_PRECISION = {'float32': torch.float32, 'float64': torch.float64}


def resolve_cast_dtype(dtype: Any) -> torch.dtype:
    """The dtype an :class:`AmpOptimWrapper` runs the forward in (None: float16).

    float16 and bfloat16 (or their names) autocast; ``'float32'`` and
    ``'float64'`` (or the torch dtypes), which MMEngine accepts too, run the
    forward without autocast and need no loss scaling. ``'auto'`` is checked
    here and resolved by the wrapper (its parameters' device): it returns
    float16, the dtype of a config that does not name one.

    Example:
        >>> resolve_cast_dtype('float64'), resolve_cast_dtype(None)
        (torch.float64, torch.float16)
    """
    if isinstance(dtype, str):
        full = _FULL_PRECISION.get(dtype.lower().replace('torch.', ''))
        if full is not None:
            return full
        if dtype.lower() == AUTO:
            return torch.float16
    elif dtype in _FULL_PRECISION.values():
        return dtype
    try:
        return dtypes.resolve_dtype(dtype)
    except ValueError:
        raise ValueError(f"Unsupported dtype {dtype!r}; expected 'float16', 'bfloat16', "
                         "'float32' or 'float64' (or the torch dtypes), 'auto' for the best "
                         'native one, or None for float16.') from None


def _bind_loss_scale(owner: str, positional: Any, optimizer: Any,
                     kwargs: Dict[str, Any]) -> Tuple[Any, Any]:
    """Read MMEngine's argument order, and this package's ``(optimizer, loss_scale=...)``.

    MMEngine's order is ``(loss_scale='dynamic', dtype=None, use_fsdp=False,
    *, optimizer, ...)``; an optimizer in the first place is taken as
    ``optimizer=`` so that ``AmpOptimWrapper(optimizer, loss_scale=512.)`` works too.
    """
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

    Native backend (torch >= 1.6): :meth:`optim_context` runs the forward
    inside ``torch.autocast`` on the model's device type (CPU included) with
    ``dtype``; the loss is scaled with a ``torch.amp.GradScaler`` made lazily
    for the device of the parameters; gradients are unscaled before
    clipping, and a step whose gradients hold an inf or a nan is skipped
    (parameters and optimizer state untouched) while the scale backs off.

    Legacy backend (older torch, or ``backend='legacy'`` for pure half
    training): pass ``model=``. The wrapper then owns float32 master copies
    of the optimizer's parameters (they replace the model's parameters in the
    optimizer's ``param_groups``; the optimizer object is kept) and converts
    the model with ``wrap_fp16_model(model, dtype, backend='legacy')``. Inside
    :meth:`optim_context` the model's float32 tensor inputs are cast to
    ``dtype`` and its outputs back to float32. Each step copies the half
    gradients into the masters, lets :class:`LossScaler` decide on a skip,
    steps the masters and copies them back into the model (foreach kernels).
    Build the optimizer on the float32 model, before wrapping.

    Cost: on the native backend a step synchronises with the device once,
    the ``.item()`` that ``GradScaler.step`` always does (the skip flag is
    read right before it, so the two reads share one wait). The scale itself
    is read back (``get_scale()``, one more sync) only on the steps where it
    changes: a skip, or a growth every ``growth_interval`` clean steps.
    ``state_dict()`` costs no sync. The legacy backend also syncs once per
    step (the fused overflow check).

    The arguments are in MMEngine's order, ``(loss_scale, dtype, use_fsdp)``
    then keywords (``optimizer=`` among them); an optimizer given first, as
    ``AmpOptimWrapper(optimizer, loss_scale=512.)``, is read as ``optimizer=``.

    Args:
        loss_scale: ``'dynamic'`` (GradScaler's defaults: 2**16, x2 every 2000
            clean steps, /2 on overflow), a number (a static scale: never
            grows or backs off, but a non-finite step is still skipped), or a
            dict of GradScaler arguments (init_scale, growth_factor,
            backoff_factor, growth_interval, enabled; mmcv's init_scale,
            mode, scale_factor, scale_window are accepted too).
        dtype: ``torch.float16`` (default) or ``torch.bfloat16`` (or their
            names). bfloat16 needs no loss scaling and gets none.
            ``'float32'`` / ``'float64'`` run the forward without autocast
            (and without loss scaling), as a switch in a config. ``'auto'``:
            bfloat16 where it is native on the parameters' device
            (:func:`fp16utils.precision_support`), else float16 (with
            ``loss_scale``) where that is native, else float32, said in one
            log line (:attr:`auto_reason`) at the first :meth:`optim_context`.
        use_fsdp: Set it when the parameters are sharded across ranks (FSDP):
            the ranks then agree on a skip (one all-reduce of the found-inf
            flag per step), as MMEngine's ``ShardedGradScaler`` makes them.
        optimizer: Optimizer built on the (float32) model parameters.
        backend: ``'native'``, ``'legacy'`` or None for the default (see
            ``fp16utils._torch.default_backend``).
        accumulative_counts: See :class:`OptimWrapper`.
        clip_grad: See :class:`OptimWrapper`.
        model: The float32 model the optimizer was built on. Required by the
            legacy backend (it is converted in place); unused by the native one.
        nonfinite: What to do with an inf/nan gradient when no dynamic scale
            can back off (bfloat16, scaling disabled, a static scale):
            ``'warn'`` (default) skips the update and logs a warning,
            ``'raise'`` raises ``FloatingPointError`` before anything changes
            (the gradients are left in place for inspection: call
            :meth:`zero_grad` before training on),
            ``'ignore'`` applies it as plain torch would (and saves the one
            fused check and device sync it costs when nothing is scaled).
            With a dynamic scale an overflow always skips and backs off, and
            the scale never goes below ``min(1, init_scale)``.
        overflow_guard: None (default), or ``dict(max_consecutive=3,
            action='diagnose')``: after ``max_consecutive`` skipped steps in a
            row, or a skip that leaves the dynamic scale at its floor, the
            next forward (from :meth:`optim_context`) and backward run under
            :func:`~fp16utils.find_overflow`; ``'diagnose'`` then logs the
            report once per streak, ``'raise'`` raises ``FloatingPointError``
            (the report in its ``report`` attribute) before the optimizer
            steps. Costs nothing while steps are clean.
        agree_across_ranks: None (default: the ranks agree on every skip, one
            MAX all-reduce of one flag per step, when torch.distributed runs
            with a world size > 1), True, False (each rank decides alone: for
            ranks that do not train one model) or a process group to agree
            within. While they agree, every rank must step the same number of
            times (see :mod:`fp16utils.engine.ranks`).
        fp32_modules: Submodules to run in float32 under autocast
            (:func:`fp16utils.keep_fp32`: name patterns such as
            ``'roi_head.*'``, classes, class names): applied to ``model`` now
            when it is given, else to the model at the first
            :meth:`optim_context` (names relative to the model given there, a
            DDP/DataParallel wrapper looked through; that first context must
            run outside ``torch.compile``). Legacy backend: applied when the
            model is converted; those modules keep float32 weights.

    Attributes:
        dtype: The resolved dtype (float16 when ``dtype=None``).
        cast_dtype: ``dtype`` as given, as a torch dtype (None stays None;
            ``'auto'`` gives the resolved dtype), the attribute MMEngine's
            wrapper has.
        auto_reason: Why ``dtype='auto'`` fell back to float32 (else None).
        skipped_steps: Steps skipped for non-finite gradients.
        scale_history: ``(step, scale)`` at the start and at each change of
            the scale, latest :data:`SCALE_HISTORY_LEN` kept; ``step`` is the
            iteration count (:attr:`inner_count`) of the update.

    Raises:
        ValueError: For a bad ``loss_scale``, ``dtype``, ``backend`` or
            ``clip_grad``, or the legacy backend without ``model``. Nothing
            is changed then.

    Example:
        >>> import torch
        >>> from torch import nn
        >>> model = nn.Linear(4, 2)
        >>> wrapper = AmpOptimWrapper(torch.optim.Adam(model.parameters()),
        ...                           loss_scale=dict(init_scale=1024.), dtype='float16')
        >>> with wrapper.optim_context(model):
        ...     out = model(torch.ones(3, 4))
        >>> out.dtype
        torch.float16
        >>> wrapper.update_params(out.float().sum()).scale
        1024.0
        >>> wrapper.state_dict()['loss_scaler']['scale']
        1024.0
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
        #: Why dtype='auto' fell back to float32 (logged at the first optim_context).
        self.auto_reason: Optional[str] = None
        if isinstance(dtype, str) and dtype.lower() == AUTO:
            dtype, self.auto_reason = auto_dtype(params[0].device if params else None)
        self.dtype: torch.dtype = resolve_cast_dtype(dtype)
        #: The ``dtype`` argument as a torch dtype (None stays None), as MMEngine keeps it.
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
            if self.dtype not in _LOW_PRECISION or use_fsdp:
                raise ValueError(
                    f'{owner}: the legacy backend runs a float16 or bfloat16 model without '
                    f'FSDP; got dtype={self.dtype}, use_fsdp={use_fsdp}: use '
                    "backend='native'." + (f' ({self.auto_reason})' if self.auto_reason else ''))
            self._engine = LegacyEngine(optimizer, spec, self.dtype, owner, nonfinite, clip)
            convert_or_defer(model, self.dtype, fp32_modules)
            _mark_fp32_done(model, self._fp32_token)
        else:
            self._engine = NativeEngine(spec, self.dtype, self._param_device_type, nonfinite,
                                        clip, owner=owner)
            if model is not None and fp32_modules is not None:  # now: not inside a trace
                keep_fp32(model, fp32_modules)
                _mark_fp32_done(model, self._fp32_token)
        self._engine.agree_across_ranks = agree
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
        """``(step, scale)`` at the start and at each change of the loss scale."""
        return self._engine.scale_history

    @property
    def master_params(self) -> Optional[List[nn.Parameter]]:
        """The float32 master weights (legacy backend), else None."""
        return self._engine.masters

    # -- the step ---------------------------------------------------------------------------

    def optim_context(self, model: nn.Module, cache_enabled: Optional[bool] = None
                      ) -> contextlib.AbstractContextManager:
        """Context for the forward pass: autocast (native) or half inputs (legacy).

        Native: ``torch.autocast`` on the model's device type with
        :attr:`dtype` (autocast disabled for float32 / float64). Legacy:
        float32 tensor inputs of ``model`` are cast to :attr:`dtype` and its
        outputs back to float32. In both cases the
        parent's context (no DDP gradient all-reduce while accumulating) is
        entered first. The first call with a model applies ``fp32_modules``
        to it (and logs :attr:`auto_reason`, if any).

        Args:
            model: The model (or the sub-model) run inside the context.
            cache_enabled: Passed to ``torch.autocast`` (native backend): False
                turns off its weight-cast cache, which pytorch#105211 needs
                when a ``no_grad`` sub-forward runs before a forward that
                trains the same weights; None keeps torch's default (on).
                The legacy backend runs no autocast: accepted, no effect.

        Returns:
            A context manager, to be entered once.
        """
        check_cache_enabled(cache_enabled, type(self).__name__)
        if self.fp32_modules is not None or self.auto_reason is not None:
            self._first_context(model)
        if self.backend == 'native':
            device_type = self._model_device_type(model)
            if self.dtype in _LOW_PRECISION:
                inner: contextlib.AbstractContextManager = autocast.autocast_for(
                    device_type, self.dtype, cache_enabled=cache_enabled)
            else:  # float32 / float64: full precision, autocast off
                inner = autocast.autocast_for(device_type, enabled=False)
        else:
            inner = CastIO(model, self.dtype)
        # The parent's context (no DDP all-reduce while accumulating), decided once.
        context = Both(model.no_sync(), inner) if self._skips_sync(model) else inner
        guard = self._guard
        if guard is not None and guard.armed:
            return Both(Guarded(guard, model), context)
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
        """The device type of ``model``'s first parameter (or buffer).

        Where that tensor lives is looked up anew on each call, through the
        submodule that owns it, so ``model.to(...)``, parameters replaced by
        ``load_state_dict(..., assign=True)`` and swapped modules are seen;
        only the path to it is cached (not inside a trace: dynamo cannot trace weakrefs
        everywhere, and the traced graph keeps the answer anyway).
        """
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

        ``'loss_scaler'`` is ``GradScaler.state_dict()`` on the native backend
        and ``LossScaler.state_dict()`` (mmcv's keys) on the legacy one; each
        backend loads either. ``'master_params'`` holds the float32 master
        weights (references, like the optimizer state), needed to resume a
        half model exactly.
        """
        return super().state_dict()

    def load_state_dict(self, state_dict: Mapping[str, Any]) -> None:
        """Restore a state written by :meth:`state_dict` (the argument is not changed).

        Without ``'master_params'`` (a native checkpoint), the legacy backend
        re-reads its masters from the model's current weights. Everything is
        checked before anything is loaded.
        """
        super().load_state_dict(state_dict)

    def __repr__(self) -> str:
        return (f'{type(self).__name__}(optimizer={type(self.optimizer).__name__}, '
                f'backend={self.backend!r}, dtype={self.dtype}, loss_scale={self.loss_scale}, '
                f'accumulative_counts={self.accumulative_counts}, '
                f'clip_grad={self.clip_grad})')


#: The attribute in which a model lists the wrappers (their tokens) that applied their
#: fp32_modules to it: a plain read for a trace (dynamo cannot look into a WeakSet
#: everywhere), and a deepcopy of the model, whose forwards are kept too, keeps it.
_FP32_DONE = '_fp16utils_fp32_done'


def _mark_fp32_done(model: nn.Module, token: str) -> None:
    model.__dict__[_FP32_DONE] = (*model.__dict__.get(_FP32_DONE, ()), token)


#: Per thread: where legacy model conversions wait while :func:`deferred_model_conversion` runs.
_deferred = threading.local()


@contextlib.contextmanager
def deferred_model_conversion() -> Iterator[List[Callable[[], Any]]]:
    """Collect the legacy backend's model conversions instead of running them.

    Inside the block, an :class:`AmpOptimWrapper` on the legacy backend
    appends its model's conversion to half to the yielded list instead of
    converting; the caller runs them once every wrapper is built, so that an
    error building a later one leaves every model as it was.

    Example:
        >>> import torch
        >>> model = torch.nn.Linear(2, 1)
        >>> with deferred_model_conversion() as conversions:
        ...     wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1),
        ...                               backend='legacy', model=model)
        >>> model.weight.dtype, len(conversions)
        (torch.float32, 1)
        >>> for convert in conversions:
        ...     _ = convert()
        >>> model.weight.dtype
        torch.float16
    """
    outer = getattr(_deferred, 'pending', None)
    pending: List[Callable[[], Any]] = []
    _deferred.pending = pending
    try:
        yield pending
    finally:
        _deferred.pending = outer


def convert_or_defer(model: nn.Module, dtype: torch.dtype, fp32_modules: Any = None) -> None:
    """Convert ``model`` for the legacy backend now, or later inside a deferral.

    What :class:`AmpOptimWrapper` calls on the legacy backend: outside
    :func:`deferred_model_conversion` it is ``wrap_fp16_model(model, dtype,
    backend='legacy', fp32_modules=fp32_modules)``.

    Example:
        >>> model = torch.nn.Linear(2, 1)
        >>> convert_or_defer(model, torch.float16)
        >>> model.weight.dtype
        torch.float16
    """
    convert = functools.partial(wrap_fp16_model, model, dtype, backend='legacy',
                                fp32_modules=fp32_modules)
    pending = getattr(_deferred, 'pending', None)
    if pending is None:
        convert()
    else:
        pending.append(convert)
