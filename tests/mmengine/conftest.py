"""The MMEngine tier: tests that run this package beside the real mmengine (0.10.x).

Run by ``.ci/mmengine``, which installs mmengine into a virtual environment of its
own. Without mmengine each test module here skips with the reason. (This folder is
itself importable as a namespace package called ``mmengine`` from ``tests/``, so the
modules look for a real, regular ``mmengine`` package before importing it.)
"""

import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]
if str(TESTS) not in sys.path:
    sys.path.insert(0, str(TESTS))
