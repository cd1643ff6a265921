"""Serialisation round trips shared by the copy and resume tests."""

from __future__ import annotations

import io
import pickle
from typing import Any

import torch


def pickle_roundtrip(obj: Any) -> Any:
    """``pickle.loads(pickle.dumps(obj))``."""
    return pickle.loads(pickle.dumps(obj))


def torch_save_roundtrip(obj: Any) -> Any:
    """Through ``torch.save`` and ``torch.load`` (whole objects allowed), in memory."""
    buf = io.BytesIO()
    torch.save(obj, buf)
    buf.seek(0)
    return torch.load(buf, weights_only=False)
