"""What the 0.x hooks keep on the runner: ``runner.meta['fp16']`` and the run's logger."""

from __future__ import annotations

import logging
from typing import Any

__all__ = ['RunLog', 'fp16_slot']

logger = logging.getLogger('fp16utils')


def fp16_slot(runner: Any) -> Any:
    """``runner.meta['fp16']``, made (with ``runner.meta``) where it is None or absent."""
    if runner.meta is None:
        runner.meta = {}
    if runner.meta.get('fp16') is None:
        runner.meta['fp16'] = {}
    return runner.meta['fp16']


class RunLog:
    """The engine's logger: the current run's ``runner.logger``, else fp16utils'."""

    def __init__(self) -> None:
        self.runner_logger: Any = None

    def warning(self, msg: str, *args: Any) -> None:
        (logger if self.runner_logger is None else self.runner_logger).warning(msg, *args)
