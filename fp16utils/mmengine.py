"""The MMEngine plug-in: this package's optimizer wrappers inside MMEngine's own Runner.

Importing it (in a config: ``custom_imports=dict(imports=['fp16utils.mmengine'])``)
registers, under names of their own, ``Fp16utilsOptimWrapper``,
``Fp16utilsAmpOptimWrapper`` and ``Fp16utilsOptimWrapperDict`` in ``OPTIM_WRAPPERS``
(also instances of MMEngine's classes, as the Runner checks), and
``Fp16utilsOptimWrapperConstructor`` and ``Fp16utilsMultiOptimWrapperConstructor``
in ``OPTIM_WRAPPER_CONSTRUCTORS``. MMEngine's own names are left alone. Warnings go
to the run's log; after each update the wrappers report ``train/grad_norm`` (when
clipping by norm) and ``train/loss_scale`` to the ``MessageHub``, as MMEngine's do.

``skip_aware_hooks=True`` on a wrapper (on every entry of a dict) makes the Runner's
``ParamSchedulerHook`` and ``EMAHook`` not advance on a skipped step (see
:mod:`fp16utils.hooks.runner_bridge`; docs/how-to/schedulers-ema.md).

Example:
    >>> import fp16utils.mmengine  # doctest: +SKIP
    >>> cfg = dict(  # doctest: +SKIP
    ...     custom_imports=dict(imports=['fp16utils.mmengine']),
    ...     optim_wrapper=dict(type='Fp16utilsAmpOptimWrapper', dtype='bfloat16',
    ...                        optimizer=dict(type='SGD', lr=0.01)))
"""

from __future__ import annotations

from typing import Any, Dict, Optional

try:
    from mmengine.logging import MessageHub, MMLogger
    from mmengine.optim import OptimWrapper as _MMOptimWrapper
    from mmengine.optim import OptimWrapperDict as _MMOptimWrapperDict
    from mmengine.registry import LOOPS, OPTIM_WRAPPER_CONSTRUCTORS, OPTIM_WRAPPERS, OPTIMIZERS
    from mmengine.runner import TestLoop as _MMTestLoop
    from mmengine.runner import ValLoop as _MMValLoop
except ImportError as _err:
    raise ModuleNotFoundError(
        f'fp16utils.mmengine is the plug-in for MMEngine and needs mmengine, which is not '
        f'importable ({_err}). Install it (pip install mmengine), or, without MMEngine, '
        'use fp16utils.AmpOptimWrapper directly.', name=getattr(_err, 'name', None)
    ) from _err
from torch import nn

from ._args.skip_hooks import MMENGINE_FOLLOWED, OPTION
from ._args.spec import PLUGIN_NAMES
from ._torch import models
from .evaluation.mmengine_loops import HalfPrecisionLoop
from .hooks import runner_bridge
from .hooks.follow import SkipLedger
from .optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict
from .optim.constructor import check_paramwise_cfg, paramwise_groups

__all__ = ['Fp16utilsAmpOptimWrapper', 'Fp16utilsMultiOptimWrapperConstructor',
           'Fp16utilsOptimWrapper', 'Fp16utilsOptimWrapperConstructor',
           'Fp16utilsOptimWrapperDict', 'Fp16utilsTestLoop', 'Fp16utilsValLoop']



class _CurrentMMLogger:
    """Forwards warnings to MMEngine's current logger (the Runner's), found at each call."""

    def warning(self, message: str) -> None:
        MMLogger.get_current_instance().warning(message)


class _MMEngineSide:
    """What MMEngine's code reads on a wrapper beyond the shared API, the logging, and
    ``skip_aware_hooks`` (False: MMEngine's behaviour; True or a list of hook classes:
    the Runner's schedule and EMA hooks do not advance on a skipped step)."""

    def __init__(self, *args: Any, skip_aware_hooks: Any = False, **kwargs: Any) -> None:
        SkipLedger.parse(skip_aware_hooks, type(self).__name__, MMENGINE_FOLLOWED)  # checked
        super().__init__(*args, **kwargs)
        self.logger = _CurrentMMLogger()
        #: The ``skip_aware_hooks`` setting, as given (read when a Runner's run starts).
        self.skip_aware_hooks = skip_aware_hooks
        if skip_aware_hooks not in (False, None):
            from mmengine.runner import Runner  # the Runner's call_hook connects the run

            runner_bridge.install(Runner)  # once per process; inert for the other runners

    def update_params(self, *args: Any, **kwargs: Any) -> Any:
        if self.skip_aware_hooks not in (False, None) and not runner_bridge.connected(self):
            raise RuntimeError(
                f'{type(self).__name__}({OPTION}={self.skip_aware_hooks!r}): no MMEngine Runner '
                "follows this wrapper's steps; a Runner (mmengine.runner.Runner) connects it "
                'when its run starts (before_run). In a training loop of your own, use '
                'fp16utils.skip_aware(scheduler, wrapper) instead, or drop the option.')
        return super().update_params(*args, **kwargs)  # type: ignore[misc]

    @property
    def message_hub(self) -> MessageHub:
        """The current MMEngine ``MessageHub`` (where the update logs its scalars)."""
        return MessageHub.get_current_instance()

    @property
    def _accumulative_counts(self) -> int:  # read by MMEngine's strategies
        return self.accumulative_counts  # type: ignore[attr-defined]

    @property
    def _max_counts(self) -> int:
        return self.max_counts  # type: ignore[attr-defined]

    @property
    def _remainder_counts(self) -> int:
        total = self.max_counts  # type: ignore[attr-defined]
        return -1 if total == -1 else total % self.accumulative_counts  # type: ignore

    @property
    def clip_grad_kwargs(self) -> Optional[Dict[str, Any]]:
        """The clipping arguments without ``type`` (MMEngine's attribute), or None."""
        clip = self.clip_grad  # type: ignore[attr-defined]
        if clip is None:
            return None
        clip.pop('type')
        return clip

    def step(self, **kwargs: Any) -> Any:
        result = super().step(**kwargs)  # type: ignore[misc]
        self._log_scalars()
        return result

    def _log_scalars(self) -> None:
        hub = self.message_hub
        name = self.__dict__.get('_log_name')  # set by the dict: 'train/generator.loss_scale'
        prefix = f'train/{name}.' if name else 'train/'
        norm = self.grad_norm  # type: ignore[attr-defined]
        if norm is not None and norm is not self.__dict__.get('_logged_norm'):
            hub.update_scalar(f'{prefix}grad_norm', float(norm))  # a sync, as in MMEngine
            self._logged_norm = norm
        scale = getattr(self, 'loss_scale', None)
        if scale is not None:
            hub.update_scalar(f'{prefix}loss_scale', scale)


class Fp16utilsOptimWrapper(_MMEngineSide, OptimWrapper, _MMOptimWrapper):
    """:class:`fp16utils.OptimWrapper`, also an ``mmengine.optim.OptimWrapper``.

    Example:
        >>> import torch  # doctest: +SKIP
        >>> w = Fp16utilsOptimWrapper(torch.optim.SGD(torch.nn.Linear(1, 1).parameters(),
        ...                                           lr=0.1))  # doctest: +SKIP
    """


class Fp16utilsAmpOptimWrapper(_MMEngineSide, AmpOptimWrapper, _MMOptimWrapper):
    """:class:`fp16utils.AmpOptimWrapper`, also an ``mmengine.optim.OptimWrapper``.

    Unlike MMEngine's ``AmpOptimWrapper`` it runs on the CPU too, in float16 or
    bfloat16.

    Example:
        >>> import torch  # doctest: +SKIP
        >>> w = Fp16utilsAmpOptimWrapper(optimizer=torch.optim.SGD(
        ...     torch.nn.Linear(1, 1).parameters(), lr=0.1), dtype='bfloat16')  # doctest: +SKIP
    """


class Fp16utilsOptimWrapperDict(OptimWrapperDict, _MMOptimWrapperDict):
    """:class:`fp16utils.OptimWrapperDict`, also an ``mmengine.optim.OptimWrapperDict``.

    Its entries may be MMEngine's own wrappers too; each logs under its name
    (``train/generator.loss_scale``). ``initialize_count_status`` does nothing, as in
    MMEngine.

    Example:
        >>> import torch  # doctest: +SKIP
        >>> d = Fp16utilsOptimWrapperDict(gen=Fp16utilsOptimWrapper(torch.optim.SGD(
        ...     torch.nn.Linear(1, 1).parameters(), lr=0.1)))  # doctest: +SKIP
    """

    _entry_types = (OptimWrapper, _MMOptimWrapper)

    def __init__(self, **wrappers: Any) -> None:
        super().__init__(**wrappers)
        for name, wrapper in wrappers.items():
            if isinstance(wrapper, _MMEngineSide):
                wrapper._log_name = name  # its scalars: 'train/<name>.loss_scale'

    def initialize_count_status(self, model: nn.Module, init_counts: int,
                                max_counts: int) -> None:
        """Do nothing (MMEngine's behaviour); call it on each entry where needed."""

    def __repr__(self) -> str:
        """MMEngine's form: ``name: <name>`` then the entry, for each entry."""
        return ''.join(f'name: {name}\n{wrapper!r}\n'
                       for name, wrapper in self.optim_wrappers.items())


#: Standard wrapper names that this package's constructors read as its own wrappers.
_OWN_WRAPPERS = {None: Fp16utilsOptimWrapper, 'OptimWrapper': Fp16utilsOptimWrapper,
        'AmpOptimWrapper': Fp16utilsAmpOptimWrapper}


class Fp16utilsOptimWrapperConstructor:
    """Build one wrapper, applying ``paramwise_cfg`` as MMEngine's default constructor does.

    Under it, ``type='OptimWrapper'`` / ``'AmpOptimWrapper'`` (or no type) build this
    package's wrappers; the legacy backend gets the model it converts.

    Args:
        optim_wrapper_cfg: ``dict(type=..., optimizer=dict(type=..., lr=...), ...)``;
            the optimizer type is looked up in MMEngine's ``OPTIMIZERS``, the
            wrapper type in ``OPTIM_WRAPPERS``.
        paramwise_cfg: The options of MMEngine's ``DefaultOptimWrapperConstructor``.

    Raises:
        TypeError: ``optim_wrapper_cfg`` is not a dict, or ``paramwise_cfg`` holds a
            value of the wrong type.
        ValueError: It has no ``optimizer`` dict, or ``paramwise_cfg`` an unknown option.

    Example:
        >>> from torch import nn  # doctest: +SKIP
        >>> Fp16utilsOptimWrapperConstructor(dict(optimizer=dict(type='SGD', lr=0.1)))(
        ...     nn.Linear(2, 1))  # doctest: +SKIP
    """

    def __init__(self, optim_wrapper_cfg: Dict[str, Any],
                 paramwise_cfg: Optional[Dict[str, Any]] = None) -> None:
        if not isinstance(optim_wrapper_cfg, dict):
            raise TypeError(f'optim_wrapper should be a dict, got '
                            f'{type(optim_wrapper_cfg).__name__}.')
        if not isinstance(optim_wrapper_cfg.get('optimizer'), dict):
            raise ValueError("optim_wrapper needs an 'optimizer' dict, e.g. "
                             "optimizer=dict(type='SGD', lr=0.01).")
        self.optim_wrapper_cfg = dict(optim_wrapper_cfg)
        self.optimizer_cfg = dict(self.optim_wrapper_cfg.pop('optimizer'))
        self.paramwise_cfg = check_paramwise_cfg(paramwise_cfg, self.optimizer_cfg,
                                                 'optim_wrapper')

    def __call__(self, model: nn.Module) -> _MMOptimWrapper:
        model = models.unwrap_model(model, any_wrapper=True)
        kwargs = dict(self.optimizer_cfg)
        optimizer_cls = _lookup(OPTIMIZERS, kwargs.pop('type', None), 'optimizer')
        params: Any = model.parameters()
        if self.paramwise_cfg:
            params = paramwise_groups(model, self.paramwise_cfg, kwargs.get('lr'),
                                      kwargs.get('weight_decay'))
        optimizer = optimizer_cls(params, **kwargs)
        cfg = dict(self.optim_wrapper_cfg)
        wtype = cfg.pop('type', None)
        wrapper_cls = _OWN_WRAPPERS.get(wtype) if isinstance(wtype, (str, type(None))) else None
        if wrapper_cls is None:
            wrapper_cls = _lookup(OPTIM_WRAPPERS, wtype, 'wrapper')
        if issubclass(wrapper_cls, AmpOptimWrapper):
            cfg['model'] = model  # the legacy backend converts it
        return wrapper_cls(optimizer=optimizer, **cfg)


class Fp16utilsMultiOptimWrapperConstructor:
    """One wrapper per sub-model (GANs, as in MMagic), each with its own ``paramwise_cfg``.

    Args:
        optim_wrapper_cfg: ``{sub-model name: wrapper config}``.
        paramwise_cfg: Must be None: give it inside each entry.

    Raises:
        ValueError: A top-level ``paramwise_cfg``, an empty or non-dict config, or
            (when called) a sub-model the model does not have.

    Example:
        >>> from torch import nn  # doctest: +SKIP
        >>> gan = nn.ModuleDict(dict(generator=nn.Linear(2, 2)))  # doctest: +SKIP
        >>> Fp16utilsMultiOptimWrapperConstructor(dict(generator=dict(
        ...     optimizer=dict(type='Adam', lr=1e-4))))(gan)  # doctest: +SKIP
    """

    def __init__(self, optim_wrapper_cfg: Dict[str, Any],
                 paramwise_cfg: Optional[Dict[str, Any]] = None) -> None:
        if paramwise_cfg is not None:
            raise ValueError('Fp16utilsMultiOptimWrapperConstructor takes paramwise_cfg inside '
                             'each sub-model config, not at the top.')
        if not isinstance(optim_wrapper_cfg, dict) or not optim_wrapper_cfg:
            raise ValueError('Fp16utilsMultiOptimWrapperConstructor needs one wrapper config '
                             'per sub-model, e.g. generator=dict(optimizer=...).')
        self.constructors = {}
        for name, entry in optim_wrapper_cfg.items():
            if not isinstance(entry, dict):
                raise ValueError(f'optim_wrapper.{name} must be a wrapper config dict, got '
                                 f'{entry!r}.')
            entry = dict(entry)
            self.constructors[name] = Fp16utilsOptimWrapperConstructor(
                entry, entry.pop('paramwise_cfg', None))

    def __call__(self, model: nn.Module) -> Fp16utilsOptimWrapperDict:
        model = models.unwrap_model(model, any_wrapper=True)
        children = dict(model.named_children())
        missing = [name for name in self.constructors if name not in children]
        if missing:
            raise ValueError(f'optim_wrapper: the model ({type(model).__name__}) has no '
                             f'sub-module(s) {missing}; its sub-modules are {list(children)}.')
        return Fp16utilsOptimWrapperDict(**{
            name: constructor(children[name]) for name, constructor in self.constructors.items()})


def _lookup(registry: Any, name: Any, what: str) -> type:
    if isinstance(name, type):
        return name
    cls = registry.get(name) if isinstance(name, str) else None
    if cls is None:
        raise ValueError(f'optim_wrapper: unknown {what} type {name!r} (not in MMEngine\'s '
                         f'{registry.name} registry).')
    return cls


for _cls, _key in ((Fp16utilsOptimWrapper, 'OptimWrapper'),
                   (Fp16utilsAmpOptimWrapper, 'AmpOptimWrapper'),
                   (Fp16utilsOptimWrapperDict, 'OptimWrapperDict')):
    OPTIM_WRAPPERS.register_module(name=PLUGIN_NAMES[_key], module=_cls, force=True)
for _cls, _key in ((Fp16utilsOptimWrapperConstructor, 'DefaultOptimWrapperConstructor'),
                   (Fp16utilsMultiOptimWrapperConstructor, 'MultiOptimWrapperConstructor')):
    OPTIM_WRAPPER_CONSTRUCTORS.register_module(name=PLUGIN_NAMES[_key], module=_cls, force=True)


class Fp16utilsValLoop(HalfPrecisionLoop, _MMValLoop):
    """MMEngine's ``ValLoop`` whose ``fp16=True`` runs the configured dtype, on any device.

    Args:
        runner: The Runner.
        dataloader: A dataloader or its config.
        evaluator: An evaluator or its config.
        fp16: Evaluate in half precision (False: float32, as MMEngine's loop).
        dtype: float16, bfloat16, ``'auto'`` or float32; None: the optimizer
            wrapper's (``runner.optim_wrapper``, built or its config), else float16
            where autocast runs it on the model's device, else bfloat16.
        fp32_modules: Modules run in float32 during the loop, besides the wrapper's
            (``keep_fp32``'s forms); put back when the loop ends.

    Raises:
        ValueError: ``dtype`` or ``fp32_modules`` without ``fp16=True``; an unknown
            dtype; wrappers of different dtypes (when ``dtype`` is None); when the
            loop runs, what :func:`~fp16utils.evaluation.eval_precision` refuses.

    Example:
        >>> val_cfg = dict(type='Fp16utilsValLoop', fp16=True)  # the wrapper's dtype
        >>> test_cfg = dict(type='Fp16utilsTestLoop', fp16=True, dtype='bfloat16',
        ...                 fp32_modules=['roi_head.*'])
    """

    _step_name = 'val_step'


class Fp16utilsTestLoop(HalfPrecisionLoop, _MMTestLoop):
    """MMEngine's ``TestLoop`` whose ``fp16=True`` runs the configured dtype, on any device.

    The arguments, errors and precision are those of ``Fp16utilsValLoop``.

    Example:
        >>> test_cfg = dict(type='Fp16utilsTestLoop', fp16=True)
    """

    _step_name = 'test_step'


for _cls in (Fp16utilsValLoop, Fp16utilsTestLoop):
    LOOPS.register_module(name=_cls.__name__, module=_cls, force=True)
