"""The fuzzer's corpus (python -m tools.fuzz): tools/fuzz/corpus/*.json, one failure found a file,
edited by hand (an entry is marked fixed there), read against one schema, ENTRY and DRAW below,
which both loading and the tests use: a file that breaks it is refused in one line naming the
file and the field (exit 2), before anything runs.

    {"draw": {<every field of tools/fuzz/draws.py's Draw; "trained", "accumulation", "zero1",
              "remat", "partial" and "variable_length" may be left out: 0, 1, false, null, 0,
              false>},
     "twins": ["typed"],                  # of auto, explicit, typed: those it concerns
     "status": "fixed",                   # fixed: must pass now; known: an open bug
     "reason": "what failed, and why",
     "match": "regular expression",       # a known entry's: a new failure's message that hits it
     "target": "tpu-v5e-8",               # optional: it replays under --target only, on this slice
     "found": "2026-12-05 tools.fuzz --seed=5", "fixed": "2026-12-05"}   # optional notes
"""

import json
import pathlib
import re

from shard_parity import UsageError

from .draws import ORDER, Draw

CORPUS = pathlib.Path(__file__).parent / 'corpus'
TWINS = ('auto', 'explicit', 'typed')  # what an entry concerns: the project's twins, not a zoo's


class CorpusError(UsageError):
    """A corpus file that breaks the schema: bad input, exit 2."""


def choice(*allowed):
    def check(v):
        if v not in allowed:
            raise ValueError(f'expected {" or ".join(map(json.dumps, allowed))}')
        return v

    return check


def whole(low: int):
    def check(v):
        if type(v) is not int or v < low:
            raise ValueError(f'expected a whole number >= {low}')
        return v

    return check


def positive(v):
    if type(v) not in (int, float) or not v > 0:
        raise ValueError('expected a number > 0')
    return v


def boolean(v):
    if type(v) is not bool:
        raise ValueError('expected true or false')
    return v


def text(v):
    if not isinstance(v, str) or not v.strip():
        raise ValueError('expected a non-empty string')
    return v


def regex(v):
    try:
        return re.compile(text(v)) and v
    except re.error as e:
        raise ValueError(f'expected a regular expression ({e})') from None


def mesh(v):
    """'axis:n,...': each axis once, of tools/fuzz/draws.py's ORDER, n >= 1."""
    wrong = ValueError(f'expected "axis:n,..." of {", ".join(ORDER)}, each once, n >= 1')
    parts = [p.split(':') for p in v.split(',')] if isinstance(v, str) else [[]]
    if any(len(p) != 2 or p[0] not in ORDER or not p[1].isdigit() or int(p[1]) < 1
           for p in parts) or len({p[0] for p in parts}) != len(parts):  # fmt: skip
        raise wrong
    return tuple((a, int(n)) for a, n in parts)


def twins(v):
    if not isinstance(v, list) or not v or any(t not in TWINS for t in v):
        raise ValueError(f'expected a non-empty list of {", ".join(map(json.dumps, TWINS))}')
    return v


def anything(v):
    return v  # the draw: checked against DRAW in `entry`


REQUIRED, OPTIONAL = True, False
DRAW = {  # Draw's fields, each required: what the draw's flags are built from
    'model': choice('mlp', 'transformer'), 'mesh': mesh, 'batch': whole(1),
    'layers': whole(1), 'heads': whole(1), 'kv_heads': whole(1), 'embed': whole(1),
    'seq_len': whole(1), 'experts': whole(0), 'k': whole(1), 'capacity': positive,
    'attention': choice('naive', 'fused'), 'microbatches': whole(1),
    'schedule': choice('gpipe', '1f1b', 'interleaved'), 'virtual': whole(1),
    'layout': choice('zigzag', 'contiguous'), 'dtype': choice('float32', 'bfloat16'),
    'reduce_dtype': choice('float32', 'bfloat16'), 'matmul': choice('default', 'high', 'highest'),
}  # fmt: skip
DRAW_OPTIONAL = {  # absent in entries written before them: their defaults
    'trained': (whole(0), OPTIONAL),  # a draw from a trained run's state: 0 if absent
    'accumulation': (whole(0), OPTIONAL),  # K (0: the flag's refusal); 1 if absent
    'zero1': (boolean, OPTIONAL),  # ZeRO-1; false if absent
    'remat': (choice(None, 'none', 'full', 'dots', 'dots_no_batch'), OPTIONAL),  # null: unset
    'partial': (whole(0), OPTIONAL),  # the second step a window of P of K microbatches; 0
    'variable_length': (boolean, OPTIONAL),  # the transformer's documents; false if absent
}
ENTRY = {  # field: (check, required)
    'draw': (anything, REQUIRED),  # an object of DRAW's fields
    'twins': (twins, REQUIRED),
    'status': (choice('fixed', 'known'), REQUIRED),
    'reason': (text, REQUIRED),
    'match': (regex, OPTIONAL),  # required where the status is known
    'target': (text, OPTIONAL),
    'found': (text, OPTIONAL),
    'fixed': (text, OPTIONAL),
}


def fields(where: str, saved, schema: dict) -> dict:
    """`saved` (a JSON object) checked against `schema` ({field: (check, required)}): each
    field's value as its check returns it; CorpusError names `where` and the first field that
    breaks it (an unknown one first: a misspelt field is named as such, not as one missing)."""
    names = ', '.join(f'"{n}"' for n in schema)
    if not isinstance(saved, dict):
        raise CorpusError(f'{where}: {json.dumps(saved)[:40]}: expected an object of {names}')
    unknown = sorted(set(saved) - set(schema))
    if unknown:
        raise CorpusError(f'{where} has "{unknown[0]}", which is no field: expected {names}')
    out = {}
    for name, (check, required) in schema.items():
        if name not in saved:
            if required:
                raise CorpusError(f'{where} has no "{name}": add it')
            continue
        try:
            out[name] = check(saved[name])
        except ValueError as e:
            raise CorpusError(f'{where}: "{name}": {json.dumps(saved[name])[:60]}: {e}') from None
    return out


def entry(path: pathlib.Path, saved) -> dict:
    """One entry, checked against ENTRY and DRAW: {'name', 'draw' (a Draw), 'twins', 'status',
    'reason', and those of 'match', 'target', 'found', 'fixed' it has}."""
    where = display(path)
    out = fields(where, saved, ENTRY)
    if out['status'] == 'known' and 'match' not in out:
        raise CorpusError(f'{where}: "status": "known" needs a "match": the regular expression on '
                          "a failure's message that says a new draw hit this bug")  # fmt: skip
    schema = {**{k: (c, REQUIRED) for k, c in DRAW.items()}, **DRAW_OPTIONAL}
    draw = fields(f'{where}: "draw"', out['draw'], schema)
    return {**out, 'name': path.stem, 'draw': Draw(**draw)}


def load(folder: pathlib.Path | None = None) -> list[dict]:
    """Every entry of `folder` (default tools/fuzz/corpus/), in name order; CorpusError (one line:
    the file, the field, what is expected) for the first file that is no entry."""
    entries = []
    for path in sorted((folder or CORPUS).glob('*.json')):
        try:
            saved = json.loads(path.read_text())
        except (OSError, UnicodeDecodeError) as e:
            raise CorpusError(f'{display(path)} cannot be read ({e}): fix or remove it') from None
        except json.JSONDecodeError as e:
            raise CorpusError(f'{display(path)} is not JSON (line {e.lineno}, column {e.colno}: '
                              f'{e.msg}): fix or remove it') from None  # fmt: skip
        entries.append(entry(path, saved))
    return entries


def display(path: pathlib.Path) -> str:
    """The path as the user can open it: relative to the working folder where it is below it."""
    try:
        return str(path.resolve().relative_to(pathlib.Path.cwd().resolve()))
    except ValueError:
        return str(path)


def known(failure, entries) -> dict | None:
    """The known-open entry a failure (tools/fuzz/judge.py's Failure) is an instance of, if any."""
    for e in entries:
        twin_ok = failure.twin is None or failure.twin in e['twins']
        if e['status'] == 'known' and twin_ok and re.search(e['match'], failure.message):
            return e
    return None
