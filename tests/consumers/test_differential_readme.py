"""The differences page (docs/reference/differences-mmcv.md) states how many call shapes
the differential tier compares: the number it has."""

from __future__ import annotations

import importlib
import re

import _consumers

_consumers.require()

import _mmcv_ref  # noqa: E402

MODULES = ('test_differential_cast', 'test_differential_decorators',
           'test_differential_scaler', 'test_differential_wrap')


PAGE = _consumers.REPO / 'docs' / 'reference' / 'differences-mmcv.md'


def test_the_differences_page_gives_the_number_of_call_shapes_compared():
    for name in MODULES:  # each registers its shapes when imported
        importlib.import_module(name)
    counted = sum(len(labels) for labels in _mmcv_ref.SHAPES.values())
    assert counted > 1000
    text = PAGE.read_text(encoding='utf-8')
    stated = re.search(r'compares (\d+) call\s+shapes', text)
    assert stated is not None, f'{PAGE.name} lost the sentence with the count'
    assert int(stated.group(1)) == counted, (
        f'{PAGE.name} says {stated.group(1)} call shapes; the tier compares {counted} '
        f'({ {k: len(v) for k, v in sorted(_mmcv_ref.SHAPES.items())} }).')
