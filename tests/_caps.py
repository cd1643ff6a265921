"""What the installed torch supports on the CPU, for tests to pick dtypes and expectations.

Tests never compare torch version numbers: they ask :mod:`fp16utils._torch`
(which tries things) and skip with the name of the missing capability.
"""

from __future__ import annotations

from typing import Optional

import pytest
import torch

from fp16utils import _torch

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
NAMES = {F16: 'float16', BF16: 'bfloat16'}


def cpu_lacks(dtype: torch.dtype, backend: Optional[str] = None,
              scaled: bool = True) -> Optional[str]:
    """Why the CPU cannot train in ``dtype`` with ``backend`` here (None: it can).

    ``backend=None`` asks only for the kernels (what the legacy backend needs);
    ``'native'`` also for torch.autocast and, for float16 with ``scaled``, a
    CPU GradScaler.
    """
    name = NAMES[dtype]
    if not _torch.caps.kernels_support('cpu', dtype):
        return f'torch has no {name} matrix kernels on cpu here'
    if backend == 'native':
        if not _torch.autocast.autocast_supports('cpu', dtype):
            return f'torch.autocast does not support {name} on cpu here'
        if (scaled and _torch.dtypes.needs_loss_scaling(dtype)
                and not _torch.caps.grad_scaler_supports('cpu')):
            return 'torch has no GradScaler for cpu here (torch.amp.GradScaler(device))'
    return None


def require(dtype: torch.dtype, backend: Optional[str] = None, scaled: bool = True) -> None:
    """Skip the calling test, naming the missing capability, unless the CPU can do it."""
    why = cpu_lacks(dtype, backend, scaled)
    if why is not None:
        pytest.skip(why)


def native_or_legacy(backend: str, dtype: torch.dtype = F16) -> None:
    """:func:`require` for a test parametrized by backend ('torch-1.5' simulates legacy)."""
    require(dtype, 'native' if backend == 'native' else None)


#: The low-precision dtypes torch.autocast runs on the CPU here, float16 first.
LOW_DTYPES = [d for d in (F16, BF16) if cpu_lacks(d, 'native', scaled=False) is None]
#: The low dtype of CPU tests that are not about one dtype: float16 where autocast
#: has it on the CPU, else bfloat16.
LOW = LOW_DTYPES[0]
#: float16 training with loss scaling works on the CPU (native or legacy).
CPU_F16 = cpu_lacks(F16) is None


def autocast_now(device_type: str = 'cpu') -> tuple:
    """(enabled, dtype) of autocast on the device, as code running now sees it."""
    return _torch.autocast.autocast_state(device_type)


#: The low dtypes the legacy backend trains in on the CPU here (it needs the kernels only).
LEGACY_DTYPES = [d for d in (F16, BF16) if cpu_lacks(d) is None]
#: The dtype of CPU tests of the legacy backend that are not about one dtype.
LEGACY_LOW = LEGACY_DTYPES[0]


def auto_backend(dtype: torch.dtype) -> Optional[str]:
    """The backend ``backend=None`` picks on the CPU for ``dtype`` (None: unusable)."""
    if cpu_lacks(dtype) is not None:
        return None
    if _torch.caps.native_reason('cpu', dtype) is not None:
        return 'legacy'
    return 'native' if _torch.caps.autocast_norms_support('cpu', dtype) else 'legacy'


#: The dtypes in which a model with float32 norm layers runs natively on the CPU here.
AUTO_NATIVE = [d for d in LOW_DTYPES if _torch.caps.autocast_norms_support('cpu', d)]


def native_norm_dtype() -> torch.dtype:
    """A dtype in which autocast feeds float32 GroupNorm/LayerNorm on the CPU, else skip."""
    if not AUTO_NATIVE:
        pytest.skip('torch.autocast on cpu cannot run float32 GroupNorm/LayerNorm on '
                    f'{", ".join(NAMES[d] for d in LOW_DTYPES)} inputs here')
    return AUTO_NATIVE[0]


#: The low dtypes the native backend trains in on the CPU here (float16: with a GradScaler).
NATIVE_DTYPES = [d for d in (F16, BF16) if cpu_lacks(d, 'native') is None]


def train_dtype(backend: Optional[str] = None) -> torch.dtype:
    """float16 where the CPU trains in it with ``backend`` here, else bfloat16, else skip.

    For tests that are about a backend, not about one dtype. ``backend`` None
    or ``'legacy'`` needs the kernels only; ``'native'`` also autocast (and a
    GradScaler for float16).
    """
    native = 'native' if backend == 'native' else None
    for dtype in (F16, BF16):
        if cpu_lacks(dtype, native) is None:
            return dtype
    pytest.skip(cpu_lacks(BF16, native) or 'no low-precision dtype on cpu here')


def require_native_norms(dtype: torch.dtype) -> None:
    """Skip unless autocast runs ``dtype`` on the CPU and feeds float32 norm layers with it."""
    require(dtype, 'native', scaled=False)
    if not _torch.caps.autocast_norms_support('cpu', dtype):
        pytest.skip('torch.autocast on cpu cannot run float32 GroupNorm/LayerNorm on '
                    f'{NAMES[dtype]} inputs here')


def on_this_cpu(cfg: dict) -> dict:
    """An ``optim_wrapper`` config as this CPU builds it: float16 AmpOptimWrappers (the
    default dtype) in the dtype :func:`train_dtype` picks for the native backend."""
    if cpu_lacks(F16, 'native') is None:
        return cfg

    def fix(entry):
        if (isinstance(entry, dict) and entry.get('type') == 'AmpOptimWrapper'
                and entry.get('dtype') in (None, 'float16', F16)):
            return dict(entry, dtype=train_dtype('native'))
        return entry

    return {key: fix(value) for key, value in fix(cfg).items()}


def fullgraph_autocast_state_lacks() -> Optional[str]:
    """Why dynamo cannot trace reading the autocast state in one graph here (None: it can).

    Older dynamo stops at ``torch.get_autocast_cpu_dtype()`` ("torch.* op returned
    non-Tensor dtype"); a module that asks which dtype autocast runs in then breaks
    the graph.
    """
    try:
        import torch._dynamo
    except ImportError as err:
        return f'torch.compile does not run here: {err}'

    def read(x):
        with torch.autocast('cpu', dtype=BF16):
            return x.to(_torch.autocast.autocast_state('cpu')[1] or F32)

    try:
        torch.compile(read, fullgraph=True, backend='eager')(torch.ones(1))
    except Exception as err:  # noqa: BLE001 - dynamo's reason, shown in the skip
        return ('torch.compile(fullgraph=True) cannot trace reading the autocast state '
                f'here: {str(err).splitlines()[0][:120]}')
    finally:
        torch._dynamo.reset()
    return None

