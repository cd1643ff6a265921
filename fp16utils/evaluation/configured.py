"""What a run configured for its forwards: :func:`configured_precision`.

Read from its optimizer wrapper, built or still a config dict, as the loops of
:mod:`fp16utils.evaluation.mmengine_loops` need it.
"""

from __future__ import annotations

from typing import Any, Dict, List, Mapping, Optional, Tuple, Union

import torch

from .._torch import dtypes
from ..fp32_modules import Fp32Modules, check_fp32_modules
from ..precision import is_auto

__all__ = ['configured_precision']


def configured_precision(source: Any, dtype: Union[torch.dtype, str, None] = None
                         ) -> Tuple[Union[torch.dtype, str, None], Optional[str], Fp32Modules]:
    """``(dtype, backend, fp32_modules)`` that an optimizer wrapper (or its config) set.

    Reads fp16utils' and MMEngine's ``AmpOptimWrapper`` (``dtype`` / ``cast_dtype``,
    ``backend``, ``fp32_modules``), an ``OptimWrapperDict`` (its entries, which must
    agree on the dtype and backend), or a wrapper config dict as a Runner holds it
    before training (``type``, ``dtype``, ``fp32_modules``; a constructor's per
    sub-model configs, their names prefixed with the sub-model's). Anything else
    (None, a float32 ``OptimWrapper``) configures nothing: ``(None, None, None)``.
    The backend of a config is not read: a model is converted when its wrapper is built.

    Args:
        source: A built wrapper, a config dict, or None.
        dtype: The evaluation's own dtype, if it has one: returned as the dtype, and the
            wrappers' dtypes need not agree.

    Returns:
        The dtype (``dtype`` when given; None: not configured; ``'auto'`` as a config
        gives it), ``'native'``/``'legacy'`` for a built wrapper (else None), and the
        float32 modules (None: none).

    Raises:
        ValueError: The entries of a dict configure different dtypes or backends.

    Example:
        >>> configured_precision(dict(type='AmpOptimWrapper', dtype='bfloat16',
        ...                           fp32_modules=['head'], optimizer=dict(type='SGD')))
        (torch.bfloat16, None, ['head'])
    """
    entries = _entries(source, '')
    found: Dict[str, Any] = {}
    fp32: List[Any] = []
    for prefix, (low, backend, modules) in entries:
        for key, value in (('dtype', low), ('backend', backend)):
            if value is not None:
                found.setdefault(key, {})[prefix or '<wrapper>'] = value
        fp32 += _prefixed(prefix, modules)
    if dtype is not None:
        found['dtype'] = {'<given>': dtype}
    fixes = dict(dtype='give the loop its own (val_cfg or test_cfg=dict(..., dtype=...))',
                 backend='a model partly converted to half cannot be evaluated in one '
                         'precision: train with one backend')
    for key, fix in fixes.items():
        values = found.get(key, {})
        if len(set(values.values())) > 1:
            raise ValueError(
                f'the optimizer wrappers configure different {key}s ({values}); a half-'
                f'precision evaluation runs the whole model in one {key}: {fix}.')
    pick = {key: next(iter(found[key].values())) if found.get(key) else None
            for key in ('dtype', 'backend')}
    return pick['dtype'], pick['backend'], (fp32 or None)


_Entry = Tuple[str, Tuple[Any, Optional[str], Fp32Modules]]


def _entries(source: Any, prefix: str) -> List[_Entry]:
    if source is None:
        return []
    if isinstance(source, Mapping):
        if 'optimizer' in source or 'type' in source:
            return [(prefix, _from_config(source))]
        return [entry for name, sub in source.items() if isinstance(sub, Mapping)
                for entry in _entries(sub, _join(prefix, str(name)))]
    wrappers = getattr(source, 'optim_wrappers', None)
    if isinstance(wrappers, Mapping):
        # Built entries applied their fp32_modules to their sub-model already.
        return [(_join(prefix, str(n)), (low, backend, None)) for n, w in wrappers.items()
                for _, (low, backend, _) in _entries(w, '')]
    low = getattr(source, 'dtype', None)
    if not isinstance(low, torch.dtype):
        low = getattr(source, 'cast_dtype', None)  # MMEngine's AmpOptimWrapper
    if not isinstance(low, torch.dtype):
        return []
    backend = getattr(source, 'backend', None)
    return [(prefix, (low, backend if backend in ('native', 'legacy') else None,
                      getattr(source, 'fp32_modules', None)))]


def _from_config(cfg: Mapping[str, Any]) -> Tuple[Any, None, Fp32Modules]:
    kind = cfg.get('type')
    name = kind if isinstance(kind, str) else getattr(kind, '__name__', '')
    if not name.endswith('AmpOptimWrapper'):
        return None, None, None
    value = cfg.get('dtype')
    if value is None or is_auto(value):
        return value, None, cfg.get('fp32_modules')  # 'auto': decided on the eval device
    return dtypes.resolve_dtype(value, full_precision=True), None, cfg.get('fp32_modules')


def _join(prefix: str, name: str) -> str:
    return f'{prefix}.{name}' if prefix else name


def _prefixed(prefix: str, modules: Fp32Modules) -> List[Any]:
    """``modules`` as a list, name patterns made relative to the whole model.

    A class name (an identifier starting with a capital) and a class stay as they are.
    """
    entries = check_fp32_modules(modules, 'fp32_modules')
    if not prefix:
        return entries
    return [e if not isinstance(e, str) or (e.isidentifier() and e[0].isupper())
            else _join(prefix, e) for e in entries]
