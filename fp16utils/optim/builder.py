"""``build_optim_wrapper``: optimizer wrappers from a 1.x ``optim_wrapper`` config."""

from __future__ import annotations

import copy
from typing import Any, Dict, Mapping, NamedTuple, Union

import torch
from torch import nn

from .._args.spec import PLUGIN_NAMES, check_positive_int, parse_clip_grad, parse_loss_scale
from .._torch import models, versions
from ..fp32_modules import check_fp32_modules
from ..precision import is_auto
from .amp import AmpOptimWrapper, deferred_model_conversion, resolve_cast_dtype
from .constructor import check_paramwise_cfg, paramwise_groups
from .wrapper import OptimWrapper
from .wrapper_dict import OptimWrapperDict

__all__ = ['PLUGIN_NAMES', 'build_optim_wrapper', 'deferred_model_conversion']

_WRAPPER_TYPES: Dict[str, type] = {
    'OptimWrapper': OptimWrapper, PLUGIN_NAMES['OptimWrapper']: OptimWrapper,
    'AmpOptimWrapper': AmpOptimWrapper, PLUGIN_NAMES['AmpOptimWrapper']: AmpOptimWrapper}
_SINGLE_CONSTRUCTORS = ('DefaultOptimWrapperConstructor', 'OptimWrapperConstructor',
                        PLUGIN_NAMES['DefaultOptimWrapperConstructor'])
_MULTI_CONSTRUCTORS = ('MultiOptimWrapperConstructor',
                       PLUGIN_NAMES['MultiOptimWrapperConstructor'])
_COMMON_KEYS = ('type', 'optimizer', 'accumulative_counts', 'clip_grad', 'paramwise_cfg')
_AMP_KEYS = ('loss_scale', 'dtype', 'use_fsdp', 'backend', 'nonfinite',
             'overflow_guard', 'agree_across_ranks', 'fp32_modules')


def _optimizer_classes() -> Dict[str, type]:
    return {name: cls for name, cls in vars(torch.optim).items()
            if isinstance(cls, type) and issubclass(cls, torch.optim.Optimizer)
            and cls is not torch.optim.Optimizer}


class _Plan(NamedTuple):
    """A validated wrapper config, ready to build without further checks."""

    where: str
    wrapper_cls: type
    optimizer_cls: type
    optimizer_kwargs: Dict[str, Any]
    wrapper_kwargs: Dict[str, Any]
    paramwise: Dict[str, Any]


def _plan(cfg: Mapping[str, Any], where: str) -> _Plan:
    cfg = dict(cfg)
    wtype = cfg.pop('type', 'OptimWrapper')
    if isinstance(wtype, type) and issubclass(wtype, OptimWrapper):
        wrapper_cls = wtype
    elif isinstance(wtype, str) and wtype in _WRAPPER_TYPES:
        wrapper_cls = _WRAPPER_TYPES[wtype]
    else:
        raise ValueError(f'{where}: unknown wrapper type {wtype!r}; expected one of '
                         f'{list(_WRAPPER_TYPES)}.')
    is_amp = issubclass(wrapper_cls, AmpOptimWrapper)
    allowed = _COMMON_KEYS + (_AMP_KEYS if is_amp else ())
    unknown = sorted(set(cfg) - set(allowed), key=str)
    if unknown:
        hint = ''
        if set(unknown) & set(_AMP_KEYS):
            hint = " (loss_scale, dtype and backend belong to type='AmpOptimWrapper')"
        raise ValueError(f'{where}: unknown key(s) {unknown}{hint}; a '
                         f'{wrapper_cls.__name__} config takes {list(allowed)}.')
    if 'optimizer' not in cfg:
        raise ValueError(f"{where}: missing 'optimizer', e.g. optimizer=dict(type='Adam', "
                         'lr=1e-4).')
    opt_cfg = cfg.pop('optimizer')
    if not isinstance(opt_cfg, Mapping) or 'type' not in opt_cfg:
        raise ValueError(f"{where}.optimizer must be a dict with a 'type', e.g. "
                         f"dict(type='Adam', lr=1e-4); got {opt_cfg!r}.")
    opt_kwargs = dict(opt_cfg)
    otype = opt_kwargs.pop('type')
    if isinstance(otype, type) and issubclass(otype, torch.optim.Optimizer):
        opt_cls = otype
    else:
        classes = _optimizer_classes()
        if not isinstance(otype, str) or otype not in classes:
            raise ValueError(f'{where}.optimizer: unknown optimizer type {otype!r}; expected '
                             f'a torch.optim class name, one of {sorted(classes)}.')
        opt_cls = classes[otype]
    # Validate the wrapper arguments before building, so that an error changes nothing.
    paramwise = check_paramwise_cfg(cfg.pop('paramwise_cfg', None), opt_kwargs, where)
    owner = f'{where} ({wrapper_cls.__name__})'
    check_positive_int(cfg.get('accumulative_counts', 1), owner, 'accumulative_counts')
    parse_clip_grad(cfg.get('clip_grad'), owner)
    if is_amp:
        parse_loss_scale(cfg.get('loss_scale', 'dynamic'), owner)
        if not is_auto(cfg.get('dtype')):  # 'auto': the wrapper resolves it on its device
            resolve_cast_dtype(cfg.get('dtype'))
        check_fp32_modules(cfg.get('fp32_modules'), f'{owner}.fp32_modules')
        versions.resolve_backend(cfg.get('backend'))
    return _Plan(where, wrapper_cls, opt_cls, opt_kwargs, cfg, paramwise)


def _make_optimizer(plan: _Plan, module: nn.Module) -> torch.optim.Optimizer:
    kwargs = plan.optimizer_kwargs
    params: Any = module.parameters()
    if plan.paramwise:  # as MMEngine: any non-empty paramwise_cfg gives a group per parameter
        params = paramwise_groups(module, plan.paramwise, kwargs.get('lr'),
                                  kwargs.get('weight_decay'))
    try:
        return plan.optimizer_cls(params, **kwargs)
    except (TypeError, ValueError) as err:
        raise type(err)(f'{plan.where}.optimizer: {plan.optimizer_cls.__name__} rejected '
                        f'{plan.optimizer_kwargs}: {err}') from None


def _make_wrapper(plan: _Plan, optimizer: torch.optim.Optimizer,
                  module: nn.Module) -> OptimWrapper:
    kwargs = dict(plan.wrapper_kwargs, optimizer=optimizer)
    if issubclass(plan.wrapper_cls, AmpOptimWrapper):
        kwargs['model'] = module
    return plan.wrapper_cls(**kwargs)


def build_optim_wrapper(model: nn.Module, cfg: Mapping[str, Any]
                        ) -> Union[OptimWrapper, OptimWrapperDict]:
    """Build an optimizer wrapper (or a dict of them) from a 1.x ``optim_wrapper`` config.

    One wrapper: ``dict(type='OptimWrapper' | 'AmpOptimWrapper', optimizer=dict(type='Adam',
    lr=...), ...)`` plus the wrapper's arguments as keys (``dtype='auto'`` picks the native
    dtype of the model's device) and ``paramwise_cfg``: the options of MMEngine's
    ``DefaultOptimWrapperConstructor``, giving the same param groups. ``constructor`` may
    be omitted, ``'DefaultOptimWrapperConstructor'`` or ``'OptimWrapperConstructor'``.
    The names that :mod:`fp16utils.mmengine` registers in MMEngine (:data:`PLUGIN_NAMES`,
    e.g. ``'Fp16utilsAmpOptimWrapper'``) read as the classes they stand for, so one
    config builds here and in MMEngine's Runner.

    One wrapper per sub-model: ``constructor='MultiOptimWrapperConstructor'`` and one
    such config (with its own ``paramwise_cfg``, if any) per attribute name of ``model``
    (``generator=dict(...), discriminator=dict(...)``); each optimizer is built on the
    parameters of ``getattr(model, name)``, and the result is an
    :class:`OptimWrapperDict`. Under ``'OptimWrapperConstructor'`` a config without an
    ``optimizer`` key whose values are such configs reads the same way.

    Everything is validated before anything is built, so an error leaves the model as
    it was. On the legacy backend each ``AmpOptimWrapper`` converts its (sub-)model to
    half and owns its float32 master weights.

    Args:
        model: The model (DataParallel / DistributedDataParallel are unwrapped to find
            sub-models).
        cfg: The config; it is not changed.

    Returns:
        An :class:`OptimWrapper`, :class:`AmpOptimWrapper` or :class:`OptimWrapperDict`.

    Raises:
        ValueError: An unknown wrapper, optimizer or constructor type, an unknown key, a
            bad argument, or a sub-model name the model lacks; the message names what
            exists.
        TypeError: ``model`` is not an ``nn.Module`` or ``cfg`` is not a dict.

    Example:
        >>> from torch import nn
        >>> gan = nn.ModuleDict(dict(generator=nn.Linear(2, 2), discriminator=nn.Linear(2, 1)))
        >>> wrappers = build_optim_wrapper(gan, dict(
        ...     constructor='MultiOptimWrapperConstructor',
        ...     generator=dict(type='AmpOptimWrapper', optimizer=dict(type='Adam', lr=1e-4)),
        ...     discriminator=dict(optimizer=dict(type='SGD', lr=0.1))))
        >>> type(wrappers['generator']).__name__, type(wrappers['discriminator']).__name__
        ('AmpOptimWrapper', 'OptimWrapper')
    """
    if not isinstance(model, nn.Module):
        raise TypeError(f'build_optim_wrapper() takes an nn.Module, got '
                        f'{type(model).__name__}.')
    if not isinstance(cfg, Mapping):
        raise TypeError(f'build_optim_wrapper() takes a config dict, got {type(cfg).__name__}.')
    cfg = copy.deepcopy(dict(cfg))
    constructor = cfg.pop('constructor', None)
    known = (None, *_SINGLE_CONSTRUCTORS, *_MULTI_CONSTRUCTORS)
    if constructor not in known:
        raise ValueError(f'optim_wrapper: unknown constructor {constructor!r}; expected one '
                         f'of {list(known[1:])} (or none).')
    per_name = constructor in _MULTI_CONSTRUCTORS or (
        constructor == 'OptimWrapperConstructor' and 'optimizer' not in cfg and cfg
        and all(isinstance(v, Mapping) and 'optimizer' in v for v in cfg.values()))
    if not per_name:
        plan = _plan(cfg, 'optim_wrapper')
        return _make_wrapper(plan, _make_optimizer(plan, model), model)

    if cfg.get('paramwise_cfg') is not None:
        raise ValueError(f'optim_wrapper: constructor={constructor!r} takes paramwise_cfg '
                         'inside each sub-model config, e.g. generator=dict(optimizer=..., '
                         'paramwise_cfg=...), not at the top.')
    cfg.pop('paramwise_cfg', None)
    if not cfg:
        raise ValueError(f'optim_wrapper: constructor={constructor!r} needs one config per '
                         'sub-model, e.g. generator=dict(optimizer=...), '
                         'discriminator=dict(optimizer=...).')
    base = models.unwrap_model(model)
    children = [name for name, _ in base.named_children()]
    plans = []
    for name, entry in cfg.items():
        where = f'optim_wrapper.{name}'
        if not isinstance(entry, Mapping):
            raise ValueError(f'{where} must be a wrapper config dict (one per sub-model), '
                             f'got {entry!r}.')
        module = getattr(base, name, None) if isinstance(name, str) else None
        if not isinstance(module, nn.Module):
            raise ValueError(f'{where}: the model ({type(base).__name__}) has no sub-module '
                             f'{name!r}; its sub-modules are {children}.')
        plans.append((name, module, _plan(entry, where)))
    optimizers = [(name, module, plan, _make_optimizer(plan, module))
                  for name, module, plan in plans]
    # Every wrapper is built before any (sub-)model is converted to half (legacy backend),
    # so that an error in a later entry leaves the whole model as it was.
    with deferred_model_conversion() as conversions:
        wrappers = {name: _make_wrapper(plan, optimizer, module)
                    for name, module, plan, optimizer in optimizers}
        result = OptimWrapperDict(**wrappers)
    for convert in conversions:
        convert()
    return result
