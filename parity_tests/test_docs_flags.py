"""Claim: every flag the docs tell users to pass exists, and the CLI it is passed to lists it under
--help. `--save_initial` (docs/bisect.md) was missing from the train CLI's --help.

Reads README.md and docs/*.md: each command `python -m <twin>.train|generate ...` or
`python -m tools.compare ...` (by its long name shard_parity.<...> too, and compare by its old
one, parity_tests.compare; a shell line, continued by `\\`) is checked against that
CLI's registry (flags.py's TRAIN_CLI and GENERATE_CLI: what --help lists; compare.py's own
flags), and every `--name` anywhere must be a flag some CLI of this project defines. No process
is started."""

import pathlib
import re

from parity_tests.helpers import REPO
from shard_parity.runtime import flags as F

DOCS = [pathlib.Path(REPO) / 'README.md', *sorted((pathlib.Path(REPO) / 'docs').glob('*.md'))]
COMMAND = re.compile(
    r'-m\s+(?:shard_parity\.)?((?:auto|explicit|typed)\.(train|generate)'
    r'|(?:tools|parity_tests)\.(compare))\b([^`\n|;&]*)'
)
FLAG = re.compile(r'(?<![\w-])--(?:\[no\])?([a-z]\w+)')
# Not ours: absl's help flags, XLA's, SLURM's srun and sbatch, and the word in "every setting is
# a --flag".
FOREIGN = {'help', 'helpshort', 'helpfull', 'nodes', 'ntasks', 'signal', 'requeue', 'flag'}


def defined_in(path: str) -> set[str]:
    return set(re.findall(r"DEFINE_\w+\(\s*'(\w+)'", (pathlib.Path(REPO) / path).read_text()))


def registries() -> dict[str, set[str]]:
    return {
        'train': {h.name for h in F.TRAIN_CLI},
        'generate': {h.name for h in F.GENERATE_CLI},
        'compare': defined_in('tools/compare/cli.py'),
    }


def commands(text: str):
    """(CLI, flag names) of each command in `text`."""
    for m in COMMAND.finditer(text.replace('\\\n', ' ')):
        yield m.group(2) or m.group(3), FLAG.findall(m.group(4))


def missing(text: str, known: dict[str, set[str]]) -> list[str]:
    return [f'{cli}: --{name}' for cli, names in commands(text) for name in names
            if name not in known[cli]]  # fmt: skip


def every_flag_defined() -> set[str]:
    files = [p for p in pathlib.Path(REPO).rglob('*.py') if '.venv' not in p.parts]
    names = {n for p in files for n in re.findall(r"DEFINE_\w+\(\s*'(\w+)'", p.read_text())}
    # and argparse's (tools.margins, benchmarks.numerics)
    names |= {n for p in files for n in re.findall(r"add_argument\(\s*'--(\w+)'", p.read_text())}
    # the test suite's own options (conftest.py: --exhaustive, --margins) are flags of it too
    tests = re.findall(r"addoption\(\s*'--(\w+)'", (pathlib.Path(REPO) / 'parity_tests/conftest.py').read_text())
    return names | set(F.TRAIN) | set(tests)  # the training flags: one per config field


def test_every_flag_in_a_documented_command_is_in_that_clis_help():
    known = registries()
    planted = 'python -m auto.train --model=mlp \\\n    --save_initial && python -m auto.generate'
    assert missing(planted, {**known, 'train': known['train'] - {'save_initial'}}) == [
        'train: --save_initial'
    ]  # the check can fail, continued lines included
    for compare in ('tools.compare', 'shard_parity.tools.compare', 'parity_tests.compare'):
        assert missing(f'python -m {compare} A B --nosuch', known) == ['compare: --nosuch']
    assert missing('python -m shard_parity.auto.train --nosuch', known) == ['train: --nosuch']
    found = {path.name: list(commands(path.read_text())) for path in DOCS}
    assert sum(map(len, found.values())) >= 15, found  # the regex still finds the commands
    assert {path.name: missing(path.read_text(), known) for path in DOCS} == {
        path.name: [] for path in DOCS
    }


def test_every_flag_the_docs_name_exists_and_the_clis_own_are_in_their_help():
    defined, listed = every_flag_defined(), set().union(*registries().values())
    ours = defined_in('shard_parity/runtime/flags.py') | set(F.TRAIN)
    for path in DOCS:
        for name in set(FLAG.findall(path.read_text())) - FOREIGN:
            if name.startswith('xla_') or (name.startswith('no') and name[2:] in defined):
                continue
            assert name in defined, f'{path.name}: --{name} is no flag of this project'
            assert name not in ours or name in listed, f'{path.name}: --{name} is not in --help'
