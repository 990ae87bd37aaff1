"""The inspector's text output: the collectives table (kind, group, bytes, shapes), the
expectation, then where each collective comes from and what it would cost, the predicted step
band, and the surprises."""

import collections
import contextlib
import io


def print_report(r: dict) -> None:
    print(
        f"Collectives in one compiled train step: --model={r['model']} --strategy="
        f"{r['strategy']}, mesh {r['mesh']} ({' x '.join(r['axes'])}), global batch "
        f"{r['batch_size']}\n"
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
    x = r['expected']
    print(
        f"\nexpected: {x['kind']} of the {x['gradient_bytes']:,} gradient bytes over "
        f"{x['group_size']} devices; a ring moves {x['ring_bytes_per_device']:,.0f} bytes per "
        f"device.\n  {x['note']}"
    )
    if ring := x.get('ring'):
        print(
            f"expected (explicit): {ring['count']} collective-permutes ({ring['per_layer']} per "
            f"attention layer, {ring['runs_per_layer']} run) of f32{list(ring['shape'])} blocks, "
            f"{ring['bytes_each']:,} bytes each, "
            f"{ring['bytes']:,} in all.\n  {ring['note']}"
        )
    if a := x['activations']:
        print(
            f"expected: {a['count']} all-reduce(s) of f32{list(a['shape'])} activations over "
            f"{a['group_size']} devices, {a['bytes']:,} bytes.\n  {a['note']}"
        )
    for name in [n for n in r['programs'] if n != 'one_device']:
        got = collections.Counter()
        for op in r['programs'][name]:
            got[op['kind']] += op['bytes']
        print(f'{name:<10} moves ' + ', '.join(f'{k} {v:,} bytes' for k, v in got.items()))
    for key, pair in (
        ('differences', 'auto and explicit'),
        ('typed_differences', 'typed and explicit'),
    ):
        if r[key] is None:
            continue
        print(f'\ndifferences between {pair}: ' + ('none' if not r[key] else ''))
        for d in r[key]:
            print(f'  - {d}')


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
            print(
                f"{name:<10} {op['kind']:<18} {axes:<10} {op['bytes']:>12,} "
                f"{'x' + str(op['trip_count']):>6} {op['predicted_us']:>9.2f}  "
                f"{op['phase']:<8} {op['origin']:<11} {where}{used}"
            )
    print(f"\nPredicted step on {hw} (compute from cost_analysis FLOPs at peak; communication at "
          'the stated achievable bandwidth; band = [full overlap, none]):')  # fmt: skip
    for name, p in r['predicted'].items():
        line = (
            f"{name:<10} compute {p['compute_us']:>10.1f} us  comms {p['comms_us']:>10.1f} us  "
            f"step {p['step_us'][0]:,.1f} .. {p['step_us'][1]:,.1f} us"
        )
        if 'measured_us' in p:
            line += f"  | measured here {p['measured_us']:,.0f} us (emulated devices)"
        print(line)
    print(f"  constants: {r['hardware_note']}")
    print_surprises(r)


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
        print(f"Collectives of one program on {r['devices']} devices ({' x '.join(r['axes'])})")
        for name, ops in r['programs'].items():
            got = collections.Counter()
            for op in ops:
                got[op['kind']] += op['bytes'] * op['trip_count']
            print(f'{name} moves ' + (', '.join(f'{k} {v:,} bytes' for k, v in got.items())
                                      or 'nothing'))  # fmt: skip
        print_attribution(r)
    return out.getvalue()
