"""Sweep: ``cast_tensor_type`` on containers that are ``Mapping``/``Sequence`` without
being ``dict``/``list``, compared with mmcv 1.7.2's own ``cast_tensor_type``.

A container that can be rebuilt from a dict (mapping) or a list (sequence) comes back
as the same type with every float32 tensor cast; one that cannot (or whose rebuilt
object does not hold the cast values) is a TypeError naming the class and the fix,
never float32 tensors returned silently; with nothing to cast the very same object
comes back. What mmcv accepts and returns correctly is never refused.
"""

from __future__ import annotations

import json
import os
import subprocess
import warnings
from pathlib import Path

import pytest
import torch

import fp16utils

F32, F16 = torch.float32, torch.float16
MMCV_PY = Path.home() / '.cache' / 'fp16utils' / 'consumers' / 'bin' / 'python'
STANDINS = Path(__file__).resolve().parent.parent / 'consumers' / 'standins'

#: The containers, defined once for both implementations (``impl`` is fp16utils or
#: mmcv's fp16_utils). ``RESULT``: per case, what ``impl.cast_tensor_type`` made of it.
SCRIPT = r'''
import collections, dataclasses, types
from collections import abc
import torch

class ReadOnlyMap(abc.Mapping):
    """A read-only mapping wrapping a dict (rebuilt from a dict)."""
    def __init__(self, data): self._d = dict(data)
    def __getitem__(self, k): return self._d[k]
    def __iter__(self): return iter(self._d)
    def __len__(self): return len(self._d)

class NoArgMap(abc.Mapping):
    """A mapping whose constructor takes no argument."""
    def __init__(self): self._d = {'x': torch.ones(2), 'n': 1}
    def __getitem__(self, k): return self._d[k]
    def __iter__(self): return iter(self._d)
    def __len__(self): return len(self._d)

class WrapSeq(abc.Sequence):
    """A sequence wrapping a list (rebuilt from a list)."""
    def __init__(self, data): self._l = list(data)
    def __getitem__(self, i): return self._l[i]
    def __len__(self): return len(self._l)

class KeepSeq(abc.Sequence):
    """A sequence that keeps what it is given (a list is fine, a generator is not)."""
    def __init__(self, data): self._l = data
    def __getitem__(self, i): return self._l[i]
    def __len__(self): return len(self._l)

class StarSeq(abc.Sequence):
    """A sequence built from its items as arguments: StarSeq(a, b)."""
    def __init__(self, *items): self._l = list(items)
    def __getitem__(self, i): return self._l[i]
    def __len__(self): return len(self._l)

def _not_half(value):
    return not (isinstance(value, torch.Tensor) and value.dtype == torch.float16)

class NoHalfSeq(abc.Sequence):
    """A constructor that drops half tensors: the rebuilt one loses the cast values."""
    def __init__(self, data): self._l = [v for v in data if _not_half(v)]
    def __getitem__(self, i): return self._l[i]
    def __len__(self): return len(self._l)

class NoHalfMap(abc.Mapping):
    """A constructor that drops half tensors: the rebuilt one loses the cast values."""
    def __init__(self, data): self._d = {k: v for k, v in dict(data).items() if _not_half(v)}
    def __getitem__(self, k): return self._d[k]
    def __iter__(self): return iter(self._d)
    def __len__(self): return len(self._d)

class OwnTensorsSeq(abc.Sequence):
    """A constructor that ignores its argument and makes float32 tensors of its own."""
    def __init__(self, data=None): self._l = [torch.ones(2), 'a']
    def __getitem__(self, i): return self._l[i]
    def __len__(self): return len(self._l)

Point = collections.namedtuple('Point', 'a b c', defaults=(None, 5))

@dataclasses.dataclass(frozen=True)
class Frozen:
    a: torch.Tensor
    b: int = 1

def f32():
    return torch.tensor([1.5, -2.0])

IDX = torch.arange(2)
CASES = {
    'ReadOnlyMap': lambda: ReadOnlyMap({'x': f32(), 'i': IDX, 's': 'txt'}),
    'NoArgMap': lambda: NoArgMap(),
    'WrapSeq': lambda: WrapSeq([f32(), IDX, 3]),
    'KeepSeq': lambda: KeepSeq([f32(), IDX]),
    'StarSeq': lambda: StarSeq(f32(), IDX),
    'NoHalfSeq': lambda: NoHalfSeq([f32(), IDX]),
    'NoHalfMap': lambda: NoHalfMap({'a': f32(), 'i': IDX}),
    'OwnTensorsSeq': lambda: OwnTensorsSeq(),
    'UserDict': lambda: collections.UserDict({'x': f32(), 'i': IDX}),
    'UserList': lambda: collections.UserList([f32(), 'a', IDX]),
    'MappingProxyType': lambda: types.MappingProxyType({'x': f32(), 'i': IDX}),
    'namedtuple with defaults': lambda: Point(f32()),
    'namedtuple full': lambda: Point(f32(), IDX, f32()),
    'nested': lambda: collections.UserDict({'p': Point(f32()), 'l': WrapSeq([f32()])}),
    'frozen dataclass': lambda: Frozen(f32()),
}

def items(obj):
    if isinstance(obj, abc.Mapping):
        return sorted(obj.items())
    return list(enumerate(obj))

def correct(before, after):
    """``after`` is ``before``'s type, float32 tensors cast (values kept), the rest kept."""
    if isinstance(before, torch.Tensor):
        if before.dtype != torch.float32:
            return after is before
        return (isinstance(after, torch.Tensor) and after.dtype == torch.float16
                and torch.equal(after.float(), before))
    if isinstance(before, (abc.Mapping, abc.Sequence)) and not isinstance(before, str):
        try:
            pairs, got = items(before), items(after)
        except Exception:
            return False
        return (type(after) is type(before) and [k for k, _ in pairs] == [k for k, _ in got]
                and all(correct(v, w) for (_, v), (_, w) in zip(pairs, got)))
    return after is before

RESULT = {}
for name, make in CASES.items():
    before = make()
    try:
        after = impl.cast_tensor_type(before, torch.float32, torch.float16)
    except Exception as err:
        RESULT[name] = ['raises', type(err).__name__, str(err)]
        continue
    RESULT[name] = ['ok', type(after).__name__, correct(before, after), after is before]
'''

NS: dict = {'impl': fp16utils}
exec(SCRIPT, NS)  # noqa: S102 - defines the containers (and fp16utils' answers) here
CASES = NS['CASES']

#: Cases that can be rebuilt from a dict or a list of their cast items.
REBUILDABLE = ['ReadOnlyMap', 'WrapSeq', 'KeepSeq', 'UserDict', 'UserList',
               'MappingProxyType', 'namedtuple with defaults', 'namedtuple full', 'nested']
#: Cases whose rebuild is impossible or does not hold the cast values.
UNREBUILDABLE = ['NoArgMap', 'StarSeq', 'NoHalfSeq', 'NoHalfMap', 'OwnTensorsSeq']


def leaves(obj):
    """Every (place, value) below ``obj``; tensors as they are."""
    if isinstance(obj, torch.Tensor) or isinstance(obj, str):
        return [((), obj)]
    if isinstance(obj, dict) or hasattr(obj, 'keys'):
        return [((k,) + p, v) for k in sorted(obj) for p, v in leaves(obj[k])]
    if isinstance(obj, (tuple, list)) or hasattr(obj, '__getitem__'):
        return [((i,) + p, v) for i, item in enumerate(obj) for p, v in leaves(item)]
    return [((), obj)]


def cast(obj):
    with warnings.catch_warnings():
        warnings.simplefilter('error')  # no warning instead of a result
        return fp16utils.cast_tensor_type(obj, F32, F16)


@pytest.mark.parametrize('name', REBUILDABLE)
def test_a_rebuildable_container_keeps_its_type_and_every_float32_tensor_is_cast(name):
    before = CASES[name]()
    snapshot = [(p, v.dtype if isinstance(v, torch.Tensor) else v) for p, v in leaves(before)]
    after = cast(before)
    assert type(after) is type(before) and after is not before
    pairs, got = leaves(before), leaves(after)
    assert [p for p, _ in pairs] == [p for p, _ in got]
    for (place, old), (_, new) in zip(pairs, got):
        if isinstance(old, torch.Tensor) and old.dtype == F32:
            assert new.dtype == F16 and torch.equal(new.float(), old), place
        else:
            assert new is old, place  # int tensors, strings, numbers: the same objects
    assert [(p, v.dtype if isinstance(v, torch.Tensor) else v)
            for p, v in leaves(before)] == snapshot  # the input is not changed


def test_a_namedtuple_with_defaults_keeps_its_fields_and_defaults():
    after = cast(NS['Point'](torch.ones(2)))
    assert after._fields == ('a', 'b', 'c') and after.b is None and after.c == 5
    assert after.a.dtype == F16


def test_a_frozen_dataclass_is_not_a_container_and_comes_back_as_it_is():
    before = CASES['frozen dataclass']()
    assert cast(before) is before and before.a.dtype == F32


@pytest.mark.parametrize('name', UNREBUILDABLE)
def test_a_container_that_cannot_be_rebuilt_is_a_type_error_naming_it(name):
    before = CASES[name]()
    dtypes = [v.dtype for _, v in leaves(before) if isinstance(v, torch.Tensor)]
    with pytest.raises(TypeError) as info:
        cast(before)
    message = str(info.value)
    assert name in message, message
    assert 'constructor' in message and ('dict' in message or 'list' in message), message
    assert [v.dtype for _, v in leaves(before) if isinstance(v, torch.Tensor)] == dtypes


@pytest.mark.parametrize('name', UNREBUILDABLE + REBUILDABLE)
def test_nothing_to_cast_gives_the_very_same_object(name):
    before = CASES[name]()
    if name in ('NoArgMap', 'OwnTensorsSeq'):  # they hold float32 tensors of their own
        assert fp16utils.cast_tensor_type(before, F16, F32) is before
        return
    assert fp16utils.cast_tensor_type(before, torch.float64, F16) is before


# ---------------------------------------------------------------- against mmcv 1.7.2


@pytest.fixture(scope='module')
def mmcv_answers():
    if not MMCV_PY.exists():
        pytest.skip(f'no consumer virtualenv with mmcv 1.7.2 at {MMCV_PY}')
    driver = ('import sys, json, warnings\nwarnings.simplefilter("ignore")\n'
              f'sys.path.insert(0, {str(STANDINS)!r})\nimport _fp16utils_standins\n'
              'from mmcv.runner import fp16_utils as impl\n'
              + SCRIPT + '\nprint(json.dumps(RESULT))\n')
    proc = subprocess.run([str(MMCV_PY), '-c', driver], capture_output=True, text=True,
                          timeout=120, env=dict(os.environ, OMP_NUM_THREADS='1'))
    if 'No module named' in proc.stderr and 'mmcv' in proc.stderr:
        pytest.skip('mmcv 1.7.2 is not (yet) importable in the consumer virtualenv')
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize('name', list(CASES))
def test_never_refuses_what_mmcv_accepts_and_returns_correctly(mmcv_answers, name):
    theirs, ours = mmcv_answers[name], NS['RESULT'][name]
    if theirs[0] == 'ok' and theirs[2]:  # mmcv answers correctly: the same answer
        assert ours == theirs, (ours, theirs)
    elif ours[0] == 'raises':  # mmcv raises or answers wrongly: a clear refusal ...
        assert ours[1] == 'TypeError' and name.split()[0] in ours[2], ours
    else:  # ... or a correct answer of the same type
        assert ours[:3] == ['ok', type(CASES[name]()).__name__, True], ours


def test_where_mmcv_differs_it_is_as_recorded(mmcv_answers):
    """mmcv 1.7.2 rebuilds a Sequence from a generator and a Mapping from a dict."""
    differs = {name: answer[:3] for name, answer in mmcv_answers.items()
               if answer[0] == 'raises' or not answer[2]}
    assert differs == {
        'NoArgMap': ['raises', 'TypeError', differs['NoArgMap'][2]],
        'KeepSeq': ['ok', 'KeepSeq', False],  # holds mmcv's generator
        'StarSeq': ['ok', 'StarSeq', False],  # one item: the generator
        'NoHalfSeq': ['ok', 'NoHalfSeq', False],  # lost the cast tensor
        'NoHalfMap': ['ok', 'NoHalfMap', False],
        'OwnTensorsSeq': ['ok', 'OwnTensorsSeq', False],
        'namedtuple with defaults': ['ok', 'Point', False],  # the generator in field a
        'namedtuple full': ['ok', 'Point', False],
        'nested': ['ok', 'UserDict', False],
    }
