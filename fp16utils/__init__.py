"""fp16utils: mixed-precision training for PyTorch, from mmcv 0.x decorators to 1.x wrappers.

The public API (:data:`__all__`), imported lazily on first access (PEP 562): ``import
fp16utils`` and ``import fp16utils.migrate`` do not import torch.
"""

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # what type checkers and IDEs see; at run time __getattr__ imports
    from ._torch.versions import TORCH_VERSION, digit_version, has_native_amp
    from .cast import cast_tensor_type
    from .debug import (
        NonFiniteRecord,
        OverflowReport,
        PrecisionProblem,
        PrecisionReport,
        diagnose_precision,
        find_overflow,
        nonfinite_summary,
    )
    from .decorators import auto_fp16, force_fp32
    from .engine import StepResult
    from .evaluation import EvalPrecision, configured_precision, eval_precision
    from .fp32_modules import keep_fp32, kept_fp32
    from .fp32_ops import fp32_function
    from .hooks import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook
    from .migrate import (
        ConfigConversionError,
        FileChange,
        Finding,
        MigrationNote,
        MigrationReport,
        MigrationWarning,
        convert_config,
        convert_config_report,
        enable_amp,
        fix_imports,
        migrate_config,
        scan,
    )
    from .mmcv import patch_mmcv, unpatch_mmcv
    from .optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict, build_optim_wrapper
    from .precision import precision_support
    from .scaler import LossScaler
    from .skip_proxy import skip_aware
    from .wrap import patch_forward_method, patch_norm_fp32, wrap_fp16_model

__version__ = '0.1.0'
"""This package's version: the newest release in CHANGELOG.md."""

__all__ = [
    'AmpOptimWrapper',
    'ConfigConversionError',
    'EvalPrecision',
    'FileChange',
    'Finding',
    'Fp16OptimizerHook',
    'GradientCumulativeFp16OptimizerHook',
    'LossScaler',
    'MigrationNote',
    'MigrationReport',
    'MigrationWarning',
    'NonFiniteRecord',
    'OptimWrapper',
    'OptimWrapperDict',
    'OverflowReport',
    'PrecisionProblem',
    'PrecisionReport',
    'StepResult',
    'TORCH_VERSION',
    '__version__',
    'auto_fp16',
    'build_optim_wrapper',
    'cast_tensor_type',
    'configured_precision',
    'convert_config',
    'convert_config_report',
    'diagnose_precision',
    'digit_version',
    'enable_amp',
    'eval_precision',
    'find_overflow',
    'fix_imports',
    'force_fp32',
    'fp32_function',
    'has_native_amp',
    'keep_fp32',
    'kept_fp32',
    'migrate_config',
    'nonfinite_summary',
    'patch_forward_method',
    'patch_mmcv',
    'patch_norm_fp32',
    'precision_support',
    'scan',
    'skip_aware',
    'unpatch_mmcv',
    'wrap_fp16_model',
]

#: The submodule that defines each public name, imported on first access.
_EXPORTS = {
    'TORCH_VERSION': '_torch.versions',
    'digit_version': '_torch.versions',
    'has_native_amp': '_torch.versions',
    'cast_tensor_type': 'cast',
    'NonFiniteRecord': 'debug',
    'OverflowReport': 'debug',
    'find_overflow': 'debug',
    'nonfinite_summary': 'debug',
    'PrecisionProblem': 'debug',
    'PrecisionReport': 'debug',
    'diagnose_precision': 'debug',
    'EvalPrecision': 'evaluation',
    'configured_precision': 'evaluation',
    'eval_precision': 'evaluation',
    'auto_fp16': 'decorators',
    'force_fp32': 'decorators',
    'StepResult': 'engine',
    'skip_aware': 'skip_proxy',
    'Fp16OptimizerHook': 'hooks',
    'GradientCumulativeFp16OptimizerHook': 'hooks',
    'fp32_function': 'fp32_ops',
    'keep_fp32': 'fp32_modules',
    'kept_fp32': 'fp32_modules',
    'patch_mmcv': 'mmcv',
    'unpatch_mmcv': 'mmcv',
    'ConfigConversionError': 'migrate',
    'FileChange': 'migrate',
    'Finding': 'migrate',
    'MigrationNote': 'migrate',
    'MigrationReport': 'migrate',
    'MigrationWarning': 'migrate',
    'migrate_config': 'migrate',
    'convert_config': 'migrate',
    'convert_config_report': 'migrate',
    'enable_amp': 'migrate',
    'fix_imports': 'migrate',
    'scan': 'migrate',
    'AmpOptimWrapper': 'optim',
    'OptimWrapper': 'optim',
    'OptimWrapperDict': 'optim',
    'build_optim_wrapper': 'optim',
    'precision_support': 'precision',
    'LossScaler': 'scaler',
    'patch_forward_method': 'wrap',
    'patch_norm_fp32': 'wrap',
    'wrap_fp16_model': 'wrap',
}
#: The submodules that define public names, reachable as attributes too.
_SUBMODULES = frozenset(m for m in _EXPORTS.values() if '.' not in m)


def __getattr__(name: str) -> Any:
    """Import a public name (or one of the submodules) on first access; PEP 562."""
    if name in _EXPORTS:
        value = getattr(importlib.import_module(f'.{_EXPORTS[name]}', __name__), name)
    elif name in _SUBMODULES:
        value = importlib.import_module(f'.{name}', __name__)
    else:
        raise AttributeError(f'module {__name__!r} has no attribute {name!r}')
    globals()[name] = value  # later look-ups skip this function
    return value


#: What the package imports for itself; not part of its API, so not in ``dir()``.
_OWN_IMPORTS = frozenset({'Any', 'TYPE_CHECKING', 'importlib'})


def __dir__() -> list[str]:
    """The module's public names (imported or not yet), submodules and dunders."""
    names = set(globals()) | set(__all__)
    return sorted(n for n in names
                  if n not in _OWN_IMPORTS and (not n.startswith('_') or n.startswith('__')))
