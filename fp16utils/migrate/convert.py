"""Convert 0.x training configs to the 1.x style, and switch on AMP.

:func:`migrate_config` returns a :class:`MigrationReport` (the new config, its problems
and notes); :func:`convert_config` warns or raises per problem,
:func:`convert_config_report` returns the problems; :func:`enable_amp` is the ``--amp``
switch for a 1.x config.
"""

from __future__ import annotations

import copy
import os
import warnings
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .._args.spec import PLUGIN_MODULE, PLUGIN_NAMES
from ._codebase import find_codebase
from ._config_converter import ConfigConverter
from ._lr_schedule import convert_lr_schedule
from ._runtime_keys import convert_runtime
from ._wrapper_layout import wrapper_entries, wrapper_layout

__all__ = [
    'ConfigConversionError',
    'MigrationNote',
    'MigrationReport',
    'MigrationWarning',
    'convert_config',
    'convert_config_report',
    'enable_amp',
    'migrate_config',
]

_WRAPPER_TYPES = frozenset({'OptimWrapper', 'AmpOptimWrapper'})
#: The plug-in's wrapper names -> MMEngine's (``convert_config(plugin=True)`` writes them).
_PLUGIN_WRAPPERS = {PLUGIN_NAMES[k]: k for k in _WRAPPER_TYPES}


class MigrationWarning(UserWarning):
    """A part of a config that could not be converted safely (``strict=False``).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter('always')
        ...     _ = convert_config({'fp16': dict(loss_scale='huge')})
        >>> caught[0].category is MigrationWarning
        True
    """


class MigrationNote(UserWarning):
    """A value converted exactly as upstream does, whose meaning changes on the way.

    :func:`convert_config` warns one per note (never raises on one, ``strict`` or not).

    Example:
        >>> import warnings
        >>> with warnings.catch_warnings(record=True) as caught:
        ...     warnings.simplefilter('always')
        ...     _ = convert_config(dict(optimizer=dict(type='SGD', lr=0.1),
        ...                             fp16=dict(loss_scale='dynamic')))
        >>> any(w.category is MigrationNote for w in caught)
        True
    """


@dataclass
class MigrationReport:
    """What :func:`migrate_config` made of a 0.x config.

    Attributes:
        config: the new config dict.
        problems: one line per key that could not be converted exactly, each naming the
            key, the 1.x key it maps to and what to do (``--strict`` fails on any).
        notes: one line per value converted as upstream converts it whose meaning
            changes on the way, with the faithful form.
        codebase: the codebase whose rules were followed (``'mmdet'``, ``'mmseg'``, ...),
            or ``None`` when it could not be told.

    Example:
        >>> report = migrate_config(dict(optimizer=dict(type='SGD', lr=0.1)))
        >>> report.config['optim_wrapper']['type'], report.problems
        ('OptimWrapper', [])
    """

    config: dict[str, Any]
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    codebase: Optional[str] = None


class ConfigConversionError(ValueError):
    """Raised by ``convert_config(cfg, strict=True)`` when a key cannot be converted safely.

    Attributes:
        problems: one line per problem, each starting with the key.

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


def migrate_config(cfg: Mapping[str, Any], *, plugin: bool = False,
                   codebase: Optional[str] = None,
                   path: Union[str, os.PathLike[str], None] = None,
                   faithful: bool = False) -> MigrationReport:
    """Convert a 0.x config to the 1.x style: the whole ``fp16utils migrate`` pass.

    The optimizer keys become ``optim_wrapper``; ``lr_config``/``momentum_config``
    become ``param_scheduler``; ``runner``, ``evaluation``, ``checkpoint_config``,
    ``log_config`` and the other runtime keys become ``train_cfg``/``val_cfg``/
    ``test_cfg``, ``default_hooks`` and ``env_cfg``. What has no exact 1.x form is
    listed in ``problems``.

    Args:
        cfg: the 0.x config as a dict (``_base_`` files merged). Not modified.
        plugin: write the names of the MMEngine plug-in (see :func:`convert_config`).
        codebase: the codebase the config belongs to (``'mmdet'``, ``'mmseg'``, ...);
            ``None``: told from ``path`` and the config itself.
        path: where the config file is, to tell its codebase.
        faithful: write values with mmcv's meaning where MMEngine's reading differs
            (``'dynamic'`` as mmcv's scaler numbers), instead of upstream's form; and
            DeepSpeed's defaults (``growth_interval=1000``, ``hysteresis=2``) for the
            keys a DeepSpeed loss scale leaves out.

    Returns:
        A :class:`MigrationReport`.

    Raises:
        TypeError: ``cfg`` is not a mapping.
        ValueError: ``codebase`` is not a known codebase name.

    Example:
        >>> report = migrate_config(dict(optimizer=dict(type='SGD', lr=0.1),
        ...                              fp16=dict(loss_scale=512.)), codebase='mmdet')
        >>> report.config['optim_wrapper']['type'], report.codebase
        ('AmpOptimWrapper', 'mmdet')
    """
    if not isinstance(cfg, Mapping):
        raise TypeError(
            f'expected the config as a dict, got {type(cfg).__name__}; load the config file '
            'first (its top-level names as a dict) and pass that'
        )
    found = find_codebase(cfg, codebase, path)
    converter = ConfigConverter(cfg, codebase=found, faithful=faithful)
    new_cfg = converter.run()
    report = MigrationReport(new_cfg, converter.problems, converter.notes, found)
    convert_lr_schedule(new_cfg, report.problems, report.notes)
    convert_runtime(new_cfg, report.problems, report.notes, test_fp16=converter.test_fp16,
                    codebase=found)
    if plugin:
        _use_plugin(new_cfg, report.notes)
    return report


def convert_config_report(cfg: Mapping[str, Any], plugin: bool = False, *,
                          codebase: Optional[str] = None
                          ) -> tuple[dict[str, Any], list[str]]:
    """Convert a 0.x training config as :func:`convert_config` does; return the problems.

    Args:
        cfg: the 0.x config as a dict. Not modified.
        plugin: write the names of the MMEngine plug-in, as :func:`convert_config` does.
        codebase: whose rules to follow for ``fp16`` (see :func:`migrate_config`).

    Returns:
        ``(new_cfg, problems)``: a new dict, and one line per key that could not be
        converted safely (none when the conversion is exact). Nothing is warned.

    Raises:
        TypeError: ``cfg`` is not a mapping.

    Example:
        >>> new, problems = convert_config_report(
        ...     dict(optimizer=dict(type='SGD', lr=0.1), optimizer_config=dict(grad_clip='35')))
        >>> new['optim_wrapper']['type'], len(problems)
        ('OptimWrapper', 1)
    """
    report = migrate_config(cfg, plugin=plugin, codebase=codebase)
    return report.config, report.problems


def _use_plugin(cfg: dict[str, Any], notes: Optional[list[str]] = None) -> None:
    """Point a converted config's ``optim_wrapper`` at the MMEngine plug-in (in place).

    The wrapper types become the plug-in's; the constructor too, unless a named one
    (layer-wise decay, ...) is in force: that one is kept, and builds the plug-in's
    wrapper from MMEngine's ``OPTIM_WRAPPERS`` registry by its ``type``. Half-precision
    evaluation loops (``ValLoop``/``TestLoop`` with ``fp16=True``) become the plug-in's,
    which run the configured dtype on any device.
    """
    wrapper = cfg.get('optim_wrapper')
    if not isinstance(wrapper, dict):
        return
    layout = wrapper_layout(wrapper)
    for _, entry in wrapper_entries(wrapper, layout):
        entry['type'] = PLUGIN_NAMES.get(entry.get('type', 'OptimWrapper'), entry.get('type'))
    standard = 'MultiOptimWrapperConstructor' if layout == 'multi' else \
        'DefaultOptimWrapperConstructor'
    named = wrapper.get('constructor', standard)
    if named in (standard, PLUGIN_NAMES[standard]):
        wrapper['constructor'] = PLUGIN_NAMES[standard]
    elif notes is not None:
        notes.append(
            f'optim_wrapper.constructor: {named!r} kept with --plugin (the plug-in\'s '
            f'{PLUGIN_NAMES[standard]} does not apply its paramwise_cfg options); it builds '
            f'the plug-in\'s {wrapper.get("type")!r} from MMEngine\'s OPTIM_WRAPPERS registry; '
            'see docs/migration/convert-config.md#named-constructors'
        )
    for key, standard in (('val_cfg', 'ValLoop'), ('test_cfg', 'TestLoop')):
        loop = cfg.get(key)  # a half-precision loop follows the configured dtype with it
        if isinstance(loop, dict) and loop.get('fp16') is True and (
                loop.get('type', standard) == standard):
            cfg[key] = {'type': f'Fp16utils{standard}', **{
                k: v for k, v in loop.items() if k != 'type'}}
    imports = cfg.setdefault('custom_imports', {})
    names = imports.setdefault('imports', [])
    if isinstance(names, str):
        names = imports['imports'] = [names]
    if PLUGIN_MODULE not in names:
        names.append(PLUGIN_MODULE)
    imports.setdefault('allow_failed_imports', False)


def convert_config(cfg: Mapping[str, Any], strict: bool = False,
                   plugin: bool = False, *, codebase: Optional[str] = None,
                   faithful: bool = False) -> dict[str, Any]:
    """Convert a 0.x (mmcv 1.x era) training config to the 1.x ``optim_wrapper`` style.

    ``optimizer``, ``optimizer_config``, ``fp16`` and ``runner.fp16_loss_scaler`` become
    one ``optim_wrapper`` (``AmpOptimWrapper`` when fp16 was on, the loss scale in
    GradScaler's names); a per-submodule ``optimizer`` becomes a
    ``MultiOptimWrapperConstructor`` config, the GAN ``train_cfg`` steps model and
    wrapper keys; the rest stays. Every rule: the guide *Convert a config*.

    Args:
        cfg: the 0.x config as a dict. Not modified.
        strict: raise on a key that cannot be converted safely, instead of warning.
        plugin: write a config for MMEngine's Runner with this package's plug-in
            (``custom_imports``, the ``Fp16utils...`` wrapper and constructor names).
        codebase: whose rules to follow for ``fp16`` (see :func:`migrate_config`).
        faithful: write values with mmcv's meaning (see :func:`migrate_config`).

    Returns:
        A new config dict.

    Raises:
        ConfigConversionError: with ``strict=True``, listing every problem by key.
        TypeError: ``cfg`` is not a mapping.

    Warns:
        MigrationWarning: one per problem, with ``strict=False``.

    Example:
        >>> cfg = dict(optimizer=dict(type='Adam', lr=1e-3), fp16=dict(loss_scale=512.))
        >>> convert_config(cfg, codebase='mmdet')
        {'optim_wrapper': {'type': 'AmpOptimWrapper', 'optimizer': {'type': 'Adam', \
'lr': 0.001}, 'loss_scale': 512.0}}
    """
    report = migrate_config(cfg, plugin=plugin, codebase=codebase, faithful=faithful)
    if report.problems:
        if strict:
            raise ConfigConversionError(report.problems)
        for text in report.problems:
            warnings.warn(text, MigrationWarning, stacklevel=2)
    for text in report.notes:
        warnings.warn(text, MigrationNote, stacklevel=2)
    return report.config


def enable_amp(cfg: Mapping[str, Any], dtype: Optional[str] = None) -> dict[str, Any]:
    """Switch a 1.x config to mixed precision: the ``--amp`` command-line switch.

    Each wrapper (``optim_wrapper`` or each entry of a ``MultiOptimWrapperConstructor``
    config; the plug-in's names too) becomes an ``AmpOptimWrapper`` with
    ``loss_scale='dynamic'`` unless it has one or ``dtype`` is ``'bfloat16'``, and
    ``dtype=dtype`` when given (``'auto'`` is resolved when the wrapper is built). One
    that already is an ``AmpOptimWrapper`` is left as it is.

    Args:
        cfg: a 1.x config (with ``optim_wrapper``). Not modified.
        dtype: ``None`` (the wrapper's default, float16), ``'float16'``, ``'bfloat16'``
            or ``'auto'``.

    Returns:
        A new config dict.

    Raises:
        ValueError: no ``optim_wrapper`` (run :func:`convert_config` first), an unknown
            ``dtype``, or a wrapper type other than ``OptimWrapper``/``AmpOptimWrapper``.
        TypeError: ``cfg`` is not a mapping.

    Warns:
        MigrationWarning: a wrapper that already was an ``AmpOptimWrapper``, when
            ``dtype`` is given (it is not applied there).

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

