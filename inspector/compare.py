"""The twins' comparison (inspector/twins.py): what one twin's program moves that explicit/'s does
not, operand by operand, independent of layout: (kind, group size, elements) per operand.

Where the plan names a compiled form as what it does the work of (`written_forms`: ZeRO-1's
reduce-scatter compiled as an all-reduce and a slice, inspector/mechanisms.py's `sliced`), the
operand counts as the collective it stands for, and, where the other side has it, it is listed
with its mechanism (`named_lines`), not as a difference. A named operand that is one layer's
piece of a stacked gradient (auto/ reduces each layer's slice where the backward forms it; the
pieces' kept shapes are the other side's stacked operand split along its leading, layer,
dimension, L pieces for L layers) pairs with that stacked operand (`paired`). Whatever does not
pair is a difference (`differences`, `difference_lines`, flagged by `mark_differences`).
"""

import collections

import numpy as np

from shard_parity.mesh import DATA


def written_forms(plan) -> frozenset:
    """The compiled forms the twins' comparison counts as the collective they do the work of
    ((mechanism, kind, mesh axes), inspector/mechanisms.py): under ZeRO-1 the `zero1` piece's
    reduce-scatter over 'data', which XLA:CPU compiles as an all-reduce of the whole gradient
    and a slice where auto/ and typed/ leave it to the compiler ('sliced': XLA:CPU forms no
    reduce-scatter from the two) and explicit/ writes psum_scatter. None elsewhere: FSDP's
    reduce-scatter in that form stays a twin difference (docs/inspector.md)."""
    return frozenset({('sliced', 'reduce-scatter', (DATA,))}) if plan.zero1 else frozenset()


def operands(op: dict, forms=frozenset()):
    """Per operand of `op`: ((kind, group size, elements), the part of it a form in `forms`
    names, or None). A named part counts as the collective it stands for: a 'sliced' operand
    as the reduce-scatter of the 1/n each device keeps."""
    axes = tuple(op['axes'] or ())
    named = {p.get('operand', 0): p for p in op.get('stands_for', [])
             if (p['mechanism'], p['kind'], axes) in forms}  # fmt: skip
    for n, shape in enumerate(op['shapes']):
        elements, part = int(np.prod(shape)), named.get(n)
        if part is None:
            yield (op['kind'], op['group_size'], elements), None
        else:
            yield (part['kind'], op['group_size'], elements // op['group_size']), part


def signature(ops, forms=frozenset()) -> collections.Counter:
    """What a program moves, independent of layout: (kind, group size, elements) per operand,
    each named by `forms` as the collective it does the work of."""
    return collections.Counter(key for op in ops for key, _ in operands(op, forms))


def entries(ops, forms=frozenset()) -> list[dict]:
    """One per operand: its key (`operands`), its named part, the shape each device holds of it
    (a named part's kept `shape`; else the operand's own) and the ops it is read from."""
    return [
        {'key': key, 'part': part, 'ops': [i],
         'shape': part.get('shape') if part else list(op['shapes'][n])}
        for i, op in enumerate(ops) for n, (key, part) in enumerate(operands(op, forms))
    ]  # fmt: skip


def _squeezed(shape) -> tuple:
    return tuple(d for d in shape if d != 1)


def _plain(rows: list) -> collections.Counter:
    """(key, shape held, 1s dropped) per entry: what pairs an operand with its like as it is."""
    return collections.Counter((x['key'], _squeezed(x['shape'] or ())) for x in rows)


def _stack(pieces: list, stacks: list) -> list:
    """`pieces` with each run of L named operands that are one stacked operand of `stacks` split
    along its leading dimension (L = its size there: each piece's kept shape is the rest, the
    same kind over the same devices) merged into one entry with that operand's key; only
    operands that no operand of the same key and shape on the other side pairs as they are."""
    spare, wanted = _plain(pieces) - _plain(stacks), _plain(stacks) - _plain(pieces)
    merged = []
    for s in stacks:
        shape = s['shape'] or []
        if not wanted[(s['key'], _squeezed(shape))] or len(shape) < 2 or shape[0] < 2:
            continue
        kind, group, elements = s['key']
        piece = ((kind, group, elements // shape[0]), _squeezed(shape[1:]))
        fits = [x for x in pieces if x['part'] and (x['key'], _squeezed(x['shape'] or ())) == piece]
        chosen = fits[: min(shape[0], spare[piece])]
        if len(chosen) < shape[0]:
            continue
        spare[piece] -= shape[0]
        wanted[(s['key'], _squeezed(shape))] -= 1
        pieces = [x for x in pieces if not any(x is c for c in chosen)]
        merged.append({
            'key': s['key'], 'part': chosen[0]['part'], 'shape': shape,
            'ops': [i for c in chosen for i in c['ops']], 'layers': shape[0],
        })  # fmt: skip
    return pieces + merged


def paired(mine, theirs, forms=frozenset()) -> tuple[list, list]:
    """Both programs' `entries`, each side's layer pieces merged into the other side's stacked
    operands they make up (`_stack`), so that the two compare as written."""
    a, b = entries(mine, forms), entries(theirs, forms)
    if forms:
        a = _stack(a, b)
        b = _stack(b, a)
    return a, b


def _count(rows: list) -> collections.Counter:
    return collections.Counter(x['key'] for x in rows)


def differences(auto_ops, explicit_ops, name: str = 'auto', forms=frozenset()) -> list[str]:
    a, e = (_count(x) for x in paired(auto_ops, explicit_ops, forms))
    out = [
        f'{name} has {k[0]} of {k[2]:,} elements over {k[1]} devices that explicit lacks (x{v})'
        for k, v in (a - e).items()
    ]
    out += [
        f'explicit has {k[0]} of {k[2]:,} elements over {k[1]} devices that {name} lacks (x{v})'
        for k, v in (e - a).items()
    ]
    return out


def difference_lines(programs: dict, name: str, forms=frozenset()) -> list[dict]:
    """`differences` with lines on both sides: per line of the twin that has collectives its
    sibling (explicit/) lacks, what they are, and the lines of the sibling's collectives of the
    same kind over the same devices (what it does instead; none when it has no such kind)."""
    if name not in programs:
        return []
    grouped = {}
    pair = {name: programs[name], 'explicit': programs['explicit']}
    rows = dict(zip((name, 'explicit'), paired(pair[name], pair['explicit'], forms)))
    for has, lacks in ((name, 'explicit'), ('explicit', name)):
        for (kind, group, elements), count in (_count(rows[has]) - _count(rows[lacks])).items():
            first = next(x for x in rows[has] if x['key'] == (kind, group, elements))
            op = pair[has][first['ops'][0]]
            others = [o for o in pair[lacks] if o['kind'] == kind and o['group_size'] == group]
            where = f"{op['file']}:{op['line']}"
            d = grouped.setdefault(
                (has, lacks, kind, group, where),
                {
                    'twin': has, 'sibling': lacks, 'kind': kind, 'group_size': group,
                    'elements': [], 'count': 0, 'file': op['file'], 'line': op['line'],
                    'sibling_lines': sorted({f"{o['file']}:{o['line']}" for o in others}),
                },
            )  # fmt: skip
            d['elements'].append(elements)
            d['count'] += count
    out = list(grouped.values())
    for d in out:
        d['what'] = (
            f"{d['twin']} has {d['count']} {d['kind']} operand(s) over {d['group_size']} devices "
            f"at {d['file']}:{d['line']} that {d['sibling']} lacks (there: "
            f"{', '.join(d['sibling_lines']) or 'no ' + d['kind']})"
        )
    return out


def mark_differences(programs: dict, lines: list[dict], forms=frozenset()) -> None:
    """Flags `twin-difference` on every op that moves an operand its sibling does not."""
    for d in lines:
        mine, _ = paired(programs[d['twin']], programs[d['sibling']], forms)
        for x in mine:
            if x['key'][:2] == (d['kind'], d['group_size']) and x['key'][2] in d['elements']:
                for i in x['ops']:
                    op = programs[d['twin']][i]
                    if 'twin-difference' not in op['flags']:
                        op['flags'].append('twin-difference')


def named_lines(programs: dict, name: str, forms=frozenset()) -> list[dict]:
    """Per line of twin `name` (or of explicit/) whose collectives a form in `forms` names as
    what the other side writes, with the same operands there: what it compiled, what it does
    the work of, the mechanism found in its HLO and the other side's lines (`layers`: how many
    of them are one layer's piece of an operand the other side moves stacked; `trips` and
    `sibling_trips`: how many times a step each side's runs, said where they differ, as a
    pipeline's reduction in its ticks' loop). Named operands the other side lacks are no such
    line: `difference_lines` lists them."""
    if name not in programs or not forms:
        return []
    pair = {name: programs[name], 'explicit': programs['explicit']}
    rows = dict(zip((name, 'explicit'), paired(pair[name], pair['explicit'], forms)))
    grouped = {}
    for has, other in ((name, 'explicit'), ('explicit', name)):
        left = _count(rows[other])
        for x in rows[has]:
            key, part = x['key'], x['part']
            if part is None or not left[key]:
                continue
            left[key] -= 1
            for i in x['ops']:
                op = pair[has][i]
                d = grouped.setdefault((has, op['kind'], key[0], key[1], op['file'], op['line']), {
                    'twin': has, 'sibling': other, 'kind': op['kind'], 'as': key[0],
                    'group_size': key[1], 'mechanism': part['mechanism'], 'count': 0,
                    'layers': 0, 'file': op['file'], 'line': op['line'], 'reason': part['reason'],
                    'sibling_lines': sorted({f"{o['file']}:{o['line']}" for o in pair[other]
                                             if o['kind'] == key[0] and o['group_size'] == key[1]}),
                })  # fmt: skip
                d['count'] += 1
                d['layers'] += 1 if x.get('layers') else 0
                d['trips'] = max(d.get('trips', 1), op.get('trip_count', 1))
                d['sibling_trips'] = max(
                    [o.get('trip_count', 1) for o in pair[other]
                     if o['kind'] == key[0] and o['group_size'] == key[1]] or [1]
                )  # fmt: skip
    return [d | {'what': _named(d)} for d in grouped.values()]


def _named(d: dict) -> str:
    layers = (
        f"; {d['layers']} of them one layer's piece each of an operand {d['sibling']} moves "
        'stacked (the layers along its leading dimension)'
        if d['layers']
        else ''
    )
    trips, theirs = d['trips'], d['sibling_trips']
    loop = (
        f"; it runs x{trips} a step (once per iteration of a loop) where {d['sibling']}'s runs "
        f'x{theirs}: {trips / theirs:g} times the bytes'
        if trips != theirs
        else ''
    )
    return (
        f"{d['twin']}'s {d['count']} {d['kind']} operand(s) over {d['group_size']} devices at "
        f"{d['file']}:{d['line']} are {d['sibling']}'s {d['as']} "
        f"({', '.join(d['sibling_lines']) or d['as']}), compiled as {FORM[d['mechanism']]} "
        f"('{d['mechanism']}', e.g. {d['reason']}){layers}{loop}"
    )


FORM = {'sliced': 'an all-reduce of the whole, each device then keeping its slice'}
