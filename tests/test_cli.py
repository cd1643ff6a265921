"""The ``fp16utils`` command, run as a user runs it: through a subprocess."""

from __future__ import annotations

import contextlib
import importlib.util
import io
import json
import os
import shutil
import subprocess
import sys
import sysconfig
import textwrap
from pathlib import Path
from types import SimpleNamespace

import _caps  # tests/ is on sys.path: see conftest.py
import pytest
import torch
from torch import nn

from fp16utils.migrate import format_config, load_config
from fp16utils.optim import AmpOptimWrapper, OptimWrapperDict, build_optim_wrapper
from fp16utils.tools import cli

FIXTURES = Path(__file__).parent / 'fixtures' / 'legacy_codebase'


def run(*args: str, cwd: Path | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONWARNINGS='error::DeprecationWarning', OMP_NUM_THREADS='1')
    env.pop('FP16UTILS_BACKEND', None)
    return subprocess.run([sys.executable, '-m', 'fp16utils', *args], capture_output=True,
                          text=True, cwd=cwd, env=env, timeout=timeout)


def call(*args: str) -> SimpleNamespace:
    """Run the command in this process (same code path as the console script)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args))
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def assert_one_line_error(proc: subprocess.CompletedProcess | SimpleNamespace,
                          *needles: str) -> None:
    # The config's notes (what changes meaning) may come first; the error is one line.
    lines = [line for line in proc.stderr.strip().splitlines() if ': note: ' not in line]
    assert len(lines) == 1, proc.stderr
    assert 'Traceback' not in proc.stderr
    assert lines[0].startswith('fp16utils: error: ')
    for needle in needles:
        assert needle in lines[0], lines[0]


def write(path: Path, text: str) -> Path:
    path.write_text(textwrap.dedent(text), encoding='utf-8')
    return path


# ------------------------------------------------------------------ usage


def test_no_command_is_a_usage_error():
    proc = run()
    assert proc.returncode == 2
    assert 'demo' in proc.stderr and 'migrate' in proc.stderr  # the help lists commands


def test_unknown_command_is_one_line_usage_error():
    proc = run('frobnicate')
    assert proc.returncode == 2
    assert_one_line_error(proc, 'frobnicate')


def test_bad_option_value_is_one_line_usage_error():
    proc = call('demo', '--steps', '0')
    assert proc.returncode == 2
    assert_one_line_error(proc, '--steps', '0')


def test_version():
    proc = run('--version')
    from fp16utils import __version__
    assert proc.returncode == 0
    assert proc.stdout.strip() == f'fp16utils {__version__}'


def test_console_script_is_installed():
    # The script pip wrote for this interpreter, not whichever one PATH finds first (a
    # shim or another environment's install).
    exe = shutil.which('fp16utils', path=sysconfig.get_path('scripts'))
    if exe is None:
        pytest.skip('no fp16utils console script beside this interpreter (not pip-installed)')
    proc = subprocess.run([exe, 'env'], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0
    assert 'backend' in proc.stdout


# -------------------------------------------------------------------- env


def test_env_reports_torch_backend_and_cpu_dtypes():
    proc = run('env')
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert torch.__version__ in out
    assert 'native' in out and 'native AMP' in out
    cpu_lines = out.split('device cpu', 1)[1].splitlines()
    autocast = cpu_lines[1].split('autocast dtypes', 1)[1].split(',')
    assert [d.strip() for d in autocast] == [_caps.NAMES[d] for d in _caps.LOW_DTYPES]
    # One row per dtype: what torch supports, and the backend it leads to (or why none).
    from fp16utils import _torch
    rows = {ln.split()[0]: ln.split(None, 1)[1] for ln in cpu_lines[2:4]}
    assert rows == dict(_torch.caps.capability_rows('cpu'))
    for dtype in (torch.float16, torch.bfloat16):
        text = rows[_caps.NAMES[dtype]]
        assert f'kernels {"no" if _caps.cpu_lacks(dtype) else "yes"}' in text
        assert ('unusable' in text) == (_caps.cpu_lacks(dtype) is not None)
    assert proc.stderr == ''


def test_env_reports_forced_legacy_backend_and_why():
    env = dict(os.environ, FP16UTILS_BACKEND='legacy')
    proc = subprocess.run([sys.executable, '-m', 'fp16utils', 'env'], capture_output=True,
                          text=True, env=env, timeout=60)
    assert proc.returncode == 0
    line = next(ln for ln in proc.stdout.splitlines() if ln.startswith('backend'))
    assert 'legacy' in line and 'FP16UTILS_BACKEND=legacy' in line


def test_demo_picks_a_device_that_is_present():
    from fp16utils.tools import env

    present = [kind for kind, _ in env.devices()]
    assert present[0] == 'cpu' and env.best_device() in present


# ---------------------------------------------------------------- migrate


def test_migrate_resolves_base_relative_to_the_file_and_writes_output(tmp_path):
    base_dir = tmp_path / 'configs' / '_base_'
    base_dir.mkdir(parents=True)
    write(base_dir / 'schedule.py', """
        optimizer = dict(type='SGD', lr=0.02, momentum=0.9)
        optimizer_config = dict(grad_clip=None)
        total_epochs = 12
        """)
    cfg = write(tmp_path / 'configs' / 'model_fp16.py', """
        _base_ = ['./_base_/schedule.py']
        fp16 = dict(loss_scale=512.)
        optimizer = dict(lr=0.01)  # merged into the base optimizer
        optimizer_config = dict(
            _delete_=True, type='Fp16OptimizerHook', grad_clip=dict(max_norm=35, norm_type=2))
        """)
    out_file = tmp_path / 'out.py'
    proc = run('migrate', str(cfg), '-o', str(out_file))
    assert proc.returncode == 0, proc.stderr
    assert f'wrote {out_file}' in proc.stdout
    result = load_config(out_file)
    assert 'fp16' not in result and 'optimizer_config' not in result
    assert 'optimizer' not in result
    assert result['optim_wrapper'] == {
        'type': 'AmpOptimWrapper',
        'optimizer': {'type': 'SGD', 'lr': 0.01, 'momentum': 0.9},
        'loss_scale': 512.0,
        'clip_grad': {'max_norm': 35, 'norm_type': 2},
    }
    wrapper = build_optim_wrapper(nn.Linear(2, 2), _caps.on_this_cpu(result['optim_wrapper']))
    assert isinstance(wrapper, AmpOptimWrapper)
    assert wrapper.loss_scale == (512.0 if wrapper.dtype == torch.float16 else 1.0)


def test_migrate_reads_fp16_by_the_codebase_told_from_the_path(tmp_path):
    folder = tmp_path / 'mmsegmentation' / 'configs' / 'mae'
    folder.mkdir(parents=True)
    cfg = write(folder / 'upernet_mae_fp16.py', """
        model = dict(type='EncoderDecoder')
        optimizer = dict(type='AdamW', lr=1e-4)
        optimizer_config = dict()
        fp16 = dict(loss_scale='dynamic')
        """)
    proc = call('migrate', str(cfg), '--strict')
    assert proc.returncode == 0, proc.stderr
    assert "type='OptimWrapper'" in proc.stdout and 'fp16 =' not in proc.stdout
    notes = [line for line in proc.stderr.splitlines() if ': note: fp16: mmseg 0.x' in line]
    assert len(notes) == 1 and 'trained in float32' in notes[0]
    assert 'warning' not in proc.stderr
    proc = call('migrate', str(cfg), '--codebase', 'mmdet')
    assert "type='AmpOptimWrapper'" in proc.stdout and "loss_scale='dynamic'" in proc.stdout
    assert "note: fp16.loss_scale: 'dynamic' kept" in proc.stderr


def test_migrate_faithful_writes_mmcv_numbers_and_says_when_the_codebase_is_unknown(tmp_path):
    cfg = write(tmp_path / 'model_fp16.py', """
        optimizer = dict(type='SGD', lr=0.01)
        fp16 = dict(loss_scale='dynamic')
        """)
    proc = call('migrate', str(cfg), '--faithful', '--codebase', 'mmcls')
    assert proc.returncode == 0, proc.stderr
    assert "loss_scale=dict(init_scale=4294967296.0, growth_interval=1000)" in proc.stdout
    assert ': note: ' in proc.stderr and 'warning' not in proc.stderr
    proc = call('migrate', str(cfg))
    assert proc.returncode == 0
    assert ': note: fp16: the codebase could not be told' in proc.stderr
    assert 'warning' not in proc.stderr
    assert call('migrate', str(cfg), '--strict').returncode == 0  # a note, not a problem


def test_migrate_to_stdout_is_a_readable_python_config():
    proc = call('migrate', str(FIXTURES / 'configs' / 'biggan_128x128_fp16.py'))
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.startswith('# Converted from biggan_128x128_fp16.py')
    assert "constructor='MultiOptimWrapperConstructor'" in proc.stdout
    assert 'accumulative_counts=8' in proc.stdout
    namespace: dict = {}
    exec(compile(proc.stdout, '<migrated>', 'exec'), namespace)  # it is valid Python
    assert namespace['model']['discriminator_steps'] == 1
    assert namespace['model']['generator_steps'] == 1


def test_migrated_gan_config_builds_an_optim_wrapper_dict(tmp_path):
    out_file = tmp_path / 'gan.py'
    proc = call('migrate', str(FIXTURES / 'configs' / 'biggan_128x128_fp16.py'),
               '-o', str(out_file))
    assert proc.returncode == 0, proc.stderr

    class GAN(nn.Module):
        def __init__(self):
            super().__init__()
            self.generator = nn.Linear(2, 2)
            self.discriminator = nn.Linear(2, 1)

    wrappers = build_optim_wrapper(GAN(),
                                   _caps.on_this_cpu(load_config(out_file)['optim_wrapper']))
    assert isinstance(wrappers, OptimWrapperDict)
    assert sorted(wrappers.keys()) == ['discriminator', 'generator']
    assert wrappers['generator'].accumulative_counts == 8


def test_migrate_amp_switch_on_a_plain_config(tmp_path):
    cfg = write(tmp_path / 'plain.py', """
        optimizer = dict(type='Adam', lr=1e-3)
        optimizer_config = dict(grad_clip=None)
        """)
    proc = call('migrate', str(cfg), '--amp', '--dtype', 'bfloat16')
    assert proc.returncode == 0, proc.stderr
    namespace: dict = {}
    exec(proc.stdout, namespace)
    wrapper = namespace['optim_wrapper']
    assert wrapper['type'] == 'AmpOptimWrapper'
    assert wrapper['dtype'] == 'bfloat16'
    assert 'loss_scale' not in wrapper


def test_migrate_reports_problems_on_stderr_and_strict_fails(tmp_path):
    cfg = write(tmp_path / 'gan.py', """
        optimizer = dict(generator=dict(type='Adam', lr=1e-4),
                         discriminator=dict(type='Adam', lr=4e-4))
        train_cfg = dict(disc_steps=5, gen_steps=1, batch_accumulation_steps=2)
        """)
    proc = call('migrate', str(cfg))
    assert proc.returncode == 0
    assert 'warning' in proc.stderr and 'disc_steps' in proc.stderr
    strict = call('migrate', str(cfg), '--strict')
    assert strict.returncode == 1
    assert 'Traceback' not in strict.stderr
    assert strict.stderr.strip().splitlines()[-1].startswith('fp16utils: error: ')
    assert strict.stdout == ''


def test_migrate_missing_file_is_usage_error(tmp_path):
    proc = call('migrate', str(tmp_path / 'nope.py'))
    assert proc.returncode == 2
    assert_one_line_error(proc, 'nope.py', 'no such config file')


def test_migrate_missing_base_names_both_files(tmp_path):
    cfg = write(tmp_path / 'child.py', "_base_ = './gone.py'\nfp16 = dict(loss_scale=512.)\n")
    proc = call('migrate', str(cfg))
    assert proc.returncode == 1
    assert_one_line_error(proc, 'child.py', 'gone.py', 'does not exist')


def test_migrate_config_with_syntax_error_names_file_and_line(tmp_path):
    cfg = write(tmp_path / 'bad.py', 'fp16 = dict(loss_scale=512.\n')
    proc = call('migrate', str(cfg))
    assert proc.returncode == 1
    assert_one_line_error(proc, 'bad.py:', 'syntax error')


def test_migrate_config_that_raises_is_reported_not_a_traceback(tmp_path):
    cfg = write(tmp_path / 'raises.py', "fp16 = dict(loss_scale=1 / 0)\n")
    proc = call('migrate', str(cfg))
    assert proc.returncode == 1
    assert_one_line_error(proc, 'raises.py', 'ZeroDivisionError')


def test_base_cycle_is_reported(tmp_path):
    write(tmp_path / 'a.py', "_base_ = './b.py'\n")
    write(tmp_path / 'b.py', "_base_ = './a.py'\n")
    with pytest.raises(cli.CommandError, match='cycle'):
        load_config(tmp_path / 'a.py')


def test_format_config_round_trips_values():
    cfg = {'a': {'b': (1,), 'c': [1.5, 'x'], 'd': None, 'not-ident': {1: 2}},
           'long': {f'key{i}': 'v' * 10 for i in range(8)}}
    namespace: dict = {}
    exec(format_config(cfg), namespace)
    assert namespace['a'] == cfg['a']
    assert namespace['long'] == cfg['long']


# ------------------------------------------------------------------- scan


def test_scan_reports_findings_and_exits_1():
    proc = run('scan', str(FIXTURES))
    assert proc.returncode == 1
    assert 'syntax-error' in proc.stdout  # broken_module.py is reported, not fatal
    assert 'Fp16OptimizerHook' in proc.stdout
    last = proc.stdout.strip().splitlines()[-1]
    assert last.endswith('file(s)') and 'finding(s)' in last


def test_scan_json_is_machine_readable():
    proc = call('scan', str(FIXTURES), '--json')
    assert proc.returncode == 1
    findings = json.loads(proc.stdout)
    assert {'path', 'line', 'col', 'kind', 'message', 'suggestion'} <= set(findings[0])
    kinds = {f['kind'] for f in findings}
    assert {'import', 'decorator', 'syntax-error'} <= kinds


def test_scan_clean_tree_exits_0(tmp_path):
    write(tmp_path / 'clean.py', 'import torch\n\nx = torch.ones(1)\n')
    proc = call('scan', str(tmp_path))
    assert proc.returncode == 0
    assert '0 finding(s)' in proc.stdout


def test_scan_missing_path_is_usage_error(tmp_path):
    proc = call('scan', str(tmp_path / 'missing'))
    assert proc.returncode == 2
    assert_one_line_error(proc, 'missing', 'no such file or directory')


def _copy_tree(tmp_path: Path) -> Path:
    dst = tmp_path / 'code'
    shutil.copytree(FIXTURES, dst)
    return dst


def _snapshot(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob('*.py'))}


def test_scan_fix_dry_run_prints_diff_and_writes_nothing(tmp_path):
    root = _copy_tree(tmp_path)
    before = _snapshot(root)
    proc = run('scan', str(root), '--fix', '--dry-run')
    assert proc.returncode == 1, proc.stderr  # broken_module.py cannot be parsed
    assert_one_line_error(proc, 'broken_module.py', 'cannot parse')
    assert '+from fp16utils import' in proc.stdout
    assert '--- ' in proc.stdout and '+++ ' in proc.stdout
    assert 'would change' in proc.stdout
    assert _snapshot(root) == before


def test_scan_fix_rewrites_imports_then_is_idempotent(tmp_path):
    root = _copy_tree(tmp_path)
    before = _snapshot(root)
    first = call('scan', str(root), '--fix')
    assert first.returncode == 1, first.stderr  # broken_module.py was skipped
    assert_one_line_error(first, 'broken_module.py', 'cannot parse')
    after = _snapshot(root)
    changed = [k for k in before if before[k] != after[k]]
    assert changed
    for name in changed:
        assert b'from fp16utils import' in after[name]
    second = call('scan', str(root), '--fix')
    assert second.returncode == 1
    assert 'changed 0 file(s)' in second.stdout
    assert _snapshot(root) == after


# ------------------------------------------------------ start-up without torch


def imported_modules(*args: str) -> list[str]:
    """The modules ``python -X importtime -m fp16utils ARGS`` imports, in order."""
    env = dict(os.environ, PYTHONWARNINGS='error::DeprecationWarning')
    proc = subprocess.run([sys.executable, '-X', 'importtime', '-m', 'fp16utils', *args],
                          capture_output=True, text=True, env=env, timeout=120)
    assert 'Traceback' not in proc.stderr, proc.stderr
    # importtime lines: "import time: self [us] | cumulative | module", on stderr
    names = [line.rsplit('|', 1)[1].strip() for line in proc.stderr.splitlines()
             if line.startswith('import time:') and line.count('|') == 2]
    assert 'fp16utils.tools.cli' in names  # the output was read
    return names


@pytest.mark.parametrize('command', [
    ('scan', '{tree}'),
    ('scan', '{tree}', '--json'),
    ('scan', '{tree}', '--fix', '--dry-run'),
    ('scan', '{tree}', '--fix'),
    ('migrate', '{cfg}'),
    ('migrate', '{cfg}', '--amp', '--dtype', 'bfloat16'),
])
def test_scan_and_migrate_start_without_torch(tmp_path, command):
    tree = tmp_path / 'code'
    tree.mkdir()
    write(tree / 'head.py', 'from mmcv.runner import BaseModule, force_fp32\n')
    cfg = write(tmp_path / 'cfg.py', """\
        optimizer = dict(type='SGD', lr=0.01)
        fp16 = dict(loss_scale=512.)
        """)
    names = imported_modules(*(a.format(tree=tree, cfg=cfg) for a in command))
    assert [n for n in names if 'torch' in n] == []
    assert 'numpy' not in names


# ------------------------------------------------------------------- bench


def test_bench_unknown_name_lists_available():
    proc = call('bench', 'nope')
    assert proc.returncode == 2
    assert_one_line_error(proc, 'nope', 'decorators')
    assert '_support' not in proc.stderr  # a shared helper, not a benchmark


def test_bench_refuses_a_helper_module_by_name():
    proc = call('bench', '_support')
    assert proc.returncode == 2
    assert_one_line_error(proc, '_support: no such benchmark', 'train_step')


def test_bench_says_in_one_line_when_torch_cannot_measure(monkeypatch):
    # What a torch without float16 CPU kernels (1.13) answers: exit 2, one line, no table.
    from fp16utils import _torch
    monkeypatch.setattr(_torch.caps, 'kernels_support',
                        lambda device, dtype: dtype != torch.float16)
    proc = call('bench', 'decorators', '--quick')
    assert proc.returncode == 2 and proc.stdout == ''
    device = 'cuda' if torch.cuda.is_available() else 'cpu'  # the benchmark's default
    assert proc.stderr.splitlines() == [
        f'decorators.py: cannot measure float16 here: torch {torch.__version__} has no '
        f'float16 matrix kernels on {device}']


# -------------------------------------------------------------------- demo

#: The demo's modes, and what each needs of torch on the CPU.
DEMO_MODES = {'fp32': None,
              'amp float16': _caps.cpu_lacks(_caps.F16, 'native'),
              'amp bfloat16': _caps.cpu_lacks(_caps.BF16, 'native'),
              'legacy float16': _caps.cpu_lacks(_caps.F16)}
#: The modes this torch runs on the CPU, in the demo's order.
DEMO_RUNS = [mode for mode, lacks in DEMO_MODES.items() if lacks is None]


def test_demo_runs_on_cpu_and_prints_the_table():
    proc = run('demo', '--steps', '20', '--device', 'cpu', timeout=300)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    header = next(ln for ln in out.splitlines() if ln.startswith('mode'))
    for column in ('steps/s', 'vs fp32', 'peak mem', 'final loss', 'scale changes', 'skipped'):
        assert column in header
    rows = {ln.split('  ')[0].strip(): ln for ln in out.splitlines()
            if ln.startswith(('fp32', 'amp ', 'legacy '))}
    assert set(rows) == set(DEMO_RUNS)
    assert '1.00x' in rows['fp32']
    # A mode this torch cannot run is left out, with the reason on one line.
    left_out = [ln for ln in out.splitlines() if ln.startswith('left out ')]
    assert [ln.split(':')[0] for ln in left_out] == [
        f'left out {mode}' for mode in DEMO_MODES if mode not in DEMO_RUNS]
    assert all('not supported' in ln or 'cannot' in ln for ln in left_out)
    # Not a terminal: plain progress lines, no carriage-return bar.
    assert 'training fp32 on cpu (20 steps)' in out
    assert '\r' not in out + proc.stderr


def test_demo_results_are_sane():
    from fp16utils.tools.demo import run_demo

    buf = io.StringIO()
    results = run_demo('cpu', steps=12, out=buf)
    by_mode = {r.mode: r for r in results}
    assert list(by_mode) == DEMO_RUNS
    for r in results:
        assert len(r.losses) == 12 and all(v == v for v in r.losses)  # no nan
        assert r.steps_per_s > 0
        assert r.peak_memory_mb is None  # the CPU reports no peak memory
    fp32 = by_mode['fp32']
    assert fp32.losses[-1] < fp32.losses[0]  # it learns
    for mode in DEMO_RUNS[1:]:
        # same data and initial weights: low precision tracks fp32 closely
        assert abs(by_mode[mode].losses[-1] - fp32.losses[-1]) < 0.05
    if 'amp float16' in by_mode:
        assert by_mode['amp float16'].scales[0] == 2.0**16
    if 'amp bfloat16' in by_mode:
        assert by_mode['amp bfloat16'].scales[0] == 1.0  # bfloat16 is not scaled


def test_demo_unknown_mode_is_a_clear_error():
    from fp16utils.tools.demo import run_demo
    with pytest.raises(ValueError, match='int8'):
        run_demo('cpu', steps=1, modes=('int8',))


def test_demo_plot(tmp_path):
    target = tmp_path / 'curves.png'
    proc = call('demo', '--steps', '4', '--device', 'cpu', '--plot', str(target))
    if importlib.util.find_spec('matplotlib') is None:
        assert proc.returncode == 1
        assert_one_line_error(proc, 'matplotlib', "pip install 'fp16utils[plot]'")
        assert not target.exists()
    else:
        assert proc.returncode == 0, proc.stderr
        assert target.read_bytes()[:8] == b'\x89PNG\r\n\x1a\n'


@pytest.mark.skipif(torch.cuda.is_available(), reason='a CUDA device is present here')
def test_demo_on_an_absent_device_is_a_usage_error():
    proc = call('demo', '--device', 'cuda', '--steps', '2')
    assert proc.returncode == 2
    assert_one_line_error(proc, '--device cuda', 'no cuda device here', 'cpu')
    assert proc.stdout == ''  # refused before any training


def test_demo_on_an_unknown_device_is_a_usage_error():
    proc = call('demo', '--device', 'bogus', '--steps', '2')
    assert proc.returncode == 2
    assert_one_line_error(proc, '--device bogus', 'not a torch device')


def test_demo_plot_into_a_missing_folder_is_refused_before_training(tmp_path):
    target = tmp_path / 'missing' / 'curves.png'
    proc = call('demo', '--steps', '2', '--device', 'cpu', '--plot', str(target))
    assert proc.returncode == 2
    assert_one_line_error(proc, 'curves.png', 'existing folder')
    assert proc.stdout == ''


def test_migrate_output_that_cannot_be_written_is_one_line_error(tmp_path):
    target = tmp_path / 'missing' / 'out.py'
    proc = call('migrate', str(FIXTURES / 'configs' / 'biggan_128x128_fp16.py'),
                '-o', str(target))
    assert proc.returncode == 1
    assert_one_line_error(proc, 'out.py', 'could not be written')
    assert not target.exists()


def test_migrate_dtype_without_amp_is_a_usage_error():
    proc = call('migrate', str(FIXTURES / 'configs' / 'plain_sgd.py'), '--dtype', 'bfloat16')
    assert proc.returncode == 2
    assert_one_line_error(proc, '--dtype', '--amp')


# ------------------------------------------------------------ option pairs, misspelt keys


def test_migrate_amp_with_plugin_writes_the_plugin_amp_wrapper(tmp_path):
    cfg = tmp_path / 'cfg.py'
    cfg.write_text("optimizer = dict(type='SGD', lr=0.01)\noptimizer_config = dict()\n")
    proc = call('migrate', str(cfg), '--amp', '--plugin', '--dtype', 'bfloat16')
    assert proc.returncode == 0, proc.stderr
    ns: dict = {}
    exec(proc.stdout, ns)  # noqa: S102 - the text under test
    assert ns['optim_wrapper']['type'] == 'Fp16utilsAmpOptimWrapper'
    assert ns['optim_wrapper']['dtype'] == 'bfloat16'
    assert ns['custom_imports']['imports'] == ['fp16utils.mmengine']


def test_run_reports_a_misspelt_fp16_key_in_one_line(tmp_path, capsys):
    from fp16utils.tools.run import run_script

    script = tmp_path / 'train.py'
    script.write_text(textwrap.dedent('''
        from fp16utils import Fp16OptimizerHook
        fp16 = dict(loss_scal=512.)
        Fp16OptimizerHook(grad_clip=None, **fp16)
    '''))
    assert run_script(str(script), []) == 1
    err = capsys.readouterr().err
    assert 'Traceback' not in err and err.count('\n') == 1, err
    assert err.startswith("fp16utils: error: Fp16OptimizerHook got the unknown key "
                          "'loss_scal' (did you mean 'loss_scale'?)")


@pytest.mark.parametrize('command, needed', [('bench', 'NAME'), ('run', 'SCRIPT')])
def test_a_missing_argument_error_does_not_list_the_optional_args(command, needed):
    proc = call(command)
    assert proc.returncode == 2
    assert proc.stderr == (f'fp16utils: error: the following arguments are required: {needed} '
                           f'(see fp16utils {command} --help)\n')
