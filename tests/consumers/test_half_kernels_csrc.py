"""The half-kernel table fp16utils ships is what mmcv 1.7.2's installed csrc says.

``fp16utils.migrate.half_kernels`` reads an installed mmcv's C++ sources; where none
is installed it falls back to ``_mmcv172_kernels``, read from mmcv 1.7.2 the same
way. This tier installs mmcv 1.7.2 with its sources, so here the two are compared
entry by entry, and a few entries are checked against the source text itself. On a
mismatch the test prints the module to ship instead (``format_shipped``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from fp16utils.migrate import half_kernels
from fp16utils.migrate._csrc import dispatch_dtypes

ROOT = half_kernels.find_mmcv()
CSRC = ROOT / 'ops' / 'csrc' if ROOT is not None else None
pytestmark = pytest.mark.skipif(
    CSRC is None or not (CSRC / 'pytorch').is_dir(),
    reason='no mmcv with its C++ sources (ops/csrc) is installed here (the consumer tier '
           'installs mmcv 1.7.2)')


def format_shipped(table: half_kernels.KernelTable) -> str:
    """The source of ``_mmcv172_kernels.py`` for ``table`` (rows grouped by evidence)."""
    ops, config = table.as_dicts()
    keys: dict = {}
    for _, (_, rows) in sorted(ops.items()):
        if rows not in keys:
            stems = dict.fromkeys(re.sub(r'_cuda$|_cpu$', '', Path(f).stem) for _, f, _ in rows)
            key = '+'.join(stems)
            n = 2
            while key in keys.values():
                key, n = f"{'+'.join(stems)}#{n}", n + 1
            keys[rows] = key
    out = [f"VERSION = '{table.version}'", '', '#: {key: (\'device file dispatch\', ...)}',
           'EVIDENCE = {']
    for rows, key in sorted(keys.items(), key=lambda item: item[1]):
        out.append(f"    '{key}': (")
        out.extend(f"        '{' '.join(row)}'," for row in rows)
        out.append('    ),')
    out += ['}', '', "#: {op name: 'kind evidence-key'}", 'OPS = {']
    out.extend(f"    '{name}': '{kind} {keys[rows]}',"
               for name, (kind, rows) in sorted(ops.items()))
    out += ['}', '', '#: {config type (registry name): op name}', 'CONFIG_TYPES = {']
    out.extend(f"    '{t}': '{name}'," for t, name in sorted(config.items()))
    out.append('}')
    return '\n'.join(out) + '\n'


@pytest.fixture(scope='module')
def installed():
    table = half_kernels.read_kernel_table(ROOT)
    assert table is not None and table.from_sources
    return table


def test_the_installed_mmcv_is_the_version_the_table_was_read_from(installed):
    assert installed.version == half_kernels.shipped_table().version == '1.7.2'


def test_the_shipped_table_is_what_the_installed_csrc_says(installed):
    shipped = half_kernels.shipped_table()
    assert shipped.as_dicts() == installed.as_dicts(), (
        'the shipped table differs from the installed csrc; ship this as '
        'fp16utils/migrate/_mmcv172_kernels.py (below the docstring):\n'
        + format_shipped(installed))


def test_kernel_table_reads_the_installed_sources():
    half_kernels.kernel_table.cache_clear()
    try:
        table = half_kernels.kernel_table()
    finally:
        half_kernels.kernel_table.cache_clear()
    assert table.from_sources and str(CSRC) in table.source


def _macros(path: Path) -> set:
    return set(re.findall(r'\b(AT_DISPATCH_\w+)\s*\(', path.read_text()))


@pytest.mark.parametrize('name, device, file', [
    ('RoIAlign', 'cpu', 'pytorch/cpu/roi_align.cpp'),
    ('RoIAlign', 'cuda', 'pytorch/cuda/roi_align_cuda.cu'),
    ('DeformConv2dPack', 'cpu', 'pytorch/cpu/deform_conv.cpp'),
    ('ModulatedDeformConv2dPack', 'cuda', 'pytorch/cuda/modulated_deform_conv_cuda.cu'),
    ('MultiScaleDeformableAttention', 'cuda', 'pytorch/cuda/ms_deform_attn_cuda.cu'),
    ('CARAFEPack', 'cuda', 'pytorch/cuda/carafe_cuda.cu'),
    ('PSAMask', 'cuda', 'pytorch/cuda/psamask_cuda.cu'),
])
def test_an_entry_names_the_file_and_the_macro_that_file_uses(installed, name, device, file):
    """The evidence quoted is in the source: that file dispatches with that macro."""
    kernels = [k for k in installed.op(name).kernels if k.device == device]
    assert [k.file for k in kernels] == [file]
    assert _macros(CSRC / file) == {kernels[0].dispatch}


def test_the_ops_the_issue_names_lack_bfloat16_everywhere_they_have_kernels(installed):
    for name in ('DeformConv2dPack', 'ModulatedDeformConv2dPack', 'RoIAlign',
                 'MultiScaleDeformableAttention', 'CARAFEPack'):
        op = installed.op(name)
        assert op.devices_lacking('bfloat16') == sorted({k.device for k in op.kernels})
    # mmcv 1.7.2's CrissCrossAttention is plain torch: nothing compiled to lack a kernel.
    assert installed.op('CrissCrossAttention') is None
    assert 'def forward' in (ROOT / 'ops' / 'cc_attention.py').read_text()
    assert 'ext_module' not in (ROOT / 'ops' / 'cc_attention.py').read_text()


def test_nms_reads_float_without_a_dispatch_on_both_devices(installed):
    nms = installed.op('nms')
    assert {k.device for k in nms.kernels} == {'cpu', 'cuda'}
    assert all(k.dtypes == frozenset() for k in nms.kernels)
    assert 'data_ptr<float>()' in (CSRC / 'pytorch' / 'cpu' / 'nms.cpp').read_text()
    assert not _macros(CSRC / 'pytorch' / 'cpu' / 'nms.cpp')


def test_every_macro_in_the_table_is_one_the_sources_use(installed):
    used = set()
    for path in (CSRC / 'pytorch').rglob('*.c[pu]*'):
        used |= _macros(path)
    quoted = {k.dispatch.split('(')[0] for op in installed.ops.values() for k in op.kernels}
    assert quoted - {'float only '} <= used
    assert all(dispatch_dtypes(m) <= {'float16'} for m in used if 'FLOATING' in m)
