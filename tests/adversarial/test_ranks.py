"""Ranks agree on every skip, whatever the entry point: 2 gloo processes on localhost.

An inf is put into rank 1's gradient *after* the reduction across ranks (a
DDP comm hook, the legacy hook's own all-reduce, or one rank's FSDP2 shard),
so rank 0 sees finite gradients: both ranks must still skip the same step,
back off the same way, and end bit-identical. The scenarios live in
``_ranks_worker.py`` (one launch per group, bounded in time).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))
import _ranks_worker as K  # noqa: E402
from test_distributed import launch_workers  # noqa: E402

R = K.R
pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures('one_thread')]

F, N = K.FAULT, K.STEPS
SCALED = [1024.0] * F + [512.0] * (N - F)


@pytest.fixture(scope='module')
def ranks(tmp_path_factory):
    return launch_workers(tmp_path_factory.mktemp('ranks'), 'ranks', script=K.__file__)


@pytest.fixture(scope='module')
def fsdp(tmp_path_factory):
    return launch_workers(tmp_path_factory.mktemp('fsdp2'), 'fsdp2', script=K.__file__)


@pytest.fixture(scope='module')
def raises(tmp_path_factory):
    return launch_workers(tmp_path_factory.mktemp('raises'), 'raises', script=K.__file__)


def both(results, name):
    pair = [r[name] for r in results]
    if 'skip' in pair[0]:
        pytest.skip(pair[0]['skip'])
    return pair


# name: (skipped per iteration, scale per iteration)
CASES = {
    'wrapper-native': ([0] * F + [1] * (N - F), SCALED),
    'wrapper-fused': ([0] * F + [1] * (N - F), SCALED),
    'wrapper-legacy': ([0] * F + [1] * (N - F), SCALED),
    'wrapper-bf16-warn': ([0] * F + [1] * (N - F), [1.0] * N),
    # rank 0's optimizer has no gradient at all: it takes part and backs off too
    'wrapper-no-grad-rank': ([0] * F + [1] * (N - F), SCALED),
    'hook-native': ([0] * F + [1] * (N - F), SCALED),
    'hook-legacy': ([0] * F + [1] * (N - F), SCALED),
    'hook-legacy-allreduce': ([0] * F + [1] * (N - F), SCALED),
    # cumulative_iters=2: the faulty gradient of iteration 2 is stepped at iteration 3
    'cumulative-native': ([0] * (F + 1) + [1] * (N - F - 1), [1024.0] * (F + 1)
                          + [512.0] * (N - F - 1)),
}


@pytest.mark.parametrize('name', sorted(CASES))
def test_a_fault_after_the_reduction_on_one_rank_is_skipped_by_both(ranks, name):
    r0, r1 = both(ranks, name)
    skipped, scales = CASES[name]
    assert r0['skipped'] == r1['skipped'] == skipped
    assert r0['scales'] == r1['scales'] == scales
    assert r0['history'] == r1['history']
    R.assert_identical(r0['final'], r1['final'])


@pytest.mark.parametrize('name', sorted(CASES))
def test_the_agreement_is_one_scalar_all_reduce_per_step(ranks, name):
    r0, r1 = both(ranks, name)
    steps = [0, 1, 0, 1, 1] if name.startswith('cumulative') else [1] * N
    assert r0['agreements'] == r1['agreements'] == steps


def test_opting_out_leaves_each_rank_to_decide_alone(ranks):
    """agree_across_ranks=False: no collective of ours; rank 0 steps where rank 1 skips."""
    r0, r1 = both(ranks, 'wrapper-optout')
    assert r0['agreements'] == r1['agreements'] == [0] * N
    assert r0['skipped'] == [0] * N
    assert r1['skipped'] == [0] * F + [1] * (N - F)
    assert not all(torch.equal(r0['final'][k], r1['final'][k]) for k in r0['final'])


@pytest.mark.parametrize('name', ['fsdp2-plain', 'fsdp2-policy'])
def test_fsdp2_shards_agree_and_resume_identically(fsdp, name):
    r0, r1 = both(fsdp, name)
    total = len(r0['skipped'])
    assert r0['skipped'] == r1['skipped'] == [0] * F + [1] * (total - F)
    assert r0['scale'] == r1['scale'] == 512.0
    R.assert_identical(r0['final'], r1['final'])
    # The resumed run (wrapper state_dict + sharded model state) continues identically.
    assert r0['resumed_skipped'] == r0['skipped'][F + 2:]
    assert r0['resumed_scale'] == r1['resumed_scale'] == 512.0
    R.assert_identical(r0['resumed'], r0['final'])
    R.assert_identical(r1['resumed'], r1['final'])


def test_the_guard_raise_is_agreed_every_rank_raises_at_the_same_step(raises):
    """Rank 1's guarded pass finds the inf; rank 0's is clean: both raise, and go on."""
    r0, r1 = both(raises, 'raise-guard')
    assert [e[:2] for e in r0['raised']] == [e[:2] for e in r1['raised']] == [
        (F + 1, 'FloatingPointError')]
    assert r0['raised'][0][2:] == (True, False)  # told that another rank found it
    assert r1['raised'][0][2:] == (False, True)  # its own report names the gradients
    assert r0['skipped'] == r1['skipped'] == [0] * F + [1] * (N - F)
    assert r0['taken'] == r1['taken'] == N - 2  # the skip and the raised step: not applied
    R.assert_identical(r0['final'], r1['final'])


def test_nonfinite_raise_is_decided_from_the_agreed_flag(raises):
    r0, r1 = both(raises, 'raise-static-raise')
    assert r0['raised'] == r1['raised'] and [e[:2] for e in r0['raised']] == [
        (F, 'FloatingPointError')]
    R.assert_identical(r0['final'], r1['final'])


def test_error_if_nonfinite_clipping_skips_an_overflow_on_every_rank(raises):
    r0, r1 = both(raises, 'raise-clip-error')
    assert r0['raised'] == r1['raised'] == []
    assert r0['skipped'] == r1['skipped'] == [0] * F + [1] * (N - F)
    R.assert_identical(r0['final'], r1['final'])


# --------------------------------------------------------------------------- one process


def test_a_setting_that_is_not_none_a_bool_or_a_group_is_refused():
    from fp16utils import AmpOptimWrapper, Fp16OptimizerHook
    model = torch.nn.Linear(2, 1)
    with pytest.raises(TypeError, match='agree_across_ranks must be None'):
        AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), agree_across_ranks='yes')
    with pytest.raises(TypeError, match='agree_across_ranks must be None'):
        Fp16OptimizerHook(agree_across_ranks=1)


def test_use_fsdp_refuses_to_opt_out_and_nothing_changes():
    from fp16utils import AmpOptimWrapper
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    groups = [dict(g) for g in optimizer.param_groups]
    with pytest.raises(ValueError, match='use_fsdp=True shards the gradients'):
        AmpOptimWrapper(optimizer, use_fsdp=True, agree_across_ranks=False)
    assert [dict(g) for g in optimizer.param_groups] == groups


def test_the_builder_passes_the_setting_and_one_process_takes_no_collective(monkeypatch):
    from fp16utils import build_optim_wrapper
    from fp16utils.engine import ranks
    model = torch.nn.Linear(2, 1)
    wrapper = build_optim_wrapper(model, dict(type='AmpOptimWrapper', dtype='bfloat16',
                                              optimizer=dict(type='SGD', lr=0.1),
                                              agree_across_ranks=False))
    assert wrapper.agree_across_ranks is False
    assert ranks.reducer(None) is None and ranks.reducer(True) is None  # not initialised
    calls = []
    monkeypatch.setattr(torch.distributed, 'all_reduce', lambda *a, **k: calls.append(a))
    with wrapper.optim_context(model):
        loss = model(torch.ones(1, 2)).sum()
    wrapper.update_params(loss * float('inf'))
    assert wrapper.skipped_steps == 1 and calls == []
