"""Which low-precision dtype is native on a device, and what ``dtype='auto'`` picks."""

from __future__ import annotations

from typing import Any, Callable, Dict, Optional, Tuple, Union

import torch

from ._torch import caps, dtypes, probes

__all__ = ['AUTO', 'auto_dtype', 'is_auto', 'precision_summary', 'precision_support']

#: The ``dtype`` value that asks for the best dtype of the device.
AUTO = 'auto'


def _parse_device(device: Union[str, torch.device, None], where: str
                  ) -> Tuple[str, Optional[int]]:
    if device is None:
        return caps.best_device_type(), None
    if isinstance(device, str):
        try:
            device = torch.device(device)
        except (RuntimeError, ValueError) as err:
            raise ValueError(
                f"{where}: {device!r} is not a torch device ({str(err).splitlines()[0]}); "
                "pass 'cpu', 'cuda', 'cuda:1', 'mps', ..., a torch.device, or None for the "
                'best device here.') from None
    if not isinstance(device, torch.device):
        raise TypeError(f'{where}: device must be a str, a torch.device or None, got '
                        f'{type(device).__name__} ({device!r}).')
    if device.type == 'meta':
        raise ValueError(f"{where}: the 'meta' device computes nothing; pass a real device.")
    if device.type == 'cuda' and device.index is not None and probes.device_present('cuda'):
        count = torch.cuda.device_count()
        if device.index >= count:
            raise ValueError(f'{where}: {device} does not exist; this machine has {count} '
                             f'CUDA device(s), cuda:0 to cuda:{count - 1}.')
    return device.type, device.index


def precision_support(device: Union[str, torch.device, None] = None,
                      probe: Optional[Callable[[str, torch.dtype, Optional[int]], str]] = None
                      ) -> Dict[torch.dtype, str]:
    """Whether float16 and bfloat16 are native, emulated or unsupported on a device.

    ``'native'``: the hardware computes in the dtype (tensor cores from sm_70 for
    float16, sm_80 for bfloat16; AVX512/AMX BF16 or FP16 CPUs; MPS).
    ``'emulated'``: torch has the kernels but converts (usually no faster than
    float32). ``'unsupported'``: no kernels there, or no such device. A capability
    table decides first; where it cannot tell, a short timed matrix product against
    float32, once per process.

    Args:
        device: ``'cpu'``, ``'cuda'``, ``'cuda:1'``, a ``torch.device``, or None
            for the best device present (cuda, mps, xpu, then cpu).
        probe: Replaces the timed probe: ``probe(device_type, dtype, index)``
            returning ``'native'`` or ``'emulated'`` (for tests).

    Returns:
        ``{torch.float16: level, torch.bfloat16: level}``.

    Raises:
        ValueError: For a string that is not a torch device, the meta device or a
            CUDA index that does not exist.
        TypeError: For a device of another type.

    Example:
        >>> support = precision_support('cpu', probe=lambda *a: 'emulated')
        >>> list(support) == [torch.float16, torch.bfloat16]
        True
    """
    return _levels(device, probe, 'precision_support')[2]


def _levels(device: Any, probe: Any, where: str
            ) -> Tuple[str, Optional[int], Dict[torch.dtype, str]]:
    device_type, index = _parse_device(device, where)
    if probe is not None and not callable(probe):
        raise TypeError(f'{where}: probe must be callable as probe(device_type, dtype, index), '
                        f'got {type(probe).__name__}.')
    levels = {d: caps.precision_level(device_type, d, index, probe) for d in dtypes.LOW_PRECISION}
    bad = {d: v for d, v in levels.items() if v not in caps.LEVELS}
    if bad:
        raise ValueError(f'{where}: the probe answered {bad}; it must answer one of '
                         f'{caps.LEVELS}.')
    return device_type, index, levels


def is_auto(dtype: Any) -> bool:
    """Whether ``dtype`` is :data:`AUTO` (any case), the choice :func:`auto_dtype` resolves."""
    return isinstance(dtype, str) and dtype.lower() == AUTO


def auto_dtype(device: Union[str, torch.device, None] = None, probe: Any = None
               ) -> Tuple[torch.dtype, Optional[str]]:
    """The dtype ``dtype='auto'`` trains in on a device, and why when it is float32.

    bfloat16 where it is native, else float16 where that is native, else float32.

    Args:
        device: As for :func:`precision_support`.
        probe: As for :func:`precision_support`.

    Returns:
        ``(dtype, reason)``; ``reason`` is None unless the dtype is float32.
    """
    device_type, index, support = _levels(device, probe, "dtype='auto'")
    if support[torch.bfloat16] == 'native':
        return torch.bfloat16, None
    if support[torch.float16] == 'native':
        return torch.float16, None
    where = device_type if index is None else f'{device_type}:{index}'
    return torch.float32, (
        f"dtype='auto': neither low-precision dtype is native on {where} (bfloat16 "
        f'{support[torch.bfloat16]}, float16 {support[torch.float16]}), so the forward runs '
        'in float32; pass dtype=\'bfloat16\' or \'float16\' to force one.')


def precision_summary(device: Union[str, torch.device, None] = None) -> str:
    """One line for ``fp16utils env`` and the demo: each dtype's level, and what 'auto' picks."""
    _, _, levels = _levels(device, None, 'precision_summary')
    text = ', '.join(f'{_name(d)} {level}' for d, level in levels.items())
    return f"{text} (dtype='auto' -> {_name(auto_dtype(device)[0])})"


def _name(dtype: torch.dtype) -> str:
    return str(dtype).replace('torch.', '')
