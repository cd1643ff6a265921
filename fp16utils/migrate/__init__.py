"""Move a 0.x fp16 codebase to the 1.x style; standard library only (no torch, no mmcv).

``convert``: :func:`migrate_config`, :func:`convert_config`,
:func:`convert_config_report` and the ``--amp`` switch :func:`enable_amp`;
``config_files``: :func:`load_config`, :func:`format_config`;
``scanner``: :func:`scan`; ``import_fixer``: :func:`fix_imports`; ``errors``: the
command's two errors.
"""

from .config_files import format_config, load_config
from .convert import (
    ConfigConversionError,
    MigrationNote,
    MigrationReport,
    MigrationWarning,
    convert_config,
    convert_config_report,
    enable_amp,
    migrate_config,
)
from .import_fixer import FileChange, fix_imports
from .scanner import Finding, scan

__all__ = [
    'ConfigConversionError',
    'FileChange',
    'Finding',
    'MigrationNote',
    'MigrationReport',
    'MigrationWarning',
    'convert_config',
    'convert_config_report',
    'enable_amp',
    'fix_imports',
    'format_config',
    'load_config',
    'migrate_config',
    'scan',
]
