"""The differences page (docs/reference/differences-mmcv.md) and README.md state how many
call shapes the differential tier compares: the number it has."""

from __future__ import annotations

import importlib
import re

import _consumers
import pytest

_consumers.require()

import _mmcv_ref  # noqa: E402

MODULES = ('test_differential_cast', 'test_differential_decorators',
           'test_differential_scaler', 'test_differential_wrap')


PAGES = (_consumers.REPO / 'docs' / 'reference' / 'differences-mmcv.md',
         _consumers.REPO / 'README.md')


@pytest.mark.parametrize('page', PAGES, ids=lambda p: p.name)
def test_the_page_gives_the_number_of_call_shapes_compared(page):
    for name in MODULES:  # each registers its shapes when imported
        importlib.import_module(name)
    counted = sum(len(labels) for labels in _mmcv_ref.SHAPES.values())
    assert counted > 1000
    text = page.read_text(encoding='utf-8')
    stated = re.search(r'compares (\d+) call\s+shapes', text)
    assert stated is not None, f'{page.name} lost the sentence with the count'
    assert int(stated.group(1)) == counted, (
        f'{page.name} says {stated.group(1)} call shapes; the tier compares {counted} '
        f'({ {k: len(v) for k, v in sorted(_mmcv_ref.SHAPES.items())} }).')
