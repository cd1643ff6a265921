"""Move a 0.x fp16 codebase to the 1.x style: configs, the ``--amp`` switch, and code.

Four tools, all plain functions that need neither torch nor mmcv (the package
imports the standard library only, so the ``fp16utils scan`` and ``fp16utils
migrate`` commands start without torch):

* :func:`convert_config` turns a 0.x training config (``fp16``, ``optimizer``,
  ``optimizer_config``, ``runner.fp16_loss_scaler``, the GAN ``train_cfg`` steps)
  into a 1.x one built around ``optim_wrapper``. :func:`convert_config_report`
  does the same and returns the list of problems instead of warning.
* :func:`enable_amp` is the ``--amp`` switch: it turns the wrapper(s) of a 1.x
  config into ``AmpOptimWrapper``.
* :func:`scan` finds every 0.x fp16 usage in a source tree (imports from mm*
  packages, decorators, ``fp16_enabled``, fp16 config keys).
* :func:`load_config` reads a Python config file (running it, as mmcv's ``Config``
  does, with its ``_base_`` files merged); :func:`format_config` writes a config
  back as a file of literals that loads back equal. With :func:`convert_config`
  they convert a file from Python as ``fp16utils migrate`` does.
* :func:`fix_imports` rewrites the imports of the 0.x fp16 names to
  ``from fp16utils import ...`` so the code runs without mmcv, and leaves
  everything else in the files as it was.

Modules: ``convert`` (the config conversion and ``enable_amp``), ``config_files``
(reading and writing Python config files), ``scanner`` (``scan``), ``fix``
(``fix_imports``), ``errors`` (the command's two errors), and the private
``_converter`` and ``_source`` they build on.

Example:
    >>> cfg = dict(
    ...     optimizer=dict(type='SGD', lr=0.02, momentum=0.9),
    ...     optimizer_config=dict(grad_clip=dict(max_norm=35, norm_type=2)),
    ...     fp16=dict(loss_scale=512.),
    ... )
    >>> convert_config(cfg)['optim_wrapper']  # doctest: +NORMALIZE_WHITESPACE
    {'type': 'AmpOptimWrapper', 'optimizer': {'type': 'SGD', 'lr': 0.02, 'momentum': 0.9},
     'loss_scale': 512.0, 'clip_grad': {'max_norm': 35, 'norm_type': 2}}
"""

from .config_files import format_config, load_config
from .convert import (
    ConfigConversionError,
    MigrationWarning,
    convert_config,
    convert_config_report,
    enable_amp,
)
from .fix import FileChange, fix_imports
from .scanner import Finding, scan

__all__ = [
    'ConfigConversionError',
    'FileChange',
    'Finding',
    'MigrationWarning',
    'convert_config',
    'convert_config_report',
    'enable_amp',
    'fix_imports',
    'format_config',
    'load_config',
    'scan',
]
