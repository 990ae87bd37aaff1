"""The expectation against a compiled program, row by row: per (kind, mesh axes, phase) the bytes a
step the records expect beside those the compiled explicit step moves (`totals`,
`program_totals`), and, where they differ, why.

A row differs for one of two reasons. Either the compiler did what it is known to do with what
was written, and the program shows it: each collective carries `stands_for`, the parts of it
that do the work of another written collective, with the mechanism found in its HLO
(inspector/mechanisms.py: f32 moved in bf16 for a DEFAULT-precision dot, an all-gather done as
an all-reduce of zeros, a reduce-scatter as an all-reduce and a slice, a padded reduce-scatter).
Counting each such part as what it stands for gives the bytes *as written*; a row whose bytes
as written equal the expectation is `explained`, with those mechanisms as its reasons. Or
nothing found explains it: `differs`, a surprise (a bug planted in a twin stays one). `rows()`
returns the verdicts; `print_expected` prints them under the expectation's records.
"""

import numpy as np

from .hlo_module import ITEMSIZE

MATCHES, EXPLAINED, DIFFERS = 'matches', 'explained', 'differs'


def totals(records, twin: str = 'explicit') -> dict:
    """{(kind, axes, phase): bytes per step} of the records `twin` writes: what the tests
    compare with the compiled program's `program_totals`."""
    out = {}
    for r in records:
        r = r if isinstance(r, dict) else r.json()
        if twin in r['twins'] and r['total']:
            key = (r['kind'], tuple(r['axes']), r['phase'])
            out[key] = out.get(key, 0) + r['total']
    return out


def _key(op: dict, kind: str | None = None) -> tuple:
    return (kind or op['kind'], tuple(op['axes'] or ()), op['phase'])


def _bytes(op: dict) -> int:
    """Its operands' bytes, scalars (the metrics, the global norm's partial sums) left out."""
    return sum(int(np.prod(s)) * ITEMSIZE[d] for s, d in zip(op['shapes'], op['dtypes']) if len(s))


def program_totals(ops, as_written: bool = False) -> dict:
    """{(kind, axes, phase): bytes per step} of a compiled program's collectives, scalars left
    out: each operand's bytes x its op's trips. `as_written`: each part an op `stands_for`
    counted as the collective it stands for (its kind, its bytes), the rest as the op itself."""
    out = {}

    def add(key, b):
        out[key] = out.get(key, 0) + b

    for op in ops:
        own = _bytes(op)
        if own and as_written:
            for part in op.get('stands_for', []):
                own -= part['compiled_bytes']
                add(_key(op, part['kind']), part['bytes'] * op['trip_count'])
        if own:
            add(_key(op), own * op['trip_count'])
    return out


def _reasons(ops, key) -> list[str]:
    """One line per mechanism behind the parts that leave or join row `key`: its reason (each
    op's own names the HLO ops it was read from; the first is shown) and how many ops share it."""
    found = {}
    for op in ops:
        for part in op.get('stands_for', []):
            if key in (_key(op), _key(op, part['kind'])):
                found.setdefault(part['mechanism'], []).append((op['name'], part['reason']))
    out = []
    for parts in found.values():
        first, why = parts[0]
        others = sorted({n for n, _ in parts} - {first})
        more = f' (and {len(others)} more like it: {", ".join(others[:3])}' + (
            ', ...)' if len(others) > 3 else ')'
        )
        out.append(f'{first}: {why}' + (more if others else ''))
    return out


def rows(records, ops, twin: str = 'explicit') -> list[dict]:
    """Per (kind, axes, phase) of `twin`'s expectation and compiled program: the bytes of each,
    those as written, and the verdict (`matches`, `explained` with its reasons, or `differs`)."""
    want, got = totals(records, twin), program_totals(ops)
    written = program_totals(ops, as_written=True)
    out = []
    for key in sorted(set(want) | set(got) | set(written), key=str):
        w, g, a = want.get(key, 0), got.get(key, 0), written.get(key, 0)
        if w == g == a == 0:
            continue
        verdict = MATCHES if w == g else EXPLAINED if w == a else DIFFERS
        out.append({
            'kind': key[0], 'axes': list(key[1]), 'phase': key[2], 'expected': w,
            'compiled': g, 'as_written': a, 'verdict': verdict,
            'reasons': _reasons(ops, key) if verdict == EXPLAINED else [],
        })  # fmt: skip
    return out


def surprises(verdicts: list[dict]) -> list[dict]:
    """A row nothing in the program explains, as a surprise of the reference twin."""
    return [
        {'kind': 'unexplained-bytes', 'op': '', 'file': '', 'line': 0,
         'what': f"{r['kind']} over {'/'.join(r['axes']) or '-'} ({r['phase']}) moves "
                 f"{r['compiled']:,} B a step where {r['expected']:,} are expected, and no "
                 'mechanism found in the program accounts for the difference'}
        for r in verdicts if r['verdict'] == DIFFERS
    ]  # fmt: skip


def print_expected(r: dict) -> None:
    """The text of the expectation's records, one piece per axis, and per (kind, axes, phase)
    their bytes a step beside what the compiled explicit step moves, with each difference's
    verdict and reasons."""
    records = r['expected']['collectives']
    print("\nExpected, one piece per mesh axis (inspector/expect.py):")
    print(f"{'piece':<9} {'kind':<18} {'axes':<10} {'phase':<12} {'bytes':>10} {'x trips':>7} "
          f"{'total':>12}  what")  # fmt: skip
    for e in records:
        print(
            f"{e['piece']:<9} {e['kind']:<18} {'/'.join(e['axes']):<10} {e['phase']:<12} "
            f"{e['bytes']:>10,} {'x' + str(e['trips']):>7} {e['total']:>12,}  {e['what']}"
            + ('' if 'auto' in e['twins'] else f" ({', '.join(e['twins'])} only)")
        )
    verdicts = r.get('expected_vs_compiled')
    if verdicts is None:
        return
    print('explicit, bytes a step by kind, axes and phase (expected / compiled):')
    for v in verdicts:
        note = {
            MATCHES: '', EXPLAINED: f"  differs, explained: as written {v['as_written']:,}",
            DIFFERS: '  differs, unexplained: a surprise',
        }[v['verdict']]  # fmt: skip
        print(f"  {v['kind']:<18} {'/'.join(v['axes']) or '-':<10} {v['phase']:<12} "
              f"{v['expected']:>12,} / {v['compiled']:>12,}{note}")  # fmt: skip
        for reason in v['reasons']:
            print(f'      - {reason}')
