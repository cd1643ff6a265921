"""The ``fp16utils`` command: its parser, :func:`main`, and the sub-commands' bodies.

``env`` lives in :mod:`.env`, ``migrate`` in :mod:`.migrate_command`, ``doctor`` in
:mod:`.doctor`, the help texts in :mod:`.help`; ``scan`` and ``migrate`` never import
torch.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
from pathlib import Path
from typing import NoReturn, Optional, Sequence, TextIO

from ..migrate._atomic import resolve_target
from ..migrate._codebase import CODEBASES
from ..migrate.errors import PROG, CommandError, UsageError, one_line, prose
from ..migrate.errors import shown_path as _shown
from .doctor import add_doctor_arguments
from .env import best_device, check_backend_env, check_device, cmd_env
from .help import HELP, MAIN_DESCRIPTION, MAIN_EPILOG, paragraph
from .migrate_command import cmd_migrate

# fp16utils.migrate imports the standard library only: the scan and migrate commands
# never import torch (env, demo and bench import it inside their functions).
from .run import run_script

__all__ = ['main']



class _Parser(argparse.ArgumentParser):
    """An argument parser whose errors are one line, exit code 2."""

    def error(self, message: str) -> NoReturn:
        required = 'the following arguments are required: '
        if message.startswith(required):  # argparse lists the optional ARGS... there too
            optional = {a.metavar for a in self._actions if a.nargs == argparse.REMAINDER}
            names = [n for n in message[len(required):].split(', ') if n not in optional]
            message = required + ', '.join(names)
        raise UsageError(f'{message} (see {self.prog} --help)')


def cmd_scan(args: argparse.Namespace, out: TextIO) -> int:
    """Report 0.x fp16 usages under a path (exit 1 if any); with --fix rewrite the imports."""
    from dataclasses import asdict, replace

    from ..migrate import fix_imports, scan

    path = args.path
    if not os.path.exists(path):
        what = ('a dangling symbolic link' if os.path.lexists(path)
                else 'no such file or directory')
        raise UsageError(f'{_shown(path)}: {what}')
    if not (os.path.isfile(path) or os.path.isdir(path)):
        raise UsageError(f'{_shown(path)}: not a regular file or a folder; pass a .py file '
                         'or a source folder')
    if args.dry_run and not args.fix:
        args.fix = True  # --dry-run alone: what --fix would do
    if args.fix:
        # JSON keeps each path as the file system gives it (an undecodable byte as a
        # surrogate escape, which json writes as \\udcXX and reads back); text shows it
        # in a form that pastes into a shell (_shown).
        changes = fix_imports(path, dry_run=args.dry_run)
        changed = [c for c in changes if c.changed]
        failed = [c for c in changes if c.error]
        for change in failed:
            sys.stderr.write(f'{PROG}: error: {_shown(change.path)}: {one_line(change.error)}\n')
        if args.json:
            json.dump([asdict(c) for c in changes if c.changed or c.error], out, indent=2)
            out.write('\n')
        elif args.dry_run:
            for change in changed:
                out.write(prose(change.diff))
        else:
            for change in changed:
                out.write(f'fixed imports in {_shown(change.path)}\n')
        if not args.json:
            verb = 'would change' if args.dry_run else 'changed'
            skipped = f', skipped {len(failed)} that could not be read or written' if failed else ''
            out.write(f'{verb} {len(changed)} file(s){skipped}\n')
        return 1 if failed else 0
    findings = [replace(f, message=one_line(f.message)) for f in scan(path)]
    if args.json:
        json.dump([asdict(f) for f in findings], out, indent=2)
        out.write('\n')
    else:
        for f in findings:
            out.write(f'{_shown(f.path)}:{f.line}:{f.col}: {f.kind}: {f.message}\n'
                      f'    -> {f.suggestion}\n')
        files = len({f.path for f in findings})
        unread = sum(f.kind == 'unreadable' for f in findings)
        note = f' ({unread} could not be read: not scanned)' if unread else ''
        out.write(f'{len(findings)} finding(s) in {files} file(s){note}\n')
    return 1 if findings else 0


def cmd_run(args: argparse.Namespace, out: TextIO) -> int:
    """Patch mmcv 1.x with fp16utils, then run a script as ``__main__``."""
    if not os.path.isfile(args.script):
        raise UsageError(f'{_shown(args.script)}: no such file')
    from ..mmcv import patch_mmcv

    check_backend_env()
    try:
        patch_mmcv(dtype=args.dtype, backend=args.backend)
    except ImportError as err:
        raise CommandError(f'run: {err}') from None
    except Exception as err:  # noqa: BLE001 - mmcv's own import failed: one line, not a traceback
        raise CommandError(
            f'run: importing mmcv.runner failed with {type(err).__name__}: {one_line(err)}; '
            'the mmcv installation is broken (python -c "import mmcv.runner" shows the '
            'traceback); nothing was run') from None
    return run_script(args.script, args.args)


def cmd_bench(args: argparse.Namespace, out: TextIO) -> int:
    """Run one of the benchmarks of a source checkout."""
    root = Path(__file__).resolve().parents[2] / 'benchmarks'
    if not re.fullmatch(r'[A-Za-z0-9_]+', args.name):  # no path: only a benchmark's name
        raise UsageError(f'{one_line(args.name)!r}: not a benchmark name; give the name of '
                         'one in benchmarks/ (e.g. decorators)')
    script = root / f'{args.name}.py'
    if args.name.startswith('_') or not script.is_file():  # _name.py: a shared helper
        available = sorted(p.stem for p in root.glob('*.py')
                           if not p.stem.startswith('_')) if root.is_dir() else []
        if not available:
            raise CommandError(
                f'{root}: no benchmarks here; they ship with the source checkout '
                '(run from a clone installed with pip install -e .)')
        raise UsageError(f'{args.name}: no such benchmark; available: {", ".join(available)}')
    return run_script(str(script), args.rest)


def cmd_demo(args: argparse.Namespace, out: TextIO) -> int:
    """Train a small model in fp32, AMP float16/bfloat16 and legacy; print a table."""
    from .demo import run_demo

    check_backend_env()
    device = check_device(args.device) if args.device else best_device()
    if args.plot:
        try:
            target = resolve_target(args.plot)
        except OSError as err:
            raise UsageError(f'{_shown(args.plot)}: --plot cannot write there: '
                             f'{err.strerror or err}') from None
        if not os.path.isdir(os.path.dirname(os.path.abspath(target))):
            raise UsageError(f'{_shown(args.plot)}: --plot needs an existing folder to '
                             'write into')
    results = run_demo(device=device, steps=args.steps, seed=args.seed,
                       progress=sys.stderr.isatty(), out=out)
    if args.plot:
        from .demo import plot_results
        try:
            plot_results(results, args.plot)
        except ImportError:
            raise CommandError(
                f'{args.plot}: --plot needs matplotlib; install it with '
                "pip install 'fp16utils[plot]'") from None
        except OSError as err:
            raise CommandError(f'{_shown(args.plot)}: could not be written: '
                               f'{err.strerror or err}') from None
        out.write(f'wrote {_shown(args.plot)}\n')
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of the ``fp16utils`` command."""
    from .. import __version__

    parser = _Parser(prog=PROG, description=paragraph(MAIN_DESCRIPTION), epilog=MAIN_EPILOG,
                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument('--version', action='version', version=f'{PROG} {__version__}')
    sub = parser.add_subparsers(dest='command', metavar='COMMAND', parser_class=_Parser)

    def command(name: str) -> argparse.ArgumentParser:
        text = HELP[name]
        return sub.add_parser(name, help=text.summary, description=paragraph(text.description),
                              epilog=text.epilog,
                              formatter_class=argparse.RawDescriptionHelpFormatter)

    demo = command('demo')
    demo.add_argument('--steps', type=_positive_int, default=100,
                      help='timed steps per mode (default: 100)')
    demo.add_argument('--device', default=None, help='device (default: the best present)')
    demo.add_argument('--seed', type=_seed, default=0,
                      help='seed of the data and the initial weights, the same for every '
                           "mode (default: 0; torch's range: -2**63 to 2**64-1)")
    demo.add_argument('--plot', metavar='FILE.png', default=None,
                      help='draw loss and loss scale per step (needs matplotlib)')
    demo.set_defaults(func=cmd_demo)

    command('env').set_defaults(func=cmd_env)

    migrate = command('migrate')
    migrate.add_argument('config', help='the 0.x config (.py, .json, .yaml); a .py one is executed')
    migrate.add_argument('-o', '--output',
                         help='write here (atomically; - is stdout) instead of stdout')
    migrate.add_argument('--amp', action='store_true',
                         help='turn the optimizer wrapper(s) into AmpOptimWrapper')
    migrate.add_argument('--dtype', choices=('float16', 'bfloat16', 'auto'), default=None,
                         help="with --amp: the low-precision dtype ('auto': the native one "
                              'of the device, picked when the wrapper is built); ignored, '
                              'with a warning, for a wrapper that already uses fp16')
    migrate.add_argument('--plugin', action='store_true',
                         help="write a config for MMEngine's Runner with fp16utils' plug-in "
                              '(a named constructor, e.g. layer-wise decay, is kept)')
    migrate.add_argument('--codebase', choices=CODEBASES, default=None, metavar='NAME',
                         help="the codebase the config belongs to, whose rules for the fp16 "
                         f"key are followed: {', '.join(CODEBASES)} (default: told from "
                         "the config's path and contents)")
    migrate.add_argument('--faithful', action='store_true',
                         help="write values with mmcv's meaning where MMEngine reads the "
                         "same value otherwise ('dynamic' loss scale as mmcv's numbers), "
                         "and DeepSpeed's defaults for the fp16 keys a DeepSpeed loss "
                         "scale leaves out")
    migrate.add_argument('--strict', action='store_true',
                         help='fail (exit 1) when something cannot be converted safely')
    migrate.set_defaults(func=cmd_migrate)

    scan = command('scan')
    scan.add_argument('path', help='a directory or a .py file')
    scan.add_argument('--fix', action='store_true', help='rewrite the imports to fp16utils')
    scan.add_argument('--dry-run', action='store_true',
                      help='print the diff --fix would apply, write nothing')
    scan.add_argument('--json', action='store_true', help='machine-readable output')
    scan.set_defaults(func=cmd_scan)

    run = command('run')
    run.add_argument('--dtype', choices=('float16', 'bfloat16'), default=None,
                     help='low-precision dtype of the hooks and wrap_fp16_model (default: '
                          'float16; a config\'s own dtype wins)')
    run.add_argument('--backend', choices=('native', 'legacy'), default=None,
                     help='default backend (default: native on torch >= 1.6)')
    run.add_argument('script', metavar='SCRIPT', help='the Python script to run')
    run.add_argument('args', metavar='ARGS', nargs=argparse.REMAINDER,
                     help="the script's own arguments, optional")
    run.set_defaults(func=cmd_run)

    add_doctor_arguments(command('doctor'))

    bench = command('bench')
    bench.add_argument('name', metavar='NAME',
                       help='the benchmark: decorators, train_step or evaluation')
    bench.add_argument('rest', metavar='ARGS', nargs=argparse.REMAINDER,
                       help="the benchmark's own arguments, optional (see: fp16utils bench "
                            'NAME --help)')
    bench.set_defaults(func=cmd_bench)
    return parser


def _integer(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f'{text!r} is not an integer') from None


def _seed(text: str) -> int:
    """A ``--seed``: an integer that ``torch.manual_seed`` takes."""
    value = _integer(text)
    low, high = -2**63, 2**64 - 1  # torch.manual_seed's range
    if not low <= value <= high:
        raise argparse.ArgumentTypeError(
            f'{value} is outside the seeds torch takes: an integer from {low} to {high}')
    return value


def _positive_int(text: str) -> int:
    value = _integer(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f'{value} is not >= 1')
    return value


def main(argv: Optional[Sequence[str]] = None, out: Optional[TextIO] = None) -> int:
    """Run the ``fp16utils`` command line; return the exit code.

    Args:
        argv: The arguments (default: ``sys.argv[1:]``).
        out: Where normal output goes (default: stdout); errors go to stderr, one line.

    Returns:
        0 on success, 1 on findings or failure, 2 on a usage error, 130 when interrupted.

    Example:
        >>> import pathlib, tempfile
        >>> d = pathlib.Path(tempfile.mkdtemp())
        >>> _ = (d / 'm.py').write_text('from mmcv.runner import auto_fp16' + chr(10))
        >>> main(['scan', '--fix', str(d)])  # doctest: +ELLIPSIS
        fixed imports in /.../m.py
        changed 1 file(s)
        0
    """
    if out is None:
        out = sys.stdout
        reconfigure = getattr(out, 'reconfigure', None)
        if reconfigure is not None:  # a terminal that is not UTF-8: \xe9 for what it lacks
            reconfigure(errors='backslashreplace')
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
        if not getattr(args, 'func', None):
            parser.print_help(sys.stderr)
            return 2
        return args.func(args, out)
    except UsageError as err:
        sys.stderr.write(f'{PROG}: error: {one_line(err)}\n')
        return 2
    except CommandError as err:
        sys.stderr.write(f'{PROG}: error: {one_line(err)}\n')
        return 1
    except KeyboardInterrupt:
        sys.stderr.write(f'{PROG}: interrupted\n')
        return 130
    except BrokenPipeError:  # the reader went away (``fp16utils scan . | head``)
        _silence_stdout()
        return 1
    except (OSError, RecursionError, MemoryError) as err:
        sys.stderr.write(f'{PROG}: error: {type(err).__name__}: {one_line(err)}\n')
        return 1


def _silence_stdout() -> None:
    """Point stdout at /dev/null so that Python's exit-time flush does not fail again."""
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
    except (OSError, ValueError, AttributeError):  # not a real file (a test's StringIO)
        pass


if __name__ == '__main__':  # pragma: no cover
    sys.exit(main())
