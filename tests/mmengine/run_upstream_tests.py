"""Run MMEngine's own optimizer-wrapper tests against the plug-in's classes (a manual step).

MMEngine's package on PyPI ships no tests, so this needs a source checkout of
open-mmlab/mmengine at the tag of the installed version (v0.10.7)::

    git clone --depth 1 -b v0.10.7 https://github.com/open-mmlab/mmengine /tmp/mmengine-src
    ~/.cache/fp16utils/mmengine/bin/python tests/mmengine/run_upstream_tests.py /tmp/mmengine-src

The test files are copied into a temporary folder (never into this repository), next
to a ``conftest.py`` that puts the plug-in's classes in place of MMEngine's under
``mmengine.optim`` (``OptimWrapper``, ``AmpOptimWrapper``, ``OptimWrapperDict``,
``DefaultOptimWrapperConstructor``) before the tests import them; pytest then runs
them and this script prints which failed. docs/reference/differences-mmengine.md says
why each expected failure differs. It needs the tests' own extra dependencies
(``parameterized``); tests that need CUDA or apex skip as upstream.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

FILES = ('tests/test_optim/test_optimizer/test_optimizer_wrapper.py',
         'tests/test_optim/test_optimizer/test_optimizer_wrapper_dict.py',
         'tests/test_optim/test_optimizer/test_optimizer.py')

CONFTEST = '''
import mmengine.optim as mo
import mmengine.optim.optimizer as moo
import fp16utils.mmengine as plugin

SWAPS = dict(OptimWrapper=plugin.Fp16utilsOptimWrapper,
             AmpOptimWrapper=plugin.Fp16utilsAmpOptimWrapper,
             OptimWrapperDict=plugin.Fp16utilsOptimWrapperDict,
             DefaultOptimWrapperConstructor=plugin.Fp16utilsOptimWrapperConstructor)
for module in (mo, moo):
    for name, cls in SWAPS.items():
        setattr(module, name, cls)
'''


def main(argv: list[str]) -> int:
    if len(argv) != 1 or not Path(argv[0], FILES[0]).is_file():
        print(__doc__)
        return 2
    source = Path(argv[0])
    with tempfile.TemporaryDirectory(prefix='mmengine-own-tests-') as tmp:
        for name in FILES:
            if Path(source, name).is_file():
                shutil.copy(Path(source, name), tmp)
        Path(tmp, 'conftest.py').write_text(CONFTEST)
        root = str(Path(__file__).resolve().parents[2])
        proc = subprocess.run(
            [sys.executable, '-m', 'pytest', '-q', '-rfs', '-p', 'no:cacheprovider', tmp],
            env={**__import__('os').environ, 'PYTHONPATH': root}, check=False)
    return proc.returncode


if __name__ == '__main__':
    sys.exit(main(sys.argv[1:]))
