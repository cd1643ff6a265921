"""``paramwise_cfg``: per-parameter learning rates and weight decays with the options and
precedence of MMEngine's ``DefaultOptimWrapperConstructor`` (docs/reference/config-keys.md):
one group per parameter; parameters with ``requires_grad=False`` are left out."""

from __future__ import annotations

import logging
from typing import Any, Dict, List, Mapping, Optional

from torch import nn

from .._torch.models import BatchNormBase as _BatchNorm
from .._torch.models import InstanceNormBase as _InstanceNorm

__all__ = ['PARAMWISE_KEYS', 'check_paramwise_cfg', 'paramwise_groups']

logger = logging.getLogger('fp16utils')

#: The options of ``paramwise_cfg`` (MMEngine's ``DefaultOptimWrapperConstructor``).
PARAMWISE_KEYS = ('custom_keys', 'bias_lr_mult', 'bias_decay_mult', 'norm_decay_mult',
                  'dwconv_decay_mult', 'flat_decay_mult', 'dcn_offset_lr_mult',
                  'bypass_duplicate')
_DECAY_KEYS = ('bias_decay_mult', 'norm_decay_mult', 'dwconv_decay_mult')
_NORMS = (_BatchNorm, _InstanceNorm, nn.GroupNorm, nn.LayerNorm)
#: mmcv's deformable convolutions (``mmcv.ops``), found by class name so that
#: mmcv is never imported; their ``conv_offset`` children are the offset layers.
_DCN_NAMES = frozenset({'DeformConv2d', 'ModulatedDeformConv2d'})


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def check_paramwise_cfg(paramwise_cfg: Any, optimizer_cfg: Mapping[str, Any],
                        where: str) -> Dict[str, Any]:
    """Validate ``paramwise_cfg`` against the optimizer config; return a copy ({} for None)."""
    if paramwise_cfg is None:
        return {}
    if not isinstance(paramwise_cfg, Mapping):
        raise TypeError(f'{where}.paramwise_cfg should be None or a dict, got '
                        f'{type(paramwise_cfg).__name__}.')
    cfg = dict(paramwise_cfg)
    unknown = sorted(set(cfg) - set(PARAMWISE_KEYS), key=str)
    if unknown:
        raise ValueError(f'{where}.paramwise_cfg: unknown option(s) {unknown}; the options '
                         f'are {list(PARAMWISE_KEYS)}.')
    for key in PARAMWISE_KEYS:
        if key.endswith('_mult') and key in cfg and not _is_number(cfg[key]):
            raise ValueError(f'{where}.paramwise_cfg.{key} must be a number, got '
                             f'{cfg[key]!r}.')
    base_wd = optimizer_cfg.get('weight_decay')
    custom = cfg.get('custom_keys', {})
    if not isinstance(custom, Mapping):
        raise TypeError(f'{where}.paramwise_cfg.custom_keys must be a dict, got '
                        f'{type(custom).__name__}.')
    for key, entry in custom.items():
        if not isinstance(entry, Mapping):
            raise TypeError(f'{where}.paramwise_cfg.custom_keys[{key!r}] must be a dict '
                            f'such as dict(lr_mult=0.1), got {entry!r}.')
        if base_wd is None and 'decay_mult' in entry:
            raise ValueError(f'{where}.paramwise_cfg.custom_keys[{key!r}] sets decay_mult, '
                             'but the optimizer config has no weight_decay to multiply.')
    if custom and optimizer_cfg.get('lr') is None:
        raise ValueError(f'{where}.paramwise_cfg.custom_keys set lr_mult, but the optimizer '
                         'config has no lr to multiply: give optimizer.lr.')
    decay = [key for key in _DECAY_KEYS if key in cfg]
    if decay and base_wd is None:
        raise ValueError(f'{where}.paramwise_cfg sets {decay}, but the optimizer config has '
                         'no weight_decay to multiply: give optimizer.weight_decay.')
    if 'bias_lr_mult' in cfg or 'dcn_offset_lr_mult' in cfg:
        if optimizer_cfg.get('lr') is None:
            raise ValueError(f'{where}.paramwise_cfg sets an lr multiplier, but the optimizer '
                             'config has no lr to multiply: give optimizer.lr.')
    if 'custom_keys' in cfg:
        cfg['custom_keys'] = {key: dict(entry) for key, entry in custom.items()}
    return cfg


def _is_dcn(module: nn.Module) -> bool:
    return any(cls.__name__ in _DCN_NAMES and cls.__module__.startswith('mmcv')
               for cls in type(module).__mro__)


def paramwise_groups(model: nn.Module, cfg: Mapping[str, Any], base_lr: Optional[float],
                     base_wd: Optional[float]) -> List[Dict[str, Any]]:
    """One param group per parameter of ``model``, with the options of ``cfg`` applied."""
    groups: List[Dict[str, Any]] = []
    seen: set = set()
    custom = cfg.get('custom_keys', {})
    keys = sorted(sorted(custom), key=len, reverse=True)  # longest first, ties alphabetical
    _add(groups, seen, model, '', False, cfg, custom, keys, base_lr, base_wd)
    return groups


def _add(groups: List[Dict[str, Any]], seen: set, module: nn.Module, prefix: str,
         in_dcn: bool, cfg: Mapping[str, Any], custom: Mapping[str, Mapping[str, Any]],
         keys: List[str], base_lr: Any, base_wd: Any) -> None:
    is_norm = isinstance(module, _NORMS)
    is_dwconv = isinstance(module, nn.Conv2d) and module.in_channels == module.groups
    for name, param in module.named_parameters(recurse=False):
        full = f'{prefix}.{name}' if prefix else name
        if cfg.get('bypass_duplicate', False) and param in seen:
            logger.warning(f'{full} is a duplicate of a parameter already added; skipped '
                           '(bypass_duplicate=True)')
            continue
        if not param.requires_grad:
            logger.warning(f'{full} is skipped since its requires_grad=False')
            continue
        group: Dict[str, Any] = {'params': [param]}
        key = next((k for k in keys if k in f'{prefix}.{name}'), None)
        if key is not None:
            entry = custom[key]
            group['lr'] = base_lr * entry.get('lr_mult', 1.0)
            if base_wd is not None:
                group['weight_decay'] = base_wd * entry.get('decay_mult', 1.0)
            group.update(entry)
        else:
            _apply_rules(group, cfg, name, param.ndim, is_norm, is_dwconv, in_dcn,
                         isinstance(module, nn.Conv2d) and 'conv_offset' in prefix,
                         base_lr, base_wd)
        seen.add(param)
        groups.append(group)
        for option, value in group.items():
            if option != 'params':
                logger.debug(f'paramwise_cfg: {full}: {option}={value}')
    child_in_dcn = _is_dcn(module)
    for child_name, child in module.named_children():
        _add(groups, seen, child, f'{prefix}.{child_name}' if prefix else child_name,
             child_in_dcn, cfg, custom, keys, base_lr, base_wd)


def _apply_rules(group: Dict[str, Any], cfg: Mapping[str, Any], name: str, ndim: int,
                 is_norm: bool, is_dwconv: bool, in_dcn: bool, is_offset: bool,
                 base_lr: Any, base_wd: Any) -> None:
    bias_lr_mult = cfg.get('bias_lr_mult')
    if name == 'bias' and not (is_norm or in_dcn) and bias_lr_mult is not None:
        group['lr'] = base_lr * bias_lr_mult
    offset_lr_mult = cfg.get('dcn_offset_lr_mult')
    if is_offset and in_dcn and offset_lr_mult is not None:
        group['lr'] = base_lr * offset_lr_mult
    if base_wd is None:
        return
    if is_norm and cfg.get('norm_decay_mult') is not None:
        group['weight_decay'] = base_wd * cfg['norm_decay_mult']
    elif name == 'bias' and not in_dcn and cfg.get('bias_decay_mult') is not None:
        group['weight_decay'] = base_wd * cfg['bias_decay_mult']
    elif is_dwconv and cfg.get('dwconv_decay_mult') is not None:
        group['weight_decay'] = base_wd * cfg['dwconv_decay_mult']
    elif ndim == 1 and not in_dcn and cfg.get('flat_decay_mult') is not None:
        group['weight_decay'] = base_wd * cfg['flat_decay_mult']
