"""fp16utils.migrate.half_kernels: mmcv's kernels read from its sources, and the scan rule.

A small mmcv is written by the tests (Python ops and a csrc tree in mmcv's layout:
``pytorch/pybind.cpp``, the ``*_impl`` entry points, ``pytorch/cpu`` and
``pytorch/cuda`` kernels registered with ``REGISTER_DEVICE_IMPL``), so the reading is
checked on sources whose answer is known. The table shipped for mmcv 1.7.2 is checked
here for its shape and a few entries; tests/consumers/test_half_kernels_csrc.py
compares it with the real sources where mmcv is installed.
"""

from __future__ import annotations

import ast
import io
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from fp16utils.migrate import half_kernels, scan
from fp16utils.migrate._csrc import FIXED_FLOAT, dispatch_dtypes, read_functions
from fp16utils.migrate.half_kernels import (
    Kernel,
    find_mmcv,
    read_kernel_table,
    report_half_kernels,
    shipped_table,
)
from fp16utils.tools import cli

ROOT = Path(__file__).resolve().parents[1]

# ------------------------------------------------------------- a small mmcv, on disk

OPS_INIT = '''
from .scale import ChannelScale, channel_scale
from .both import BothConv
from .plain import PlainAttention
from .boxes import nms, batched_nms, iou
from .aten import aten_op
'''

SCALE = '''
import torch
from torch.autograd import Function
from ..cnn import CONV_LAYERS
from ..utils import ext_loader

ext_module = ext_loader.load_ext('_ext', ['scale_forward', 'scale_backward'])


class ScaleFunction(Function):
    @staticmethod
    def forward(ctx, x, w):
        return ext_module.scale_forward(x, w)

    @staticmethod
    def backward(ctx, g):
        return ext_module.scale_backward(g)

    @staticmethod
    def _npu_forward(x):
        return torch.npu_scale(x)  # another device's library: none of this csrc


channel_scale = ScaleFunction.apply


@CONV_LAYERS.register_module('SCL')
class ChannelScale(torch.nn.Module):
    def forward(self, x):
        return channel_scale(x, self.weight)
'''

BOTH = '''
import torch
from ..cnn import CONV_LAYERS
from ..utils import ext_loader
from .scale import ScaleFunction

ext_module = ext_loader.load_ext('_ext', ['both_forward'])


@CONV_LAYERS.register_module(name='BothV2')
class BothConv(torch.nn.Module):
    def forward(self, x):
        if x.device.type == 'npu':
            return ScaleFunction._npu_forward(x)  # another device's path: not its kernels
        return ext_module.both_forward(x)
'''

PLAIN = '''
import torch
from ..cnn import PLUGIN_LAYERS


@PLUGIN_LAYERS.register_module()
class PlainAttention(torch.nn.Module):
    """Plain torch: nothing compiled."""
    def forward(self, x):
        return torch.softmax(x, -1)
'''

BOXES = '''
from ..utils import ext_loader

ext_module = ext_loader.load_ext('_ext', ['nms', 'iou'])


def nms(boxes, scores, thr):
    return ext_module.nms(boxes, scores, thr)


def batched_nms(boxes, scores, cfg):
    op = eval(cfg.pop('type', 'nms'))  # reached through a string, as mmcv does
    return op(boxes, scores, 0.5)


def iou(a, b):
    return ext_module.iou(a, b)
'''

ATEN = '''
from ..utils import ext_loader

ext_module = ext_loader.load_ext('_ext', ['aten_op'])


def aten_op(x):
    return ext_module.aten_op(x)
'''

PYBIND = '''
#include "pytorch_cpp_helper.hpp"
void scale_forward(Tensor x, Tensor w, Tensor out);
PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.def("scale_forward", &scale_forward, "scale forward", py::arg("x"));
  m.def("scale_backward", &scale_backward, "scale backward");
  m.def("both_forward", &both_forward, "both");
  m.def("nms", &nms, "nms (CPU)");
  m.def("iou", &iou_entry, "iou");
  m.def("aten_op", &aten_op, "aten");
}
'''

ENTRY = '''
#include "pytorch_device_registry.hpp"
void scale_forward_impl(Tensor x, Tensor w, Tensor out) {
  DISPATCH_DEVICE_IMPL(scale_forward_impl, x, w, out);
}
void scale_forward(Tensor x, Tensor w, Tensor out) { scale_forward_impl(x, w, out); }
void scale_backward_impl(Tensor g) { DISPATCH_DEVICE_IMPL(scale_backward_impl, g); }
void scale_backward(Tensor g) { scale_backward_impl(g); }
void both_forward_impl(Tensor x) { DISPATCH_DEVICE_IMPL(both_forward_impl, x); }
void both_forward(Tensor x) { both_forward_impl(x); }
Tensor nms_cpu(Tensor boxes, Tensor scores, float thr);
Tensor nms(Tensor boxes, Tensor scores, float thr) {
  // no registry: calls the CPU function itself, as mmcv's nms_rotated does
  return nms_cpu(boxes, scores, thr);
}
Tensor iou_impl(Tensor a, Tensor b) { return DISPATCH_DEVICE_IMPL(iou_impl, a, b); }
Tensor iou_entry(Tensor a, Tensor b) { return iou_impl(a, b); }
Tensor aten_op_impl(Tensor x) { return DISPATCH_DEVICE_IMPL(aten_op_impl, x); }
Tensor aten_op(Tensor x) { return aten_op_impl(x); }
'''

CPU = '''
// AT_DISPATCH_FLOATING_TYPES_AND_HALF appears in this comment only: not a dispatch.
template <typename T>
static void scale_kernel(const T* x, const T* w, T* out, int64_t n) {
  for (int64_t i = 0; i < n; ++i) { if (x[i] > 0) { out[i] = x[i] * w[i]; } }
}

void ScaleForwardCPULauncher(Tensor x, Tensor w, Tensor out) {
  const char* note = "AT_DISPATCH_FLOATING_TYPES_AND_HALF(";  // a string: not one
  AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "scale_forward_cpu", [&] {
    scale_kernel<scalar_t>(x.data_ptr<scalar_t>(), w.data_ptr<scalar_t>(),
                           out.data_ptr<scalar_t>(), x.numel());
  });
}

void scale_forward_cpu(Tensor x, Tensor w, Tensor out) { ScaleForwardCPULauncher(x, w, out); }

void scale_backward_cpu(Tensor g) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::ScalarType::Half, at::ScalarType::BFloat16,
                                  g.scalar_type(), "scale_backward_cpu", [&] { g.zero_(); });
}

void both_forward_cpu(Tensor x) {
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "both", [&] {
    x.mul_(2);
  });
}

Tensor nms_cpu(Tensor boxes, Tensor scores, float thr) {
  auto x1 = boxes.data_ptr<float>();
  return scores;
}

Tensor iou_cpu(Tensor a, Tensor b) {
  AT_DISPATCH_INTEGRAL_TYPES(a.scalar_type(), "iou_index", [&] { a.add_(1); });
  using scalar_t = float;
  return a;
}

Tensor aten_op_cpu(Tensor x) { return x.sum(0); }  // ATen operators: every dtype

REGISTER_DEVICE_IMPL(scale_forward_impl, CPU, scale_forward_cpu);
REGISTER_DEVICE_IMPL(scale_backward_impl, CPU, scale_backward_cpu);
REGISTER_DEVICE_IMPL(both_forward_impl, CPU, both_forward_cpu);
REGISTER_DEVICE_IMPL(iou_impl, CPU, iou_cpu);
REGISTER_DEVICE_IMPL(aten_op_impl, CPU, aten_op_cpu);
'''

CUDA = '''
#include "scale_cuda_kernel.cuh"
void ScaleForwardCUDAKernelLauncher(Tensor x, Tensor w, Tensor out) {
  AT_DISPATCH_FLOATING_TYPES_AND_HALF(x.scalar_type(), "scale_forward_cuda", ([&] {
    scale_forward_cuda_kernel<scalar_t><<<1, 1>>>(x.data_ptr<scalar_t>());
  }));
}
void ScaleBackwardCUDAKernelLauncher(Tensor g) {
  AT_DISPATCH_FLOATING_TYPES_AND_HALF(g.scalar_type(), "scale_backward_cuda", [&] {});
}
'''

CUDABIND = '''
void ScaleForwardCUDAKernelLauncher(Tensor x, Tensor w, Tensor out);
void scale_forward_cuda(Tensor x, Tensor w, Tensor out) {
  ScaleForwardCUDAKernelLauncher(x, w, out);
}
void scale_forward_impl(Tensor x, Tensor w, Tensor out);
REGISTER_DEVICE_IMPL(scale_forward_impl, CUDA, scale_forward_cuda);
void ScaleBackwardCUDAKernelLauncher(Tensor g);
void scale_backward_cuda(Tensor g) { ScaleBackwardCUDAKernelLauncher(g); }
REGISTER_DEVICE_IMPL(scale_backward_impl, CUDA, scale_backward_cuda);
'''


def write_mmcv(root: Path, version: str = '9.9.9') -> Path:
    """A package ``mmcv`` under ``root`` with the ops and csrc above; returns its folder."""
    files = {
        '__init__.py': '',
        'version.py': f"__version__ = '{version}'\n",
        'ops/__init__.py': OPS_INIT,
        'ops/scale.py': SCALE,
        'ops/both.py': BOTH,
        'ops/plain.py': PLAIN,
        'ops/boxes.py': BOXES,
        'ops/aten.py': ATEN,
        'ops/csrc/pytorch/pybind.cpp': PYBIND,
        'ops/csrc/pytorch/entry.cpp': ENTRY,
        'ops/csrc/pytorch/cpu/ops.cpp': CPU,
        'ops/csrc/pytorch/cuda/scale_cuda.cu': CUDA,
        'ops/csrc/pytorch/cuda/cudabind.cpp': CUDABIND,
    }
    package = root / 'mmcv'
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return package


@pytest.fixture
def small_mmcv(tmp_path):
    return read_kernel_table(write_mmcv(tmp_path))


def rows(table, name):
    return [(k.device, k.file, k.dispatch) for k in table.op(name).kernels]


# ----------------------------------------------------------------- reading the sources

def test_dispatch_macros_say_which_low_dtypes_have_kernels():
    assert dispatch_dtypes('AT_DISPATCH_FLOATING_TYPES') == frozenset()
    assert dispatch_dtypes('AT_DISPATCH_FLOATING_TYPES_AND_HALF') == {'float16'}
    assert dispatch_dtypes('AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16)') == {
        'float16', 'bfloat16'}
    assert dispatch_dtypes('AT_DISPATCH_FLOATING_TYPES_AND(BFloat16)') == {'bfloat16'}
    assert dispatch_dtypes('AT_DISPATCH_REDUCED_FLOATING_TYPES') == {'float16', 'bfloat16'}
    assert dispatch_dtypes(FIXED_FLOAT) == frozenset()


def test_functions_are_found_outside_bodies_only():
    text = '''
    namespace ops { extern "C" {
    template <typename T> __device__ T twice(T x) { return x + x; }
    void launch(Tensor x) {
      if (x.numel()) { AT_DISPATCH_FLOATING_TYPES(x.scalar_type(), "k", [&] { x.add_(1); }); }
      for (int i = 0; i < 2; ++i) { x.mul_(2); }
    }
    } }
    struct Op { Tensor run(Tensor x) const { return x; } };
    '''
    assert [name for name, _ in read_functions(text)] == ['twice', 'launch', 'run']
    body = dict(read_functions(text))['launch']
    assert 'AT_DISPATCH_FLOATING_TYPES' in body and 'x.mul_(2)' in body


def test_a_small_mmcv_is_read_per_op_and_device(small_mmcv):
    table = small_mmcv
    assert table.from_sources and table.version == '9.9.9'
    # Forward and backward kernels together; the comment and the string ignored.
    assert rows(table, 'ChannelScale') == [
        ('cpu', 'pytorch/cpu/ops.cpp', 'AT_DISPATCH_FLOATING_TYPES'),
        ('cpu', 'pytorch/cpu/ops.cpp', 'AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16)'),
        ('cuda', 'pytorch/cuda/scale_cuda.cu', 'AT_DISPATCH_FLOATING_TYPES_AND_HALF')]
    op = table.op('ChannelScale')
    assert op.kind == 'module' and op.devices_lacking('float16') == ['cpu']
    assert op.devices_lacking('bfloat16') == ['cpu', 'cuda']
    assert table.op('channel_scale').kind == 'function'
    assert table.op('ScaleFunction').kind == 'function'  # an autograd Function
    # Both dtypes on the CPU, no CUDA kernel: nothing lacking. An NPU method of another
    # class it calls does not bring that class's kernels in.
    assert rows(table, 'BothConv') == [
        ('cpu', 'pytorch/cpu/ops.cpp', 'AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16)')]
    assert table.op('BothConv').lacking('float16') == ()
    # A kernel reading data_ptr<float>, one with `using scalar_t = float` (its integral
    # dispatch does not count), an entry point that calls the CPU function directly,
    # and one reached through eval('nms').
    assert rows(table, 'nms') == [('cpu', 'pytorch/cpu/ops.cpp', FIXED_FLOAT)]
    assert rows(table, 'iou') == [('cpu', 'pytorch/cpu/ops.cpp', FIXED_FLOAT)]
    assert table.op('batched_nms').kernels == table.op('nms').kernels
    # Plain torch, and ATen operators only: nothing to report.
    assert table.op('PlainAttention') is None and table.op('aten_op') is None


def test_registry_names_come_from_the_decorators(small_mmcv):
    assert small_mmcv.config_types == {'SCL': 'ChannelScale', 'BothV2': 'BothConv'}
    assert small_mmcv.op('SCL') is small_mmcv.op('ChannelScale')
    assert small_mmcv.op('PlainAttention') is None  # registered, but nothing compiled


def test_a_folder_without_csrc_is_no_table(tmp_path):
    (tmp_path / 'mmcv' / 'ops').mkdir(parents=True)
    assert read_kernel_table(tmp_path / 'mmcv') is None


# ------------------------------------------------- which table: installed or shipped

@pytest.fixture
def fresh_table():
    half_kernels.kernel_table.cache_clear()
    yield
    half_kernels.kernel_table.cache_clear()


@pytest.mark.usefixtures('fresh_table')
def test_an_installed_mmcv_with_sources_is_read_without_importing_it(tmp_path, monkeypatch):
    write_mmcv(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'mmcv', raising=False)
    assert find_mmcv() == tmp_path / 'mmcv'
    table = half_kernels.kernel_table()
    assert table.from_sources and table.version == '9.9.9'
    assert f"read from mmcv 9.9.9's csrc at {tmp_path / 'mmcv' / 'ops' / 'csrc'}" == table.source
    assert 'mmcv' not in sys.modules


@pytest.mark.usefixtures('fresh_table')
def test_without_sources_the_shipped_table_stands_in(tmp_path, monkeypatch):
    (tmp_path / 'mmcv').mkdir()
    (tmp_path / 'mmcv' / '__init__.py').write_text('')  # an mmcv wheel without csrc
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'mmcv', raising=False)
    table = half_kernels.kernel_table()
    assert not table.from_sources and table.version == '1.7.2'
    assert table.source == ("mmcv 1.7.2's csrc, from the table fp16utils ships, as no mmcv "
                            'with its C++ sources is installed')


@pytest.mark.usefixtures('fresh_table')
def test_sources_that_cannot_be_read_count_as_absent(tmp_path, monkeypatch):
    write_mmcv(tmp_path)
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'mmcv', raising=False)

    def unreadable(root):
        raise PermissionError(13, 'Permission denied', str(root))

    monkeypatch.setattr(half_kernels, 'read_kernel_table', unreadable)
    assert not half_kernels.kernel_table().from_sources


def test_a_namespace_mmcv_is_not_found(tmp_path, monkeypatch):
    (tmp_path / 'mmcv').mkdir()  # no __init__.py: a namespace package, not mmcv
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, 'mmcv', raising=False)
    if find_mmcv() is not None and find_mmcv() != tmp_path / 'mmcv':
        pytest.skip('a real mmcv is installed here')
    assert find_mmcv() is None


# ------------------------------------------------------------------ the shipped table

def test_the_shipped_table_says_what_mmcv_172_compiles():
    table = shipped_table()
    assert rows(table, 'RoIAlign') == [
        ('cpu', 'pytorch/cpu/roi_align.cpp', 'AT_DISPATCH_FLOATING_TYPES_AND_HALF'),
        ('cuda', 'pytorch/cuda/roi_align_cuda.cu', 'AT_DISPATCH_FLOATING_TYPES_AND_HALF')]
    assert rows(table, 'nms') == [('cpu', 'pytorch/cpu/nms.cpp', FIXED_FLOAT),
                                  ('cuda', 'pytorch/cuda/nms_cuda.cu', FIXED_FLOAT)]
    assert rows(table, 'PSAMask') == [
        ('cuda', 'pytorch/cuda/psamask_cuda.cu', 'AT_DISPATCH_FLOATING_TYPES')]
    assert table.op('nms_rotated').devices_lacking('float16') == ['cpu']
    for name in ('MultiScaleDeformableAttention', 'CARAFEPack'):  # CUDA kernels only
        assert {k.device for k in table.op(name).kernels} == {'cuda'}
    assert table.op('CrissCrossAttention') is None  # plain torch in mmcv 1.7.2
    assert table.config_types == {
        'DCN': 'DeformConv2dPack', 'DCNv2': 'ModulatedDeformConv2dPack', 'SAC': 'SAConv2d',
        'carafe': 'CARAFEPack', 'MMSyncBN': 'SyncBatchNorm',
        'MultiScaleDeformableAttention': 'MultiScaleDeformableAttention'}


def test_every_shipped_row_is_well_formed():
    from fp16utils.migrate import _mmcv172_kernels as data

    assert set(entry.split()[1] for entry in data.OPS.values()) == set(data.EVIDENCE)
    for evidence in data.EVIDENCE.values():
        for row in evidence:
            device, file, dispatch = row.split(' ', 2)
            assert device in ('cpu', 'cuda') and file.startswith(f'pytorch/{device}/')
            assert dispatch == FIXED_FLOAT or dispatch.startswith('AT_DISPATCH_'), row
    assert {e.split()[0] for e in data.OPS.values()} == {'module', 'function'}
    assert set(data.CONFIG_TYPES.values()) <= set(data.OPS)


# ------------------------------------------------------------------------ scan findings

SOURCE = '''\
import mmcv
import mmcv.ops as mo
from mmcv import ops
from mmcv.ops import RoIAlign, nms as mm_nms, DeformConv2dPack, CrissCrossAttention
from mmcv.ops.roi_align import roi_align as ra


class Head(DeformConv2dPack):
    def forward(self, x, rois):
        a = mmcv.ops.roi_align(x, rois, 7)
        b = ops.ModulatedDeformConv2dPack(4, 4, 3)
        c = mo.roi_align.RoIAlign(7)
        return RoIAlign(7)(x, rois), ra(x, rois, 7), CrissCrossAttention(8), a, b, c
'''

CONFIG = '''\
model = dict(
    backbone=dict(dcn=dict(type='DCN', deform_groups=1), stage_with_dcn=(False, True)),
    neck=dict(upsample_cfg={'type': 'carafe'}),
    roi_head=dict(bbox_roi_extractor=dict(roi_layer=dict(type='RoIAlign', output_size=7))),
    test_cfg=dict(nms=dict(type='nms', iou_threshold=0.5)))
'''

LOOKALIKES = '''\
import torchvision
from torchvision.ops import roi_align, nms, RoIAlign, DeformConv2d
from mmcv.cnn import ConvModule
from mmcv.ops import Conv2d, CrissCrossAttention
from mydet.ops import DeformConv2dPack


class DCN:
    def nms(self, boxes):
        return self.nms(boxes)


def f(x, rois, kind):
    y = torchvision.ops.roi_align(x, rois, 7)
    conv = dict(type='DCNv3', name='DCN')
    cfg = dict(type=kind, other='RoIAlign')
    return roi_align(x, rois, 7), nms(x, x, 0.5), RoIAlign(7), DeformConv2d(2, 2, 3), y
'''


@pytest.fixture
def shipped(monkeypatch):
    """Scan with the shipped table, whatever mmcv is installed here."""
    monkeypatch.setattr(half_kernels, 'kernel_table', shipped_table)


def findings(tmp_path, text, name='m.py'):
    path = tmp_path / name
    path.write_text(text)
    return [f for f in scan(path) if f.kind == 'half-kernel']


@pytest.mark.usefixtures('shipped')
def test_each_use_of_an_mmcv_op_is_reported_with_its_evidence(tmp_path):
    found = findings(tmp_path, SOURCE)
    assert [(f.line, f.col, f.message.split(':')[0]) for f in found] == [
        (4, 1, 'imports nms from mmcv.ops'),  # imported, never used in the file
        (8, 12, 'uses mmcv.ops.DeformConv2dPack'),
        (10, 13, 'uses mmcv.ops.roi_align'),
        (11, 13, 'uses mmcv.ops.ModulatedDeformConv2dPack'),
        (12, 13, 'uses mmcv.ops.RoIAlign'),
        (13, 16, 'uses mmcv.ops.RoIAlign'),
        (13, 38, 'uses mmcv.ops.roi_align'),
    ]
    dcn = found[1]
    assert dcn.message == (
        'uses mmcv.ops.DeformConv2dPack: no bfloat16 kernel on cpu or cuda; evidence: '
        'cpu: pytorch/cpu/deform_conv.cpp AT_DISPATCH_FLOATING_TYPES_AND_HALF; cuda: '
        'pytorch/cuda/deform_conv_cuda.cu AT_DISPATCH_FLOATING_TYPES_AND_HALF '
        f'({shipped_table().source})')
    assert dcn.suggestion.startswith(
        "keep it in float32: fp32_modules=['DeformConv2dPack'] (AmpOptimWrapper, ")
    assert dcn.suggestion.endswith('see docs/troubleshooting/not-implemented-for-half.md')
    nms = found[0]
    assert 'no float16 or bfloat16 kernel on cpu or cuda' in nms.message
    assert 'cpu: pytorch/cpu/nms.cpp float only (no AT_DISPATCH)' in nms.message
    assert nms.suggestion.startswith(
        'run it in float32: mm_nms = fp16utils.fp32_function(mm_nms, cast_output=True)')
    assert nms.suggestion.endswith('see docs/troubleshooting/expected-scalar-type.md')
    attribute = found[2]
    assert 'roi_align = fp16utils.fp32_function(mmcv.ops.roi_align, ' in attribute.suggestion


@pytest.mark.usefixtures('shipped')
def test_config_types_are_reported_by_registry_and_op_name(tmp_path):
    found = findings(tmp_path, CONFIG, 'mask_rcnn_dcn.py')
    assert [(f.line, f.message.split(':')[0]) for f in found] == [
        (2, "config type='DCN' (mmcv.ops.DeformConv2dPack)"),
        (3, "config type='carafe' (mmcv.ops.CARAFEPack)"),
        (4, "config type='RoIAlign'"),
        (5, "config type='nms'"),
    ]
    assert 'no bfloat16 kernel on cuda;' in found[1].message  # CARAFE: CUDA kernels only
    lines = CONFIG.splitlines()
    for f in found:  # the column points at the type's value
        assert lines[f.line - 1][f.col - 1] == "'"


@pytest.mark.usefixtures('shipped')
def test_names_that_only_look_alike_are_not_reported(tmp_path):
    assert findings(tmp_path, LOOKALIKES) == []
    # The same file, the names imported from mmcv.ops instead: reported.
    real = LOOKALIKES.replace('from torchvision.ops import', 'from mmcv.ops import')
    assert len(findings(tmp_path, real, 'real.py')) == 4


@pytest.mark.usefixtures('shipped')
def test_a_table_without_gaps_reports_nothing(tmp_path):
    full = half_kernels._build('0', 'test', {'RoIAlign': ('module', (
        ('cpu', 'pytorch/cpu/r.cpp', 'AT_DISPATCH_FLOATING_TYPES_AND2(Half, BFloat16)'),))},
        {}, False)
    found = []
    report_half_kernels(ast.parse('from mmcv.ops import RoIAlign\nRoIAlign(7)\n'),
                        lambda *args: found.append(args), table=full)
    assert found == []
    assert Kernel('cpu', 'f', 'AT_DISPATCH_FLOATING_TYPES').dtypes == frozenset()


@pytest.mark.usefixtures('shipped')
def test_the_command_prints_them_and_exits_1(tmp_path):
    (tmp_path / 'configs').mkdir()
    (tmp_path / 'configs' / 'dcn.py').write_text(CONFIG)
    out = io.StringIO()
    assert cli.main(['scan', str(tmp_path)], out=out) == 1
    text = out.getvalue().splitlines()
    assert text[0].startswith(f'{tmp_path}/configs/dcn.py:2:33: half-kernel: config '
                              "type='DCN' (mmcv.ops.DeformConv2dPack): no bfloat16 kernel")
    assert text[1].startswith("    -> keep it in float32: fp32_modules=['DeformConv2dPack']")
    assert text[-1] == '4 finding(s) in 1 file(s)'
    out = io.StringIO()
    assert cli.main(['scan', '--json', str(tmp_path)], out=out) == 1
    assert [f['kind'] for f in json.loads(out.getvalue())] == ['half-kernel'] * 4
    # --fix rewrites fp16 imports only: these findings stay.
    out = io.StringIO()
    assert cli.main(['scan', '--fix', str(tmp_path)], out=out) == 0
    assert out.getvalue() == 'changed 0 file(s)\n'


def test_scan_reads_an_installed_mmcv_without_importing_it_or_torch(tmp_path):
    write_mmcv(tmp_path / 'site')
    (tmp_path / 'user.py').write_text('from mmcv.ops import ChannelScale\nChannelScale()\n')
    code = ('import sys\nfrom fp16utils.tools import cli\n'
            f'code = cli.main(["scan", {str(tmp_path / "user.py")!r}])\n'
            'print(code, "torch" in sys.modules, "mmcv" in sys.modules)\n')
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(tmp_path / 'site'), str(ROOT)]))
    done = subprocess.run([sys.executable, '-c', code], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    lines = done.stdout.splitlines()
    assert lines[-1] == '1 False False'
    assert lines[0].endswith('user.py:2:1: half-kernel: uses mmcv.ops.ChannelScale: no '
                             'float16 kernel on cpu; no bfloat16 kernel on cpu or cuda; '
                             'evidence: cpu: pytorch/cpu/ops.cpp AT_DISPATCH_FLOATING_TYPES; '
                             'cuda: pytorch/cuda/scale_cuda.cu '
                             "AT_DISPATCH_FLOATING_TYPES_AND_HALF (read from mmcv 9.9.9's "
                             f"csrc at {tmp_path / 'site' / 'mmcv' / 'ops' / 'csrc'})")
