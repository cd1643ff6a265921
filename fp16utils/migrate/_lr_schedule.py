"""0.x ``lr_config``/``momentum_config`` -> 1.x ``param_scheduler``."""

from __future__ import annotations

from typing import Any

__all__ = ['convert_lr_schedule']


def convert_lr_schedule(out: dict[str, Any], problems: list[str], notes: list[str]) -> None:
    """Replace ``lr_config``/``momentum_config`` in ``out`` by ``param_scheduler`` (in place)."""
