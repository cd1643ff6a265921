"""What the adversarial tests share: run the command in-process or as a real process."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from types import SimpleNamespace
from typing import Optional

import pytest

from fp16utils.tools import cli

FIXTURES = Path(__file__).resolve().parent.parent / 'fixtures' / 'legacy_codebase'
CONFIGS = FIXTURES / 'configs'


def call(*args: str, out: Optional[io.StringIO] = None) -> SimpleNamespace:
    """``fp16utils ARGS`` in this process: returncode, stdout, stderr."""
    out = io.StringIO() if out is None else out
    err = io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = cli.main(list(args), out)
    return SimpleNamespace(returncode=code, stdout=out.getvalue(), stderr=err.getvalue())


def run(*args: str, env: Optional[dict] = None, **kw) -> subprocess.CompletedProcess:
    """``python -m fp16utils ARGS`` as a real process."""
    full = dict(os.environ, OMP_NUM_THREADS='1')
    full.pop('FP16UTILS_BACKEND', None)
    full.update(env or {})
    return subprocess.run([sys.executable, '-m', 'fp16utils', *args], capture_output=True,
                          text=True, env=full, timeout=60, **kw)


def one_line_error(proc, code: int, *needles: str) -> str:
    """Assert the exit code and that stderr is one ``fp16utils: error:`` line; return it."""
    assert proc.returncode == code, (proc.returncode, proc.stdout, proc.stderr)
    assert 'Traceback' not in proc.stderr, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1, proc.stderr
    assert lines[0].startswith('fp16utils: error: '), lines[0]
    for needle in needles:
        assert needle in lines[0], lines[0]
    return lines[0]


def tree(root: Path) -> dict[str, bytes]:
    """Every file under ``root`` (links as their target's bytes), by relative path."""
    return {str(p.relative_to(root)): (p.read_bytes() if p.is_file() else b'<not a file>')
            for p in sorted(root.rglob('*')) if not p.is_dir() or p.is_symlink()}


def denied(*args, **kwargs):
    """Stands in for a call that the OS refuses (the tests may run as root)."""
    raise PermissionError(13, 'Permission denied', str(args[0]) if args else None)


def deny_temp_files(monkeypatch) -> None:
    """Simulate a folder no file can be created in (a read-only folder)."""
    monkeypatch.setattr(tempfile, 'mkstemp', denied)


def deny_listing(monkeypatch, name: str) -> None:
    """Simulate a folder called ``name`` that cannot be listed (permission denied)."""
    real = os.scandir

    def scandir(path='.'):
        if os.fspath(path).endswith(name):
            denied(os.fspath(path))
        return real(path)

    monkeypatch.setattr(os, 'scandir', scandir)


def make_odd(path: Path, kind: str) -> Path:
    """Put at ``path`` something that is not a regular file: missing, dir, dangling, loop, fifo."""
    if kind in ('dir', 'folder'):
        path.mkdir()
    elif kind == 'dangling':
        os.symlink(path.parent / 'nowhere' / path.name, path)
    elif kind == 'loop':
        os.symlink(path, path)
    elif kind == 'fifo':
        if not hasattr(os, 'mkfifo'):
            pytest.skip('no FIFOs on this system')
        os.mkfifo(path)
    return path
