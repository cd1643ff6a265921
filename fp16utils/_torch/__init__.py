"""The one place that knows about torch versions, devices and backends.

Everything version- or device-dependent goes through this module, so tests can
simulate an old torch by patching :data:`TORCH_VERSION` (and calling
:func:`refresh`), and the rest of the package never compares versions itself.

Example:
    >>> from fp16utils import _torch
    >>> _torch.digit_version('1.6.0') > _torch.digit_version('1.5.1')
    True
    >>> _torch.resolve_backend('legacy')
    'legacy'
"""

from __future__ import annotations

import contextlib
import os
import warnings
from typing import Any, Callable, ContextManager, Sequence

import torch
from packaging.version import InvalidVersion, Version

__all__ = [
    'BACKEND_ENV',
    'BACKENDS',
    'TORCH_VERSION',
    'LEVELS',
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
    'register_forward_pre_hook_with_kwargs',
    'autocast_state',
    'backend_reason',
    'call_autocast',
    'default_backend',
    'digit_version',
    'group_by_device_and_dtype',
    'has_native_amp',
    'is_compiling',
    'make_grad_scaler',
    'needs_loss_scaling',
    'refresh',
    'resolve_backend',
    'resolve_dtype',
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

#: The running torch version string, e.g. ``'2.13.0+cpu'``. Tests patch it.
TORCH_VERSION: str = str(torch.__version__)  # a plain str (dynamo hashes it as a key)

#: Environment variable that forces a backend for the whole process.
BACKEND_ENV = 'FP16UTILS_BACKEND'

#: The backends this package knows.
BACKENDS = ('native', 'legacy')

_NATIVE_AMP_MIN = (1, 6, 0, 0, 0, 0)
_LOW_PRECISION = (torch.float16, torch.bfloat16)
_DTYPE_NAMES = {
    'float16': torch.float16,
    'fp16': torch.float16,
    'half': torch.float16,
    'bfloat16': torch.bfloat16,
    'bf16': torch.bfloat16,
}

# Caches, decided at import and again by refresh(): the default backend (or why the
# environment names none); version -> has native AMP. A dynamo trace only reads them.
_default: str | None = None
_default_error: str | None = None
_native_cache: dict[str, bool] = {}


def digit_version(version_str: str, length: int = 4) -> tuple[int, ...]:
    """Turn a version string into a tuple of ints that orders correctly.

    Pre-releases sort before the release (``1.6.0rc1 < 1.6.0``), post-releases
    after it, and local labels (``+cu121``) are ignored.

    Args:
        version_str: A PEP 440 version, e.g. ``'2.1.0+cu121'`` or ``'1.6.0rc1'``.
        length: How many release numbers to keep (padded with zeros).

    Returns:
        A tuple of ``length + 2`` ints.

    Raises:
        ValueError: If ``version_str`` is not a version.

    Example:
        >>> digit_version('1.6.0rc1') < digit_version('1.6.0')
        True
    """
    try:
        version = Version(str(version_str))
    except InvalidVersion:
        raise ValueError(
            f'digit_version() got {version_str!r}, which is not a PEP 440 version '
            "string; pass something like '2.1.0' or '1.6.0rc1'.") from None
    if isinstance(length, bool) or not isinstance(length, int) or length < 1:
        raise ValueError(f'digit_version() needs an int length >= 1, got {length!r}.')
    release = list(version.release[:length])
    release += [0] * (length - len(release))
    if version.pre is not None:
        kind = {'a': -3, 'b': -2, 'rc': -1}[version.pre[0]]
        return (*release, kind, version.pre[1])
    if version.post is not None:
        return (*release, 1, version.post)
    if version.dev is not None:
        return (*release, -4, version.dev)
    return (*release, 0, 0)


def has_native_amp(version: str | None = None) -> bool:
    """Tell whether torch has native automatic mixed precision (torch >= 1.6).

    Args:
        version: A torch version to judge; defaults to :data:`TORCH_VERSION`.

    Returns:
        True when ``torch.autocast`` style AMP is available.

    Example:
        >>> has_native_amp('1.5.0')
        False
    """
    version = TORCH_VERSION if version is None else version
    cached = _native_cache.get(version)
    if cached is None:
        if _is_compiling():  # no version parsing inside a trace: what compiles has AMP
            return True
        cached = version != 'parrots' and (
            digit_version(version, length=3)[:3] >= _NATIVE_AMP_MIN[:3])
        _native_cache[version] = cached
    return cached


def resolve_backend(backend: str | None = None) -> str:
    """Pick the backend: an explicit argument, else the process default.

    Args:
        backend: ``'native'``, ``'legacy'`` or None for the default (see
            :func:`default_backend`).

    Returns:
        ``'native'`` or ``'legacy'``.

    Raises:
        ValueError: For an unknown name, or ``'native'`` on a torch without
            native AMP.

    Example:
        >>> resolve_backend('native') in ('native', 'legacy')
        True
    """
    if backend is None:
        return default_backend()
    if backend not in BACKENDS:
        raise ValueError(
            f'Unknown fp16utils backend {backend!r}; expected one of {BACKENDS} '
            'or None for the automatic choice.')
    if backend == 'native' and not has_native_amp():
        raise ValueError(
            f"backend='native' needs torch >= 1.6 but torch is {TORCH_VERSION}; use "
            "backend='legacy' or leave it as None.")
    return backend


def default_backend() -> str:
    """The process-wide backend: env ``FP16UTILS_BACKEND``, else by torch version.

    Decided when :mod:`fp16utils._torch` is imported and again by
    :func:`refresh`, so a ``torch.compile`` trace only reads the answer; call
    :func:`refresh` after changing the environment (or :data:`TORCH_VERSION`)
    at run time.

    Returns:
        ``'native'`` when torch has native AMP (and the environment does not ask
        for ``'legacy'``), else ``'legacy'``.

    Raises:
        ValueError: When ``FP16UTILS_BACKEND`` names no backend (or asks for
            ``'native'`` on a torch without native AMP).

    Example:
        >>> default_backend() in ('native', 'legacy')
        True
    """
    backend = _default
    if backend is not None:
        return backend
    if _is_compiling():  # the environment is never read inside a trace
        if _default_error is not None:
            raise ValueError(_default_error)
        return 'native' if has_native_amp() else 'legacy'  # not kept: refresh() decides
    return _decide_default()


def _decide_default() -> str:
    """Read the environment and keep the default backend (or why there is none)."""
    global _default, _default_error
    try:
        env = os.environ.get(BACKEND_ENV) or None
        if env is not None:
            env = env.strip().lower()
            if env not in BACKENDS:
                raise ValueError(
                    f'{BACKEND_ENV}={env!r} is not a backend; set it to one of {BACKENDS} '
                    'or unset it.')
            backend = resolve_backend(env)
        else:
            backend = 'native' if has_native_amp() else 'legacy'
    except ValueError as err:
        _default_error = str(err)
        raise
    _default, _default_error = backend, None
    return backend


def backend_reason() -> str:
    """Explain in one sentence why :func:`default_backend` chose what it did.

    Example:
        >>> isinstance(backend_reason(), str)
        True
    """
    env = os.environ.get(BACKEND_ENV)
    if env:
        return f'{BACKEND_ENV}={env} is set in the environment'
    if has_native_amp():
        return f'torch {TORCH_VERSION} has native AMP (torch.autocast + GradScaler)'
    return f'torch {TORCH_VERSION} is older than 1.6 and has no native AMP'


def refresh() -> None:
    """Decide again what depends on :data:`TORCH_VERSION` and the environment.

    Call it after patching either; it reads them now (eagerly, so that a
    ``torch.compile`` trace never has to).

    Example:
        >>> refresh()
    """
    global _default, _default_error
    _default = _default_error = None
    _native_cache.clear()
    _warm.decide()


def resolve_dtype(dtype: Any, default: torch.dtype = torch.float16) -> torch.dtype:
    """Normalise a low-precision dtype given as a torch dtype or a name.

    Args:
        dtype: ``torch.float16``, ``torch.bfloat16``, one of the names
            ``'float16' 'fp16' 'half' 'bfloat16' 'bf16'``, or None.
        default: Returned when ``dtype`` is None.

    Returns:
        ``torch.float16`` or ``torch.bfloat16``.

    Raises:
        ValueError: For any other dtype.

    Example:
        >>> resolve_dtype('bf16')
        torch.bfloat16
    """
    if dtype is None:
        return default
    if isinstance(dtype, str):
        key = dtype.lower().replace('torch.', '')
        if key in _DTYPE_NAMES:
            return _DTYPE_NAMES[key]
    elif dtype in _LOW_PRECISION:
        return dtype
    raise ValueError(
        f'Unsupported low-precision dtype {dtype!r}; expected torch.float16 or '
        "torch.bfloat16 (or the names 'float16' / 'bfloat16').")


def needs_loss_scaling(dtype: torch.dtype) -> bool:
    """Whether gradients in ``dtype`` need loss scaling (only float16 does).

    Example:
        >>> needs_loss_scaling(torch.bfloat16)
        False
    """
    return dtype == torch.float16


def autocast_for(device_type: str, dtype: torch.dtype | None = None,
                 enabled: bool = True, cache_enabled: bool | None = None
                 ) -> ContextManager[Any]:
    """Return the autocast context for one device type.

    Uses ``torch.autocast(device_type=...)``; on a torch without native AMP it
    returns a no-op context.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ``'mps'``, ``'xpu'``, ``'npu'``, ...
        dtype: The low-precision dtype; None keeps torch's default for the device.
        enabled: False gives a context that disables autocast on that device.
        cache_enabled: ``torch.autocast``'s weight-cast cache inside the context
            (None: torch's default, on). False avoids pytorch#105211 (a weight
            cast under ``no_grad`` reused by a later forward that needs its
            gradient). Ignored by torch < 1.10's CUDA-only autocast.

    Returns:
        A context manager.

    Example:
        >>> with autocast_for('cpu', torch.bfloat16):
        ...     y = torch.mm(torch.ones(2, 2), torch.ones(2, 2))
        >>> y.dtype
        torch.bfloat16
    """
    if not has_native_amp():
        return contextlib.nullcontext()
    if not _HAS_DEVICE_AUTOCAST:  # torch 1.6 - 1.9: CUDA float16 autocast only
        if device_type == 'cuda':
            return torch.cuda.amp.autocast(enabled=enabled)
        return contextlib.nullcontext()
    if dtype is not None:
        ok = _probe_cache.get(('autocast', device_type, dtype))
        if ok is None and not _is_compiling():  # in a trace, torch.autocast decides
            ok = autocast_supports(device_type, dtype)
        if ok is False:
            # torch.autocast warns for such a pair (older torch raises on entry); off is
            # what it would give, and the dtype of a disabled autocast does not matter.
            return torch.autocast(device_type=device_type, enabled=False)
    extra = {} if cache_enabled is None else {'cache_enabled': cache_enabled}
    if dtype is None:
        return torch.autocast(device_type=device_type, enabled=enabled, **extra)
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled, **extra)


def call_autocast(device_type: str, dtype: torch.dtype | None, enabled: bool,
                  func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call ``func(*args, **kwargs)`` inside autocast on one device type.

    Equivalent to ``with torch.autocast(device_type, dtype, enabled=enabled):
    func(...)``, with the same state changes on entry and exit (enabled flag,
    dtype, nesting count, cast cache), but without building a context object
    per call. While torch.compile traces, under a torch-function mode (as
    torch.export uses) or when TorchScript compiles, ``torch.autocast`` itself
    is used so those tools see it. On a torch without native AMP the function
    is simply called.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ...
        dtype: The low-precision dtype (None: keep the device's current one).
        enabled: True to turn autocast on, False to turn it off.
        func: What to call.
        *args: Its positional arguments.
        **kwargs: Its keyword arguments.

    Returns:
        What ``func`` returns.

    Example:
        >>> a = torch.ones(2, 2)
        >>> call_autocast('cpu', torch.bfloat16, True, torch.mm, a, a).dtype
        torch.bfloat16
    """
    if not (_native_cache.get(TORCH_VERSION) or has_native_amp()):
        return func(*args, **kwargs)
    # torch < 2.4 has no per-device autocast state setters: use the context.
    if (not _HAS_DEVICE_AUTOCAST_STATE or _is_compiling() or _torch_function_mode()
            or _is_scripting()):
        with autocast_for(device_type, dtype, enabled):
            return func(*args, **kwargs)
    prev_enabled = _is_autocast_enabled(device_type)
    prev_dtype = _get_autocast_dtype(device_type)
    if enabled and not autocast_supports(device_type, dtype or prev_dtype):
        enabled = False
    _set_autocast_enabled(device_type, enabled)
    if dtype is not None:
        _set_autocast_dtype(device_type, dtype)
    _increment_nesting()
    try:
        return func(*args, **kwargs)
    finally:
        if _decrement_nesting() == 0:
            torch.clear_autocast_cache()
        _set_autocast_enabled(device_type, prev_enabled)
        _set_autocast_dtype(device_type, prev_dtype)


# torch.compiler.is_compiling from torch 2.3; before it torch._utils.is_compiling, which
# dynamo answers True while it traces (importing torch._dynamo here would cost seconds).
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, 'compiler', None), 'is_compiling', None) or getattr(
    torch._utils, 'is_compiling', lambda: False)
#: Whether dynamo is tracing (always False on a torch without torch.compile).
is_compiling = _is_compiling
# Bound once: call_autocast's eager path runs per decorated call (the per-device
# functions exist from torch 2.4, the only torch that takes that path).
_torch_function_mode: Callable[[], bool] = getattr(
    torch._C, '_is_torch_function_mode_enabled', lambda: False)
_is_scripting: Callable[[], bool] = torch._jit_internal.is_scripting
_is_autocast_enabled = torch.is_autocast_enabled
_get_autocast_dtype = getattr(torch, 'get_autocast_dtype', None)
_set_autocast_enabled = torch.set_autocast_enabled
_set_autocast_dtype = getattr(torch, 'set_autocast_dtype', None)
_increment_nesting = getattr(torch, 'autocast_increment_nesting', None)
_decrement_nesting = getattr(torch, 'autocast_decrement_nesting', None)


def make_grad_scaler(device_type: str = 'cuda', *, init_scale: float = 2.0**16,
                     growth_factor: float = 2.0, backoff_factor: float = 0.5,
                     growth_interval: int = 2000,
                     enabled: bool = True) -> torch.amp.GradScaler:
    """Build a ``torch.amp.GradScaler`` for a device type.

    Args:
        device_type: The device the gradients live on.
        init_scale: Initial scale.
        growth_factor: Factor applied after ``growth_interval`` clean steps.
        backoff_factor: Factor applied on overflow.
        growth_interval: Clean steps between growths.
        enabled: False gives a pass-through scaler.

    Returns:
        A GradScaler.

    Example:
        >>> scaler = make_grad_scaler('cuda', init_scale=512.0, enabled=False)
        >>> scaler.scale(torch.tensor(3.0)).item()  # disabled: a pass-through, any device
        3.0
    """
    if not has_native_amp():
        raise RuntimeError(
            f'torch {TORCH_VERSION} has no native GradScaler; use the legacy backend '
            "(backend='legacy'), which scales with fp16utils.LossScaler.")
    if _AMP_GRAD_SCALER is None:  # only torch.cuda.amp.GradScaler, no device argument
        if device_type != 'cuda' and enabled:
            raise RuntimeError(
                f'torch {torch.__version__} has a GradScaler for cuda only, not for '
                f'{device_type!r} (no torch.amp.GradScaler(device)); use the legacy backend '
                "(backend='legacy'), or bfloat16, which needs no loss scaling.")
        # A disabled scaler only passes the loss through, whatever the device.
        return torch.cuda.amp.GradScaler(
            init_scale=init_scale, growth_factor=growth_factor,
            backoff_factor=backoff_factor, growth_interval=growth_interval,
            enabled=enabled)
    return torch.amp.GradScaler(
        device_type, init_scale=init_scale, growth_factor=growth_factor,
        backoff_factor=backoff_factor, growth_interval=growth_interval,
        enabled=enabled)


def autocast_state(device_type: str) -> tuple[bool, torch.dtype | None]:
    """Tell whether autocast is on for a device type, and in which dtype.

    Works with the per-device API of torch >= 2.4 and with the older
    ``is_autocast_enabled()`` / ``is_autocast_cpu_enabled()`` functions.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ...

    Returns:
        ``(enabled, dtype)``; ``(False, None)`` where torch cannot tell.

    Example:
        >>> with autocast_for('cpu', torch.bfloat16):
        ...     autocast_state('cpu')
        (True, torch.bfloat16)
    """
    if _HAS_DEVICE_AUTOCAST_STATE:  # per-device state calls
        return (torch.is_autocast_enabled(device_type),
                torch.get_autocast_dtype(device_type))
    if device_type == 'cuda':
        get_dtype = getattr(torch, 'get_autocast_gpu_dtype', None)
        return (torch.is_autocast_enabled(),
                get_dtype() if get_dtype is not None else torch.float16)
    # One pair of functions per device: is_autocast_cpu_enabled/get_autocast_cpu_dtype, ...
    is_enabled = getattr(torch, f'is_autocast_{device_type}_enabled', None)
    get_dtype = getattr(torch, f'get_autocast_{device_type}_dtype', None)
    if is_enabled is not None and get_dtype is not None:
        return bool(is_enabled()), get_dtype()
    return False, None


def any_autocast_enabled() -> bool:
    """Whether autocast is on for any device type (one C call on current torch).

    The cheap first question of ``@force_fp32``'s flag-off path; dynamo traces it.

    Example:
        >>> any_autocast_enabled()
        False
        >>> with autocast_for('cpu', torch.bfloat16):
        ...     any_autocast_enabled()
        True
    """
    if _any_autocast is not None:
        return bool(_any_autocast())
    return autocast_state('cpu')[0] or autocast_state('cuda')[0]


def group_by_device_and_dtype(
        tensors: Sequence[torch.Tensor]) -> list[tuple[Any, list[torch.Tensor]]]:
    """Group tensors by (device, dtype) for foreach kernels (one C++ pass).

    Args:
        tensors: Dense tensors.

    Returns:
        ``((device, dtype), tensors)`` pairs.

    Example:
        >>> groups = group_by_device_and_dtype([torch.ones(1), torch.ones(2)])
        >>> [(key[1], len(ts)) for key, ts in groups]
        [(torch.float32, 2)]
    """
    if not tensors:
        return []
    if _c_group is not None:
        grouped = _c_group([list(tensors)], False)
        if _C_GROUP_NAMES_DTYPES:  # some torch keys the groups by the dtype's name
            return [((key[0], getattr(torch, key[1])), value[0][0])
                    for key, value in grouped.items()]
        return [(key, value[0][0]) for key, value in grouped.items()]
    groups: dict[tuple[Any, Any], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.items())


_c_group = getattr(torch._C, '_group_tensors_by_device_and_dtype', None)
_C_GROUP_NAMES_DTYPES = _c_group is not None and isinstance(
    next(iter(_c_group([[torch.ones(1)]], False)))[1], str)
# Feature flags (what the installed torch has, whatever TORCH_VERSION says).
_HAS_DEVICE_AUTOCAST = hasattr(torch, 'autocast')  # torch >= 1.10
_HAS_DEVICE_AUTOCAST_STATE = hasattr(torch, 'get_autocast_dtype')  # torch >= 2.4
_AMP_GRAD_SCALER = getattr(getattr(torch, 'amp', None), 'GradScaler', None)  # >= 2.3
_any_autocast = getattr(torch._C, '_is_any_autocast_enabled', None)  # torch >= 2.0


# --------------------------------------------------------------------------- probes
#
# What the installed torch can do is found by trying it once per process (see
# the capability rules in :mod:`fp16utils._torch.caps`); the probes that the hot
# paths need live here, the others in ``caps``.


_LOW_NAMES = {torch.float16: 'float16', torch.bfloat16: 'bfloat16'}
_probe_cache: dict[tuple[str, str, Any], bool] = {}


def _cached_probe(kind: str, device_type: str, dtype: Any,
                  probe: Callable[[], bool]) -> bool:
    key = (kind, device_type, dtype)
    ok = _probe_cache.get(key)
    if ok is None:
        if _is_compiling():  # never probe inside a trace: "cannot", and nothing kept
            return False
        with warnings.catch_warnings():
            warnings.simplefilter('ignore')
            try:
                ok = bool(probe())
            except Exception:  # noqa: BLE001 - whatever torch raises means "cannot"
                ok = False
        _probe_cache[key] = ok
    return ok


def device_present(device_type: str) -> bool:
    """Whether a device of this type is usable here (``'cpu'`` always is).

    Example:
        >>> device_present('cpu')
        True
    """
    if device_type in ('cpu', 'meta'):
        return True
    if device_type == 'cuda':
        return torch.cuda.is_available()
    if device_type == 'mps':
        mps = getattr(torch.backends, 'mps', None)
        return bool(mps is not None and mps.is_available())
    module = getattr(torch, device_type, None)
    is_available = getattr(module, 'is_available', None)
    if is_available is None:
        return False
    try:
        return bool(is_available())
    except Exception:  # noqa: BLE001
        return False


def autocast_supports(device_type: str, dtype: torch.dtype) -> bool:
    """Whether ``torch.autocast`` accepts ``dtype`` on the device (tried once).

    torch.autocast itself validates the pair: it warns and turns itself off
    (some versions raise on entry) when the pair is not supported; either
    answer is kept, so the fast path never repeats that work.

    Example:
        >>> autocast_supports('cpu', torch.bfloat16)
        True
    """
    ok = _probe_cache.get(('autocast', device_type, dtype))  # the per-call fast path
    if ok is not None:
        return ok

    def probe() -> bool:
        if not device_present(device_type):
            return False
        if not _HAS_DEVICE_AUTOCAST:  # only torch.cuda.amp.autocast (float16)
            return device_type == 'cuda' and dtype == torch.float16
        ctx = torch.autocast(device_type=device_type, dtype=dtype)
        if not getattr(ctx, '_enabled', True):
            return False
        before = autocast_state(device_type)
        try:
            with ctx:
                inside = autocast_state(device_type)
        finally:
            _restore_autocast_state(device_type, before)
        return inside[1] in (None, dtype)
    return _cached_probe('autocast', device_type, dtype, probe)


def _restore_autocast_state(device_type: str, state: tuple[bool, Any]) -> None:
    """Undo a half-entered autocast (an entry that raised after changing the state)."""
    if autocast_state(device_type) == state or state[1] is None:
        return
    enabled, dtype = state
    if _HAS_DEVICE_AUTOCAST_STATE:
        torch.set_autocast_enabled(device_type, enabled)
        torch.set_autocast_dtype(device_type, dtype)
    elif device_type == 'cuda':
        torch.set_autocast_enabled(enabled)
    else:
        set_enabled = getattr(torch, f'set_autocast_{device_type}_enabled', None)
        set_dtype = getattr(torch, f'set_autocast_{device_type}_dtype', None)
        if set_enabled is not None:
            set_enabled(enabled)
        if set_dtype is not None:
            set_dtype(dtype)


# The rest of the torch layer, one concern a module, re-exported here so that the
# package reads ``_torch.name`` whatever module defines it.
from . import warm as _warm  # noqa: E402
from .caps import (  # noqa: E402
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
from .compat import (  # noqa: E402
    clip_grad_norm_,
    clip_grad_value_,
    foreach_copy_,
    forward_pre_hook_takes_kwargs,
    register_forward_pre_hook_with_kwargs,
)
from .state import (  # noqa: E402
    dispatch_mode_active,
    grad_scaler_changes,
    grad_scaler_found_inf,
    grad_scaler_started,
    optimizer_handles_unscaling,
    quiet_grad_scaler_load,
    quiet_grad_scaler_update,
    reset_grad_scaler_step,
)
from .warm import warm_device  # noqa: E402

_warm.warm_at_import()  # what a torch.compile trace reads is decided before any trace runs
