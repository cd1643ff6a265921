"""Move a 0.x fp16 codebase to the 1.x style; standard library only (no torch, no mmcv).

``convert``: :func:`convert_config`, :func:`convert_config_report` and the ``--amp``
switch :func:`enable_amp`; ``config_files``: :func:`load_config`, :func:`format_config`;
``scanner``: :func:`scan`; ``import_fixer``: :func:`fix_imports`; ``errors``: the
command's two errors.
"""

from .config_files import format_config, load_config
from .convert import (
    ConfigConversionError,
    MigrationWarning,
    convert_config,
    convert_config_report,
    enable_amp,
)
from .import_fixer import FileChange, fix_imports
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
