"""Run a Python file as ``__main__`` exactly as ``python SCRIPT`` does (``fp16utils run``).

Standard library only: ``fp16utils run`` imports it before anything else.
"""

from __future__ import annotations

import builtins
import importlib.machinery
import os
import runpy
import sys
import traceback
import types
import zipfile
from typing import Sequence

from .._args.keys import UnknownKeyError

__all__ = ['run_script']


def run_script(script: str, argv: Sequence[str]) -> int:
    """Run ``script`` as ``python SCRIPT *argv`` would; return its exit code."""
    # As python does: sys.argv[0] as typed, __file__ absolute but links kept, and
    # sys.path[0] the folder of the real file. A traceback starts at the script's frame;
    # a misspelt config key (UnknownKeyError) is one line.
    path = script if os.path.isabs(script) else os.path.join(os.getcwd(), script)
    folder = os.path.dirname(os.path.realpath(script))
    saved_argv, saved_path0 = sys.argv, sys.path[0] if sys.path else None
    sys.argv = [script, *argv]
    if sys.path:
        sys.path[0] = folder
    else:
        sys.path.append(folder)
    try:
        if zipfile.is_zipfile(path):
            runpy.run_path(path, run_name='__main__')  # an application zip: its __main__.py
        else:
            _run_as_main(path)
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        sys.stderr.write(f'{stop.code}\n')
        return 1
    except UnknownKeyError as err:  # a misspelt config key: the one line that names it
        sys.stderr.write(f'fp16utils: error: {err}\n')
        return 1
    except Exception as err:  # noqa: BLE001 - reported as Python reports it
        tb = err.__traceback__
        while tb is not None and tb.tb_frame.f_code.co_filename != path:
            tb = tb.tb_next
        sys.stderr.flush()
        traceback.print_exception(type(err), err, tb or err.__traceback__, file=sys.stderr)
        return 1
    finally:
        sys.argv = saved_argv
        if saved_path0 is not None:
            sys.path[0] = saved_path0
    return 0


def _run_as_main(path: str) -> None:
    """Execute ``path`` as the ``__main__`` module; unlike ``runpy``, ``sys.argv[0]`` stays."""
    with open(path, 'rb') as file:
        source = file.read()
    code = compile(source, path, 'exec', dont_inherit=True)
    module = types.ModuleType('__main__')
    module.__dict__.update(__file__=path, __cached__=None, __package__=None, __spec__=None,
                           __loader__=importlib.machinery.SourceFileLoader('__main__', path),
                           __builtins__=builtins)
    saved = sys.modules.get('__main__')
    sys.modules['__main__'] = module
    try:
        exec(code, module.__dict__)
    finally:
        if saved is None:
            sys.modules.pop('__main__', None)
        else:
            sys.modules['__main__'] = saved
