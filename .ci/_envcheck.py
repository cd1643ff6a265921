"""Check a tier's virtualenv: the pinned distributions are there and the modules import.

Run by ``.ci/_tier.sh`` with the virtualenv's interpreter::

    _envcheck.py --root ROOT [--dist NAME==VERSION ...] [--path DIR ...]
                 [--import MODULE ...] [--project] [--exec CODE ...]

``--dist``: the distribution is installed at that version (a local label such as
``+cpu`` is ignored). ``--path``: put DIR first on ``sys.path`` before importing
(the consumer tier's stand-ins). ``--import``: the module imports. ``--project``:
``fp16utils`` imports from ROOT, as the tier's tests will import it. ``--exec``:
the Python statements run without an exception.
Exit 0 when all hold; otherwise 1, the last line saying what does not.
"""

import argparse
import importlib
import os
import sys
import traceback


def main() -> int:
    """Run the checks given on the command line; 0 when they all pass."""
    parser = argparse.ArgumentParser()
    parser.add_argument('--root', required=True)
    parser.add_argument('--dist', action='append', default=[])
    parser.add_argument('--path', action='append', default=[])
    parser.add_argument('--import', dest='modules', action='append', default=[])
    parser.add_argument('--project', action='store_true')
    parser.add_argument('--exec', dest='code', action='append', default=[])
    args = parser.parse_args()

    from importlib import metadata

    for pin in args.dist:
        name, _, wanted = pin.partition('==')
        try:
            version = metadata.version(name)
        except metadata.PackageNotFoundError:
            print(f'{name} is not installed (the tier pins {pin})')
            return 1
        if version.split('+')[0] != wanted:
            print(f'{name} {version} is installed; the tier pins {pin}')
            return 1

    root = os.path.realpath(args.root)
    sys.path[:0] = [os.path.realpath(p) for p in args.path] + [root]
    modules = list(args.modules) + (['fp16utils'] if args.project else [])
    for name in modules:
        try:
            module = importlib.import_module(name)
        except BaseException as exc:  # noqa: B036 - a SystemExit in an import is a failure too
            traceback.print_exc()
            print(f'import {name} fails: {type(exc).__name__}: {exc}'.replace('\n', ' '))
            return 1
        if name == 'fp16utils' and args.project:
            where = os.path.realpath(getattr(module, '__file__', '') or '')
            if not where.startswith(root + os.sep):
                print(f'fp16utils imports from {where}, not from {root}')
                return 1
    for code in args.code:
        try:
            exec(code, {})
        except BaseException as exc:  # noqa: B036 - as above
            traceback.print_exc()
            print(f'{code!r} fails: {type(exc).__name__}: {exc}'.replace('\n', ' '))
            return 1
    print('ok: ' + ', '.join(args.dist + modules + args.code))
    return 0


if __name__ == '__main__':
    sys.exit(main())
