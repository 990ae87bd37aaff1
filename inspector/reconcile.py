"""The expectation against a compiled program, row by row: per (kind, mesh axes, phase) the bytes a
step the records expect beside those the compiled explicit step moves (`totals`,
`program_totals`), and the text table of both (`print_expected`).
"""

import numpy as np

from .hlo_module import ITEMSIZE

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


def program_totals(ops) -> dict:
    """{(kind, axes, phase): bytes per step} of a compiled program's collectives, scalars (the
    metrics, the global norm's partial sums) left out: each operand's bytes x its op's trips."""
    out = {}
    for op in ops:
        sizes = [int(np.prod(s)) * ITEMSIZE[d]
                 for s, d in zip(op['shapes'], op['dtypes']) if len(s)]  # fmt: skip
        if sizes:
            key = (op['kind'], tuple(op['axes'] or ()), op['phase'])
            out[key] = out.get(key, 0) + sum(sizes) * op['trip_count']
    return out



def print_expected(r: dict) -> None:
    """The text of the expectation's records, one piece per axis, and per (kind, axes, phase)
    their bytes a step beside what the compiled explicit step moves."""
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
    if 'explicit' not in r['programs']:
        return
    want, got = totals(records), program_totals(r['programs']['explicit'])
    print('explicit, bytes a step by kind, axes and phase (expected / compiled):')
    for key in sorted(set(want) | set(got), key=str):
        w, g = want.get(key, 0), got.get(key, 0)
        kind, axes, phase = key
        print(f"  {kind:<18} {'/'.join(axes) or '-':<10} {phase:<12} {w:>12,} / {g:>12,}"
              + ('' if w == g else '  differs'))  # fmt: skip
