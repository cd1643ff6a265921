"""0.x runtime keys (``runner``, ``evaluation``, hooks' configs, ...) -> their 1.x keys."""

from __future__ import annotations

from typing import Any, Optional

__all__ = ['convert_runtime']


def convert_runtime(out: dict[str, Any], problems: list[str], notes: list[str], *,
                    test_fp16: bool, codebase: Optional[str]) -> None:
    """Replace the 0.x runtime keys in ``out`` by their 1.x keys (in place)."""
