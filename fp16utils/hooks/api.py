"""What mmcv 1.x's optimizer hooks give their subclasses (``clip_grads``, ``loss_scaler``,
``_scale_update_param``, ``copy_grads_to_fp32``, ...), with mmcv's signatures and meaning."""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterable, List, Optional

import torch
from torch import nn

from .._args.spec import MMCV_LOSS_SCALE, parse_clip_grad
from .._torch import compat
from .._torch.models import BatchNormBase as _BatchNorm
from .base import RunnerHook, follow_mmcv, follows_mmcv, set_base

__all__ = ['CumulativeHookApi', 'OptimizerHookApi', 'follow_mmcv', 'set_base']

logger = logging.getLogger('fp16utils')


@follows_mmcv
class OptimizerHookApi(RunnerHook):
    """mmcv's ``OptimizerHook`` API for the hooks' subclasses; its base follows mmcv's ``Hook``.

    A subclass whose ``__init__`` sets mmcv's attributes instead of calling ours is set
    up from them when first used.
    """

    #: mmcv's flag: when True, each iteration first logs the parameters the loss does not use.
    detect_anomalous_params = False
    #: The runner hooks that ``skip_aware_hooks`` follows (None: off; also for a hook
    #: unpickled from a version without the option).
    _skips: Any = None

    @property
    def skip_aware_hooks(self) -> Any:
        """The hook classes the ``skip_aware_hooks`` option follows (a tuple), or False."""
        skips = self._skips
        return False if skips is None else skips.followed

    # -- a subclass whose __init__ does not call ours ----------------------------------------

    def __getattr__(self, name: str) -> Any:
        # Reached only for an attribute not found: on a hook whose subclass __init__ set
        # mmcv's attributes without calling super().__init__, set up from them, once.
        state = self.__dict__
        if name.startswith('__') or state.get('_set_up') or state.get('_setting_up'):
            raise AttributeError(f'{type(self).__name__!r} object has no attribute {name!r}')
        state['_setting_up'] = True
        try:
            self._set_up_from_attributes()
        finally:
            state.pop('_setting_up', None)
        return object.__getattribute__(self, name)

    def _set_up_from_attributes(self) -> None:
        """Run the first ``__init__`` of this package along the MRO with what an mmcv-style
        ``__init__`` set (an assigned mmcv ``LossScaler`` picks the legacy backend)."""
        state = self.__dict__
        given = state.get('_given_scaler')
        update = state.get('_scale_update_param')
        kwargs: Dict[str, Any] = dict(
            grad_clip=state.get('_grad_clip'), coalesce=state.get('coalesce', True),
            bucket_size_mb=state.get('bucket_size_mb', -1),
            distributed=state.get('distributed', True),
            loss_scale=update if update is not None else _loss_scale_of(given))
        if given is not None and hasattr(given, 'update_scale'):
            kwargs['backend'] = 'legacy'
        kwargs.update(self._set_up_arguments())
        init = next(cls.__dict__['__init__'] for cls in type(self).__mro__
                    if '__init__' in cls.__dict__ and cls.__module__.startswith('fp16utils.'))
        init(self, **kwargs)

    def _set_up_arguments(self) -> Dict[str, Any]:
        return {}

    def __getstate__(self) -> Dict[str, Any]:
        # Tensors pickle without their .grad: keep the gradients of an unfinished
        # accumulation window (references: pickled with their parameters).
        state = self.__dict__.copy()
        engine, optimizer = state.get('_engine'), state.get('_optimizer')
        if engine is not None and optimizer is not None:
            state['_grads'] = [p.grad for p in engine.grad_params(optimizer)]
        return state

    def __setstate__(self, state: Dict[str, Any]) -> None:
        grads = state.pop('_grads', None)
        self.__dict__.update(state)
        if grads is not None:
            for p, grad in zip(state['_engine'].grad_params(state['_optimizer']), grads):
                p.grad = grad

    # -- grad_clip and clip_grads ------------------------------------------------------------

    @property
    def grad_clip(self) -> Optional[dict]:
        """The clipping settings (None: none); checked when set, read at each update as mmcv."""
        return self.__dict__.get('_grad_clip')

    @grad_clip.setter
    def grad_clip(self, value: Optional[dict]) -> None:
        clip = parse_clip_grad(value, type(self).__name__)  # refused: nothing changes
        settings = None if value is None else dict(value)
        self.__dict__.update(_grad_clip=settings, _grad_clip_seen=_snapshot(settings),
                             _clip=clip)
        engine = self.__dict__.get('_engine')
        if engine is not None:
            engine.clip = clip

    def _refresh_clip(self) -> None:
        """Take a ``grad_clip`` dict changed in place (mmcv reads it at each update)."""
        settings = self.__dict__.get('_grad_clip')
        if settings != self.__dict__.get('_grad_clip_seen'):
            self.grad_clip = settings

    def clip_grads(self, params: Iterable[Any]) -> Optional[torch.Tensor]:
        """Clip the gradients of ``params`` as ``grad_clip`` says (mmcv's ``clip_grads``).

        The hook's own update calls it (on the model's parameters, native; on the
        float32 masters, legacy), so a subclass that overrides it changes the clipping.

        Args:
            params: Parameters (e.g. ``runner.model.parameters()``).

        Returns:
            The total norm before clipping (a 0-dim tensor) when clipping by norm;
            None when clipping by value or when no parameter has a gradient.

        Raises:
            TypeError: ``grad_clip`` is None (mmcv calls ``clip_grads`` only
                when it is set).

        Example:
            >>> import torch
            >>> from fp16utils import Fp16OptimizerHook
            >>> hook = Fp16OptimizerHook(grad_clip=dict(type='value', clip_value=0.5))
            >>> p = torch.nn.Parameter(torch.ones(2)); p.grad = torch.full((2,), 3.0)
            >>> hook.clip_grads([p]), p.grad.tolist()
            (None, [0.5, 0.5])
        """
        owner = type(self).__name__
        clip = parse_clip_grad(self.grad_clip, owner)
        if clip is None:
            raise TypeError(f'{owner}.clip_grads(): grad_clip is None, so there is nothing to '
                            'clip with; set grad_clip=dict(max_norm=..., norm_type=2) (mmcv '
                            'calls clip_grads only when grad_clip is set).')
        chosen = [p for p in params if p.requires_grad and p.grad is not None]
        if not chosen:
            return None
        kind, kwargs = clip
        if kind == 'norm':
            return compat.clip_grad_norm_(chosen, **kwargs)
        compat.clip_grad_value_(chosen, **kwargs)
        return None

    def _clip_override(self) -> Any:
        """``self.clip_grads`` when a subclass overrides it (the engine then clips with it)."""
        return None if type(self).clip_grads is OptimizerHookApi.clip_grads else self.clip_grads

    # -- the loss scaler ---------------------------------------------------------------------

    @property
    def loss_scaler(self) -> Any:
        """The GradScaler (native) or LossScaler (legacy), from ``before_run`` on; one
        assigned (as an mmcv-style ``__init__`` does) is scaled with."""
        engine = self.__dict__.get('_engine')
        return self.__dict__.get('_given_scaler') if engine is None else engine.scaler

    @loss_scaler.setter
    def loss_scaler(self, scaler: Any) -> None:
        engine = self.__dict__.get('_engine')
        if engine is not None:
            engine.adopt_scaler(scaler)  # checks it first: a refused one changes nothing
        self.__dict__['_given_scaler'] = scaler

    @property
    def _scale_update_param(self) -> Optional[float]:
        """What mmcv's hook gives ``loss_scaler.update()``: the static scale, else None."""
        if '_scale_update_param' in self.__dict__:  # set, as an mmcv-style __init__ does
            return self.__dict__['_scale_update_param']
        spec = self._scale_spec(self.backend)  # Fp16OptimizerHook's
        return spec.init_scale if spec.static else None

    @_scale_update_param.setter
    def _scale_update_param(self, value: Optional[float]) -> None:
        self.__dict__['_scale_update_param'] = value

    # -- mmcv's fp16 helpers -----------------------------------------------------------------

    def copy_grads_to_fp32(self, fp16_net: nn.Module, fp32_weights: Iterable[Any]) -> None:
        """Copy the gradients of ``fp16_net``'s parameters into ``fp32_weights`` (mmcv's).

        Paired in order; a parameter without a gradient is left out, and a pair that
        is one tensor (the native backend's optimizer holds the model's) is left alone.

        Args:
            fp16_net: The (half) model.
            fp32_weights: The float32 weights, in the order of ``fp16_net.parameters()``.
        """
        dst: List[torch.Tensor] = []
        src: List[torch.Tensor] = []
        for master, param in zip(fp32_weights, fp16_net.parameters()):
            grad = param.grad
            if grad is None or master is param:
                continue
            if master.grad is None:
                master.grad = torch.empty_like(master)
            dst.append(master.grad)
            src.append(grad)
        if dst:
            compat.foreach_copy_(dst, src)

    def copy_params_to_fp16(self, fp16_net: nn.Module, fp32_weights: Iterable[Any]) -> None:
        """Copy ``fp32_weights`` into ``fp16_net``'s parameters, in order (mmcv's); a pair
        that is one tensor is left alone.

        Args:
            fp16_net: The (half) model.
            fp32_weights: The float32 weights, in the order of ``fp16_net.parameters()``.
        """
        pairs = [(p, m) for p, m in zip(fp16_net.parameters(), fp32_weights) if p is not m]
        if pairs:
            with torch.no_grad():
                compat.foreach_copy_([p for p, _ in pairs], [m for _, m in pairs])

    def detect_anomalous_parameters(self, loss: torch.Tensor, runner: Any) -> None:
        """Log at ERROR (``runner.logger``) the trainable parameters ``loss`` does not use.

        Args:
            loss: The loss, before its backward.
            runner: Has ``model`` and ``logger``.
        """
        in_graph = set()
        seen = set()
        stack = [loss.grad_fn]
        while stack:
            node = stack.pop()
            if node is None or node in seen:
                continue
            seen.add(node)
            variable = getattr(node, 'variable', None)
            if variable is not None:
                in_graph.add(variable)
            stack.extend(parent for parent, _ in node.next_functions)
        log = getattr(runner, 'logger', None) or logging.getLogger('fp16utils')
        for name, param in runner.model.named_parameters():
            if param.requires_grad and param not in in_graph:
                log.log(logging.ERROR,
                        f'{name} with shape {param.size()} is not in the computational graph '
                        'of the loss (unused in the forward, or not used for the loss)')


class CumulativeHookApi:
    """What mmcv's ``GradientCumulativeOptimizerHook`` adds: settable views of the window."""

    _driver: Any  # the hook's StepDriver

    @property
    def divisible_iters(self) -> int:
        """Iterations before the last, shorter window (0 until :meth:`_init`)."""
        return self._driver.window.divisible

    @divisible_iters.setter
    def divisible_iters(self, value: int) -> None:
        window = self._driver.window
        window.max_counts = int(value) + window.remainder

    @property
    def remainder_iters(self) -> int:
        """Iterations of the last, shorter window (0 when the total is a multiple)."""
        return self._driver.window.remainder

    @remainder_iters.setter
    def remainder_iters(self, value: int) -> None:
        window = self._driver.window
        window.max_counts, window.remainder = window.divisible + int(value), int(value)

    @property
    def initialized(self) -> bool:
        """Whether :meth:`_init` has run in this run."""
        return self._driver.window.started

    @initialized.setter
    def initialized(self, value: bool) -> None:
        self._driver.window.started = bool(value)

    def has_batch_norm(self, module: nn.Module) -> bool:
        """Whether ``module`` or any module inside it is a batch norm (mmcv's check)."""
        return any(isinstance(m, _BatchNorm) for m in module.modules())

    def _set_up_arguments(self) -> Dict[str, Any]:
        return {'cumulative_iters': self.__dict__.get('cumulative_iters', 1)}

    def _get_loss_factor(self, runner: Any) -> int:
        """What the loss of iteration ``runner.iter`` is divided by (mmcv's name for it)."""
        return self._driver.window.divisor(runner.iter)


def _loss_scale_of(scaler: Any) -> Any:
    """The ``loss_scale`` argument that describes ``scaler`` (None: mmcv's default, 512)."""
    if scaler is None:
        return MMCV_LOSS_SCALE
    if hasattr(scaler, 'update_scale'):  # an mmcv LossScaler
        return dict(init_scale=scaler.cur_scale, mode=scaler.mode,
                    scale_factor=scaler.scale_factor, scale_window=scaler.scale_window)
    return dict(init_scale=scaler.get_scale(), growth_factor=scaler.get_growth_factor(),
                backoff_factor=scaler.get_backoff_factor(),
                growth_interval=scaler.get_growth_interval(), enabled=scaler.is_enabled())


def _snapshot(settings: Optional[dict]) -> Optional[dict]:
    return None if settings is None else dict(settings)
