"""Fixtures of the adversarial tier (tests/adversarial): attacks on the public API."""

import warnings

import pytest
import torch


@pytest.fixture
def script():
    """``torch.jit.script`` without its deprecation warning (newer torch warns)."""

    def make(module):
        with warnings.catch_warnings():
            warnings.simplefilter('ignore', DeprecationWarning)
            return torch.jit.script(module)

    return make
