"""The precision policy (shard_parity/plan.py, `Precision`; docs/numerics.md) held against what
each collective of a twin's step moves: per operand its traffic, the dtype the policy wants for
that traffic, the dtype the step asked for (the partitioned program, inspector/asked.py) and
the one the compiled program carries.

    traffic     what it is                                                       wants
    weight      an all-gather over 'fsdp': a layer gathered where it runs         --dtype
    gradient    an all-reduce or reduce-scatter over batch axes only (data,     --reduce_dtype
                fsdp, seq, expert) after grad or in the backward; after grad
                over 'stage' too (1F1B's sum of the gradients outside the blocks)
    activation  any other all-gather, all-reduce, reduce-scatter, all-to-all or   --dtype
                collective-permute: partial sums over 'model', a pipeline's or a
                ring's blocks, the experts' slots, and their gradients (1F1B's
                vjp runs outside grad: its 'model' sums of an input's gradient)
    metric      a scalar: the metrics' means, the global norm's partial sums      float32

A TPU's all-gather done as an all-reduce is a weight (it stands for the gather). An integer
operand is no float traffic and is not audited. A dtype asked otherwise than the policy wants
is the step's doing: a `dtype-asked` surprise. One carried otherwise where the step asked as
the policy wants is the compiler's: a backend's promotion (XLA:CPU carries bf16 in f32) and a
TPU's narrowing for a DEFAULT-precision dot are named and allowed; any other is a
`dtype-carried` surprise (a TPU that reduces a float32 gradient in bf16, jax-ml/jax#27496).
"""

import collections

import numpy as np

from shard_parity.mesh import FSDP, STAGE

from .asked import REDUCTIONS, written_kinds
from .hlo_module import ITEMSIZE

HLO = {'float16': 'f16', 'bfloat16': 'bf16', 'float32': 'f32', 'float64': 'f64'}
FLOATS = set(HLO.values())
HLO_NAME = {v: k for k, v in HLO.items()}
FLAG = {'weight': '--dtype', 'activation': '--dtype', 'gradient': '--reduce_dtype'}
ALLOWED = ('promoted', 'narrowed')  # what may change a carried dtype (asked_by)


def axes_of(op: dict) -> set[str]:
    """The mesh axes an op runs over, by name ('data/fsdp~2': part of data x fsdp's groups)."""
    return {a for x in op['axes'] or () for a in x.split('~')[0].split('/')}


def traffic(op: dict, kind: str, shape, dtype: str, plan) -> str | None:
    """The traffic one operand is (module docstring); None for an integer one."""
    if dtype not in FLOATS:
        return None
    if not len(shape):
        return 'metric'
    axes = axes_of(op)
    if kind == 'all-gather':
        return 'weight' if FSDP in axes else 'activation'
    batch = set(plan.batch_axes)
    if kind in REDUCTIONS and axes and (
        (op['phase'] == 'outside-grad' and axes <= batch | {STAGE})
        or (op['phase'] == 'backward' and axes <= batch)
    ):
        return 'gradient'
    return 'activation'


def wanted(kind: str, precision) -> str:
    """The HLO dtype the policy wants for traffic `kind`."""
    name = {'weight': precision.compute, 'activation': precision.compute,
            'gradient': precision.reduce, 'metric': precision.param}[kind]  # fmt: skip
    return HLO[name]


def off_policy(traffic_, want, asked, carried, by) -> str:
    """'dtype-asked', 'dtype-carried' or '' for one operand (module docstring). One the
    partitioned program has no match for (asked None) is held by its carried dtype alone, where
    that is narrower than the policy's (a backend may widen what it carries)."""
    if traffic_ is None:
        return ''
    if asked is None:
        narrower = ITEMSIZE[carried] < ITEMSIZE[want]
        return 'dtype-carried' if narrower and by not in ALLOWED else ''
    if asked != want:
        return 'dtype-asked'
    return 'dtype-carried' if carried != want and by not in ALLOWED else ''


def audit(ops: list[dict], plan) -> list[dict]:
    """Marks each op's operands with their `traffic` and `wanted` dtype, and returns the
    surprises: per op, the operands asked otherwise than the policy wants (`dtype-asked`), and
    those asked as it wants but carried otherwise for no allowed reason (`dtype-carried`); each
    operand's verdict in `off_policy` ('' where it is as the policy wants)."""
    found = []
    for op in ops:
        kinds = written_kinds(op)
        op['traffic'] = [traffic(op, k, s, d, plan) for k, s, d in
                         zip(kinds, op['shapes'], op['dtypes'])]  # fmt: skip
        op['wanted'] = [wanted(t, plan.precision) if t else None for t in op['traffic']]
        op['off_policy'] = [
            off_policy(*x)
            for x in zip(op['traffic'], op['wanted'], op['asked'], op['dtypes'], op['asked_by'])
        ]
        off = collections.defaultdict(list)
        for n, kind in enumerate(op['off_policy']):
            if kind:
                got = op['asked'][n] if kind == 'dtype-asked' else op['dtypes'][n]
                off[(kind, op['traffic'][n], got, op['wanted'][n])].append(n)
        for (kind, t, got, want), operands in off.items():
            verb = 'asks' if kind == 'dtype-asked' else 'carries'
            says = (f'{FLAG[t]}={HLO_NAME[want]}' if t in FLAG
                    else f'the metrics in {HLO_NAME[want]}')  # fmt: skip
            what = (f"{op['kind']} over {'/'.join(op['axes'] or ['?'])} ({op['phase']}) {verb} "
                    f'{len(operands)} {t} operand(s) in {got} where the policy wants {want} '
                    f'({says})')  # fmt: skip
            if kind == 'dtype-carried':
                why = (
                    op['asked_why'][operands[0]] or 'none of its kind is in the partitioned program'
                )
                what += f': {why}'
            op.setdefault('flags', []).append(kind)
            found.append({'kind': kind, 'what': what, 'op': op['name'], 'file': op['file'],
                          'line': op['line']})  # fmt: skip
    return found


def rows(ops: list[dict]) -> list[dict]:
    """What an audited program moves, per traffic, written kind, mesh axes and phase: the dtype
    wanted, the operands and bytes a step by dtype asked and carried, and the reasons a carried
    dtype differs; `surprise` where an operand is off the policy (audit)."""
    out = {}
    for op in ops:
        for n, (t, kind, shape) in enumerate(zip(op['traffic'], written_kinds(op), op['shapes'])):
            if t is None:
                continue
            key = (t, kind, '/'.join(op['axes'] or ['?']), op['phase'])
            row = out.setdefault(key, {
                'traffic': t, 'kind': kind, 'axes': key[2], 'phase': op['phase'],
                'wanted': op['wanted'][n], 'asked': collections.Counter(),
                'carried': collections.Counter(), 'asked_bytes': 0, 'carried_bytes': 0,
                'reasons': [], 'surprise': False,
            })  # fmt: skip
            asked, carried, elements = op['asked'][n], op['dtypes'][n], int(np.prod(shape))
            row['asked'][asked or '?'] += 1
            row['carried'][carried] += 1
            row['asked_bytes'] += elements * ITEMSIZE.get(asked, 0) * op['trip_count']
            row['carried_bytes'] += elements * ITEMSIZE[carried] * op['trip_count']
            why = op['asked_why'][n]
            reason = why.split(': ')[0] if op['asked_by'][n] == 'promoted' else why
            if reason and reason not in row['reasons']:
                row['reasons'].append(reason)
            row['surprise'] |= bool(op['off_policy'][n])
    return [r | {'asked': dict(r['asked']), 'carried': dict(r['carried'])}
            for r in out.values()]  # fmt: skip
