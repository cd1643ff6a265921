"""Installs the consumer tier's stand-ins in each process that has this folder on PYTHONPATH."""

import _fp16utils_standins  # noqa: F401
