"""What the installed torch can do per device type and dtype, the backend rules, and
whether a dtype is native or emulated on a device.
"""

from __future__ import annotations

from typing import Any, Optional

import torch

from . import factory as _factory
from . import versions as _versions
from .autocast import autocast_supports
from .decisions import warm_device
from .dtypes import LOW_NAMES, LOW_PRECISION, needs_loss_scaling
from .probes import _cached_probe, device_present
from .versions import has_native_amp, resolve_backend

# Each capability is tried once per process, never read from the version; refresh()
# leaves these caches alone. The rules of backend_for() are stated in
# docs/reference/supported-torch.md ("What a torch can do").


def kernels_support(device_type: str, dtype: torch.dtype) -> bool:
    """Whether torch has ``dtype`` matrix kernels, forward and backward, on the device."""
    def probe() -> bool:
        if not device_present(device_type):
            return False
        a = torch.ones(2, 2, dtype=dtype, device=device_type, requires_grad=True)
        out = torch.nn.functional.linear(a, a, torch.ones(2, dtype=dtype, device=device_type))
        out.sum().backward()
        return out.dtype == dtype and a.grad is not None
    return _cached_probe('kernels', device_type, dtype, probe)


def autocast_norms_support(device_type: str, dtype: torch.dtype) -> bool:
    """Whether autocast runs GroupNorm/LayerNorm on ``dtype`` inputs with float32 weights."""
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
    """Whether torch has a working GradScaler for the device type."""
    cls = _factory._AMP_GRAD_SCALER

    def probe() -> bool:
        if not device_present(device_type):
            return False
        if cls is None:
            return device_type == 'cuda'
        return bool(cls(device_type).is_enabled())
    return _cached_probe('grad_scaler', device_type, cls, probe)


def fused_check_supports(device_type: str, dtype: torch.dtype) -> bool:
    """Whether the fused overflow kernel (check and unscale in one pass) runs there."""
    def probe() -> bool:
        if not device_present(device_type):
            return False
        found = torch.zeros(1, device=device_type)
        torch._amp_foreach_non_finite_check_and_unscale_(
            [torch.ones(1, dtype=dtype, device=device_type)], found,
            torch.ones(1, device=device_type))
        return not bool(found.item())
    return _cached_probe('fused_check', device_type, dtype, probe)


def native_reason(device_type: str, dtype: torch.dtype) -> Optional[str]:
    """Why the native backend cannot run ``dtype`` on the device (None: it can)."""
    name = LOW_NAMES.get(dtype, str(dtype))
    if not has_native_amp():
        return f'torch {_versions.TORCH_VERSION} has no native AMP'
    if not autocast_supports(device_type, dtype):
        return f'torch.autocast does not support {name} on {device_type}'
    if needs_loss_scaling(dtype) and not grad_scaler_supports(device_type):
        return f'torch has no GradScaler for {device_type} (needed to scale {name} losses)'
    return None


def check_dtype(device_type: str, dtype: torch.dtype) -> None:
    """Raise a ValueError naming the dtype that works where torch cannot compute in ``dtype``."""
    if kernels_support(device_type, dtype):
        return
    name = LOW_NAMES.get(dtype, str(dtype))
    others = [d for d in LOW_PRECISION if d != dtype and kernels_support(device_type, d)]
    if others:
        hint = f'use dtype=torch.{LOW_NAMES[others[0]]}'
    else:
        hint = 'train in float32 there, or on a device that has them'
    raise ValueError(
        f'{name} is not supported on {device_type} by torch {torch.__version__}: it has no '
        f'{name} matrix multiply kernels there; {hint}.')


def backend_for(backend: Optional[str], device_type: str, dtype: torch.dtype,
                model: Optional[torch.nn.Module] = None) -> str:
    """The backend that trains ``dtype`` on ``device_type`` (``model``: whether it has norms)."""
    # What the model's decorated forwards will ask per call, answered before any trace.
    warm_device(device_type)
    if dtype not in LOW_PRECISION:  # full precision: nothing to cast or scale
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
        other = [d for d in LOW_PRECISION
                 if d != dtype and native_reason(device_type, d) is None
                 and kernels_support(device_type, d)]
        also = f", or dtype=torch.{LOW_NAMES[other[0]]}" if other else ''
        raise ValueError(
            f"backend='native' cannot train {LOW_NAMES.get(dtype, dtype)} on {device_type}: "
            f"{why}; use backend='legacy' (half model, float32 master weights) or "
            f'backend=None, which falls back to it{also}.')
    return 'legacy'


def _has_norms(model: torch.nn.Module) -> bool:
    norms = (torch.nn.GroupNorm, torch.nn.LayerNorm)
    return any(isinstance(m, norms) for m in model.modules())


def capability_rows(device_type: str) -> list[tuple[str, str]]:
    """What torch supports on one device type: one ``(dtype name, summary)`` row per dtype."""
    def yes(flag: bool) -> str:
        return 'yes' if flag else 'no'

    rows = []
    for dtype in LOW_PRECISION:
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
            parts.append(f'-> unusable (no {LOW_NAMES[dtype]} kernels)')
        rows.append((LOW_NAMES[dtype], ', '.join(parts)))
    return rows


_NORMS_MODEL = torch.nn.GroupNorm(1, 1)


# Native or emulated: a capability table first (CUDA compute capability, the CPU's ISA
# flags, MPS); where it cannot tell, a short timed matrix product (speed_probe).

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
    """The CPU's ISA flags as ``/proc/cpuinfo`` lists them (empty where it cannot be read)."""
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
    """What the capability table says of ``dtype`` on the device (None: it cannot tell)."""
    if not kernels_support(device_type, dtype):
        return 'unsupported'
    if device_type == 'cuda':
        if torch.version.hip:
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
    """``'native'`` where a timed matrix product in ``dtype`` clearly beats float32."""
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
    """``'native'``, ``'emulated'`` or ``'unsupported'``: the table, else the probe (once)."""
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
    """The device a run picks when none is named: cuda, then mps, then xpu, then cpu."""
    for kind in ('cuda', 'mps', 'xpu'):
        if device_present(kind):
            return kind
    return 'cpu'
