"""The promises of the "Migrating 0.x to 1.x" pages, checked on the pages' own blocks.

tests/test_docs_blocks.py runs every block; this file checks what the pages say
about them: the output shown after each command is the command's real output, the
config files shown are the sample files, and the guide of "Move the model" keeps
the loss in float32 at every step.
"""

from __future__ import annotations

import contextlib
import io
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch

from fp16utils import fix_imports, kept_fp32

ROOT = Path(__file__).resolve().parents[1]
DOCS = ROOT / 'docs' / 'migration'
SAMPLES = ROOT / 'docs' / '_samples' / 'migration'
_FENCE = re.compile(r'^```(?P<lang>\w*)\n(?P<body>.*?)^```$', re.M | re.S)


def blocks(page: Path) -> list:
    """``(lang, body)`` of every fenced block of ``page``, in page order."""
    return [(m.group('lang'), m.group('body')) for m in _FENCE.finditer(page.read_text())]


def shown_outputs(page: Path) -> list:
    """``(command, shown output)`` for each bash block that a text block follows."""
    found = blocks(page)
    return [(body.strip(), nxt[1]) for (lang, body), nxt in zip(found, found[1:])
            if lang == 'bash' and nxt[0] == 'text']


def run_shell(command: str) -> str:
    """Run a page's command from the checkout root as the docs harness does; its stdout."""
    script = 'set -e\nfp16utils() { "$PY" -m fp16utils "$@"; }\n' + command + '\n'
    env = dict(os.environ, PY=sys.executable, PYTHONPATH=os.pathsep.join(
        [str(ROOT)] + [p for p in os.environ.get('PYTHONPATH', '').split(os.pathsep) if p]))
    done = subprocess.run(['bash', '-c', script], cwd=str(ROOT), env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, f'{command}: exit {done.returncode}\n{done.stderr[-2000:]}'
    return done.stdout


def _lines(text: str) -> list:
    return [line.rstrip() for line in text.rstrip('\n').splitlines()]


PAIRS = [(page, command, shown) for page in (DOCS / 'scan-and-fix.md', DOCS / 'convert-config.md')
         for command, shown in shown_outputs(page)]


def test_the_pages_show_outputs():
    commands = [command for _, command, _ in PAIRS]
    assert len(commands) >= 5, commands
    assert any('--plugin' in c for c in commands) and any('--dry-run' in c for c in commands)


@pytest.mark.parametrize('page, command, shown', PAIRS,
                         ids=[f'{p.name}:{c[:60]}' for p, c, _ in PAIRS])
def test_the_output_shown_is_the_real_output(page, command, shown):
    assert _lines(run_shell(command)) == _lines(shown)


def test_scan_reports_every_kind_the_guide_relies_on():
    """Scan: the findings the page explains are found in the samples, with exit status 1."""
    shown = dict((c, s) for _, c, s in PAIRS)
    out = next(s for c, s in shown.items()
               if c.startswith('fp16utils scan docs/_samples/migration ||'))
    kinds = {m.group(1) for m in re.finditer(r':\d+:\d+: ([a-z0-9-]+):', out)}
    assert kinds == {'import', 'fp16-enabled', 'forward-decorator', 'decorator',
                     'config-fp16', 'config-optimizer-hook'}
    assert out.rstrip().endswith('exit status 1')


def test_dry_run_writes_nothing():
    before = (SAMPLES / 'project' / 'heads' / 'anchor_head.py').read_bytes()
    run_shell('fp16utils scan docs/_samples/migration/project --fix --dry-run')
    assert (SAMPLES / 'project' / 'heads' / 'anchor_head.py').read_bytes() == before
    assert b'from mmcv.runner import auto_fp16, force_fp32' in before


def test_the_config_files_shown_are_the_samples():
    shown = [body for lang, body in blocks(DOCS / 'convert-config.md') if lang == 'python'
             and '>>>' not in body]
    files = [SAMPLES / 'configs' / 'retinanet_fp16.py',
             SAMPLES / 'configs' / '_base_' / 'schedule_1x.py',
             SAMPLES / 'configs' / '_base_' / 'default_runtime.py']
    assert shown[:3] == [f.read_text() for f in files]


def test_dtype_is_ignored_for_a_config_already_in_fp16():
    """The page: --dtype does not apply to a wrapper already in fp16; the output is unchanged."""
    plain = run_shell('fp16utils migrate docs/_samples/migration/configs/retinanet_fp16.py')
    amp = run_shell('fp16utils migrate docs/_samples/migration/configs/retinanet_fp16.py '
                    '--amp --dtype bfloat16 2>/dev/null')
    assert amp == plain and "dtype='bfloat16'" not in amp


def test_migrate_runs_the_config_file(tmp_path):
    """The warning box: migrate executes the config (a side effect of the file happens)."""
    marker = tmp_path / 'ran'
    config = tmp_path / 'cfg.py'
    config.write_text(f'open({str(marker)!r}, "w").close()\nfp16 = dict(loss_scale=512.)\n')
    out = run_shell(f'fp16utils migrate {config}')
    assert marker.exists() and "type='AmpOptimWrapper'" in out


# ------------------------------------------------------------------ move the model


def _steps() -> list:
    page = DOCS / 'move-the-model.md'
    return [body for lang, body in blocks(page) if lang == 'python' and '>>>' not in body]


def _run_step(body: str, name: str) -> tuple:
    """Run one step of the guide; (namespace, printed, what the loss got per call)."""
    seen = []
    original = torch.nn.functional.cross_entropy

    def spy(scores, labels, *args, **kwargs):
        seen.append((scores.dtype, _caps.autocast_now('cpu')[0]))
        return original(scores, labels, *args, **kwargs)

    namespace: dict = {'__name__': '__main__'}
    out = io.StringIO()
    with pytest.MonkeyPatch.context() as mp, contextlib.redirect_stdout(out):
        mp.setattr(torch.nn.functional, 'cross_entropy', spy)
        exec(compile(body, name, 'exec'), namespace)
    return namespace, out.getvalue(), seen


@pytest.fixture
def bfloat16_autocast():
    _caps.require(torch.bfloat16, 'native', scaled=False)


def test_the_guide_has_four_steps_from_flags_to_fp32_modules():
    steps = _steps()
    assert len(steps) == 4
    found = [('\n    @auto_fp16()' in s, 'fp16_enabled' in s, '\n    @force_fp32(' in s,
              'fp32_modules' in s) for s in steps]
    assert found == [(True, True, True, False), (True, True, True, False),
                     (False, False, True, False), (False, False, False, True)]


def test_step_one_is_the_sample_after_fix_imports(tmp_path):
    project = tmp_path / 'project'
    shutil.copytree(SAMPLES / 'project', project)
    fix_imports(project)
    fixed = (project / 'heads' / 'anchor_head.py').read_text()
    assert 'mmcv' not in fixed
    assert _steps()[0].startswith(fixed)


@pytest.mark.usefixtures('bfloat16_autocast')
@pytest.mark.parametrize('index', range(4), ids=lambda i: f'step{i + 1}')
def test_every_step_trains_and_the_loss_gets_float32(index):
    namespace, printed, seen = _run_step(_steps()[index], f'move-the-model step {index + 1}')
    # What the page prints (and its comment promises): a bfloat16 forward, a float32 loss.
    assert printed.splitlines() == ['torch.bfloat16 torch.float32']
    # Every loss call got float32 scores, with autocast off: never the forward's dtype.
    assert len(seen) == 3 and set(seen) == {(torch.float32, False)}, seen
    loss = namespace['loss']
    assert loss.dtype == torch.float32 and torch.isfinite(loss)
    head = namespace['head']
    if index == 0:
        assert head.fp16_enabled is True  # wrap_fp16_model set the flag
    else:
        assert getattr(head, 'fp16_enabled', False) is False  # no flag from step 2 on
        assert namespace['optim_wrapper'].last_result.stepped
    if index == 3:
        assert kept_fp32(head) == ['loss_cls']


@pytest.mark.usefixtures('bfloat16_autocast')
def test_without_force_fp32_the_loss_would_get_bfloat16():
    """The check above can fail: step 3 without @force_fp32 hands bfloat16 to the loss."""
    body = _steps()[2]
    stripped = re.sub(r"\n    @force_fp32\(apply_to=\('scores',\)\)", '', body)
    assert stripped != body
    _, _, seen = _run_step(stripped, 'move-the-model step 3 without force_fp32')
    assert set(seen) == {(torch.bfloat16, True)}, seen


@pytest.mark.usefixtures('bfloat16_autocast')
def test_the_steps_train_the_same_weights_from_step_two_on():
    """Steps 2 to 4 change the model code, not what it computes: identical weights."""
    finals = []
    for index in (1, 2, 3):
        namespace, _, _ = _run_step(_steps()[index], f'step {index + 1}')
        finals.append([p.detach().clone() for p in namespace['head'].cls.parameters()])
    for other in finals[1:]:
        assert all(torch.equal(a, b) for a, b in zip(finals[0], other))


@pytest.mark.parametrize('flags', ['', '--plugin'])
def test_the_converted_sample_builds_the_wrapper_it_describes(flags):
    """Step 4 of the path: the written 1.x config builds an AmpOptimWrapper as converted."""
    _caps.require(torch.float16, 'native')
    from fp16utils import AmpOptimWrapper, build_optim_wrapper

    text = run_shell(f'fp16utils migrate docs/_samples/migration/configs/retinanet_fp16.py '
                     f'{flags}')
    cfg: dict = {}
    exec(compile(text, 'converted config', 'exec'), cfg)
    model = torch.nn.Linear(4, 2)
    wrapper = build_optim_wrapper(model, cfg['optim_wrapper'])
    assert isinstance(wrapper, AmpOptimWrapper) and wrapper.dtype == torch.float16
    assert wrapper.loss_scale == 512.0
    assert wrapper.state_dict()['loss_scaler']['growth_interval'] == 500  # scale_window
    group = wrapper.optimizer.param_groups[0]
    assert (group['lr'], group['momentum'], group['weight_decay']) == (0.01, 0.9, 0.0001)
    assert 'lr_config' not in cfg  # the schedule became param_scheduler
    assert [s['type'] for s in cfg['param_scheduler']] == ['LinearLR', 'MultiStepLR']
    assert 'fp16' not in cfg and 'optimizer_config' not in cfg and 'optimizer' not in cfg
