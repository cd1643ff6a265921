"""fp16utils: mixed-precision training for PyTorch, 0.x decorators to 1.x wrappers.

Example:
    >>> import torch
    >>> from torch import nn
    >>> import fp16utils
    >>> class Net(nn.Module):
    ...     def __init__(self):
    ...         super().__init__()
    ...         self.fc = nn.Linear(4, 4)
    ...         self.fp16_enabled = False
    ...     @fp16utils.auto_fp16(out_fp32=True)
    ...     def forward(self, x):
    ...         return self.fc(x)
    >>> net = fp16utils.wrap_fp16_model(Net(), dtype=torch.bfloat16)
    >>> net(torch.ones(1, 4)).dtype
    torch.float32
"""

from ._torch import TORCH_VERSION, digit_version, has_native_amp
from .cast import cast_tensor_type
from .debug import NonFiniteRecord, OverflowReport, find_overflow, nonfinite_summary
from .decorators import auto_fp16, force_fp32
from .hooks import Fp16OptimizerHook, GradientCumulativeFp16OptimizerHook
from .migrate import (
    ConfigConversionError,
    FileChange,
    Finding,
    MigrationWarning,
    convert_config,
    convert_config_report,
    enable_amp,
    fix_imports,
    scan,
)
from .optim import AmpOptimWrapper, OptimWrapper, OptimWrapperDict, build_optim_wrapper
from .scaler import LossScaler
from .wrap import patch_forward_method, patch_norm_fp32, wrap_fp16_model

__version__ = '0.1.0'

__all__ = [
    'AmpOptimWrapper',
    'ConfigConversionError',
    'FileChange',
    'Finding',
    'Fp16OptimizerHook',
    'GradientCumulativeFp16OptimizerHook',
    'LossScaler',
    'MigrationWarning',
    'NonFiniteRecord',
    'OptimWrapper',
    'OptimWrapperDict',
    'OverflowReport',
    'TORCH_VERSION',
    '__version__',
    'auto_fp16',
    'build_optim_wrapper',
    'cast_tensor_type',
    'convert_config',
    'convert_config_report',
    'digit_version',
    'enable_amp',
    'find_overflow',
    'fix_imports',
    'force_fp32',
    'has_native_amp',
    'nonfinite_summary',
    'patch_forward_method',
    'patch_norm_fp32',
    'scan',
    'wrap_fp16_model',
]
