"""Convert 0.x training configs to the 1.x ``optim_wrapper`` style, and switch on AMP.

:func:`convert_config` (warns or raises per problem) and :func:`convert_config_report`
(returns the problems) do the conversion; :func:`enable_amp` is the ``--amp`` switch
for a 1.x config. Standard library only.

Example:
    >>> new = convert_config(dict(optimizer=dict(type='Adam', lr=1e-3)))
    >>> enable_amp(new, 'bfloat16')['optim_wrapper']
    {'type': 'AmpOptimWrapper', 'optimizer': {'type': 'Adam', 'lr': 0.001}, 'dtype': 'bfloat16'}
"""

from __future__ import annotations

import copy
import warnings
from collections.abc import Mapping
from typing import Any, Optional

from .._args.spec import PLUGIN_MODULE, PLUGIN_NAMES
from ._converter import ConfigConverter, wrapper_entries, wrapper_layout

__all__ = [
    'ConfigConversionError',
    'MigrationWarning',
    'convert_config',
    'convert_config_report',
    'enable_amp',
]

_WRAPPER_TYPES = frozenset({'OptimWrapper', 'AmpOptimWrapper'})
#: The plug-in's wrapper names -> MMEngine's (``convert_config(plugin=True)`` writes them).
_PLUGIN_WRAPPERS = {PLUGIN_NAMES[k]: k for k in _WRAPPER_TYPES}


class MigrationWarning(UserWarning):
    """A part of a config or codebase that could not be migrated safely.

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter('always')
        ...     _ = convert_config({'optimizer': dict(generator=dict(type='Adam')),
        ...                         'train_cfg': dict(disc_steps=5, batch_accumulation_steps=2)})
        >>> caught[0].category is MigrationWarning
        True
    """


class ConfigConversionError(ValueError):
    """Raised by ``convert_config(cfg, strict=True)`` when a key cannot be converted safely.

    Attributes:
        problems: one human-readable line per problem, each starting with the key.

    Example:
        >>> try:
        ...     convert_config({'fp16': dict(loss_scale='huge')}, strict=True)
        ... except ConfigConversionError as err:
        ...     err.problems[0].startswith('fp16')
        True
    """

    def __init__(self, problems: list[str]) -> None:
        self.problems = list(problems)
        lines = '\n'.join(f'  - {p}' for p in self.problems)
        super().__init__(
            f'the config cannot be converted safely ({len(self.problems)} problem(s)):\n'
            f'{lines}\n'
            'Fix these keys in the 0.x config, or call convert_config(cfg, strict=False) '
            'to get the partial result with a MigrationWarning per problem.'
        )



def convert_config_report(cfg: Mapping[str, Any], plugin: bool = False
                          ) -> tuple[dict[str, Any], list[str]]:
    """Convert a 0.x training config to 1.x and return the problems instead of warning.

    The rules are those of :func:`convert_config`; this function never warns or
    raises for a conversion problem, it lists them.

    Args:
        cfg: the 0.x config as a dict (e.g. the globals of a config file). Not modified.
        plugin: write the names of the MMEngine plug-in, see :func:`convert_config`.

    Returns:
        ``(new_cfg, problems)``: a new dict, and one line per key that could not be
        converted safely (empty when the conversion is exact).

    Example:
        >>> new, problems = convert_config_report(
        ...     dict(optimizer=dict(type='SGD', lr=0.1),
        ...          optimizer_config=dict(grad_clip='35')))
        >>> new['optim_wrapper']['type'], len(problems)
        ('OptimWrapper', 1)
    """
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f'expected the config as a dict, got {type(cfg).__name__}; load the config file '
            'first (its top-level names as a dict) and pass that'
        )
    converter = ConfigConverter(cfg)
    new_cfg = converter.run()
    if plugin:
        _use_plugin(new_cfg)
    return new_cfg, converter.problems


def _use_plugin(cfg: dict[str, Any]) -> None:
    """Point a converted config's ``optim_wrapper`` at the MMEngine plug-in (in place)."""
    wrapper = cfg.get('optim_wrapper')
    if not isinstance(wrapper, dict):
        return
    layout = wrapper_layout(wrapper)
    for _, entry in wrapper_entries(wrapper, layout):
        entry['type'] = PLUGIN_NAMES.get(entry.get('type', 'OptimWrapper'), entry.get('type'))
    wrapper['constructor'] = PLUGIN_NAMES[
        'MultiOptimWrapperConstructor' if layout == 'multi' else 'DefaultOptimWrapperConstructor']
    imports = cfg.setdefault('custom_imports', {})
    names = imports.setdefault('imports', [])
    if isinstance(names, str):
        names = imports['imports'] = [names]
    if PLUGIN_MODULE not in names:
        names.append(PLUGIN_MODULE)
    imports.setdefault('allow_failed_imports', False)


def convert_config(cfg: Mapping[str, Any], strict: bool = False,
                   plugin: bool = False) -> dict[str, Any]:
    """Convert a 0.x (mmcv 1.x era) training config to the 1.x ``optim_wrapper`` style.

    Rules:

    * ``optimizer`` + ``optimizer_config`` (``OptimizerHook``, ``Fp16OptimizerHook``,
      ``GradientCumulative[Fp16]OptimizerHook``) + ``fp16`` become one
      ``optim_wrapper``: ``type`` is ``'AmpOptimWrapper'`` when fp16 was on, else
      ``'OptimWrapper'``; ``grad_clip`` becomes ``clip_grad``, ``cumulative_iters``
      becomes ``accumulative_counts``, ``paramwise_cfg`` moves next to the optimizer.
    * ``loss_scale``: a number stays a (static) float, ``'dynamic'`` stays; a dict in
      mmcv ``LossScaler`` names becomes GradScaler names (``scale_factor`` ->
      ``growth_factor`` and ``backoff_factor = 1 / scale_factor``, ``scale_window`` ->
      ``growth_interval``; ``mode='static'`` -> the float ``init_scale``). fp16 on
      without a loss_scale means mmcv's default, a static 512.
    * ``runner.fp16_loss_scaler`` (MMEditing/MMGeneration) becomes ``AmpOptimWrapper``
      with ``loss_scale=<that dict>``; the key leaves ``runner`` (an emptied runner goes).
    * ``optimizer = dict(generator=dict(type=...), discriminator=dict(...))`` becomes a
      ``MultiOptimWrapperConstructor`` config with one entry per submodule.
    * ``train_cfg`` ``disc_steps``/``gen_steps``/``batch_accumulation_steps`` become
      ``model.discriminator_steps = disc_steps // batch_accumulation_steps``,
      ``model.generator_steps = gen_steps`` and ``accumulative_counts`` on each wrapper;
      other train_cfg keys stay.
    * Everything else (``model`` type, ``lr_config``, ``total_epochs``, ``log_config``,
      unknown keys) is kept untouched. Model changes outside fp16 (e.g. a renamed model
      type) are not this function's business.

    Args:
        cfg: the 0.x config as a dict. It is not modified.
        strict: raise :class:`ConfigConversionError` if anything could not be
            converted safely, instead of warning.
        plugin: write a config for MMEngine's Runner with this package's plug-in:
            ``custom_imports=dict(imports=['fp16utils.mmengine'])``, the plug-in's
            wrapper names (``'Fp16utilsAmpOptimWrapper'``, ...) and constructors
            (``'Fp16utilsOptimWrapperConstructor'`` /
            ``'Fp16utilsMultiOptimWrapperConstructor'``). :func:`build_optim_wrapper`
            reads these names too.

    Returns:
        A new config dict.

    Raises:
        ConfigConversionError: with ``strict=True``, listing every problem by key.

    Warns:
        MigrationWarning: one per problem, with ``strict=False``.

    Example:
        >>> cfg = dict(optimizer=dict(type='Adam', lr=1e-3),
        ...            runner=dict(fp16_loss_scaler=dict(init_scale=512)))
        >>> convert_config(cfg)
        {'optim_wrapper': {'type': 'AmpOptimWrapper', 'optimizer': {'type': 'Adam', \
'lr': 0.001}, 'loss_scale': {'init_scale': 512}}}
    """
    new_cfg, problems = convert_config_report(cfg, plugin)
    if problems:
        if strict:
            raise ConfigConversionError(problems)
        for text in problems:
            warnings.warn(text, MigrationWarning, stacklevel=2)
    return new_cfg


def enable_amp(cfg: Mapping[str, Any], dtype: Optional[str] = None) -> dict[str, Any]:
    """Switch a 1.x config to mixed precision: the ``--amp`` command-line switch.

    Every wrapper (the single ``optim_wrapper``, or each entry of a
    ``MultiOptimWrapperConstructor`` config) becomes ``type='AmpOptimWrapper'`` with
    ``loss_scale='dynamic'`` (a loss_scale already there is kept), and ``dtype=dtype``
    when one is given. ``'bfloat16'`` needs no loss scaling, so none is added.
    ``'auto'`` is written as it is: the wrapper resolves it when it is built
    (bfloat16 where native on the model's device, else float16 with the dynamic
    loss scale, else float32).
    A wrapper that is already an ``AmpOptimWrapper`` is left as it is (with a warning
    when ``dtype`` is given: it is not applied to that wrapper).
    The plug-in's names (``convert_config(cfg, plugin=True)``) are switched the same
    way: ``'Fp16utilsOptimWrapper'`` becomes ``'Fp16utilsAmpOptimWrapper'``.

    Args:
        cfg: a 1.x config (with ``optim_wrapper``). Not modified.
        dtype: ``None`` (the wrapper's default, float16), ``'float16'``, ``'bfloat16'``
            or ``'auto'``.

    Returns:
        A new config dict.

    Raises:
        ValueError: no ``optim_wrapper`` (a 0.x config: run :func:`convert_config`
            first), an unknown ``dtype``, or a wrapper type other than
            ``OptimWrapper``/``AmpOptimWrapper`` (or the plug-in's names of them).

    Warns:
        MigrationWarning: for each wrapper that already was an ``AmpOptimWrapper``,
            when ``dtype`` is given.

    Example:
        >>> enable_amp(dict(optim_wrapper=dict(optimizer=dict(type='SGD', lr=0.1))))
        {'optim_wrapper': {'optimizer': {'type': 'SGD', 'lr': 0.1}, 'type': \
'AmpOptimWrapper', 'loss_scale': 'dynamic'}}
    """
    if not isinstance(cfg, Mapping):
        raise TypeError(f'expected the config as a dict, got {type(cfg).__name__}')
    if dtype not in (None, 'float16', 'bfloat16', 'auto'):
        raise ValueError(
            f"dtype must be None, 'float16', 'bfloat16' or 'auto', got {dtype!r}; pass one of "
            'these names as a string'
        )
    if not isinstance(cfg.get('optim_wrapper'), Mapping):
        old = [k for k in ('optimizer', 'optimizer_config', 'fp16') if k in cfg]
        hint = f' (it has the 0.x keys {", ".join(old)})' if old else ''
        raise ValueError(
            f'the config has no optim_wrapper dict{hint}; enable_amp works on 1.x configs: '
            'run convert_config(cfg) first and pass its result'
        )
    new_cfg = copy.deepcopy(dict(cfg))
    wrapper = dict(new_cfg['optim_wrapper'])
    new_cfg['optim_wrapper'] = wrapper
    layout = wrapper_layout(wrapper)
    if layout == 'multi':
        for key in list(wrapper):
            if key not in ('constructor', 'paramwise_cfg') and isinstance(wrapper[key], Mapping):
                wrapper[key] = dict(wrapper[key])
    for where, entry in wrapper_entries(wrapper, layout):
        kind = entry.get('type', 'OptimWrapper')
        plugin = kind in _PLUGIN_WRAPPERS  # the plug-in's names stay the plug-in's
        kind = _PLUGIN_WRAPPERS.get(kind, kind)
        if kind == 'AmpOptimWrapper':
            if dtype is not None:  # only then is something asked for and not applied
                warnings.warn(
                    f'{where} is already an AmpOptimWrapper; left as it is '
                    f'(dtype={dtype!r} not applied)',
                    MigrationWarning,
                    stacklevel=2,
                )
            continue
        if kind not in _WRAPPER_TYPES:
            raise ValueError(
                f"{where}.type is {kind!r}; enable_amp can only switch 'OptimWrapper' to "
                f"'AmpOptimWrapper' (or {PLUGIN_NAMES['OptimWrapper']!r} to "
                f"{PLUGIN_NAMES['AmpOptimWrapper']!r}); make that wrapper mixed-precision "
                'by hand'
            )
        entry['type'] = PLUGIN_NAMES['AmpOptimWrapper'] if plugin else 'AmpOptimWrapper'
        if dtype != 'bfloat16':
            entry.setdefault('loss_scale', 'dynamic')
        if dtype is not None:
            entry['dtype'] = dtype
    return new_cfg

