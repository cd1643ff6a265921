"""Fixtures of the consumer tier (see ``_consumers.py`` for what it needs and sets up)."""

from __future__ import annotations

from typing import Any, Dict, List

import _consumers
import pytest

#: The stand-ins are loaded by ``_consumers`` (or as ``sitecustomize`` in subprocesses),
#: never collected: importing them installs them.
collect_ignore = ['standins']


def pytest_configure(config: Any) -> None:
    """Quiet the codebases' own notices (mmcv's 2.0 announcement, mmseg's loss hints)."""
    for line in ('ignore::UserWarning:mmcv', 'ignore::UserWarning:mmseg',
                 "ignore:'pin_memory' argument is set as true:UserWarning"):
        config.addinivalue_line('filterwarnings', line)

@pytest.fixture
def probe() -> List[Dict[str, Any]]:
    """The records of ``Fp16ProbeHook`` for this test (add ``custom_hooks`` to the config)."""
    _consumers.Fp16ProbeHook.records.clear()
    return _consumers.Fp16ProbeHook.records


@pytest.fixture(autouse=True)
def _patched_and_no_compiled_op_called() -> Any:
    """Each test starts patched with the defaults, and calls no stand-in op of mmcv's."""
    if _consumers.SKIP_REASON is not None:
        yield
        return
    _consumers.fp16utils.patch_mmcv()
    calls_before = len(_consumers.standins.calls)
    yield
    _consumers.fp16utils.patch_mmcv()
    assert _consumers.standins.calls[calls_before:] == [], 'a compiled mmcv op was called'
