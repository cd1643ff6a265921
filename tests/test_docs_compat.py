"""docs/reference/compatibility.md: every ``>>>`` example on the page runs as it is written."""

import doctest
from pathlib import Path

import pytest
import torch

from fp16utils import _torch

PAGE = Path(__file__).resolve().parents[1] / 'docs' / 'reference' / 'compatibility.md'


def test_every_example_of_the_compatibility_page_runs():
    # The page wraps a model for float16 on the native backend, as the doctests that
    # train in float16 do: the same rule as the root conftest's for those.
    if not _torch.caps.kernels_support('cpu', torch.float16):
        pytest.skip('torch has no float16 matrix kernels on cpu here')
    why = _torch.caps.native_reason('cpu', torch.float16)
    if why is not None:
        pytest.skip(why)
    results = doctest.testfile(str(PAGE), module_relative=False, verbose=False, report=True,
                               optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    assert results.attempted >= 40, f'the page lost its examples: {results}'
    assert results.failed == 0, f'{results.failed} example(s) of {PAGE.name} failed (see above)'
