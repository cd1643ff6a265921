"""Shared fixtures: simulate an old torch, force or clear the backend choice."""

import pytest

from fp16utils import _torch


@pytest.fixture
def old_torch():
    """Make fp16utils believe torch is 1.5.0 (no native AMP) for one test."""
    _torch.refresh()
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(_torch, 'TORCH_VERSION', '1.5.0')
        _torch.refresh()
        yield '1.5.0'
    _torch.refresh()


@pytest.fixture
def force_backend():
    """Return ``force(name)``, which sets FP16UTILS_BACKEND for one test."""
    _torch.refresh()
    with pytest.MonkeyPatch.context() as mp:

        def force(name):
            mp.setenv(_torch.BACKEND_ENV, name)
            _torch.refresh()
            return name

        yield force
    _torch.refresh()


@pytest.fixture
def no_backend_env():
    """Unset FP16UTILS_BACKEND for one test, so the choice follows torch."""
    with pytest.MonkeyPatch.context() as mp:
        mp.delenv(_torch.BACKEND_ENV, raising=False)
        _torch.refresh()
        yield
    _torch.refresh()
