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
import inspect
import os
import warnings
from typing import Any, Callable, ContextManager, Optional, Sequence

import torch
from packaging.version import InvalidVersion, Version

__all__ = [
    'BACKEND_ENV',
    'BACKENDS',
    'TORCH_VERSION',
    'autocast_for',
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
    'make_grad_scaler',
    'needs_loss_scaling',
    'refresh',
    'resolve_backend',
    'resolve_dtype',
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
    if dtype is not None and not autocast_supports(device_type, dtype):
        # torch.autocast warns for such a pair (older torch raises on entry); off is
        # what it would give, and the dtype of a disabled autocast does not matter.
        return torch.autocast(device_type=device_type, enabled=False)
    if dtype is None:
        return torch.autocast(device_type=device_type, enabled=enabled)
    return torch.autocast(device_type=device_type, dtype=dtype, enabled=enabled)


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
    if not has_native_amp():
        return func(*args, **kwargs)
    # torch < 2.4 has no per-device autocast state setters: use the context.
    if (not _HAS_DEVICE_AUTOCAST_STATE or _is_compiling()
            or torch._C._is_torch_function_mode_enabled()
            or torch._jit_internal.is_scripting()):
        with autocast_for(device_type, dtype, enabled):
            return func(*args, **kwargs)
    prev_enabled = torch.is_autocast_enabled(device_type)
    prev_dtype = torch.get_autocast_dtype(device_type)
    if enabled and not autocast_supports(device_type, dtype or prev_dtype):
        enabled = False
    torch.set_autocast_enabled(device_type, enabled)
    if dtype is not None:
        torch.set_autocast_dtype(device_type, dtype)
    torch.autocast_increment_nesting()
    try:
        return func(*args, **kwargs)
    finally:
        if torch.autocast_decrement_nesting() == 0:
            torch.clear_autocast_cache()
        torch.set_autocast_enabled(device_type, prev_enabled)
        torch.set_autocast_dtype(device_type, prev_dtype)


_is_compiling: Callable[[], bool] = getattr(
    getattr(torch, 'compiler', None), 'is_compiling', lambda: False)


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


# =============================================================================
# Capabilities of the installed torch, per device type and dtype.
#
# Every decision below is made by trying the thing (entering an autocast,
# running a tiny matrix product, building a GradScaler, looking at a signature),
# never by comparing version numbers, so a backport or a vendor build is judged
# by what it does. Each probe runs once per process; the caches describe the
# installed torch, so refresh() (which forgets decisions that depend on
# TORCH_VERSION and the environment) leaves them alone.
#
# The rules, used by backend_for():
#   1. The kernels must exist: a float16/bfloat16 matrix product (and its
#      backward) on the device. If not, no backend can train in that dtype there:
#      check_dtype() raises one error naming the dtype that does work.
#   2. The native backend needs torch.autocast to accept (device, dtype), and
#      for float16 (loss scaling) a GradScaler for the device.
#   3. Where rule 2 fails but rule 1 holds, the automatic choice (backend=None)
#      is the legacy backend: the model converted by hand, norms in float32,
#      float32 master weights and LossScaler. backend='native' asked explicitly
#      is an error that says so.
#   4. The automatic choice is also the legacy backend for a model with GroupNorm or
#      LayerNorm layers where autocast cannot run them (float32 weights) on
#      low-precision inputs (bfloat16 on the CPU of older torch); an explicit
#      'native' is allowed there.
# =============================================================================

_LOW_NAMES = {torch.float16: 'float16', torch.bfloat16: 'bfloat16'}
_probe_cache: dict[tuple[str, str, Any], bool] = {}


def _cached_probe(kind: str, device_type: str, dtype: Any,
                  probe: Callable[[], bool]) -> bool:
    key = (kind, device_type, dtype)
    ok = _probe_cache.get(key)
    if ok is None:
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


def kernels_support(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch has ``dtype`` matrix kernels on the device (forward and backward).

    A tiny ``linear`` and its backward in ``dtype`` is tried once; without
    them no backend can train in that dtype on that device (float16 on the
    CPU of older torch, for instance).

    Example:
        >>> kernels_support('cpu', torch.bfloat16)
        True
    """
    def probe() -> bool:
        if not device_present(device_type):
            return False
        a = torch.ones(2, 2, dtype=dtype, device=device_type, requires_grad=True)
        out = torch.nn.functional.linear(a, a, torch.ones(2, dtype=dtype, device=device_type))
        out.sum().backward()
        return out.dtype == dtype and a.grad is not None
    return _cached_probe('kernels', device_type, dtype, probe)


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


def autocast_norms_support(device_type: str, dtype: torch.dtype) -> bool:
    """Whether GroupNorm and LayerNorm take ``dtype`` inputs with float32 weights in autocast.

    That is what a model's float32 norm layers see under autocast; where it
    fails (bfloat16 on the CPU of older torch), the automatic backend choice
    is the legacy one, which runs those norms in float32.

    Example:
        >>> isinstance(autocast_norms_support('cpu', torch.bfloat16), bool)
        True
    """
    def probe() -> bool:
        if not autocast_supports(device_type, dtype):
            return False
        x = torch.ones(2, 4, 3, dtype=dtype, device=device_type)
        w4, w3 = (torch.ones(n, device=device_type) for n in (4, 3))
        with torch.autocast(device_type=device_type, dtype=dtype):
            torch.nn.functional.group_norm(x, 2, w4, torch.zeros_like(w4))
            torch.nn.functional.layer_norm(x, (3,), w3, torch.zeros_like(w3))
        return True
    return _cached_probe('autocast_norms', device_type, dtype, probe)


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


def grad_scaler_supports(device_type: str) -> bool:
    """Whether torch has a working GradScaler for the device type.

    ``torch.amp.GradScaler(device)`` takes any device that has the scaling
    kernels; where it is missing only ``torch.cuda.amp.GradScaler`` exists.

    Example:
        >>> isinstance(grad_scaler_supports('cpu'), bool)
        True
    """
    cls = _AMP_GRAD_SCALER

    def probe() -> bool:
        if not device_present(device_type):
            return False
        if cls is None:
            return device_type == 'cuda'
        return bool(cls(device_type).is_enabled())
    return _cached_probe('grad_scaler', device_type, cls, probe)


def fused_check_supports(device_type: str, dtype: torch.dtype) -> bool:
    """Whether the fused overflow kernel (check and unscale in one pass) runs there.

    ``torch._amp_foreach_non_finite_check_and_unscale_`` is tried once on a
    one-element tensor; where it is missing the check falls back to one
    ``isfinite`` per tensor (still a single device sync).

    Example:
        >>> isinstance(fused_check_supports('cpu', torch.float32), bool)
        True
    """
    def probe() -> bool:
        fused = getattr(torch, '_amp_foreach_non_finite_check_and_unscale_', None)
        if fused is None or not device_present(device_type):
            return False
        found = torch.zeros(1, device=device_type)
        fused([torch.ones(1, dtype=dtype, device=device_type)], found,
              torch.ones(1, device=device_type))
        return not bool(found.item())
    return _cached_probe('fused_check', device_type, dtype, probe)


def native_reason(device_type: str, dtype: torch.dtype) -> Optional[str]:
    """Why the native backend cannot run ``dtype`` on the device (None: it can).

    Example:
        >>> native_reason('cpu', torch.bfloat16) is None
        True
    """
    name = _LOW_NAMES.get(dtype, str(dtype))
    if not has_native_amp():
        return f'torch {TORCH_VERSION} has no native AMP'
    if not autocast_supports(device_type, dtype):
        return f'torch.autocast does not support {name} on {device_type}'
    if needs_loss_scaling(dtype) and not grad_scaler_supports(device_type):
        return f'torch has no GradScaler for {device_type} (needed to scale {name} losses)'
    return None


def check_dtype(device_type: str, dtype: torch.dtype) -> None:
    """Fail up front when torch cannot compute in ``dtype`` on the device at all.

    Args:
        device_type: ``'cpu'``, ``'cuda'``, ...
        dtype: ``torch.float16`` or ``torch.bfloat16``.

    Raises:
        ValueError: Naming the dtype that does work there (if any).

    Example:
        >>> check_dtype('cpu', torch.bfloat16)
    """
    if kernels_support(device_type, dtype):
        return
    name = _LOW_NAMES.get(dtype, str(dtype))
    others = [d for d in _LOW_PRECISION if d != dtype and kernels_support(device_type, d)]
    if others:
        hint = f'use dtype=torch.{_LOW_NAMES[others[0]]}'
    else:
        hint = 'train in float32 there, or on a device that has them'
    raise ValueError(
        f'{name} is not supported on {device_type} by torch {torch.__version__}: it has no '
        f'{name} matrix multiply kernels there; {hint}.')


def backend_for(backend: Optional[str], device_type: str, dtype: torch.dtype,
                model: Optional[torch.nn.Module] = None) -> str:
    """Choose the backend that trains ``dtype`` on ``device_type``.

    ``None`` takes the process default (:func:`default_backend`), then falls
    back to ``'legacy'`` where the native backend cannot run the pair
    (:func:`native_reason`), or where ``model`` has GroupNorm/LayerNorm layers
    and autocast cannot feed them float32 weights with ``dtype`` inputs
    (:func:`autocast_norms_support`), provided the kernels exist. An explicit
    ``'native'`` that cannot run is an error, and so is a dtype torch cannot
    compute in on that device (:func:`check_dtype`).

    Args:
        backend: ``'native'``, ``'legacy'`` or None.
        device_type: Where the model's parameters live.
        dtype: The low-precision dtype.
        model: The model to train, if the caller has one (the legacy backend
            converts it; without it, legacy is chosen only where native cannot
            run at all).

    Returns:
        ``'native'`` or ``'legacy'``.

    Raises:
        ValueError: As described above.

    Example:
        >>> backend_for('legacy', 'cpu', torch.bfloat16)
        'legacy'
    """
    chosen = resolve_backend(backend)
    check_dtype(device_type, dtype)
    if chosen != 'native':
        return chosen
    why = native_reason(device_type, dtype)
    if why is None:
        # An explicit 'native' is allowed without mixed norms (the model may have none).
        if backend == 'native' or model is None or not _has_norms(model) or (
                autocast_norms_support(device_type, dtype)):
            return chosen
        return 'legacy'
    if backend == 'native':
        other = [d for d in _LOW_PRECISION
                 if d != dtype and native_reason(device_type, d) is None
                 and kernels_support(device_type, d)]
        also = f", or dtype=torch.{_LOW_NAMES[other[0]]}" if other else ''
        raise ValueError(
            f"backend='native' cannot train {_LOW_NAMES.get(dtype, dtype)} on {device_type}: "
            f"{why}; use backend='legacy' (half model, float32 master weights) or "
            f'backend=None, which falls back to it{also}.')
    return 'legacy'


def _has_norms(model: torch.nn.Module) -> bool:
    norms = (torch.nn.GroupNorm, torch.nn.LayerNorm)
    return any(isinstance(m, norms) for m in model.modules())


def capability_rows(device_type: str) -> list[tuple[str, str]]:
    """What torch supports on one device type, one ``(dtype, summary)`` row per dtype.

    Example:
        >>> dict(capability_rows('cpu'))['bfloat16'].startswith('kernels yes')
        True
    """
    def yes(flag: bool) -> str:
        return 'yes' if flag else 'no'

    rows = []
    for dtype in _LOW_PRECISION:
        parts = [f'kernels {yes(kernels_support(device_type, dtype))}',
                 f'autocast {yes(has_native_amp() and autocast_supports(device_type, dtype))}',
                 f'autocast float32 norms {yes(autocast_norms_support(device_type, dtype))}']
        if needs_loss_scaling(dtype):
            parts.append(f'GradScaler {yes(grad_scaler_supports(device_type))}')
        parts.append(f'fused overflow check {yes(fused_check_supports(device_type, dtype))}')
        try:
            backend = backend_for(None, device_type, dtype)
            with_norms = backend_for(None, device_type, dtype, _NORMS_MODEL)
            parts.append(f'-> {backend} backend' if backend == with_norms else
                         f'-> {backend} backend ({with_norms} for models with Group/LayerNorm)')
        except ValueError:
            parts.append(f'-> unusable (no {_LOW_NAMES[dtype]} kernels)')
        rows.append((_LOW_NAMES[dtype], ', '.join(parts)))
    return rows


def forward_pre_hook_takes_kwargs() -> bool:
    """Whether ``register_forward_pre_hook`` takes ``with_kwargs`` (keyword arguments).

    Example:
        >>> isinstance(forward_pre_hook_takes_kwargs(), bool)
        True
    """
    return _PRE_HOOK_KWARGS


class _ForwardPatch:
    """A forward pre-hook that sees keyword arguments, where torch has none such.

    The module's forward is wrapped by an instance attribute (what ``nn.Module``
    calls), and :meth:`remove` puts back what was there.
    """

    __slots__ = ('module', 'previous')

    def __init__(self, module: torch.nn.Module,
                 hook: Callable[[Any, tuple, dict], Any]) -> None:
        self.module = module
        self.previous = module.__dict__.get('forward')
        inner = module.forward

        def forward(*args: Any, **kwargs: Any) -> Any:
            result = hook(module, args, kwargs)
            if result is not None:
                args, kwargs = result
            return inner(*args, **kwargs)

        module.forward = forward  # type: ignore[method-assign]

    def remove(self) -> None:
        module = self.module
        if self.previous is None:
            module.__dict__.pop('forward', None)
        else:
            module.forward = self.previous  # type: ignore[method-assign]


def register_forward_pre_hook_with_kwargs(
        module: torch.nn.Module, hook: Callable[[Any, tuple, dict], Any]) -> Any:
    """``module.register_forward_pre_hook(hook, with_kwargs=True)`` on any torch.

    Where torch lacks ``with_kwargs`` the module's forward is wrapped instead
    (undone by the handle's ``remove()``).

    Args:
        module: The module.
        hook: ``hook(module, args, kwargs)`` returning None or ``(args, kwargs)``.

    Returns:
        A handle with ``remove()``.

    Example:
        >>> m = torch.nn.Identity()
        >>> h = register_forward_pre_hook_with_kwargs(m, lambda mod, a, k: ((a[0] * 2,), k))
        >>> m(torch.ones(1)).item()
        2.0
        >>> h.remove(); m(torch.ones(1)).item()
        1.0
    """
    if _PRE_HOOK_KWARGS:
        return module.register_forward_pre_hook(hook, with_kwargs=True)
    return _ForwardPatch(module, hook)


def foreach_copy_(dst: Sequence[torch.Tensor], src: Sequence[torch.Tensor]) -> None:
    """``dst[i].copy_(src[i])`` for all i, one fused kernel where torch has it.

    Example:
        >>> a = [torch.zeros(2)]
        >>> foreach_copy_(a, [torch.ones(2)]); a[0].tolist()
        [1.0, 1.0]
    """
    if _foreach_copy is not None:
        _foreach_copy(dst, src)
        return
    for d, s in zip(dst, src):
        d.copy_(s)


def clip_grad_norm_(parameters: Any, **kwargs: Any) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_``, leaving out arguments this torch lacks.

    ``foreach`` (a speed hint) is dropped where the function does not take it.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(4)); p.grad = torch.ones(4)
        >>> float(clip_grad_norm_([p], max_norm=1.0, foreach=None))
        2.0
    """
    return _clip_norm(parameters, **_known(kwargs, _CLIP_NORM_ARGS))


def clip_grad_value_(parameters: Any, **kwargs: Any) -> None:
    """``torch.nn.utils.clip_grad_value_``, leaving out arguments this torch lacks.

    Example:
        >>> p = torch.nn.Parameter(torch.ones(1)); p.grad = torch.full((1,), 5.0)
        >>> clip_grad_value_([p], clip_value=1.0, foreach=None); p.grad.item()
        1.0
    """
    _clip_value(parameters, **_known(kwargs, _CLIP_VALUE_ARGS))


def _known(kwargs: dict, accepted: frozenset) -> dict:
    if 'foreach' in kwargs and 'foreach' not in accepted:
        kwargs = {k: v for k, v in kwargs.items() if k != 'foreach'}
    return kwargs


def _parameter_names(func: Callable[..., Any]) -> frozenset:
    try:
        return frozenset(inspect.signature(func).parameters)
    except (TypeError, ValueError):
        return frozenset()


_foreach_copy = getattr(torch, '_foreach_copy_', None)
_clip_norm = torch.nn.utils.clip_grad_norm_
_clip_value = torch.nn.utils.clip_grad_value_
_CLIP_NORM_ARGS = _parameter_names(_clip_norm)
_CLIP_VALUE_ARGS = _parameter_names(_clip_value)
_PRE_HOOK_KWARGS = 'with_kwargs' in _parameter_names(torch.nn.Module.register_forward_pre_hook)

_NORMS_MODEL = torch.nn.GroupNorm(1, 1)
