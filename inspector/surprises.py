"""What a person debugging a sharded program did not expect, flagged with its line:
- the SPMD partitioner's "involuntary full rematerialization" warning (it replicates a whole
  array, then slices it), captured while compiling and attached to the op and line it names;
- an all-gather that brings back a whole sharded argument (a weight, under a training step)
  over axes the placement did not say it gathers over (FSDP's 'fsdp' is asked for);
- an all-to-all or collective-permute the partitioner generated: a reshard nobody wrote;
- (twins) a collective one twin has that its sibling does not: see twins.differences.
"""

import re

REMAT = 'Involuntary full rematerialization'


def remat_warnings(log: str) -> list[dict]:
    """The partitioner's rematerialization warnings in a compile log, with the op name and, where
    the message carries it, the source line of the HLO operation they name."""
    out = []
    for m in re.finditer(re.escape(REMAT) + r'.*', log):
        msg = m.group(0)
        op_name = re.search(r'op_name="([^"]*)"', msg)
        src = re.search(r'source_file="([^"]*)" source_line=(\d+)', msg)
        op = re.search(r'HLO operation:?\s*(%[\w.\-]+)', msg)
        out.append(
            {
                'message': msg[:600],
                'op_name': op_name.group(1) if op_name else '',
                'file': src.group(1) if src else '',
                'line': int(src.group(2)) if src else 0,
                'hlo_op': op.group(1) if op else '',
            }
        )
    return out


def _flag(op: dict, kind: str, what: str) -> dict:
    op.setdefault('flags', []).append(kind)
    return {'kind': kind, 'what': what, 'op': op['name'], 'file': op['file'], 'line': op['line']}


def program_surprises(result: dict, whole: list[tuple[str, int]], expect_gathers=()) -> list:
    """The surprises of one analysed program (`analyse()`'s result); marks each op's `flags`.
    `whole`: (name, elements) of every sharded argument; `expect_gathers`: the mesh axes over
    which gathering a whole argument is the plan."""
    found = []
    ops = result['ops']
    for op in ops:
        op.setdefault('flags', [])
    for w in result['warnings']:
        hits = [op for op in ops if w['op_name'] and op['op_name'] == w['op_name']]
        for op in hits:
            op['flags'].append('involuntary-remat')
        where = hits[0] if hits else {'file': w['file'], 'line': w['line'], 'name': w['hlo_op']}
        found.append(
            {
                'kind': 'involuntary-remat',
                'what': 'the partitioner replicated a whole array to reshard it: ' + w['message'],
                'op': where['name'],
                'file': where['file'] or w['file'],
                'line': where['line'] or w['line'],
            }
        )
    sizes = {}
    for name, n in whole:
        sizes.setdefault(n, name)
    for op in ops:
        axes = set(op['axes'] or ['?'])
        if op['kind'] == 'all-gather' and not axes <= set(expect_gathers):
            for s in op['shapes']:
                n = 1
                for d in s:
                    n *= d
                if n in sizes:
                    what = (
                        f'all-gather brings back the whole of {sizes[n]} ({n:,} elements) over '
                        f"{'/'.join(sorted(axes))}, which the placement does not gather over"
                    )
                    found.append(_flag(op, 'whole-weight-gather', what))
                    break
        if op.get('accumulates_in_loop') and op['kind'] in ('all-reduce', 'reduce-scatter'):
            what = (
                f"{op['kind']} x{op['trip_count']} whose result is added to a loop carry: sum "
                'locally in the loop and reduce once after it'
            )
            found.append(_flag(op, 'reduction-per-iteration', what))
        if op['kind'] in ('all-to-all', 'collective-permute') and op['origin'] == 'partitioner':
            what = f"{op['kind']} that no line wrote: the partitioner reshards here"
            found.append(_flag(op, 'unrequested-reshard', what))
    return found
