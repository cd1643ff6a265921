"""The one place that knows about torch versions, devices, backends and torch's private state.

Everything version- or device-dependent goes through this package, and so
does every read of torch's private state (each behind a named helper that
says what it relies on and what it falls back to); the rest of fp16utils
never compares versions nor touches a private torch name. One concept a
module, re-exported here so that the library reads ``_torch.name``:

- :mod:`.versions`: the torch version, native AMP, the default backend.
- :mod:`.dtypes`: the low-precision dtypes and their names.
- :mod:`.tracing`: whether dynamo, TorchScript or a torch-function mode traces.
- :mod:`.probes`: the once-per-process probe cache, which devices are present.
- :mod:`.autocast`: entering autocast per device type, reading its state.
- :mod:`.factory`: building a GradScaler.
- :mod:`.caps`: capabilities per (device, dtype) and the backend rules.
- :mod:`.compat`: stand-ins for what older torch lacks (hooks, clipping, copies).
- :mod:`.ops`: tensor operations torch keeps private (foreach, flatten, grouping).
- :mod:`.state`: private GradScaler and optimizer state.
- :mod:`.models`: a model's device type, the model inside a DataParallel/DDP.
- :mod:`.warm`: what a ``torch.compile`` trace reads, decided before any trace
  (at import and by :func:`refresh`).

Tests simulate an old torch by patching ``versions.TORCH_VERSION`` and calling
:func:`refresh`; a flag or cache is patched in the module that defines it.

Example:
    >>> from fp16utils import _torch
    >>> _torch.digit_version('1.6.0') > _torch.digit_version('1.5.1')
    True
    >>> _torch.resolve_backend('legacy')
    'legacy'
"""

from __future__ import annotations

# The submodules, reachable as attributes (tests patch a flag where it is defined).
from . import (
    autocast,  # noqa: F401
    caps,  # noqa: F401
    compat,  # noqa: F401
    dtypes,  # noqa: F401
    factory,  # noqa: F401
    models,  # noqa: F401
    ops,  # noqa: F401
    probes,  # noqa: F401
    state,  # noqa: F401
    tracing,  # noqa: F401
    versions,  # noqa: F401
    warm,  # noqa: F401
)
from .autocast import (
    any_autocast_enabled,
    autocast_for,
    autocast_state,
    autocast_supports,
    call_autocast,
)
from .caps import (
    LEVELS,
    autocast_norms_support,
    backend_for,
    best_device_type,
    capability_rows,
    check_dtype,
    cpu_isa_flags,
    fused_check_supports,
    grad_scaler_supports,
    kernels_support,
    native_reason,
    precision_level,
    speed_probe,
    table_level,
)
from .compat import (
    clip_grad_norm_,
    clip_grad_value_,
    foreach_copy_,
    forward_pre_hook_takes_kwargs,
    register_forward_hook_with_kwargs,
    register_forward_pre_hook_with_kwargs,
)
from .dtypes import _LOW_NAMES, _LOW_PRECISION, needs_loss_scaling, resolve_dtype  # noqa: F401
from .factory import make_grad_scaler
from .models import (
    BatchNormBase,
    InstanceNormBase,
    TensorPath,
    has_no_sync,
    module_device_type,
    own_tensor,
    unwrap_model,
)
from .ops import (
    flatten_dense_tensors,
    foreach_div_,
    foreach_zero_,
    fused_non_finite_check,
    group_by_device_and_dtype,
    local_tensor,
    sparse_values,
    unflatten_dense_tensors,
)
from .probes import (
    _probe_cache,  # noqa: F401
    device_present,
)
from .state import (
    dispatch_mode_active,
    grad_scaler_changes,
    grad_scaler_found_inf,
    grad_scaler_started,
    optimizer_handles_unscaling,
    quiet_grad_scaler_load,
    quiet_grad_scaler_update,
    reset_grad_scaler_step,
)
from .tracing import is_compiling, is_scripting, torch_function_mode_active
from .versions import (
    BACKEND_ENV,
    BACKENDS,
    TORCH_VERSION,
    backend_reason,
    default_backend,
    digit_version,
    has_native_amp,
    resolve_backend,
)
from .warm import refresh, warm_device

__all__ = [
    'BACKEND_ENV',
    'BACKENDS',
    'TORCH_VERSION',
    'LEVELS',
    'BatchNormBase',
    'InstanceNormBase',
    'TensorPath',
    'any_autocast_enabled',
    'autocast_for',
    'best_device_type',
    'cpu_isa_flags',
    'precision_level',
    'speed_probe',
    'table_level',
    'autocast_norms_support',
    'autocast_supports',
    'backend_for',
    'capability_rows',
    'check_dtype',
    'clip_grad_norm_',
    'clip_grad_value_',
    'device_present',
    'foreach_copy_',
    'forward_pre_hook_takes_kwargs',
    'fused_check_supports',
    'grad_scaler_supports',
    'kernels_support',
    'native_reason',
    'register_forward_hook_with_kwargs',
    'register_forward_pre_hook_with_kwargs',
    'autocast_state',
    'backend_reason',
    'call_autocast',
    'default_backend',
    'digit_version',
    'group_by_device_and_dtype',
    'has_native_amp',
    'has_no_sync',
    'is_compiling',
    'is_scripting',
    'make_grad_scaler',
    'module_device_type',
    'needs_loss_scaling',
    'own_tensor',
    'refresh',
    'resolve_backend',
    'resolve_dtype',
    'torch_function_mode_active',
    'unwrap_model',
    # tensor operations torch keeps private (ops.py)
    'flatten_dense_tensors',
    'foreach_div_',
    'foreach_zero_',
    'fused_non_finite_check',
    'local_tensor',
    'sparse_values',
    'unflatten_dense_tensors',
    # private torch state (state.py)
    'dispatch_mode_active',
    'grad_scaler_changes',
    'grad_scaler_found_inf',
    'grad_scaler_started',
    'optimizer_handles_unscaling',
    'quiet_grad_scaler_load',
    'quiet_grad_scaler_update',
    'reset_grad_scaler_step',
    # eager decisions (warm.py)
    'warm_device',
]
