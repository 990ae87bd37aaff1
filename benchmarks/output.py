"""Where a run of `python -m benchmarks.run` writes, checked before the first section runs, and
how its figures join the results already recorded there.

    <out>/results{suffix}.json   every figure; results{suffix}.md the tables; the PNG plots
    (suffix: _gpu with --platform=gpu, _NAME with --target=NAME)

- A folder that is a file, that cannot be made or written, or a results file that is not one this
  benchmark wrote, is refused in one line before anything runs (minutes of sections are not
  spent on a run whose figures could not be kept).
- A run of some of the sections recorded in results.json merges into it: the sections it ran
  replace theirs, the others stay, and the file records which run each section came from
  (`merged`; the tables' header says so). A run of every recorded section replaces the file.
- `--target` without `--out` writes nothing: its tables are printed, and the checkout keeps only
  the results recorded in it (a compile-only run for hardware that is not here is not one of
  them); `--out=DIR` keeps its files there.
"""

import dataclasses
import json
import os
import pathlib
import tempfile

from shard_parity import UsageError


@dataclasses.dataclass(frozen=True)
class Output:
    folder: pathlib.Path | None  # None: write nothing (--target without --out)
    suffix: str
    recorded: dict | None  # the results.json already there, if any

    @property
    def json(self) -> pathlib.Path:
        return self.folder / f'results{self.suffix}.json'

    @property
    def md(self) -> pathlib.Path:
        return self.folder / f'results{self.suffix}.md'


def _probe(folder: pathlib.Path, out: str) -> None:
    try:
        fd, probe = tempfile.mkstemp(dir=folder, prefix='.benchmarks-probe-')
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        raise UsageError(f'--out={out}: cannot write in {folder} ({e.strerror})') from e


def check(out: str, given: bool, suffix: str, target: str | None) -> Output:
    """The run's outputs, checked (module docstring); raises UsageError with the one line."""
    if target and not given:
        return Output(None, suffix, None)
    folder = pathlib.Path(os.path.abspath(os.path.expanduser(out)))  # 'a/b/..' is 'a'
    existing = next(p for p in (folder, *folder.absolute().parents) if p.exists())
    if not existing.is_dir():
        raise UsageError(f'--out={out}: {existing} is a file, not a folder')
    _probe(existing, out)
    found = Output(folder, suffix, None)
    for path in (found.json, found.md):
        if path.is_dir():
            raise UsageError(f'--out={out}: {path} is a folder, where the results file goes')
    if not found.json.exists():
        return found
    try:
        recorded = json.loads(found.json.read_text())
        assert isinstance(recorded, dict) and 'machine' in recorded
    except (OSError, ValueError, AssertionError) as e:
        raise UsageError(
            f'--out={out}: {found.json} is not a results file of this benchmark '
            f'({type(e).__name__}): move it away or give another --out'
        ) from e
    return Output(folder, suffix, recorded)


def sections_of(results: dict, known) -> list[str]:
    return [k for k in known if k in results]


def merge(recorded: dict | None, results: dict, known) -> tuple[dict, list[str]]:
    """(what to write, the recorded sections kept): `results` alone when it ran every section
    `recorded` holds; else `recorded` with this run's sections replaced and the run noted under
    `merged` (each earlier note keeps only the sections still its own)."""
    ran, old = sections_of(results, known), sections_of(recorded or {}, known)
    if not recorded or set(ran) >= set(old):
        return results, []
    out = dict(recorded)
    out.update({s: results[s] for s in ran})
    notes = [
        n | {'sections': [s for s in n['sections'] if s not in ran]}
        for n in recorded.get('merged', [])
    ]
    note = {'sections': ran, 'command': results['command'], 'machine': results['machine']}
    out['merged'] = [n for n in notes if n['sections']] + [note]
    return out, [s for s in old if s not in ran]
