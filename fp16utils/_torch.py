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
from typing import Any, Callable, ContextManager, Sequence

import torch
from packaging.version import InvalidVersion, Version

__all__ = [
    'BACKEND_ENV',
    'BACKENDS',
    'TORCH_VERSION',
    'autocast_for',
    'autocast_state',
    'backend_reason',
    'call_autocast',
    'default_backend',
    'digit_version',
    'group_by_device_and_dtype',
    'has_native_amp',
    'make_grad_scaler',
    'needs_loss_scaling',
    'refresh',
    'resolve_backend',
    'resolve_dtype',
]

#: The running torch version string, e.g. ``'2.13.0+cpu'``. Tests patch it.
TORCH_VERSION: str = torch.__version__

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

# Caches, emptied by refresh(): the default backend; version -> has native AMP.
_default: str | None = None
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
    if length < 1:
        raise ValueError(f'digit_version() needs length >= 1, got {length}.')
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

    The environment is read on first use; call :func:`refresh` after changing
    it (or :data:`TORCH_VERSION`) at run time.

    Returns:
        ``'native'`` when torch has native AMP (and the environment does not ask
        for ``'legacy'``), else ``'legacy'``.

    Example:
        >>> default_backend() in ('native', 'legacy')
        True
    """
    global _default
    if _default is not None:
        return _default
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
    _default = backend
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
    """Forget cached decisions (after patching :data:`TORCH_VERSION` or the env).

    Example:
        >>> refresh()
    """
    global _default
    _default = None
    _native_cache.clear()


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
                 enabled: bool = True) -> ContextManager[Any]:
    """Return the autocast context for one device type.

    Uses ``torch.autocast(device_type=...)``; on a torch without native AMP it
    returns a no-op context.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ``'mps'``, ``'xpu'``, ``'npu'``, ...
        dtype: The low-precision dtype; None keeps torch's default for the device.
        enabled: False gives a context that disables autocast on that device.

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
    if dtype is None:
        return torch.autocast(device_type=device_type, enabled=enabled)
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled)


def _autocast_supported(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch accepts autocast to ``dtype`` on ``device_type`` (cached).

    torch.autocast itself validates the pair (and warns once when it is not
    supported); the answer is kept so the fast path never repeats that work.
    """
    key = (device_type, dtype)
    ok = _supported_cache.get(key)
    if ok is None:
        ok = bool(torch.autocast(device_type=device_type, dtype=dtype)._enabled)
        _supported_cache[key] = ok
    return ok


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
    if enabled:
        key = (device_type, dtype or prev_dtype)
        if not (_supported_cache.get(key) or _autocast_supported(*key)):
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


_supported_cache: dict[tuple[str, torch.dtype], bool] = {}
_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, 'compiler', None), 'is_compiling', lambda: False)
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
        >>> make_grad_scaler('cpu', init_scale=512.0).get_scale()
        512.0
    """
    if not has_native_amp():
        raise RuntimeError(
            f'torch {TORCH_VERSION} has no native GradScaler; use the legacy backend '
            "(backend='legacy'), which scales with fp16utils.LossScaler.")
    if _AMP_GRAD_SCALER is None:  # torch < 2.3: only the CUDA GradScaler exists
        if device_type != 'cuda':
            raise RuntimeError(
                f'torch {TORCH_VERSION} has a GradScaler for cuda only, not for '
                f'{device_type!r}; upgrade torch (>= 2.3) or use the legacy backend.')
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
    if _HAS_DEVICE_AUTOCAST_STATE:  # torch >= 2.4
        return (torch.is_autocast_enabled(device_type),
                torch.get_autocast_dtype(device_type))
    if device_type == 'cuda':
        get_dtype = getattr(torch, 'get_autocast_gpu_dtype', None)
        return (torch.is_autocast_enabled(),
                get_dtype() if get_dtype is not None else torch.float16)
    if device_type == 'cpu' and hasattr(torch, 'is_autocast_cpu_enabled'):
        return torch.is_autocast_cpu_enabled(), torch.get_autocast_cpu_dtype()
    return False, None


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
        return [(key, value[0][0]) for key, value in grouped.items()]
    groups: dict[tuple[Any, Any], list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return list(groups.items())


_c_group = getattr(torch._C, '_group_tensors_by_device_and_dtype', None)
# Feature flags (what the installed torch has, whatever TORCH_VERSION says).
_HAS_DEVICE_AUTOCAST = hasattr(torch, 'autocast')  # torch >= 1.10
_HAS_DEVICE_AUTOCAST_STATE = hasattr(torch, 'get_autocast_dtype')  # torch >= 2.4
_AMP_GRAD_SCALER = getattr(getattr(torch, 'amp', None), 'GradScaler', None)  # >= 2.3


# --------------------------------------------------------------------------- private torch state
#
# Every read of torch's private state goes through one of these helpers. Each
# says what it relies on, and falls back to public behaviour where it can.


def optimizer_handles_unscaling(optimizer: Any) -> bool:
    """Whether ``optimizer.step`` unscales and skips by itself (``fused=True`` optimizers).

    Relies on the private ``_step_supports_amp_scaling`` flag that torch's
    fused optimizers set (torch >= 2.0); False where it is absent.

    Example:
        >>> optimizer_handles_unscaling(torch.optim.SGD([torch.nn.Parameter(torch.ones(1))],
        ...                                              lr=1.0))
        False
    """
    return bool(getattr(optimizer, '_step_supports_amp_scaling', False))


def grad_scaler_started(scaler: Any) -> bool:
    """Whether ``scaler`` has scaled a loss yet (made its scale tensor).

    Relies on GradScaler's private ``_scale`` attribute (None until the
    first ``scale()``); a scaler without it counts as started.

    Example:
        >>> scaler = make_grad_scaler('cpu')
        >>> before = grad_scaler_started(scaler)
        >>> _ = scaler.scale(torch.ones(1))
        >>> before, grad_scaler_started(scaler)
        (False, True)
    """
    return getattr(scaler, '_scale', True) is not None


def grad_scaler_found_inf(scaler: Any, optimizer: Any) -> dict[Any, torch.Tensor]:
    """The per-device found-inf flags that ``scaler.unscale_(optimizer)`` recorded.

    Uses GradScaler's private ``_found_inf_per_device`` (or, on older torch,
    its ``_per_optimizer_states``). Call it after ``unscale_`` and before
    ``update``; the flags are device tensors (reading them syncs).

    Example:
        >>> p = torch.nn.Parameter(torch.ones(1)); opt = torch.optim.SGD([p], lr=1.0)
        >>> scaler = make_grad_scaler('cpu')
        >>> scaler.scale(p.sum()).backward(); scaler.unscale_(opt)
        >>> [bool(flag) for flag in grad_scaler_found_inf(scaler, opt).values()]
        [False]
    """
    getter = getattr(scaler, '_found_inf_per_device', None)
    if getter is not None:
        return getter(optimizer)
    return scaler._per_optimizer_states[id(optimizer)]['found_inf_per_device']


class _ObservedScaler:
    """Mixin for a GradScaler: counts the state changes made from outside fp16utils.

    ``load_state_dict`` and ``update(new_scale)`` bump ``_fp16utils_changes``,
    so an owner that mirrors the scale on the host (to read it without a
    device sync) can tell that its mirror is stale. fp16utils makes its own
    calls through :func:`quiet_grad_scaler_update` / :func:`quiet_grad_scaler_load`.
    A pickled or deep-copied scaler is a plain GradScaler again.
    """

    _fp16utils_base: type
    _fp16utils_changes = 0

    def load_state_dict(self, state_dict: Any) -> None:
        super().load_state_dict(state_dict)  # type: ignore[misc]
        self._fp16utils_changes += 1

    def update(self, new_scale: Any = None) -> None:
        super().update(new_scale)  # type: ignore[misc]
        if new_scale is not None:
            self._fp16utils_changes += 1

    def __reduce_ex__(self, protocol: Any) -> Any:
        state = self.__getstate__()  # type: ignore[misc]
        state.pop('_fp16utils_changes', None)
        return _plain_grad_scaler, (self._fp16utils_base, state)

    def __deepcopy__(self, memo: Any) -> Any:
        import copy

        state = copy.deepcopy(self.__getstate__(), memo)  # type: ignore[misc]
        state.pop('_fp16utils_changes', None)
        return _plain_grad_scaler(self._fp16utils_base, state)


def _plain_grad_scaler(cls: type, state: dict[str, Any]) -> Any:
    scaler = cls.__new__(cls)
    scaler.__setstate__(state)
    return scaler


_OBSERVED_CLASSES: dict[type, type] = {}


def observe_grad_scaler(scaler: Any) -> Any:
    """Make ``scaler`` count the state changes made to it from outside fp16utils.

    Read the count with :func:`grad_scaler_changes`. The scaler stays an
    instance of its class (a subclass is swapped in).

    Example:
        >>> scaler = observe_grad_scaler(make_grad_scaler('cpu', init_scale=8.0))
        >>> before = grad_scaler_changes(scaler)
        >>> scaler.load_state_dict(dict(scaler.state_dict(), scale=4.0))
        >>> grad_scaler_changes(scaler) - before, scaler.get_scale()
        (1, 4.0)
    """
    base = type(scaler)
    if isinstance(scaler, _ObservedScaler):
        return scaler
    cls = _OBSERVED_CLASSES.get(base)
    if cls is None:
        cls = type(base.__name__, (_ObservedScaler, base), {'_fp16utils_base': base})
        cls.__module__ = base.__module__
        _OBSERVED_CLASSES[base] = cls
    scaler.__class__ = cls
    return scaler


def grad_scaler_changes(scaler: Any) -> int:
    """How many outside ``load_state_dict`` / ``update(new_scale)`` calls ``scaler`` had."""
    return getattr(scaler, '_fp16utils_changes', 0)


def quiet_grad_scaler_update(scaler: Any, new_scale: Any = None) -> None:
    """``scaler.update(new_scale)`` without counting it as an outside change."""
    base = getattr(scaler, '_fp16utils_base', None)
    (base.update if base is not None else type(scaler).update)(scaler, new_scale)


def quiet_grad_scaler_load(scaler: Any, state: Any) -> None:
    """``scaler.load_state_dict(state)`` without counting it as an outside change."""
    base = getattr(scaler, '_fp16utils_base', None)
    (base.load_state_dict if base is not None else type(scaler).load_state_dict)(scaler, state)


_dispatch_stack_len = getattr(torch._C, '_len_torch_dispatch_stack', None)


def dispatch_mode_active() -> bool:
    """Whether a torch dispatch mode (fake or meta tensors, tracing) is on.

    Reads torch's private ``torch._C._len_torch_dispatch_stack``; False where
    torch lacks it (no dispatch modes there).

    Example:
        >>> dispatch_mode_active()
        False
    """
    return bool(_dispatch_stack_len is not None and _dispatch_stack_len())
