"""Differential: ``cast_tensor_type`` against mmcv 1.7.2's own, call by call.

Every input kind (tensors of several dtypes, arrays, strings, numbers, None, odd
objects, each container type) meets every ``(src_type, dst_type)`` pair, the
dtypes, None, ``str``, ``np.ndarray`` and what ``Tensor.to`` reads among them; then
random nestings of them (hypothesis). Both answer the same, or both raise. The
differences docs/reference/differences-mmcv.md lists are asserted, each exactly, at the end.
"""

from __future__ import annotations

import collections
import warnings

import _consumers
import pytest

_consumers.require()

import numpy as np  # noqa: E402
import torch  # noqa: E402
from _mmcv_ref import call, compares, fp16_utils, shapes  # noqa: E402
from _same import difference  # noqa: E402
from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402
from torch import nn  # noqa: E402

import fp16utils  # noqa: E402

F32, F16, BF16 = torch.float32, torch.float16, torch.bfloat16
MODULE = nn.Linear(1, 1)
SENTINEL = object()


def ours(*args):
    return call(fp16utils.cast_tensor_type, *args)


def theirs(*args):
    return call(fp16_utils().cast_tensor_type, *args)


def _mixed():
    """Fresh leaves of every dtype the pairs below pick, and non-tensors."""
    return [torch.tensor([1.5, -2.0]), torch.tensor([0.25], dtype=F16),
            torch.tensor([3.0], dtype=BF16), torch.arange(3), torch.tensor([True]),
            'text', 7, None]


class DictSub(dict):
    pass


class ListSub(list):
    pass


#: input kind -> a function making a fresh input of that kind.
KINDS = {
    'tensor float32': lambda: torch.tensor([1.5, -2.0]),
    'tensor float16': lambda: torch.tensor([0.25], dtype=F16),
    'tensor bfloat16': lambda: torch.tensor([3.0], dtype=BF16),
    'tensor int64': lambda: torch.arange(3),
    'tensor bool': lambda: torch.tensor([True, False]),
    'tensor 0-dim float32 requiring grad': lambda: torch.tensor(2.0, requires_grad=True),
    'Parameter': lambda: nn.Parameter(torch.ones(2)),
    'ndarray': lambda: np.ones(2, np.float32),
    'str': lambda: 'tensor',
    'bytes': lambda: b'ab',
    'int': lambda: 5,
    'float': lambda: 0.5,
    'bool': lambda: True,
    'complex': lambda: 1j,
    'None': lambda: None,
    'object': lambda: SENTINEL,
    'nn.Module': lambda: MODULE,
    'numpy scalar': lambda: np.float32(2.0),
    'list': _mixed,
    'tuple': lambda: tuple(_mixed()),
    'dict': lambda: {f'k{i}': v for i, v in enumerate(_mixed())},
    'OrderedDict': lambda: collections.OrderedDict((f'k{i}', v) for i, v in enumerate(_mixed())),
    'dict subclass': lambda: DictSub(a=torch.ones(1), b=[torch.ones(1, dtype=F16)]),
    'list subclass': lambda: ListSub(_mixed()),
    'set': lambda: set(_mixed()),
    'frozenset': lambda: frozenset(_mixed()),
    'deque (no maxlen)': lambda: collections.deque(_mixed()),
    'torch.Size': lambda: torch.Size([2, 3]),
    'empty list': lambda: [],
    'empty dict': lambda: {},
    'nested': lambda: {'a': [(torch.ones(2), {'b': torch.ones(1, dtype=F16)})],
                       'c': ({torch.arange(2)},), 'd': 'x'},
}

#: (label, src_type, dst_type).
PAIRS = [
    ('float32 -> float16', F32, F16),
    ('float32 -> bfloat16', F32, BF16),
    ('float16 -> float32', F16, F32),
    ('bfloat16 -> float32', BF16, F32),
    ('float32 -> int32', F32, torch.int32),
    ('float32 -> float64', F32, torch.float64),
    ('int64 -> float32', torch.int64, F32),
    ('float32 -> float32', F32, F32),
    ('None -> float16', None, F16),
    ('float32 -> None', F32, None),
    ('None -> None', None, None),
    ('str -> str', str, str),
    ('np.ndarray -> np.ndarray', np.ndarray, np.ndarray),
    ("'float32' -> float16", 'float32', F16),
    ('np.float32 -> float16', np.float32, F16),
    ('float32 -> float (Python type)', F32, float),
    ('float32 -> int (Python type)', F32, int),
    ("float32 -> 'cpu'", F32, 'cpu'),
    ('float32 -> torch.device', F32, torch.device('cpu')),
    ('float32 -> a float16 tensor', F32, torch.zeros(1, dtype=F16)),
    ("float32 -> 'float16' (refused)", F32, 'float16'),
    ('float32 -> str (refused)', F32, str),
    ('float32 -> np.ndarray (refused)', F32, np.ndarray),
]

shapes('cast_tensor_type', [f'{kind}; {pair[0]}' for kind in KINDS for pair in PAIRS])


def compare(inputs_a, inputs_b, src, dst):
    """Both give the same result, or both raise; the inputs are left as they were."""
    expected, got = theirs(inputs_a, src, dst), ours(inputs_b, src, dst)
    if expected[0] == 'raises':
        assert got[0] == 'raises', f'mmcv raises {expected[1]!r}; fp16utils returns {got[1]!r}'
        return
    assert got[0] == 'ok', f'mmcv returns {expected[1]!r}; fp16utils raises {got[1]!r}'
    found = difference(expected[1], got[1])
    assert found is None, found
    assert difference(inputs_a, inputs_b) is None  # neither touched its input


@pytest.mark.parametrize('pair', PAIRS, ids=[p[0] for p in PAIRS])
def test_every_input_kind_casts_as_in_mmcv(pair):
    _, src, dst = pair
    for kind, make in KINDS.items():
        torch.manual_seed(0)
        try:
            compare(make(), make(), src, dst)
        except AssertionError as err:
            raise AssertionError(f'{kind}: {err}') from None


def test_refused_destinations_raise_in_both_only_when_a_tensor_matches():
    for _, src, dst in PAIRS[-3:]:
        assert theirs([torch.ones(1)], src, dst)[0] == 'raises'
        assert ours([torch.ones(1)], src, dst)[0] == 'raises'
        inp = ['x', torch.arange(2)]
        assert theirs(inp, src, dst) == ('ok', inp)
        assert ours(inp, src, dst) == ('ok', inp)


# -- random nestings ---------------------------------------------------------------------

_LEAVES = st.one_of(
    st.sampled_from([F32, F16, BF16, torch.int64]).flatmap(
        lambda dtype: st.lists(st.floats(-1e3, 1e3, width=16), min_size=0, max_size=3).map(
            lambda values: torch.tensor(values, dtype=dtype))),
    st.sampled_from(['s', b'b', 3, 0.5, None, True, SENTINEL, MODULE]),
    st.builds(lambda n: np.arange(n, dtype=np.float32), st.integers(0, 3)),
)


def _hashable(value) -> bool:
    """Whether ``value`` hashes (a tuple holding a numpy array does not)."""
    try:
        hash(value)
    except TypeError:
        return False
    return True


def _containers(children):
    keys = st.text('abcdef', min_size=1, max_size=3)
    hashable = st.lists(children.filter(_hashable), max_size=3)
    return st.one_of(
        st.lists(children, max_size=4),
        st.lists(children, max_size=4).map(tuple),
        st.dictionaries(keys, children, max_size=4),
        st.dictionaries(keys, children, max_size=4).map(collections.OrderedDict),
        st.lists(children, max_size=4).map(collections.deque),
        hashable.map(frozenset),
        hashable.map(set),
    )


NESTED = st.recursive(_LEAVES, _containers, max_leaves=12)
PROPERTY = settings(max_examples=120, deadline=None, derandomize=True,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])


def _copy(obj):
    """The same structure, with fresh tensors (mmcv and fp16utils each get their own)."""
    if isinstance(obj, torch.Tensor):
        return obj.clone()
    if isinstance(obj, (list, tuple, set, frozenset, collections.deque)):
        return type(obj)(_copy(v) for v in obj)
    if isinstance(obj, dict):
        return type(obj)((k, _copy(v)) for k, v in obj.items())
    return obj


@PROPERTY
@given(NESTED, st.sampled_from(PAIRS))
def test_random_nestings_cast_as_in_mmcv(inputs, pair):
    _, src, dst = pair
    compare(inputs, _copy(inputs), src, dst)


# -- the differences docs/reference/differences-mmcv.md lists -----------------------------


@compares('cast_tensor_type', ['difference: nothing to cast'])
def test_difference_nothing_to_cast_gives_the_same_object_where_mmcv_builds_a_copy():
    inp = {'ids': torch.arange(2), 'names': ['a'], 'n': 3}
    mine, reference = ours(inp, F32, F16)[1], theirs(inp, F32, F16)[1]
    assert mine is inp
    assert reference is not inp and reference['names'] is not inp['names']
    assert difference(mine, reference) is None


Pair = collections.namedtuple('Pair', 'a b')
One = collections.namedtuple('One', 'a')


def _checked_namedtuple_results():
    """mmcv cannot rebuild a namedtuple: a TypeError, or (one field) a generator inside."""
    pair = Pair(torch.ones(1), 'x')
    status, err = theirs(pair, F32, F16)
    assert status == 'raises' and isinstance(err, TypeError)
    mine = ours(pair, F32, F16)[1]
    assert type(mine) is Pair and mine.a.dtype == F16 and mine.b == 'x'
    status, wrong = theirs(One(torch.ones(1)), F32, F16)
    assert status == 'ok' and type(wrong.a).__name__ == 'generator'
    assert ours(One(torch.ones(1)), F32, F16)[1].a.dtype == F16


@compares('cast_tensor_type', ['difference: namedtuple', 'difference: one-field namedtuple',
                               'difference: defaultdict', 'difference: range',
                               'difference: iterator', 'difference: generator',
                               'difference: memoryview', 'difference: dict view',
                               'difference: namedtuple, no dtype'])
def test_difference_containers_mmcv_cannot_rebuild():
    _checked_namedtuple_results()
    factory = collections.defaultdict(list, x=torch.ones(1))
    assert isinstance(theirs(factory, F32, F16)[1], TypeError)
    mine = ours(factory, F32, F16)[1]
    assert type(mine) is collections.defaultdict and mine.default_factory is list
    assert mine['x'].dtype == F16
    gen = (t for t in [torch.ones(1)])
    as_is = [range(3), iter([torch.ones(1)]), gen, memoryview(b'ab'), {'a': 1}.values()]
    for inp in as_is:
        assert isinstance(theirs(inp, F32, F16)[1], TypeError), inp
        assert ours(inp, F32, F16)[1] is inp
    assert next(gen).dtype == F32  # not consumed
    for src in (None, F32):  # mmcv recurses whatever the dtypes are
        assert isinstance(theirs(Pair(1, 2), src, None)[1], TypeError)
        assert ours(Pair(1, 2), src, None)[1] == Pair(1, 2)


@compares('cast_tensor_type', ['difference: deque with maxlen'])
def test_difference_deque_keeps_its_maxlen():
    inp = collections.deque([torch.ones(1)], maxlen=2)
    assert theirs(inp, F32, F16)[1].maxlen is None
    mine = ours(inp, F32, F16)[1]
    assert mine.maxlen == 2 and mine[0].dtype == F16


class TwoArgs(list):
    """A list whose constructor cannot take the list of its items."""

    def __init__(self, a, b):
        super().__init__([a, b])


class Bag:
    """An iterable that is no sequence, set or mapping, built from an iterable."""

    def __init__(self, items=()):
        self.items = list(items)

    def __iter__(self):
        return iter(self.items)


@compares('cast_tensor_type', ['container refusing its items'])
def test_a_container_that_cannot_be_rebuilt_is_a_type_error_in_both():
    inp = TwoArgs(torch.ones(1), 2)
    assert isinstance(theirs(inp, F32, F16)[1], TypeError)
    with pytest.raises(TypeError, match='cannot rebuild a .*TwoArgs'):
        fp16utils.cast_tensor_type(inp, F32, F16)
    assert inp[0].dtype == F32


@compares('cast_tensor_type', ['difference: custom iterable'])
def test_difference_an_iterable_that_is_no_sequence_set_or_mapping_is_returned_as_is():
    inp = Bag([torch.ones(1)])
    rebuilt = theirs(inp, F32, F16)[1]
    assert type(rebuilt) is Bag and rebuilt is not inp and rebuilt.items[0].dtype == F16
    mine = ours(inp, F32, F16)[1]
    assert mine is inp and inp.items[0].dtype == F32


@compares('cast_tensor_type', ['difference: cycle', 'difference: cycle, nothing to cast',
                               'difference: deeper than MAX_DEPTH'])
def test_difference_cycles_and_depth():
    loop = [torch.ones(1)]
    loop.append(loop)
    assert isinstance(theirs(loop, F32, F16)[1], RecursionError)
    assert 'contains itself' in str(ours(loop, F32, F16)[1])
    quiet = [torch.arange(1)]
    quiet.append(quiet)
    assert ours(quiet, F32, F16)[1] is quiet
    deep = torch.ones(1)
    for _ in range(fp16utils.cast.MAX_DEPTH + 20):
        deep = [deep]
    status, out = theirs(deep, F32, F16)
    assert status == 'ok'  # mmcv recurses as deep as Python lets it
    for _ in range(fp16utils.cast.MAX_DEPTH + 20):
        out = out[0]
    assert out.dtype == F16
    status, err = ours(deep, F32, F16)
    assert status == 'raises' and isinstance(err, ValueError) and 'nested more than' in str(err)


@compares('cast_tensor_type', ['difference: dtype name as dst'])
def test_difference_refused_destination_is_always_a_type_error():
    with warnings.catch_warnings():
        warnings.simplefilter('ignore')
        err = theirs([torch.ones(1)], F32, 'float16')[1]
    assert type(err) is RuntimeError and 'Invalid device string' in str(err)
    err = ours([torch.ones(1)], F32, 'float16')[1]
    assert type(err) is TypeError and "not the string 'float16'" in str(err)
