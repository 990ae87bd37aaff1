"""Claim: the project installs one top-level name, `shard_parity`, so it lives beside the
ecosystem: Hugging Face's `datasets` keeps its name, and every command runs from any directory as
`python -m shard_parity.<name>` (in a checkout, `python -m <name>` too).

    pip install -e . && python -m pytest parity_tests/test_install.py -m ''
"""

import concurrent.futures
import configparser
import importlib.metadata
import os
import pathlib
import re
import shutil
import subprocess
import sys
import zipfile

import pytest

from parity_tests.helpers import REPO

DIST = 'shard-parity'


def installed(name: str):
    try:
        return importlib.metadata.distribution(name)
    except importlib.metadata.PackageNotFoundError:
        return None


def top_level(names) -> set[str]:
    """The top-level import names among file paths of a distribution."""
    tops = {n.split('/')[0] for n in names}
    return {t.removesuffix('.py') for t in tops if not t.endswith(('.dist-info', '.data'))}


def test_setup_cfg_installs_only_shard_parity():
    config = configparser.ConfigParser()
    config.read(pathlib.Path(REPO) / 'setup.cfg')
    packages = config['options']['packages'].split()
    assert 'shard_parity.inspector' in packages, packages  # the check reads the real list
    assert {p.split('.')[0] for p in packages} == {'shard_parity'}, packages
    for line in config['options']['package_dir'].strip().splitlines():
        package, folder = (part.strip() for part in line.split('='))
        assert package.startswith('shard_parity.') and (pathlib.Path(REPO) / folder).is_dir()
    assert top_level(['shard_parity/mesh.py', 'datasets/mnist.py']) == {'shard_parity', 'datasets'}


def test_the_installed_distribution_has_one_top_level_name():
    dist = installed(DIST)
    if dist is None:
        pytest.skip(f'{DIST} is not installed (pip install -e .)')
    assert (dist.read_text('top_level.txt') or '').split() == ['shard_parity'], (
        f'top_level.txt of the installed {DIST}: {dist.read_text("top_level.txt")!r}; '
        'an install from before the one name? Reinstall: pip install -e .'
    )


def outside_env() -> dict:
    """The environment of a command run outside the checkout: the data folder as an absolute
    path, nothing of the checkout on PYTHONPATH."""
    env = {k: v for k, v in os.environ.items() if k != 'PYTHONPATH'}
    if 'SHARD_PARITY_DATA_DIR' in env:
        env['SHARD_PARITY_DATA_DIR'] = os.path.abspath(env['SHARD_PARITY_DATA_DIR'])
    return env


def train_elsewhere(tmp_path) -> subprocess.CompletedProcess:
    """`python -m shard_parity.explicit.train` for 2 steps, from a folder outside the checkout."""
    if installed(DIST) is None:
        pytest.skip(f'{DIST} is not installed (pip install -e .): only a checkout can run it')
    elsewhere = tmp_path / 'elsewhere'
    elsewhere.mkdir()
    flags = ['--model=mlp', '--steps=2', '--cpu_devices=2', '--batch_size=32']
    return subprocess.run(
        [sys.executable, '-m', 'shard_parity.explicit.train', *flags, '--workdir=run'],
        cwd=elsewhere, env=outside_env(), capture_output=True, text=True, timeout=300,
    )  # fmt: skip


@pytest.mark.slow
def test_the_long_command_trains_from_any_directory(tmp_path):
    result = train_elsewhere(tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert '"final": true' in result.stdout and (tmp_path / 'elsewhere' / 'run').is_dir()


@pytest.mark.slow
def test_hugging_face_datasets_keeps_its_name_beside_ours(tmp_path):
    """With Hugging Face's `datasets` installed (CI's first leg installs it), a user's `import
    datasets` from the checkout's root gets theirs, and the train CLI works from elsewhere: it was
    `ImportError: cannot import name 'DataError' from 'datasets'`."""
    hf = installed('datasets')
    if hf is None:
        pytest.skip("Hugging Face's datasets is not installed: pip install datasets")
    where = subprocess.run(
        [sys.executable, '-c', 'import datasets; print(datasets.__file__)'],
        cwd=REPO, env=outside_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert where.returncode == 0, where.stderr[-2000:]
    assert pathlib.Path(where.stdout.strip()) == pathlib.Path(
        hf.locate_file('datasets/__init__.py')
    ), where.stdout
    result = train_elsewhere(tmp_path)
    assert result.returncode == 0, result.stderr[-2000:]
    assert 'datasets' not in result.stderr, result.stderr[-2000:]  # no warning, no clash


@pytest.mark.slow
def test_the_wheel_holds_shard_parity_alone_with_every_subpackage(tmp_path):
    """Built from a copy of the checkout, as pip would: one top-level name, and the mapped
    folders inside it (datasets/, a folder without __init__.py, included)."""
    source = tmp_path / 'source'
    ignore = shutil.ignore_patterns('.*', '__pycache__', 'runs', 'build', '*.egg-info')
    shutil.copytree(REPO, source, ignore=ignore)
    result = subprocess.run(
        [sys.executable, '-m', 'pip', 'wheel', '--no-deps', '-q', '-w', str(tmp_path / 'wheels'),
         str(source)],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    if result.returncode and 'satisfies the requirement setuptools' in result.stderr:
        pytest.skip("pip cannot fetch the build backend (setuptools>=68): no package index")
    assert result.returncode == 0, result.stderr[-2000:]
    (wheel,) = (tmp_path / 'wheels').glob('*.whl')
    names = zipfile.ZipFile(wheel).namelist()
    assert top_level(names) == {'shard_parity'}, sorted(top_level(names))
    for path in (
        'shard_parity/mesh.py',
        'shard_parity/runtime/train.py',
        'shard_parity/auto/train.py',
        'shard_parity/explicit/fsdp.py',
        'shard_parity/typed/__init__.py',
        'shard_parity/inspector/__main__.py',
        'shard_parity/datasets/mnist.py',
        'shard_parity/tools/bisect/cli.py',
        'shard_parity/tools/zoo/tp_pmean.py',
    ):
        assert path in names, path


def readme_commands() -> list[str]:
    """The modules of the README's tools table (`python -m auto.train` (`explicit.`, `typed.`)
    is three), and tools.margins, which the README names beside the claims."""
    text = (pathlib.Path(REPO) / 'README.md').read_text()
    modules = []
    for row in text.splitlines():
        if row.startswith('| `python -m '):
            first = row.split(' | ')[0]
            module = re.match(r'\| `python -m ([\w.]+)', first)[1]
            modules.append(module)
            twins = re.findall(r'`(\w+)\.`', first)  # (`explicit.`, `typed.`)
            modules += [twin + module[module.index('.') :] for twin in twins]
    assert 'python -m tools.margins' in text
    return modules + ['tools.margins']


# The commands whose bare run is a refusal (the others start work: train, bisect and inspect at
# their defaults, fuzz draws, margins runs the fast tier's parity tests); margins too where pytest
# is missing.
REFUSE_NO_ARGUMENTS = {'tools.compare', 'tools.launch', 'auto.generate', 'explicit.generate',
                       'typed.generate'}  # fmt: skip
BLOCK_PYTEST = """
import sys


class NoPytest:  # an environment without the `test` extra
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in ('pytest', '_pytest'):
            raise ModuleNotFoundError(f'No module named {name!r}', name=name)


sys.meta_path.insert(0, NoPytest())
"""


@pytest.mark.slow  # 35 runs, 2 s for each that imports JAX, two at a time: 40 s
def test_every_readme_command_runs_from_any_directory_with_and_without_pytest(tmp_path):
    """By its installed name from a folder outside the checkout: --help exits 0; a bare command
    that is a refusal says so in one line, exit 2; the same where pytest cannot be imported
    (a sitecustomize blocks it), where margins says what it needs in one line. No traceback."""
    if installed(DIST) is None:
        pytest.skip(f'{DIST} is not installed (pip install -e .): only a checkout can run it')
    commands = readme_commands()
    assert REFUSE_NO_ARGUMENTS <= set(commands) and len(commands) == 12, commands
    elsewhere, blocker = tmp_path / 'elsewhere', tmp_path / 'no_pytest'
    elsewhere.mkdir()
    blocker.mkdir()
    (blocker / 'sitecustomize.py').write_text(BLOCK_PYTEST)
    no_pytest = {**outside_env(), 'PYTHONPATH': str(blocker)}

    def run(env, *args):
        return subprocess.run(
            [sys.executable, *args], cwd=elsewhere, env=env, capture_output=True, text=True,
            timeout=120,
        )  # fmt: skip

    assert run(outside_env(), '-c', 'import pytest').returncode == 0  # the block is the change
    assert 'No module named' in run(no_pytest, '-c', 'import pytest').stderr
    runs = []  # (env, command, arguments): --help, and no arguments where that is a refusal
    for env, refusals in ((outside_env(), REFUSE_NO_ARGUMENTS),
                          (no_pytest, REFUSE_NO_ARGUMENTS | {'tools.margins'})):  # fmt: skip
        runs += [(env, c, ['--help']) for c in commands]
        runs += [(env, c, []) for c in commands if c in refusals]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:  # a process a core: half the time
        results = pool.map(lambda r: run(r[0], '-m', f'shard_parity.{r[1]}', *r[2]), runs)
        for (env, command, args), result in zip(runs, results):
            said = (command, args, result.stdout[-1000:] + result.stderr[-2000:])
            assert 'Traceback' not in result.stderr, said
            if args:  # --help: the docstring and the flags
                assert result.returncode == 0 and len(result.stdout.splitlines()) > 10, said
            else:
                printed = [x for x in (result.stdout + result.stderr).splitlines() if x.strip()]
                assert result.returncode == 2 and len(printed) == 1, said
                assert printed[0].startswith('error: '), said
    assert len(runs) == 35 and not list(elsewhere.iterdir())  # nothing written where they ran
    margins = run(no_pytest, '-m', 'shard_parity.tools.margins')
    assert 'pytest, which is not installed: pip install -e' in margins.stderr, margins.stderr
