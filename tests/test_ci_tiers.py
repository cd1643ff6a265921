"""The CI tiers' decisions (.ci/_tier.sh): skip only without a package index, else fail.

Each tier is run for real with pip pointed at a closed local port (no index), or at a
folder that holds the package under other versions only (an index that answers
without the pin); neither downloads anything, so each run takes a second or two.
"""

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
TIERS = {'compat': 'torch', 'consumers': 'mmdet', 'mmengine': 'mmengine',
         'mmcvops': 'mmdet', 'migration': 'mmengine', 'docs': 'mkdocstrings'}


def _have_pip() -> bool:
    return subprocess.run([sys.executable, '-m', 'pip', '--version'],
                          capture_output=True).returncode == 0


pytestmark = pytest.mark.skipif(
    os.name != 'posix' or shutil.which('bash') is None or not _have_pip(),
    reason='the CI tiers are bash scripts that need pip')


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


def _env(cache: Path, **pip: str) -> dict:
    """This environment without pip's settings (and its config files), plus ``pip``."""
    env = {k: v for k, v in os.environ.items() if not k.startswith('PIP_')}
    env.update(PIP_CONFIG_FILE=os.devnull, PYTHON=sys.executable,
               FP16UTILS_VENV_CACHE=str(cache), PIP_DISABLE_PIP_VERSION_CHECK='1')
    env.update(pip)
    return env


def _run_tier(tier: str, env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', str(ROOT / '.ci' / tier)], env=env, cwd=str(ROOT),
                          capture_output=True, text=True, timeout=300)


def _offline(cache: Path) -> dict:
    return _env(cache, PIP_INDEX_URL=f'http://127.0.0.1:{_closed_port()}/simple')


@pytest.mark.parametrize('tier', sorted(TIERS))
def test_a_tier_skips_with_the_reason_when_the_index_cannot_be_reached(tier, tmp_path):
    result = _run_tier(tier, _offline(tmp_path))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'{tier}: skipped: the package index cannot be reached' in result.stdout
    assert 'Connection refused' in result.stdout  # pip's own words, in the reason
    assert 'passed' not in result.stdout and 'FAILED' not in result.stdout
    # Nothing was built: the index is asked before a virtualenv is made.
    assert not any(p.is_dir() for p in tmp_path.iterdir())
    if tier == 'compat':
        assert result.stdout.splitlines()[-1] == 'compat-result: 1.13.1 - - - - skipped'


@pytest.mark.parametrize('tier', sorted(TIERS))
def test_no_index_at_all_is_a_skip_too(tier, tmp_path):
    result = _run_tier(tier, _env(tmp_path, PIP_NO_INDEX='1'))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'{tier}: skipped: the package index cannot be reached' in result.stdout


@pytest.mark.parametrize('tier', sorted(TIERS))
def test_an_index_that_answers_without_the_pin_fails_the_tier(tier, tmp_path):
    links = tmp_path / 'links'
    links.mkdir()
    # Only listed, never downloaded: the name is all pip reads of them.
    links.joinpath(f'{TIERS[tier]}-0.0.1-py3-none-any.whl').touch()
    cache = tmp_path / 'cache'
    result = _run_tier(tier, _env(cache, PIP_NO_INDEX='1', PIP_FIND_LINKS=str(links)))
    assert result.returncode == 1, result.stdout + result.stderr
    assert f'{tier}: FAILED: the package index answered but does not serve' in result.stdout
    assert '0.0.1' in result.stdout and 'skipped' not in result.stdout
    if tier == 'compat':
        assert result.stdout.splitlines()[-1] == 'compat-result: 1.13.1 - - - - failed'


@pytest.mark.parametrize('tier', ['consumers', 'mmengine', 'mmcvops', 'migration', 'docs'])
def test_a_cached_environment_that_does_not_import_is_not_reused(tier, tmp_path):
    venv = tmp_path / tier
    (venv / 'bin').mkdir(parents=True)
    # Looks finished (stamp, pyvenv.cfg) but holds none of the tier's packages.
    venv.joinpath('pyvenv.cfg').write_text(
        f'home = {Path(sys.executable).parent}\ninclude-system-site-packages = false\n')
    venv.joinpath('.fp16utils-tier').write_text('anything\n')
    venv.joinpath('bin', 'python').symlink_to(sys.executable)
    result = _run_tier(tier, _offline(tmp_path))
    # It cannot be rebuilt without an index: a skip that says why, the tests not run.
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'no longer imports what the tier needs' in result.stdout
    assert 'is not installed' in result.stdout or 'is installed; the tier pins' in result.stdout
    assert f'{tier}: skipped: the package index cannot be reached' in result.stdout
    assert 'reusing' not in result.stdout and 'passed' not in result.stdout


def _source(script: str, tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(['bash', '-c', f'. .ci/_tier.sh && {script}'], cwd=str(ROOT),
                          capture_output=True, text=True, timeout=60,
                          env={**_env(tmp_path), **env})


# Abridged from pip 23's output in each case.
LOGS = {
    'refused': "WARNING: Retrying (Retry(total=0, connect=None, read=None, redirect=None, "
               "status=None)) after connection broken by 'NewConnectionError('<pip._vendor."
               "urllib3.connection.HTTPConnection object at 0x7f>: Failed to establish a new "
               "connection: [Errno 111] Connection refused')': /simple/mmengine/\n"
               'ERROR: Could not find a version that satisfies the requirement '
               'mmengine==0.10.7 (from versions: none)\n'
               'ERROR: No matching distribution found for mmengine==0.10.7\n',
    'no-index': 'ERROR: Could not find a version that satisfies the requirement '
                'mmengine==0.10.7 (from versions: none)\n'
                'ERROR: No matching distribution found for mmengine==0.10.7\n',
    'index-versions-offline': 'ERROR: No matching distribution found for torch\n',
    'wrong-pin': 'ERROR: Could not find a version that satisfies the requirement '
                 'mmengine==0.10.99 (from versions: 0.10.6, 0.10.7)\n'
                 'ERROR: No matching distribution found for mmengine==0.10.99\n',
    'build-error': 'error: subprocess-exited-with-error\n'
                   '  python setup.py egg_info did not run successfully.\n'
                   'ERROR: Failed building wheel for mmcv\n',
}


@pytest.mark.parametrize('name, cannot_connect, served_nothing', [
    ('refused', True, True), ('no-index', False, True),
    ('index-versions-offline', False, True), ('wrong-pin', False, False),
    ('build-error', False, False)])
def test_how_a_pip_log_is_read(name, cannot_connect, served_nothing, tmp_path):
    log = tmp_path / 'pip.log'
    log.write_text(LOGS[name])
    result = _source(f'tier_cannot_connect {log}; echo $?; tier_served_nothing {log}; echo $?',
                     tmp_path)
    assert result.stdout.split() == [str(int(not cannot_connect)), str(int(not served_nothing))]


def _old_layout_venv(venv: Path) -> None:
    """What an older checkout's .ci/consumers left: a virtualenv with its own marker."""
    for sub in ('bin', 'lib', 'include'):
        (venv / sub).mkdir(parents=True)
    venv.joinpath('pyvenv.cfg').write_text('include-system-site-packages = true\n')
    venv.joinpath('install.log').write_text('')
    venv.joinpath('.fp16utils-consumers').write_text('mmcv==1.7.2\n')


def test_a_cache_left_by_an_older_checkout_is_rebuilt(tmp_path):
    venv = tmp_path / 'cache' / 'consumers'
    _old_layout_venv(venv)
    result = _source(f'tier_init consumers; VENV={venv}; tier_new_venv; echo made', tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.split()[-1] == 'made'
    assert not venv.joinpath('.fp16utils-consumers').exists()
    assert venv.joinpath('bin', 'python').exists()


def test_a_folder_holding_anything_else_is_refused_and_left_alone(tmp_path):
    venv = tmp_path / 'cache' / 'consumers'
    _old_layout_venv(venv)
    venv.joinpath('notes.txt').write_text('mine\n')
    result = _source(f'tier_init consumers; VENV={venv}; tier_new_venv; echo made', tmp_path)
    assert result.returncode == 1
    assert 'holds notes.txt, so it is not only a virtualenv' in result.stdout
    assert venv.joinpath('notes.txt').read_text() == 'mine\n'
    assert venv.joinpath('.fp16utils-consumers').exists()


# What apt-get says (abridged from Debian 12's) when its mirrors cannot be reached, and
# when they answer without the package.
APT_OFFLINE = ("Err:1 http://deb.debian.org/debian bookworm InRelease\n"
               "  Temporary failure resolving 'deb.debian.org'\n"
               "W: Some index files failed to download. They have been ignored, or old ones "
               "used instead.\n")
APT_ONLINE = 'Hit:1 http://deb.debian.org/debian bookworm InRelease\nReading package lists...\n'
APT_NO_PACKAGE = 'E: Unable to locate package chromium\n'


def _fake_apt(tmp_path: Path, update: str, install: str, installs: bool = False,
              uid: int = 0) -> dict:
    """PATH with an apt-get that prints UPDATE / INSTALL (and maybe installs) and an id."""
    fake = tmp_path / 'bin'
    fake.mkdir()
    update_file, install_file = tmp_path / 'update.txt', tmp_path / 'install.txt'
    update_file.write_text(update)
    install_file.write_text(install)
    chromium = tmp_path / 'chromium'
    put = f'printf "#!/bin/sh\\necho Chromium 1\\n" >{chromium}; chmod +x {chromium}'
    fake.joinpath('apt-get').write_text(
        '#!/bin/sh\n'
        f'echo "$@" >>{tmp_path / "apt-calls.txt"}\n'
        f'case "$1" in update) cat {update_file}; exit 0 ;; esac\n'
        f'cat {install_file}\n' + (f'{put}; exit 0\n' if installs else 'exit 100\n'))
    fake.joinpath('id').write_text(f'#!/bin/sh\necho {uid}\n')
    for name in ('apt-get', 'id'):
        fake.joinpath(name).chmod(0o755)
    return {'PATH': f'{fake}:{os.environ["PATH"]}'}


def _find_chromium(tmp_path: Path, **env: str) -> subprocess.CompletedProcess:
    script = (f'. .ci/_chromium.sh && tier_init docs && tier_chromium {tmp_path}/chromium '
              '&& echo "CHROMIUM=$CHROMIUM" && echo "SKIP=$BROWSER_SKIP"')
    env.setdefault('FP16UTILS_CHROMIUM', '')
    return _source(script, tmp_path, **env)


def test_the_docs_tier_uses_the_chromium_that_is_there(tmp_path):
    chromium = tmp_path / 'chromium'
    chromium.write_text('#!/bin/sh\n')
    chromium.chmod(0o755)
    result = _find_chromium(tmp_path, **_fake_apt(tmp_path, APT_ONLINE, APT_NO_PACKAGE))
    assert result.returncode == 0, result.stdout + result.stderr
    assert f'CHROMIUM={chromium}' in result.stdout.splitlines()
    assert not (tmp_path / 'apt-calls.txt').exists()


def test_the_docs_tier_installs_chromium_with_apt(tmp_path):
    result = _find_chromium(tmp_path, **_fake_apt(tmp_path, APT_ONLINE, 'Setting up chromium',
                                                  installs=True))
    assert result.returncode == 0, result.stdout + result.stderr
    assert 'docs: installed Chromium 1' in result.stdout
    assert f'CHROMIUM={tmp_path / "chromium"}' in result.stdout.splitlines()
    assert 'SKIP=' in result.stdout.splitlines()
    calls = (tmp_path / 'apt-calls.txt').read_text().splitlines()
    assert calls[0] == 'update' and calls[1].startswith('install -y ')
    assert calls[1].endswith(' chromium')


def test_without_apt_mirrors_only_the_browser_check_is_skipped(tmp_path):
    result = _find_chromium(tmp_path, **_fake_apt(tmp_path, APT_OFFLINE, APT_NO_PACKAGE))
    assert result.returncode == 0, result.stdout + result.stderr
    skip = [line for line in result.stdout.splitlines() if line.startswith('SKIP=')]
    assert skip == ["SKIP=apt-get could not reach its mirrors to install chromium "
                    "(Temporary failure resolving 'deb.debian.org')"]
    assert 'FAILED' not in result.stdout and 'docs: skipped' not in result.stdout


def test_an_apt_that_answers_without_chromium_fails_the_tier(tmp_path):
    result = _find_chromium(tmp_path, **_fake_apt(tmp_path, APT_ONLINE, APT_NO_PACKAGE))
    assert result.returncode == 1
    assert f'docs: FAILED: apt-get install chromium failed (log: {tmp_path}/docs-apt.log)' \
        in result.stdout
    assert 'E: Unable to locate package chromium' in result.stdout  # the log's tail
    assert 'CHROMIUM=' not in result.stdout


def test_no_chromium_and_no_way_to_install_it_fails_the_tier(tmp_path):
    result = _find_chromium(tmp_path, **_fake_apt(tmp_path, APT_ONLINE, '', uid=1000))
    assert result.returncode == 1
    assert f'docs: FAILED: no Chromium at {tmp_path}/chromium, and it cannot be installed ' \
           'here (that needs root and apt-get)' in result.stdout
    assert not (tmp_path / 'apt-calls.txt').exists()


def test_a_chromium_named_by_the_environment_must_be_there(tmp_path):
    missing = tmp_path / 'elsewhere' / 'chrome'
    result = _find_chromium(tmp_path, FP16UTILS_CHROMIUM=str(missing),
                            **_fake_apt(tmp_path, APT_ONLINE, '', installs=True))
    assert result.returncode == 1
    assert f'docs: FAILED: FP16UTILS_CHROMIUM={missing} is not a program' in result.stdout
    assert not (tmp_path / 'apt-calls.txt').exists()
