"""The MMEngine tier: tests that run this package beside the real mmengine (0.10.x).

Run by ``.ci/mmengine``, which installs mmengine into a virtual environment of its
own; in an environment without mmengine every test here skips with the reason.
"""

import sys
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))

try:
    import mmengine  # noqa: F401
except ImportError as err:  # the main suite runs without mmengine
    MISSING = f'mmengine is not importable ({err}); run .ci/mmengine for this tier'
else:
    MISSING = ''


def pytest_collection_modifyitems(config, items):
    if not MISSING:
        return
    here = Path(__file__).resolve().parent
    for item in items:
        if here in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.skip(reason=MISSING))
