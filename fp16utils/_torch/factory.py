"""Building a GradScaler for a device type, on any supported torch."""

from __future__ import annotations

import torch

from . import versions as _versions
from .versions import has_native_amp

__all__ = ['make_grad_scaler']

#: ``torch.amp.GradScaler`` (torch >= 2.3, any device); None where only
#: ``torch.cuda.amp.GradScaler`` exists. Tests patch it.
_AMP_GRAD_SCALER = getattr(torch.amp, 'GradScaler', None)


def make_grad_scaler(device_type: str = 'cuda', *, init_scale: float = 2.0**16,
                     growth_factor: float = 2.0, backoff_factor: float = 0.5,
                     growth_interval: int = 2000,
                     enabled: bool = True) -> torch.amp.GradScaler:
    """A GradScaler for ``device_type``; a disabled one passes losses through on any device."""
    if not has_native_amp():
        raise RuntimeError(
            f'torch {_versions.TORCH_VERSION} has no native GradScaler; use the legacy backend '
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
