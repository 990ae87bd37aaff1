"""The inspector's text output: the collectives table (kind, group, bytes, shapes), the
expectation, then where each collective comes from and what it would cost, the predicted step
band, and the surprises."""

import collections
import contextlib
import io

SHORT = {'float16': 'f16', 'bfloat16': 'bf16', 'float32': 'f32', 'float64': 'f64'}


def print_report(r: dict) -> None:
    print(
        f"Collectives in one compiled train step: --model={r['model']} --strategy="
        f"{r['strategy']}, mesh {r['mesh']} ({' x '.join(r['axes'])}), global batch "
        f"{r['batch_size']}" + (f", {compiled_for(r)}" if r.get('target') else '') + '\n'
    )
    print(f"{'program':<10} {'kind':<12} {'group':>5} {'dtype':<6} {'bytes':>12}  result shapes")
    for name, ops in r['programs'].items():
        if not ops:
            print(f'{name:<10} (none)')
        for op in ops:
            shapes = ', '.join('[' + ','.join(map(str, s)) + ']' for s in op['shapes'])
            dtypes = ','.join(sorted(set(op['dtypes'])))
            head = f"{name:<10} {op['kind']:<12} {op['group_size']:>5} {dtypes:<6}"
            print(f"{head} {op['bytes']:>12,}  {shapes}")
    for name, line in r.get('refused', {}).items():
        print(f'{name:<10} refused: {line}')
    x = r['expected']
    print(
        f"\nexpected: {x['kind']} of the {x['gradient_bytes']:,} gradient bytes over "
        f"{x['group_size']} devices; a ring moves {x['ring_bytes_per_device']:,.0f} bytes per "
        f"device.\n  {x['note']}"
    )
    dtype = SHORT[r.get('precision', {}).get('compute', 'float32')]  # what --dtype moves
    if ring := x.get('ring'):
        print(
            f"expected (explicit): {ring['count']} collective-permutes ({ring['per_layer']} per "
            f"attention layer, {ring['runs_per_layer']} run) of {dtype}{list(ring['shape'])} "
            'blocks, '
            f"{ring['bytes_each']:,} bytes each, "
            f"{ring['bytes']:,} in all.\n  {ring['note']}"
        )
    if a := x['activations']:
        print(
            f"expected: {a['count']} all-reduce(s) of {dtype}{list(a['shape'])} activations over "
            f"{a['group_size']} devices, {a['bytes']:,} bytes.\n  {a['note']}"
        )
    for name in [n for n in r['programs'] if n != 'one_device']:
        got = collections.Counter()
        for op in r['programs'][name]:
            got[op['kind']] += op['bytes']
        print(f'{name:<10} moves ' + ', '.join(f'{k} {v:,} bytes' for k, v in got.items()))
    print_dtypes(r)
    for key, pair in (
        ('differences', 'auto and explicit'),
        ('typed_differences', 'typed and explicit'),
    ):
        if r[key] is None:
            continue
        print(f'\ndifferences between {pair}: ' + ('none' if not r[key] else ''))
        for d in r[key]:
            print(f'  - {d}')
    if r.get('same_as_written'):
        print('\nthe same as written, compiled in another form (no difference):')
        for d in r['same_as_written']:
            print(f"  - {d['what']}")


def _counts(by_dtype: dict) -> str:
    return ', '.join(f'{n} {d}' for d, n in sorted(by_dtype.items(), key=lambda kv: -kv[1]))


def print_dtypes(r: dict) -> None:
    """Per program, what each traffic carries against the precision policy (inspector/policy.py):
    operands asked for (the partitioned program) and carried (the compiled one), with why a
    carried dtype differs."""
    if not r.get('dtypes'):
        return
    p = r['precision']
    print(f"\nDtypes against the precision policy (--dtype={p['compute']} --reduce_dtype="
          f"{p['reduce']}; metrics {p['param']}), operands per step: asked for (the partitioned "
          'program) / carried (the compiled one):')  # fmt: skip
    print(f"{'program':<10} {'traffic':<10} {'kind':<18} {'axes':<10} {'phase':<12} {'wants':<5} "
          f"{'asked':<20} {'carried':<20}")  # fmt: skip
    for name, rows in r['dtypes'].items():
        for row in rows:
            off = '  off the policy' if row['surprise'] else ''
            print(f"{name:<10} {row['traffic']:<10} {row['kind']:<18} {row['axes']:<10} "
                  f"{row['phase']:<12} {row['wanted']:<5} {_counts(row['asked']):<20} "
                  f"{_counts(row['carried']):<20}{off}")  # fmt: skip
            for reason in row['reasons']:
                print(f'      - {reason}')


def print_attribution(r: dict) -> None:
    """Per collective: axes, bytes, count x trips, predicted time, phase, origin, line, consumer."""
    hw = r['hardware']
    print(f"\nWhere each collective comes from, and its predicted time on {hw}:")
    print(
        f"{'program':<10} {'kind':<18} {'axes':<10} {'bytes':>12} {'x trip':>6} "
        f"{'pred us':>9}  {'phase':<8} {'origin':<11} line (function) <- consumer"
    )
    for name, ops in r['programs'].items():
        for op in ops:
            axes = '/'.join(op['axes']) if op['axes'] is not None else '?'
            where = f"{op['file']}:{op['line']} ({op['function']})" if op['file'] else '?'
            used = f"  <- {op['consumer']}" if op['consumer'] else ''
            if op.get('strategy_line'):
                where += f" [{op['strategy_line']}]"
            kind = op['kind'] + ('*' if op.get('async') else '')
            print(
                f"{name:<10} {kind:<18} {axes:<10} {op['bytes']:>12,} "
                f"{'x' + str(op['trip_count']):>6} {op['predicted_us']:>9.2f}  "
                f"{op['phase']:<8} {op['origin']:<11} {where}{used}"
            )
    if any(op.get('async') for ops in r['programs'].values() for op in ops):
        print('  * asynchronous: started, then awaited after other work (below)')
    print(f"\nPredicted step on {hw} (compute from cost_analysis FLOPs at peak; communication at "
          'the stated achievable bandwidth; band = [full overlap, none]):')  # fmt: skip
    for name, p in r['predicted'].items():
        line = (
            f"{name:<10} compute {p['compute_us']:>10.1f} us  comms {p['comms_us']:>10.1f} us  "
            f"step {p['step_us'][0]:,.1f} .. {p['step_us'][1]:,.1f} us"
        )
        if 'measured_us' in p:
            line += f"  | measured here {p['measured_us']:,.0f} us (emulated devices)"
        if p.get('does_not_fit'):
            line = f"{name:<10} not compiled: it does not fit ({p['does_not_fit']})"
        print(line)
    print(f"  constants: {r['hardware_note']}")
    if r.get('target'):
        print_target(r)
    print_surprises(r)


def compiled_for(r: dict) -> str:
    if r.get('target_here'):
        return f"compiled on this {r['device_kind']} host ({r['target']})"
    return f"compiled for {r['target']} ({r['device_kind']}) from shapes alone"


def _mib(b) -> str:
    return f'{b / 2**20:,.1f}'


def overlap_summary(op: dict) -> str:
    """'3 ops: 2 matmul, 1 copy' for what runs between an async collective's start and done."""
    what = collections.Counter(o.rpartition(' (')[2].rstrip(')') for o in op.get('overlaps', []))
    parts = ', '.join(f'{n} {k}' for k, n in what.most_common())
    return f"{len(op['overlaps'])} ops" + (f': {parts}' if parts else '')


def print_target(r: dict) -> None:
    """What a --target report adds: async collectives and what they overlap, memory per device
    against the chip's HBM, and the target compiler's own cost figures."""
    print(f'\nAsynchronous collectives on {r["target"]} (started, then awaited after the ops '
          'between):')  # fmt: skip
    any_async = False
    for name, ops in r['programs'].items():
        for op in ops:
            if op.get('async'):
                any_async = True
                where = f"{op['file']}:{op['line']}" if op['file'] else '?'
                print(f"{name:<10} {op['kind']:<18} {','.join(sorted(set(op['dtypes']))):<9} "
                      f"{op['bytes']:>12,} x{op['trip_count']:<3} {where}: overlaps "
                      f'{overlap_summary(op)}')  # fmt: skip
    if not any_async:
        print('  none: every collective is synchronous')
    print(
        f"\nMemory per device on {r['target']} (MiB, memory_analysis(); compiler peak is its "
        'own peak_memory_in_bytes), against the HBM its compiler allows:'
    )
    print(f"{'program':<10} {'arguments':>10} {'outputs':>10} {'aliased':>10} {'temp':>10} "
          f"{'comp. peak':>10} {'HBM':>10}  verdict")  # fmt: skip
    for name, m in r['memory'].items():
        if m.get('reason'):  # refused by the compiler: its own figures
            print(f"{name:<10} {'-':>10} {'-':>10} {'-':>10} {'-':>10} {'-':>10} "
                  f"{_mib(m['hbm']):>10}  DOES NOT FIT: {m['reason']}")  # fmt: skip
            continue
        verdict = 'fits' if m.get('fits') else 'DOES NOT FIT'
        print(f"{name:<10} {_mib(m['arguments']):>10} {_mib(m['outputs']):>10} "
              f"{_mib(m['aliased']):>10} {_mib(m['temp']):>10} {_mib(m['compiler_peak']):>10} "
              f"{_mib(m.get('hbm', 0)):>10}  {verdict}")  # fmt: skip
    print("\nThe target compiler's own figures (cost_analysis(), per device; loop bodies "
          'counted once):')  # fmt: skip
    for name, p in r['predicted'].items():
        c = p.get('target_cost', {})
        us = f"{c['optimal_us']:,.1f} us" if c.get('optimal_us') is not None else 'n/a'
        note = f"  ({c['optimal_note']})" if c.get('optimal_note') else ''
        print(f"{name:<10} flops {c.get('flops', 0):>14,.0f}  bytes accessed "
              f"{c.get('bytes_accessed', 0):>14,.0f}  optimal time {us}{note}")  # fmt: skip


def print_surprises(r: dict) -> None:
    items = [(name, s) for name, found in r['surprises'].items() for s in found]
    print('\nsurprises: ' + ('none' if not items else f'{len(items)}'))
    for name, s in items:
        where = f"{s['file']}:{s['line']}" if s['file'] else 'no line'
        print(f"  - {name}: [{s['kind']}] {where}: {s['what']}")


def program_text(r: dict) -> str:
    """The text report of `inspector.inspect()` (one program, no expectation)."""
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        print(f"Collectives of one program on {r['devices']} devices ({' x '.join(r['axes'])})"
              + (f", {compiled_for(r)}" if r.get('target') else ''))  # fmt: skip
        for name, ops in r['programs'].items():
            got = collections.Counter()
            for op in ops:
                got[op['kind']] += op['bytes'] * op['trip_count']
            print(f'{name} moves ' + (', '.join(f'{k} {v:,} bytes' for k, v in got.items())
                                      or 'nothing'))  # fmt: skip
        print_attribution(r)
    return out.getvalue()


def print_measured(r: dict) -> None:
    """--measure_memory: the chip's peak after one step beside its compiler's (MiB)."""
    for name, m in r.get('measured_memory', {}).items():
        own = '' if m['rose'] else ' (not the step\'s own: the process had held more before it)'
        print(f"\nMeasured on this {m['device_kind']}, {name}: peak_bytes_in_use {_mib(m['peak'])} "
              f"MiB after one step{own}; the compiler's peak {_mib(m['compiler_peak'])} MiB "
              f"(difference {_mib(m['difference'])} MiB)")
