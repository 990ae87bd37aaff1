"""Reads the collectives out of a compiled XLA program (its optimized HLO text)."""

import dataclasses
import re

import numpy as np

KINDS = ('all-reduce', 'all-gather', 'reduce-scatter', 'all-to-all', 'collective-permute')
_OP = re.compile(
    r'^\s*(?:ROOT\s+)?%\S+ = (?P<type>.+?) (?P<kind>' + '|'.join(KINDS) + r')(?:-start)?\(',
    re.M,
)
_ARRAY = re.compile(r'(?P<dtype>[a-z]+\d*)\[(?P<dims>[\d,]*)\]')
_BYTES = {'f32': 4, 's32': 4, 'u32': 4, 'bf16': 2, 'f16': 2, 'f64': 8, 's8': 1, 'u8': 1, 'pred': 1}


@dataclasses.dataclass(frozen=True)
class Collective:
    kind: str
    shapes: tuple[tuple[int, ...], ...]  # one per operand (XLA combines several into a tuple)
    dtypes: tuple[str, ...]
    replica_groups: str

    @property
    def group_size(self) -> int:
        """Devices in each replica group, whichever of XLA's three spellings the HLO uses."""
        g = self.replica_groups
        if g.startswith('pairs'):  # collective-permute: pairs={{0,0},{1,2},...}, every device
            return g.count('},{') + 1
        if g.startswith('{{'):  # explicit device lists: {{0,1,2,3},{4,5,6,7}}
            return len(g[2:].split('}')[0].split(','))
        if g.startswith('mesh['):  # mesh['axis_0'=8,'axis_1'=1] {'axis_0'}
            sizes = dict(re.findall(r"'(\w+)'=(\d+)", g))
            reduced = re.findall(r"'(\w+)'", g[g.index('{') :])
            return int(np.prod([int(sizes[a]) for a in reduced]))
        if m := re.match(r'\[(\d+),(\d+)\]<=', g):  # iota: [groups,size]<=[n]
            return int(m.group(2))
        raise ValueError(f'unknown replica_groups format: {g}')

    @property
    def bytes(self) -> int:
        return sum(int(np.prod(s)) * _BYTES[d] for s, d in zip(self.shapes, self.dtypes))


def collectives(hlo_text: str) -> list[Collective]:
    """Every collective op in the program, in order of appearance."""
    found = []
    for m in _OP.finditer(hlo_text):
        arrays = _ARRAY.findall(m.group('type'))
        line = hlo_text[m.start() : hlo_text.find('\n', m.start())]
        # mesh['axis_0'=2,'axis_1'=4], device_ids=([4,2]T(1,0)) {'axis_1'}: up to the axes
        groups = re.search(r"replica_groups=(mesh\[.*?\{[^}]*\}|.+?)(?:, [a-z_]+=|$)", line)
        pairs = re.search(r'source_target_pairs=(\{.*?\}\})', line)
        found.append(
            Collective(
                kind=m.group('kind'),
                shapes=tuple(tuple(int(d) for d in dims.split(',') if d) for _, dims in arrays),
                dtypes=tuple(dtype for dtype, _ in arrays),
                replica_groups=groups.group(1) if groups else f'pairs={pairs.group(1)}',
            )
        )
    return found


def compiled_text(jitted, *args) -> str:
    return jitted.lower(*args).compile().as_text()
