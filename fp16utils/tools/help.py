"""What ``fp16utils --help`` and ``fp16utils COMMAND --help`` say beside the options.

One description and one epilog (examples, exit codes) per subcommand, apart from the
parser code so that the text reads and reviews in one place.
"""

from __future__ import annotations

import textwrap
from typing import NamedTuple


class CommandHelp(NamedTuple):
    """The help of one subcommand: a summary line, a description and an epilog."""

    summary: str
    description: str
    epilog: str


def _exit_codes(*rows: str) -> str:
    return 'exit codes:\n' + '\n'.join(
        textwrap.fill(row, 79, initial_indent='  ', subsequent_indent='     ')
        for row in rows)


def paragraph(text: str) -> str:
    """``text`` filled to 79 columns (the help is printed as it is written)."""
    return textwrap.fill(text, 79)


USAGE_ERROR = '2  a usage error (a bad option or argument); nothing was done'
INTERRUPTED = '130  interrupted (Ctrl-C)'

MAIN_DESCRIPTION = (
    'Mixed-precision training tools for PyTorch: the OpenMMLab 0.x fp16 API on any '
    'device, and a path to 1.x-style AMP optimizer wrappers.')
MAIN_EPILOG = '''\
commands in the order a migration uses them:
  env      what this torch and machine support (start here)
  demo     see float16/bfloat16 training next to float32 on this machine
  scan     find the 0.x fp16 code in a codebase (reads only; --fix rewrites imports)
  run      train a 0.x codebase through mmcv's own runner with fp16utils in place
  migrate  convert a 0.x config to the 1.x optim_wrapper style
  doctor   find the modules that must stay in float32, and check the fix
  bench    run a benchmark of a source checkout

Run "fp16utils COMMAND --help" for a command's options, examples and exit codes.'''

HELP = {
    'demo': CommandHelp(
        summary='train a small model in fp32, AMP and legacy modes',
        description=(
            'Train the same small model from the same seed in float32, with AMP in float16 '
            'and bfloat16, and with the legacy backend (pure float16 with float32 master '
            'weights), then print one table: steps per second, speed against float32, '
            'peak memory (CUDA), final loss, scale changes and skipped steps. A mode that '
            'this torch cannot run on the device is left out with its reason. Every mode '
            'is warmed up untimed before it is timed, so a first run reports warm figures.'),
        epilog='examples:\n'
               '  fp16utils demo\n'
               '  fp16utils demo --device cuda --steps 300\n'
               '  fp16utils demo --seed 7 --plot demo.png     # needs matplotlib\n\n'
               + _exit_codes('0  the table was printed (and the plot written)',
                             '1  a plot could not be written, or matplotlib is missing',
                             USAGE_ERROR + ' (e.g. a device that is not present)',
                             INTERRUPTED)),
    'env': CommandHelp(
        summary='torch version, backend, devices, supported dtypes',
        description=(
            'Print the torch version, the backend fp16utils uses (and why), every device '
            'torch can see, and for each device which low-precision dtypes train there '
            '(float16 with loss scaling, bfloat16) and how fast the CPU runs them. Use it '
            "to choose a dtype; dtype='auto' picks the same one."),
        epilog='examples:\n'
               '  fp16utils env\n'
               '  FP16UTILS_BACKEND=legacy fp16utils env\n\n'
               + _exit_codes('0  the report was printed',
                             '2  FP16UTILS_BACKEND names no backend', INTERRUPTED)),
    'migrate': CommandHelp(
        summary='convert a 0.x config file to the 1.x style',
        description=(
            'Convert a 0.x training config (fp16, optimizer, optimizer_config, '
            'runner.fp16_loss_scaler, GAN train_cfg steps) to a 1.x one built around '
            'optim_wrapper, and print it (or write it with -o). The config file is '
            'EXECUTED, as mmcv\'s Config.fromfile does, _base_ files included: never '
            'migrate a config you do not trust. What has no fp16 meaning (lr_config, '
            'runner, data, model, ...) is left as it is. --amp turns the wrapper into an '
            'AmpOptimWrapper; --dtype chooses its dtype, but a config that already trains '
            'in fp16 (an fp16 key, or an AmpOptimWrapper) keeps its own settings and '
            '--dtype is ignored for it, with a warning. --plugin writes a config for '
            "MMEngine's Runner with fp16utils' plug-in (custom_imports and the "
            'registered names).'),
        epilog='examples:\n'
               '  fp16utils migrate configs/retinanet_fp16.py\n'
               '  fp16utils migrate old.py -o new.py --strict\n'
               '  fp16utils migrate old.py --amp --dtype bfloat16 -o new.py\n'
               '  fp16utils migrate old.py --plugin -o mmengine_cfg.py\n\n'
               + _exit_codes('0  converted (warnings, if any, on stderr)',
                             '1  the config cannot be read, executed, converted or written; '
                             'or --strict and a problem was found; nothing written',
                             USAGE_ERROR + ' (e.g. no such file, -o equal to the input)',
                             INTERRUPTED)),
    'scan': CommandHelp(
        summary='find 0.x fp16 usages in a codebase',
        description=(
            'List every 0.x fp16 usage under PATH: imports of the fp16 names from mmcv, '
            'mmdet and the like, @auto_fp16/@force_fp32, fp16_enabled, fp16 config '
            'keys, and calls into mmcv ops whose kernels lack float16 or bfloat16 '
            '(half-kernel, with the evidence from mmcv\'s own sources), each with a line '
            'of advice. Files are parsed, never imported or run. '
            '--fix rewrites those imports to fp16utils (atomically, file by file) and '
            'leaves everything else in the files as it was; --dry-run prints the diff.'),
        epilog='examples:\n'
               '  fp16utils scan mmdet/\n'
               '  fp16utils scan mmdet/models/dense_heads/anchor_head.py --json\n'
               '  fp16utils scan my_project/ --fix --dry-run\n\n'
               + _exit_codes('0  nothing found; with --fix: every file that needed it was '
                             'rewritten (or, with --dry-run, shown)',
                             '1  findings were reported (without --fix), or a file could not '
                             'be read or rewritten',
                             USAGE_ERROR + ' (e.g. PATH does not exist)', INTERRUPTED)),
    'run': CommandHelp(
        summary='patch mmcv 1.x with fp16utils, then run a script (e.g. tools/train.py)',
        description=(
            "Put fp16utils in place of mmcv 1.x's fp16 decorators, wrap_fp16_model, "
            'LossScaler and optimizer hooks (fp16utils.patch_mmcv), then run SCRIPT as '
            '__main__ with ARGS as its arguments, as "python SCRIPT ARGS" would (sys.argv, '
            "sys.path[0] the script's folder). The codebase and its configs stay "
            'unchanged.'),
        epilog='examples:\n'
               '  fp16utils run tools/train.py configs/retinanet_fp16.py\n'
               '  fp16utils run --dtype bfloat16 tools/train.py my_cfg.py --work-dir w\n\n'
               + _exit_codes("the script's own exit code",
                             '1  mmcv cannot be imported or patched; SCRIPT was not run',
                             USAGE_ERROR + ' (e.g. SCRIPT does not exist)', INTERRUPTED)),
    'doctor': CommandHelp(
        summary='find the modules that fail, overflow or drift in float16/bfloat16',
        description=(
            'Build the model (MODULE:FACTORY with a random input of --input-shape, or an '
            'OpenMMLab 0.x config through mmdet\'s or mmseg\'s registry with a synthetic '
            'training batch of the config\'s size), run it in float32, then in the chosen '
            'dtype and backend module by module, and print one table: each module that '
            'raises a dtype error, outputs inf/nan or drifts past the tolerance from '
            'float32. Each is kept in float32 and the model run again until it runs '
            'clean; the fp32_modules that did it are printed as a 1.x config line and a '
            '0.x script line, with the verdict of a last run, forward and backward. A '
            'config file or module is EXECUTED: never run one you do not trust.'),
        epilog='examples:\n'
               '  fp16utils doctor my_models:build --input-shape 2,3,32,32\n'
               '  fp16utils doctor my_models.py:build --input-shape 4,16 --dtype bfloat16\n'
               '  fp16utils doctor configs/retinanet/retinanet_r50_fpn_1x_coco.py --json\n\n'
               + _exit_codes('0  the model runs clean in the dtype, nothing kept in float32',
                             '1  problems were found (the table says which, and whether the '
                             'fix was verified), the model fails in float32, or it cannot '
                             'be built',
                             USAGE_ERROR + ' (e.g. no --input-shape with MODULE:FACTORY)',
                             INTERRUPTED)),
    'bench': CommandHelp(
        summary='run a benchmark of a source checkout',
        description=(
            "Run one of the benchmarks in a source checkout's benchmarks/ folder (they "
            'ship with the repository, not with the wheel: install the clone with '
            '"pip install -e ."). Each prints a table of ratios against the hand-written '
            'PyTorch code measured in the same run.'),
        epilog='examples:\n'
               '  fp16utils bench decorators --quick\n'
               '  fp16utils bench train_step --repeats 5 --steps 20\n'
               '  fp16utils bench decorators --help     # the benchmark\'s own options\n\n'
               + _exit_codes("the benchmark's own exit code",
                             '1  no benchmarks here (not a source checkout)',
                             USAGE_ERROR + ' (e.g. no such benchmark)', INTERRUPTED)),
}
