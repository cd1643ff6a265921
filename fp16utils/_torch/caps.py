"""Capabilities of the installed torch per device type and dtype, and the backend rules.

Example:
    >>> import torch
    >>> from fp16utils._torch import caps
    >>> caps.kernels_support('cpu', torch.bfloat16)
    True
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import factory as _factory
from . import versions as _versions
from .autocast import autocast_supports
from .decisions import warm_device
from .dtypes import _LOW_NAMES, _LOW_PRECISION, needs_loss_scaling
from .probes import _cached_probe, device_present
from .versions import has_native_amp, resolve_backend

# =============================================================================
# Capabilities of the installed torch, per device type and dtype.
#
# Every decision below is made by trying the thing (entering an autocast,
# running a tiny matrix product, building a GradScaler, looking at a signature),
# never by comparing version numbers, so a backport or a vendor build is judged
# by what it does. Each probe runs once per process; the caches describe the
# installed torch, so refresh() (which forgets decisions that depend on
# _versions.TORCH_VERSION and the environment) leaves them alone.
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


def grad_scaler_supports(device_type: str) -> bool:
    """Whether torch has a working GradScaler for the device type.

    ``torch.amp.GradScaler(device)`` takes any device that has the scaling
    kernels; where it is missing only ``torch.cuda.amp.GradScaler`` exists.

    Example:
        >>> isinstance(grad_scaler_supports('cpu'), bool)
        True
    """
    cls = _factory._AMP_GRAD_SCALER

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
        return f'torch {_versions.TORCH_VERSION} has no native AMP'
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
    # What the model's decorated forwards will ask per call, answered before any trace.
    warm_device(device_type)
    if dtype not in _LOW_PRECISION:  # full precision: nothing to cast or scale
        return 'native' if backend is None else resolve_backend(backend)
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
        autocast = has_native_amp() and autocast_supports(device_type, dtype)
        parts = [f'kernels {yes(kernels_support(device_type, dtype))}',
                 f'autocast {yes(autocast)}',
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


_NORMS_MODEL = torch.nn.GroupNorm(1, 1)


# =============================================================================
# Native or emulated: does the hardware compute in the dtype, or does torch
# convert to float32 and back? A capability table first (CUDA compute
# capability, the CPU's ISA flags, MPS); where it cannot tell, a short timed
# matrix product in the dtype against float32 (speed_probe), once per process.
# =============================================================================

#: The answers of :func:`precision_level`, best first.
LEVELS = ('native', 'emulated', 'unsupported')
#: CPU ISA flags (``/proc/cpuinfo``) that give native arithmetic in each dtype.
_CPU_NATIVE_FLAGS = {
    torch.bfloat16: frozenset({'avx512_bf16', 'amx_bf16', 'bf16'}),  # x86; aarch64 'bf16'
    torch.float16: frozenset({'avx512_fp16', 'amx_fp16', 'asimdhp'}),  # x86; aarch64 fp16
}
#: CUDA: the first compute capability with native arithmetic worth having. bfloat16:
#: Ampere (sm_80). float16: tensor cores from Volta (sm_70); sm_53/sm_60/sm_62 also
#: run float16 at twice the float32 rate; other Pascal/Maxwell parts are slower than
#: float32 there (emulated in all but name).
_CUDA_NATIVE = {torch.bfloat16: (8, 0), torch.float16: (7, 0)}
_CUDA_FAST_FP16 = frozenset({(5, 3), (6, 0), (6, 2)})
_speed_cache: dict = {}
_cpu_flags: list = []


def cpu_isa_flags() -> frozenset:
    """The CPU's ISA flags as ``/proc/cpuinfo`` lists them (empty where it cannot be read).

    Example:
        >>> isinstance(cpu_isa_flags(), frozenset)
        True
    """
    if not _cpu_flags:
        flags: frozenset = frozenset()
        try:
            with open('/proc/cpuinfo', encoding='utf-8', errors='replace') as f:
                for line in f:
                    key, _, value = line.partition(':')
                    if key.strip() in ('flags', 'Features'):
                        flags = frozenset(value.split())
                        break
        except OSError:
            pass
        _cpu_flags.append(flags)
    return _cpu_flags[0]


def table_level(device_type: str, dtype: torch.dtype, index: Optional[int] = None
                ) -> Optional[str]:
    """What the capability table says about ``dtype`` on the device (None: it cannot tell).

    ``'unsupported'`` where torch has no kernels (:func:`kernels_support`);
    CUDA by compute capability (ROCm: None), the CPU by its ISA flags, MPS
    natively in both where the kernels exist; other devices: None.

    Example:
        >>> table_level('cpu', torch.bfloat16) in (None, 'native', 'emulated')
        True
    """
    if not kernels_support(device_type, dtype):
        return 'unsupported'
    if device_type == 'cuda':
        if getattr(torch.version, 'hip', None):
            return None
        capability = tuple(torch.cuda.get_device_capability(index))
        if capability >= _CUDA_NATIVE[dtype]:
            return 'native'
        fast = dtype == torch.float16 and capability in _CUDA_FAST_FP16
        return 'native' if fast else 'emulated'
    if device_type == 'cpu':
        flags = cpu_isa_flags()
        if not flags or not ({'sse2', 'fp', 'asimd'} & flags):  # neither x86 nor arm64
            return None
        return 'native' if flags & _CPU_NATIVE_FLAGS[dtype] else 'emulated'
    if device_type == 'mps':
        return 'native'
    return None


def speed_probe(device_type: str, dtype: torch.dtype, index: Optional[int] = None) -> str:
    """Time a matrix product in ``dtype`` against float32: ``'native'`` when clearly faster.

    A few milliseconds: warm-up first, then the best of three runs of each.
    Tests replace it (``precision_level(..., probe=...)`` or by patching).

    Example:
        >>> speed_probe('cpu', torch.bfloat16) in ('native', 'emulated')
        True
    """
    import time

    device = torch.device(device_type, index) if index is not None else torch.device(
        device_type)
    n = 128 if device_type == 'cpu' else 1024

    def best(dt: torch.dtype) -> float:
        a = torch.ones(n, n, device=device, dtype=dt)
        times = []
        for i in range(5):
            start = time.perf_counter()
            for _ in range(4):
                a = torch.mm(a, a) * (1.0 / n)
            a.sum().item()  # waits for the device
            if i >= 2:  # the first two runs warm up
                times.append(time.perf_counter() - start)
        return min(times)

    return 'native' if best(dtype) < 0.9 * best(torch.float32) else 'emulated'


def precision_level(device_type: str, dtype: torch.dtype, index: Optional[int] = None,
                    probe: Optional[Any] = None) -> str:
    """``'native'``, ``'emulated'`` or ``'unsupported'`` for ``dtype`` on one device.

    The table (:func:`table_level`) decides where it can; otherwise the probe
    (``probe(device_type, dtype, index)``, default :func:`speed_probe`) runs,
    once per process per device and dtype unless a probe is passed in.

    Example:
        >>> precision_level('cpu', torch.float16, probe=lambda *a: 'emulated') in LEVELS
        True
    """
    level = table_level(device_type, dtype, index)
    if level is not None:
        return level
    if probe is not None:
        return probe(device_type, dtype, index)
    key = (device_type, index, dtype)
    if key not in _speed_cache:
        try:
            _speed_cache[key] = speed_probe(device_type, dtype, index)
        except Exception:  # noqa: BLE001 - a device that cannot run it: no support
            _speed_cache[key] = 'unsupported'
    return _speed_cache[key]


def best_device_type() -> str:
    """The device a run picks when none is named: cuda, then mps, then xpu, then cpu.

    Example:
        >>> best_device_type() in ('cuda', 'mps', 'xpu', 'cpu')
        True
    """
    for kind in ('cuda', 'mps', 'xpu'):
        if device_present(kind):
            return kind
    return 'cpu'
