"""``fp16utils env``, and the devices torch sees here (``--device`` and the backend checked).

torch is imported inside the functions: importing this module stays cheap.
"""

from __future__ import annotations

import argparse
import os
from typing import TextIO

from ..migrate.errors import UsageError

__all__ = ['best_device', 'check_backend_env', 'check_device', 'cmd_env', 'devices']


def cmd_env(args: argparse.Namespace, out: TextIO) -> int:
    """Print the torch version, backend, and per device what torch supports in each dtype."""

    from .. import __version__
    from .._torch import autocast, caps, dtypes, versions
    from ..precision import precision_summary

    check_backend_env()
    rows: list[tuple[str, str]] = [
        ('fp16utils', __version__),
        ('torch', versions.TORCH_VERSION),
        ('backend', f'{versions.default_backend()} ({versions.backend_reason()})'),
    ]
    for device_type, name in devices():
        names = [str(d).replace('torch.', '') for d in dtypes.LOW_PRECISION
                 if versions.has_native_amp() and autocast.autocast_supports(device_type, d)]
        rows.append((f'device {device_type}', name))
        rows.append(('  autocast dtypes', ', '.join(names) or 'none'))
        rows.extend((f'  {dtype}', what) for dtype, what in caps.capability_rows(device_type))
        rows.append(('  precision', precision_summary(
            name.split(' ', 1)[0] if name.startswith('cuda:') else device_type)))
    width = max(len(k) for k, _ in rows)
    for key, value in rows:
        out.write(f'{key.ljust(width)}  {value}\n')
    return 0


def check_backend_env() -> None:
    """A FP16UTILS_BACKEND that names no backend is a usage error, not a traceback."""
    from .._torch import versions

    try:
        versions.default_backend()
    except ValueError as err:
        raise UsageError(str(err)) from None


def devices() -> list[tuple[str, str]]:
    """(device type, description) for every device torch can see."""
    import torch

    found = [('cpu', f'{os.cpu_count() or 1} cores, {torch.get_num_threads()} torch threads')]
    if torch.cuda.is_available():
        for i in range(torch.cuda.device_count()):
            props = torch.cuda.get_device_properties(i)
            found.append(('cuda', f'cuda:{i} {props.name}, '
                                  f'{props.total_memory / 2**30:.0f} GiB, '
                                  f'sm_{props.major}{props.minor}'))
    mps = getattr(torch.backends, 'mps', None)
    if mps is not None and mps.is_available():
        found.append(('mps', 'Apple Metal'))
    xpu = getattr(torch, 'xpu', None)
    if xpu is not None and xpu.is_available():
        found.append(('xpu', f'{xpu.device_count()} device(s)'))
    return found


def check_device(name: str) -> str:
    """A ``--device`` value that torch knows and that is present here."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        raise UsageError(f'--device {name}: not a torch device; use one of '
                         f'{", ".join(k for k, _ in devices())}') from None
    present = [k for k, _ in devices()]
    if device.type not in present:
        raise UsageError(f'--device {name}: no {device.type} device here; present: '
                         f'{", ".join(present)} (see fp16utils env)')
    return name


def best_device() -> str:
    """The fastest device present: cuda, then mps, then xpu, then cpu."""
    kinds = [k for k, _ in devices()]
    for kind in ('cuda', 'mps', 'xpu'):
        if kind in kinds:
            return kind
    return 'cpu'
