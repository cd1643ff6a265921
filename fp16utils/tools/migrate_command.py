"""``fp16utils migrate``: a 0.x config file to the 1.x style, written atomically."""

from __future__ import annotations

import argparse
import os
import sys
import warnings
from pathlib import Path
from typing import TextIO

from ..migrate._atomic import atomic_write, resolve_target
from ..migrate.config_files import format_config, load_config
from ..migrate.errors import PROG, CommandError, UsageError, one_line
from ..migrate.errors import shown_path as _shown

__all__ = ['cmd_migrate']



def cmd_migrate(args: argparse.Namespace, out: TextIO) -> int:
    """Convert a 0.x config file to the 1.x style."""
    from ..migrate import ConfigConversionError, enable_amp, migrate_config

    if args.dtype and not args.amp:
        raise UsageError('--dtype only applies with --amp (it sets the AMP dtype)')
    to_file = args.output not in (None, '-')
    if to_file:
        _check_output(args.config, args.output)
    with warnings.catch_warnings(record=True) as read:
        warnings.simplefilter('always')
        cfg = load_config(args.config)
    shown = _shown(args.config)
    for notice in read:  # _deprecation_ notes: said, not problems of the conversion
        sys.stderr.write(f'{shown}: note: {one_line(notice.message)}\n')
    try:
        report = migrate_config(cfg, plugin=args.plugin, codebase=args.codebase,
                                path=args.config, faithful=args.faithful)
    except (ConfigConversionError, TypeError, ValueError, AttributeError) as err:
        raise CommandError(f'{shown}: cannot be converted: {one_line(err)}; nothing written'
                           ) from None
    converted, problems = report.config, report.problems
    for note in report.notes:
        sys.stderr.write(f'{shown}: note: {one_line(note)}\n')
    if args.amp:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter('always')
            try:
                converted = enable_amp(converted, dtype=args.dtype)
            except (TypeError, ValueError, AttributeError) as err:
                raise CommandError(f'{shown}: {one_line(err)}') from None
        problems += [str(w.message) for w in caught]
    for problem in problems:
        sys.stderr.write(f'{shown}: warning: {one_line(problem)}\n')
    if problems and args.strict:
        raise CommandError(f'{shown}: {len(problems)} problem(s) found and --strict given')
    try:
        body = format_config(converted)
    except ValueError as err:
        raise CommandError(f'{shown}: the converted config cannot be written as a file '
                           f'that loads back: {one_line(err)}; nothing written') from None
    name = Path(args.config).name.replace('\n', ' ').replace('\r', ' ')
    text = f'# Converted from {_shown(name)} by `{PROG} migrate`.\n' + body
    if to_file:
        try:
            atomic_write(args.output, text.encode('utf-8'))
        except OSError as err:
            raise CommandError(f'{_shown(args.output)}: could not be written: '
                               f'{err.strerror or err}; nothing written') from None
        out.write(f'wrote {_shown(args.output)}\n')
    else:
        out.write(text)
    return 0


def _check_output(config: str, output: str) -> None:
    """Refuse an ``-o`` that is the input config itself (or a link to it)."""
    try:
        same = os.path.exists(config) and os.path.samefile(config, resolve_target(output))
    except OSError:  # the write reports what is wrong with it
        same = False
    if same:
        raise UsageError(f'{_shown(output)}: -o is the input config itself; write the 1.x '
                         'config to a new file (or - for stdout) and keep the 0.x one')
