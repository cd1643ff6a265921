"""Save at any step, load in a fresh process, continue: bit-identical to never stopping.

This process trains each setup without interruption and, for every save point,
trains a copy up to it and writes a checkpoint with ``torch.save``: the model's
``state_dict`` and the scaler state (``wrapper.state_dict()`` for the 1.x
wrapper; an mmcv checkpoint with ``runner.meta`` for the 0.x hook). One fresh
Python process (``_dist_worker.py resume``) then builds every setup anew from a
different random initialisation, loads each checkpoint, trains to the end and
writes the result, which the tests compare with the uninterrupted run.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import _dist_worker as W
import pytest
import torch
from _roundtrip import torch_save_roundtrip

R = W.R

STYLES = ['wrapper', 'hook']
BACKENDS = ['native', 'legacy']
STEPS = W.RESUME_STEPS
#: The iteration right after the skipped one (data[RESUME_FAULT] overflows).
AFTER_SKIP = W.RESUME_FAULT + 1
#: Without accumulation: every save point. With accumulative_counts=2: 4 ends a
#: window; 3 (its pending gradients hold the overflow) and 5 are in the middle of one.
SINGLE_POINTS = list(range(1, STEPS))
ALIGNED, MID_WINDOW = [4], [3, 5]
TIMEOUT_S = 120
#: Why the CPU cannot train float16 (loss scaling, an overflowing batch) per backend.
LACKS = {b: _caps.cpu_lacks(torch.float16, 'native' if b == 'native' else None)
         for b in BACKENDS}


def float16(backend):
    """Skip unless the CPU trains float16 with ``backend`` here."""
    if LACKS[backend] is not None:
        pytest.skip(LACKS[backend])


pytestmark = pytest.mark.usefixtures('one_thread')


def _key(style, backend, accumulate, save_at, restore_grads=False):
    return f'{style}-{backend}-acc{accumulate}-at{save_at}-grads{int(restore_grads)}'


def _jobs():
    for style in STYLES:
        for backend in (b for b in BACKENDS if LACKS[b] is None):
            for save_at in SINGLE_POINTS:
                yield style, backend, 1, save_at, False
            for save_at in ALIGNED:
                yield style, backend, 2, save_at, False
            for save_at in MID_WINDOW:
                yield style, backend, 2, save_at, False
                yield style, backend, 2, save_at, True


@pytest.fixture(scope='module')
def resumed(tmp_path_factory):
    """``(uninterrupted, resumed)``: results keyed by setup and by job."""
    if all(LACKS.values()):
        pytest.skip(LACKS['legacy'])
    tmp = tmp_path_factory.mktemp('resume')
    data = W.resume_data()
    quiet = logging.root.manager.disable
    logging.disable(logging.WARNING)  # the skip and resume warnings are tested elsewhere
    try:
        full, jobs, saved = {}, [], {}
        for style, backend, accumulate, save_at, restore_grads in _jobs():
            setup = (style, backend, accumulate)
            if setup not in full:
                trainer = W.Trainer(style, backend, accumulate)
                updates = []
                trainer.run(data, on_update=updates.append)
                full[setup] = {**trainer.result(), 'updates': updates}
            ckpt = tmp / f'{style}-{backend}-acc{accumulate}-at{save_at}.pt'
            if ckpt not in saved:
                trainer = W.Trainer(style, backend, accumulate)
                trainer.run(data, stop=save_at)
                torch.save(trainer.checkpoint(), ckpt)
                saved[ckpt] = trainer.loss_scale
            name = _key(style, backend, accumulate, save_at, restore_grads)
            jobs.append(dict(name=name, style=style, backend=backend, accumulate=accumulate,
                             save_at=save_at, checkpoint=str(ckpt), restore_grads=restore_grads,
                             saved_scale=saved[ckpt], out=str(tmp / f'{name}.out.pt')))
    finally:
        logging.disable(quiet)
    manifest = tmp / 'manifest.json'
    manifest.write_text(json.dumps({'threads': torch.get_num_threads(), 'jobs': jobs}))
    env = dict(os.environ)
    env.pop('FP16UTILS_BACKEND', None)
    try:
        proc = subprocess.run(
            [sys.executable, str(Path(W.__file__)), 'resume', str(manifest)],
            capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
    except subprocess.TimeoutExpired as err:  # run() has killed the child
        pytest.fail(f'the resuming process did not finish within {TIMEOUT_S}s and was '
                    f'killed: {(err.stderr or "")[-3000:]}')
    except OSError as err:
        pytest.skip(f'cannot start a fresh Python process here: {err}')
    if proc.returncode:
        pytest.fail(f'the resuming process exited with {proc.returncode}: '
                    f'{proc.stderr[-3000:]}')
    results = {job['name']: {**torch.load(job['out']), 'job': job} for job in jobs}
    return full, results


def check_identical(full, result):
    save_at = result['job']['save_at']
    float16(result['job']['backend'])
    # The optimizer stepped at the same iterations after the save point ...
    assert result['updates'] == [i for i in full['updates'] if i > save_at]
    # ... and everything ends bit-identical: weights, masters, optimizer and scaler state.
    R.assert_identical(full['final'], result['final'])
    assert result['scaler'] == full['scaler']
    assert result['loss_scale'] == full['loss_scale']
    assert result['iter'] == full['iter'] == STEPS


@pytest.mark.parametrize('save_at', SINGLE_POINTS)
@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_resume_at_any_step_in_a_fresh_process_is_bit_identical(resumed, style, backend,
                                                                 save_at):
    float16(backend)
    full, results = resumed
    result = results[_key(style, backend, 1, save_at)]
    assert result['resumed_scale'] == result['job']['saved_scale']
    check_identical(full[(style, backend, 1)], result)


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_the_uninterrupted_run_skips_and_grows(resumed, style, backend):
    """What the save points cover: a skipped step at iteration 3, growth every 2 clean ones."""
    float16(backend)
    full, results = resumed
    scales = [results[_key(style, backend, 1, s)]['job']['saved_scale'] for s in SINGLE_POINTS]
    # 512 grows at the 2nd clean step, halves at the overflow (3rd), grows every 2 after.
    assert scales == [512.0, 1024.0, 512.0, 512.0, 1024.0, 1024.0, 2048.0]
    assert full[(style, backend, 1)]['loss_scale'] == 2048.0
    after_skip = results[_key(style, backend, 1, AFTER_SKIP)]
    assert after_skip['resumed_scale'] == 512.0


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_resume_at_the_end_of_an_accumulation_window_is_bit_identical(resumed, style,
                                                                      backend):
    full, results = resumed
    for save_at in ALIGNED:
        check_identical(full[(style, backend, 2)], results[_key(style, backend, 2, save_at)])


@pytest.mark.parametrize('save_at', MID_WINDOW)
@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_resume_mid_window_restores_the_count_and_the_schedule(resumed, style, backend,
                                                               save_at):
    """MMEngine semantics: the runner's iteration restores the wrapper's inner_count.

    ``inner_count`` is not in ``AmpOptimWrapper.state_dict()``; the runner passes
    its iteration to ``initialize_count_status(model, iter, max_iters)``, which
    sets it (and warns when it is not a multiple of accumulative_counts). The
    updates then happen at the same iterations as without the interruption, and
    with the pending gradients carried over by hand the result is bit-identical.
    """
    float16(backend)
    full, results = resumed
    result = results[_key(style, backend, 2, save_at, restore_grads=True)]
    check_identical(full[(style, backend, 2)], result)
    if style == 'wrapper':
        assert result['inner_count'] == full[(style, backend, 2)]['inner_count'] == STEPS


#: The dtype of the resume tests that are not about loss scaling.
NATIVE = _caps.NATIVE_DTYPES[0] if _caps.NATIVE_DTYPES else None


def test_resume_mid_window_without_the_saved_window_warns_that_gradients_are_lost(caplog):
    """A state without 'pending_window': the warning, then the same update schedule."""
    data = W.resume_data()
    trainer = W.Trainer('wrapper', 'native', accumulate=2, dtype=NATIVE)
    trainer.run(data, stop=5)
    ckpt = trainer.checkpoint()
    assert ckpt['optim']['pending_window']['iter'] == 5
    del ckpt['optim']['pending_window']  # as an MMEngine-style state would be
    fresh = W.Trainer('wrapper', 'native', accumulate=2, seed=5, dtype=NATIVE)
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        fresh.resume(ckpt)
    assert 'Resumed iteration number 5 is not a multiple of accumulative_counts=2' in (
        caplog.text)
    assert fresh.wrapper.inner_count == 5
    assert fresh.wrapper.should_sync()  # the next backward completes the window (DDP sync)
    updates = []
    fresh.run(data, on_update=updates.append)
    assert updates == [6, 8] and fresh.wrapper.inner_count == STEPS


def test_resume_mid_window_with_the_saved_window_does_not_warn(caplog):
    data = W.resume_data()
    trainer = W.Trainer('wrapper', 'native', accumulate=2, dtype=NATIVE)
    trainer.run(data, stop=5)
    fresh = W.Trainer('wrapper', 'native', accumulate=2, seed=5, dtype=NATIVE)
    with caplog.at_level(logging.WARNING, logger='fp16utils'):
        fresh.resume(trainer.checkpoint())
    assert 'Resumed iteration number' not in caplog.text
    assert fresh.wrapper.inner_count == 5
    saved = trainer.checkpoint()['optim']['pending_window']['grads']
    for p, g in zip(fresh.wrapper.optimizer.param_groups[0]['params'], saved):
        assert torch.equal(p.grad, g)


def test_aligned_checkpoint_has_no_pending_window():
    trainer = W.Trainer('wrapper', 'native', accumulate=2, dtype=NATIVE)
    trainer.run(W.resume_data(), stop=4)
    assert 'pending_window' not in trainer.checkpoint()['optim']


@pytest.mark.parametrize('save_at', MID_WINDOW)
@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_resume_mid_window_from_the_saved_state_alone_is_bit_identical(resumed, style,
                                                                        backend, save_at):
    full, results = resumed
    check_identical(full[(style, backend, 2)], results[_key(style, backend, 2, save_at)])


@pytest.mark.parametrize('backend', BACKENDS)
@pytest.mark.parametrize('style', STYLES)
def test_skip_count_and_scale_history_carry_on_after_a_resume(style, backend):
    float16(backend)
    trainer = W.Trainer(style, backend, 1)
    trainer.run(W.resume_data(), stop=AFTER_SKIP + 1)
    owner = trainer.wrapper if style == 'wrapper' else trainer.hook
    assert owner.skipped_steps == 1
    history = list(owner.scale_history)
    assert len(history) >= 2 and history[-1][1] < history[-2][1]  # ends with the backoff
    fresh = W.Trainer(style, backend, 1, seed=5)
    fresh.resume(torch_save_roundtrip(trainer.checkpoint()))
    if style == 'hook':
        fresh.hook.before_run(fresh.runner)  # what the runner does when the run starts
    resumed = fresh.wrapper if style == 'wrapper' else fresh.hook
    assert resumed.skipped_steps == 1
    assert resumed.scale_history == history


def test_wrapper_rejects_a_pending_window_from_another_model_and_changes_nothing():
    trainer = W.Trainer('wrapper', 'native', 2, dtype=NATIVE)
    trainer.run(W.resume_data(), stop=3)
    state = trainer.wrapper.state_dict()
    state['pending_window'] = dict(state['pending_window'],
                                   grads=state['pending_window']['grads'][:-1])
    fresh = W.Trainer('wrapper', 'native', 2, seed=5, dtype=NATIVE)
    fresh.run(W.resume_data(), stop=2)
    before_opt = {k: v.clone() for s in fresh.optimizer.state.values()
                  for k, v in s.items() if torch.is_tensor(v)}
    before_scale = fresh.wrapper.loss_scale
    with pytest.raises(ValueError, match='pending gradients'):
        fresh.wrapper.load_state_dict(state)
    after_opt = {k: v for s in fresh.optimizer.state.values()
                 for k, v in s.items() if torch.is_tensor(v)}
    assert before_opt.keys() == after_opt.keys()
    assert all(torch.equal(before_opt[k], after_opt[k]) for k in before_opt)
    assert fresh.wrapper.loss_scale == before_scale
    assert fresh.wrapper.inner_count == 2


def test_hook_rejects_a_pending_window_from_another_model_before_loading_state():
    trainer = W.Trainer('hook', 'native', 2, dtype=NATIVE)
    trainer.run(W.resume_data(), stop=3)
    ckpt = trainer.checkpoint()
    meta = ckpt['meta']['fp16']
    meta['pending_window'] = dict(meta['pending_window'],
                                  grads=meta['pending_window']['grads'][:-1])
    if meta['loss_scaler']:  # empty where nothing is scaled (bfloat16)
        meta['loss_scaler'] = dict(meta['loss_scaler'], scale=4.0)
    fresh = W.Trainer('hook', 'native', 2, seed=5, dtype=NATIVE)
    fresh.resume(ckpt)
    with pytest.raises(ValueError, match='pending gradients'):
        fresh.hook.before_run(fresh.runner)
    assert fresh.hook.loss_scale != 4.0  # the saved scaler state was not applied
