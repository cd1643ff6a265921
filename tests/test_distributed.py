"""Mixed precision under torch.distributed: two real processes on localhost (gloo, CPU).

Both ranks run every scenario of a group of ``_dist_worker.DIST_GROUPS`` in one
launch (starting a worker, which imports torch and DDP's dependencies, costs more
than all the training here) and write their results to a file; the tests below
compare the ranks in this process. The workers get a bounded time, after which
they are killed and the test fails with their output.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import _dist_worker as W  # tests/ is on sys.path: see conftest.py
import pytest
import torch
import torch.distributed as dist

from fp16utils import AmpOptimWrapper, Fp16OptimizerHook

R = W.R

pytestmark = [pytest.mark.multiprocess, pytest.mark.usefixtures('one_thread')]

WORLD_SIZE = 2
#: Seconds both workers get to start, train every scenario and exit: an upper bound that
#: only a hang reaches. A launch takes seconds alone and several times that on a loaded
#: machine (47 s for test_ranks' 'raises' group beside 8 CPU-bound processes on 2 cores,
#: where it had 90 s). Longer than the workers' own timeout for waiting on each other
#: (W.PG_TIMEOUT_S), so that a stuck rank reports itself before it is killed.
TIMEOUT_S = 2 * W.PG_TIMEOUT_S
#: Seconds the other workers get to exit by themselves once one has failed.
FAILED_GRACE_S = 30
FAULT = W.DIST_FAULT_ITER




def _tail(path, limit=4000):
    try:
        return Path(path).read_text(errors='replace')[-limit:]
    except OSError:
        return '<no output>'


def launch_workers(tmp_dir, group='main', world_size=WORLD_SIZE, timeout=TIMEOUT_S,
                   script=None):
    """Start ``world_size`` workers on a scenario group, wait (bounded), return their results.

    ``script``: a worker script that adds its own groups (default: ``_dist_worker.py``).

    Skips when torch.distributed / gloo is missing or processes cannot be
    started; fails (after killing every straggler) on a timeout or an error.
    """
    if not dist.is_available():
        pytest.skip('torch.distributed is not available in this torch build')
    if not dist.is_gloo_available():
        pytest.skip('the gloo backend of torch.distributed is not available')
    env = dict(os.environ)
    env.update(OMP_NUM_THREADS='1', MKL_NUM_THREADS='1')
    if sys.platform.startswith('linux'):
        env.setdefault('GLOO_SOCKET_IFNAME', 'lo')  # no network needed, nor a resolvable name
    env.pop('FP16UTILS_BACKEND', None)
    init_file = tmp_dir / 'pg_init'
    procs, logs = [], []
    try:
        for rank in range(world_size):
            log = tmp_dir / f'rank{rank}.log'
            logs.append(log)
            with open(log, 'wb') as out:
                procs.append(subprocess.Popen(
                    [sys.executable, str(Path(script or W.__file__)), 'dist', str(rank),
                     str(world_size), str(init_file), str(tmp_dir), group],
                    stdout=out, stderr=subprocess.STDOUT, env=env))
    except OSError as err:
        for p in procs:
            p.kill()
        pytest.skip(f'cannot start worker processes here: {err}')
    deadline = time.monotonic() + timeout
    failed_at = None  # when a rank first exited with an error
    while None in [p.poll() for p in procs]:  # every one polled: a list, not any()
        now = time.monotonic()
        if failed_at is None and any(p.returncode for p in procs):
            failed_at = now
        # A rank that failed leaves the others waiting for it (up to W.PG_TIMEOUT_S): they
        # get FAILED_GRACE_S to notice and report it, then are killed.
        if now > deadline or (failed_at is not None and now > failed_at + FAILED_GRACE_S):
            for p in procs:
                if p.poll() is None:
                    p.kill()
                p.wait()
            if now > deadline:
                pytest.fail(f'distributed workers did not finish within {timeout}s and were '
                            'killed; ' + ' | '.join(f'rank {r}: {_tail(log)}'
                                                    for r, log in enumerate(logs)))
            break
        time.sleep(0.05)
    codes = [p.returncode for p in procs]
    if W.EXIT_NO_GLOO in codes:
        pytest.skip('a gloo process group could not be started on localhost: '
                    + _tail(logs[codes.index(W.EXIT_NO_GLOO)], 500))
    if any(code < 0 for code in codes) and all(code <= 0 for code in codes) and all(
            (tmp_dir / f'rank{rank}.pt').exists() for rank in range(world_size)):
        # A worker killed by a signal after it wrote its complete results (the file is
        # renamed into place) died tearing down torch's background threads, after the
        # last collective: the results stand, unless a scenario reported an error.
        results = [torch.load(tmp_dir / f'rank{rank}.pt') for rank in range(world_size)]
        if not any('error' in r for r in results):
            return results
    if any(codes):
        pytest.fail(f'distributed workers exited with {codes}: '
                    + ' | '.join(f'rank {r}: {_tail(log)}' for r, log in enumerate(logs)))
    return [torch.load(tmp_dir / f'rank{rank}.pt') for rank in range(world_size)]


@pytest.fixture(scope='module')
def ranks(tmp_path_factory):
    """Results of every scenario on every rank: ``ranks[rank][scenario]``."""
    return launch_workers(tmp_path_factory.mktemp('dist'))


def both(ranks, name):
    results = [results[name] for results in ranks]
    if 'skip' in results[0]:  # the workers found that this CPU cannot run the scenario
        pytest.skip(results[0]['skip'])
    return results


def _params(state):
    """The float32 parameters being trained (the masters on the legacy backend)."""
    return {k: v for k, v in state.items() if k.startswith('opt.') and k.count('.') == 2}


# ------------------------------------------------------------------ overflow on one rank


@pytest.mark.parametrize('inject', ['input', 'grad'])
@pytest.mark.parametrize('backend', ['native', 'legacy'])
@pytest.mark.parametrize('style', ['wrapper', 'hook'])
def test_an_overflow_on_one_rank_is_skipped_on_every_rank(ranks, style, backend, inject):
    r0, r1 = both(ranks, f'overflow-{style}-{backend}-{inject}')
    # The hook found its backend by itself (FP16UTILS_BACKEND=legacy, or the default).
    assert r0['backend'] == r1['backend'] == backend
    # Only one rank saw the inf locally ...
    assert [r0['local_fault'], r1['local_fault']].count(True) == 1
    # ... yet both skipped that one step, and backed off the same way.
    expected_skips = [0] * FAULT + [1] * (W.DIST_STEPS - FAULT)
    assert r0['skipped'] == r1['skipped'] == expected_skips
    expected_scales = [1024.0] * FAULT + [512.0] * (W.DIST_STEPS - FAULT)
    assert r0['scales'] == r1['scales'] == expected_scales
    assert r0['scale_history'] == r1['scale_history'] == [(0, 1024.0), (FAULT + 1, 512.0)]
    for r in (r0, r1):  # the skipped step changed nothing, on either rank
        R.assert_identical(r['before_fault'], r['after_fault'])
        state = {k.rsplit('.', 1)[1] for k in r['after_fault'] if k.count('.') == 3}
        assert state == {'step', 'exp_avg', 'exp_avg_sq'}  # Adam's state was compared too
    # Every rank ends with bit-identical weights, masters and optimizer state.
    R.assert_identical(r0['final'], r1['final'])
    assert not torch.equal(r0['final']['model.fc1.weight'], r0['after_fault']['model.fc1.weight'])
    assert all(torch.isfinite(v.float()).all() for v in r0['final'].values())


# ------------------------------------------------------- legacy hook: its own all-reduce


def _reference_allreduce(coalesce, bucket_size_mb):
    """One process, one model, the concatenation of both ranks' batches per step."""
    per_rank = [W.allreduce_data(rank) for rank in range(WORLD_SIZE)]
    data = [(torch.cat([d[i][0] for d in per_rank]), torch.cat([d[i][1] for d in per_rank]))
            for i in range(W.DIST_STEPS)]
    model = R.Net(seed=0)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    hook = Fp16OptimizerHook(loss_scale=dict(W.HOOK_SCALE), coalesce=coalesce,
                             bucket_size_mb=bucket_size_mb, distributed=False,
                             backend='legacy')  # float16: the scenario ran only where it can
    runner = R.MiniRunner(model, optimizer, [hook], max_iters=W.DIST_STEPS, meta={})
    runner.run(data, R.mse)
    return hook, R.snapshot(model, optimizer)


#: (coalesce, bucket_size_mb) -> numel of each all_reduce per step. Net's float32
#: masters are 128 + 16 + 64 + 4 numbers (512, 64, 256, 16 bytes); 0.0006 MiB is 629
#: bytes, so the buckets are [fc1.weight, fc1.bias] and [fc2.weight, fc2.bias]. The 4
#: per-parameter "has a gradient" flags ride in the first bucket (coalesced) or go in
#: one more all_reduce of their own (not coalesced).
EXPECTED_BUCKETS = {(True, -1): [216], (True, 0.0006): [148, 68],
                    (False, -1): [128, 16, 64, 4, 4]}


@pytest.mark.parametrize('coalesce, bucket_size_mb', W.ALLREDUCE_SETTINGS)
def test_legacy_hook_averages_master_grads_across_processes(ranks, coalesce, bucket_size_mb):
    r0, r1 = both(ranks, f'allreduce-{coalesce}-{bucket_size_mb}')
    assert r0['backend'] == r1['backend'] == 'legacy'  # chosen as on torch 1.5
    # Rank 1 overflowed at one step; both ranks skipped it.
    expected_skips = [0] * FAULT + [1] * (W.DIST_STEPS - FAULT)
    assert r0['skipped'] == r1['skipped'] == expected_skips
    assert r0['scales'] == r1['scales'] == [(0, 1024.0), (FAULT + 1, 512.0)]
    # Gradients went through the configured buckets; the agreement on the overflow takes
    # at most one more (scalar) collective. Today it takes none: an inf in any rank's
    # gradients survives the sum. The skipped step communicates exactly what the others do.
    buckets = [('all_reduce', n) for n in EXPECTED_BUCKETS[(coalesce, bucket_size_mb)]]
    for r in (r0, r1):
        per_step = [[(name, n) for i, name, n in r['collectives'] if i == it]
                    for it in range(W.DIST_STEPS)]
        assert all(calls == per_step[0] for calls in per_step), per_step
        assert [c for c in per_step[0] if c[1] > 1] == buckets, per_step[0]
        assert len([c for c in per_step[0] if c[1] <= 1]) <= 1, per_step[0]
    assert r0['collectives'] == r1['collectives']
    # Ranks identical, bit for bit, and equal to one process on the whole batch.
    R.assert_identical(r0['final'], r1['final'])
    ref_hook, ref = _reference_allreduce(coalesce, bucket_size_mb)
    assert ref_hook.skipped_steps == 1
    got = _params(r0['final'])
    assert got.keys() == _params(ref).keys() and len(got) == 4
    for key, value in got.items():
        assert value.dtype == torch.float32
        torch.testing.assert_close(value, ref[key], rtol=0, atol=2e-3, msg=key)
    start = [p.detach() for p in R.Net(seed=0).parameters()]
    assert all(not torch.allclose(a, b) for a, b in zip(got.values(), start))  # it trained


# ---------------------------------------------------------------- no_sync while accumulating


def _reference_no_sync(backend):
    """One process: each update sees both ranks' batches of the window at once."""
    per_rank = [W.no_sync_data(rank) for rank in range(WORLD_SIZE)]
    model = R.Net(seed=0)
    wrapper = AmpOptimWrapper(torch.optim.SGD(model.parameters(), lr=0.1), loss_scale=512.0,
                              backend=backend, model=model, dtype=W.no_sync_dtype(backend))
    for start in range(0, W.NO_SYNC_STEPS, 2):
        window = [d[i] for d in per_rank for i in (start, start + 1)]
        x, y = torch.cat([b[0] for b in window]), torch.cat([b[1] for b in window])
        with wrapper.optim_context(model):
            out = model(x)
        wrapper.update_params((out.float() - y).pow(2).mean())
    return R.snapshot(model, wrapper.optimizer)


@pytest.mark.parametrize('backend', ['native', 'legacy'])
def test_optim_context_skips_ddp_sync_while_accumulating(ranks, backend):
    acc0, acc1 = both(ranks, f'nosync-{backend}-accumulate')
    every0, every1 = both(ranks, f'nosync-{backend}-every')
    # no_sync was entered for the accumulation passes (iterations 0 and 2) only ...
    assert acc0['no_sync'] == acc1['no_sync'] == [1, 1, 2, 2]
    assert every0['no_sync'] == every1['no_sync'] == [0, 0, 0, 0]
    # ... and DDP really did not all-reduce then: no bucket went out, and the pending
    # gradients of the first pass are still each rank's own.
    for r in (acc0, acc1):
        assert r['comm'][0] == r['comm'][2] == 0 and r['comm'][1] > 0 and r['comm'][3] > 0
    assert all(c > 0 for c in every0['comm'])
    assert not torch.equal(acc0['pending_grad'], acc1['pending_grad'])
    assert torch.equal(every0['pending_grad'], every1['pending_grad'])
    for r in (acc0, acc1, every0, every1):
        assert r['skipped'] == 0
    # Bit-identical ranks; the same result as syncing every pass, and as one process
    # training on the whole data (up to float16 rounding).
    R.assert_identical(acc0['final'], acc1['final'])
    R.assert_identical(every0['final'], every1['final'])
    ref = _reference_no_sync(backend)
    got, every = _params(acc0['final']), _params(every0['final'])
    assert len(got) == 4
    low = W.no_sync_dtype(backend) == torch.bfloat16  # 8 bits of mantissa, not 11
    for key, value in got.items():
        torch.testing.assert_close(value, every[key], rtol=0, atol=1e-2 if low else 1e-3,
                                   msg=key)
        torch.testing.assert_close(value, ref[key], rtol=0, atol=2e-2 if low else 2e-3,
                                   msg=key)


def test_legacy_hook_reduces_a_gradient_only_some_ranks_have(tmp_path):
    r0, r1 = (r['unused-param'] for r in launch_workers(tmp_path, 'unused-param'))
    assert r0['skipped'] == r1['skipped'] == 0
    R.assert_identical(r0['final'], r1['final'])


def test_use_fsdp_makes_the_ranks_agree_on_a_skip(ranks):
    """Sharded gradients: an inf on rank 1 only is skipped by both ranks with use_fsdp
    (and by rank 1 alone when the ranks opt out with agree_across_ranks=False)."""
    if 'skip' in ranks[0]['sharded-True']:
        pytest.skip(ranks[0]['sharded-True']['skip'])
    assert [r['sharded-True']['skipped'] for r in ranks] == [1, 1]
    assert [r['sharded-False']['skipped'] for r in ranks] == [0, 1]


def test_at_min_scale_raise_is_agreed_across_ranks(ranks):
    """An overflow on rank 1 only, with the scale at its floor: every rank raises at the
    same step, with the same scale and skipped steps, and neither applied that step."""
    if 'skip' in ranks[0]['floor-raise']:
        pytest.skip(ranks[0]['floor-raise']['skip'])
    r0, r1 = (r['floor-raise'] for r in ranks)
    assert r0['raised'] == r1['raised'] == (2, 'step 3')
    assert r0['scale'] == r1['scale'] == 2.0 and r0['skipped'] == r1['skipped'] == 1
    assert r0['unchanged'] and r1['unchanged']
