"""The mesh laid over several hosts (`--hosts=H`), and each collective priced by the link its
devices span: within a host the chip's own link (cost.HARDWARE: NVLink, ICI), across hosts the
slower network between them (`INTER_HOST`: InfiniBand, the data-center network).

The layout is the one `jax.experimental.mesh_utils.create_hybrid_device_mesh` builds: the outer
axes of the mesh go across hosts, the inner ones stay within a host. Walking the axes from the
outermost, each takes as many of the H hosts as it can: all of its size while that divides what
is left of H, else the part of it that is left (data:4 over 2 hosts: 2 across x 2 within). A host
then holds a contiguous block of D/H of the mesh's devices, in the mesh's order; its
`mesh_shape` (within) and `dcn_mesh_shape` (across) are create_hybrid_device_mesh's arguments.

A ring whose group spans hosts runs at the speed of its slowest link: every step of the ring
waits for the pair that crosses hosts, so its bandwidth and per-step latency are the inter-host
link's (NCCL's trees and XLA's hierarchical collectives do better; this is the plain ring the
cost model prices within a host too). A collective-permute crosses when any of its pairs does.

`axis_table` says which axes belong across hosts: for each mesh axis, the explicit twin's
collectives over it (ops x trips, bytes) priced within a host and across hosts. 'data' moves the
gradient once a step; 'fsdp' each layer's weights, three times (gathered forward, again
backward, the gradient scattered); 'model' each layer's activations, five or six times; 'stage'
one microbatch a tick. 'data' always loses least across hosts; 'fsdp' loses less than 'model'
once a device's tokens b x T outnumber about 1.5 x the width C (on fsdp:2,model:2, a layer's
wire bytes: 3 x 48 C^2 / 2 x 1/2 of weights against 6 x 4 b T C of activations), and when its
many small ops' latency does not dominate. The report's `suggested` mesh orders the axes by that loss.
"""

import dataclasses
import math
import re

from shard_parity import UsageError

from . import cost
from .hlo import device_groups


@dataclasses.dataclass(frozen=True)
class Link:
    name: str
    link_gb_s: float  # per device, one direction (GB/s, 1e9)
    achievable: float  # fraction of link_gb_s that collectives reach in practice
    hop_us: float  # latency floor per ring step
    sources: str


# Per hardware of cost.HARDWARE: the link between its hosts, per device.
INTER_HOST = {
    'h100x8': Link(
        'InfiniBand NDR, one 400 Gb/s ConnectX-7 per GPU (DGX H100)',
        link_gb_s=50.0,  # 400 Gb/s
        achievable=0.8,
        hop_us=5.0,  # a network round through the NIC and switch, against NVLink's ~1
        sources='NVIDIA DGX H100 user guide (8 x single-port ConnectX-7, 400 Gb/s InfiniBand, '
        'one per GPU); the achievable fraction and latency as assumed for NVLink.',
    ),
    'h200x8': Link(
        'InfiniBand NDR, one 400 Gb/s ConnectX-7 per GPU (HGX H200)',
        link_gb_s=50.0,
        achievable=0.8,
        hop_us=5.0,
        sources='as h100x8: HGX H200 systems pair each GPU with one 400 Gb/s NIC.',
    ),
    'tpu-v5e-8': Link(
        'data-center network: 2 x 100 Gb/s NICs per host of 8 chips',
        link_gb_s=3.125,  # 200 Gb/s = 25 GB/s per host, shared by its 8 chips
        achievable=0.7,
        hop_us=10.0,
        sources='Google Cloud TPU v5e documentation (per-host NIC configuration 2 x 100 Gbps, 8 '
        'chips per host); the latency is an assumption.',
    ),
    'tpu-v5p-8': Link(
        'data-center network: assumed 2 x 100 Gb/s NICs per host of 4 chips',
        link_gb_s=6.25,  # 200 Gb/s = 25 GB/s per host, shared by its 4 chips
        achievable=0.7,
        hop_us=10.0,
        sources='assumed: the NIC configuration of a v5e host (Cloud TPU v5e documentation) '
        'over the 4 chips of a v5p host; check your own VMs.',
    ),
    'tpu-v4-8': Link(
        'data-center network: assumed 2 x 100 Gb/s NICs per host of 4 chips',
        link_gb_s=6.25,  # 200 Gb/s = 25 GB/s per host, shared by its 4 chips
        achievable=0.7,
        hop_us=10.0,
        sources='assumed, as tpu-v5p-8: the NIC configuration of a v5e host over the 4 chips '
        'of a v4 host; check your own VMs.',
    ),
    'cpu': Link(
        'emulation: processes of one machine over its loopback (gloo)',
        link_gb_s=1.0,
        achievable=1.0,
        hop_us=50.0,
        sources='emulation: a rough guess for jax.distributed on one machine, not hardware.',
    ),
}


@dataclasses.dataclass(frozen=True)
class Layout:
    """A mesh over `hosts` hosts: per axis (mesh order) its size and how many hosts it spans."""

    hosts: int
    axes: tuple[tuple[str, int], ...]
    across: tuple[int, ...]  # dcn_mesh_shape

    @property
    def devices(self) -> int:
        return math.prod(n for _, n in self.axes)

    @property
    def per_host(self) -> int:
        return self.devices // self.hosts

    @property
    def within(self) -> tuple[int, ...]:  # mesh_shape: each axis's size within one host
        return tuple(n // k for (_, n), k in zip(self.axes, self.across))

    def host(self, position: int) -> int:
        """The host of the device at `position` in the mesh's device order."""
        return position // self.per_host

    def spans(self, positions) -> bool:
        return len({self.host(p) for p in positions}) > 1

    def crossing(self) -> dict:
        """{axis: hosts it spans} for the axes that cross hosts."""
        return {a: k for (a, _), k in zip(self.axes, self.across) if k > 1}


def lay(axes, hosts: int) -> Layout:
    """The layout of a mesh (its ((name, size), ...) in order) over `hosts` hosts, outer axes
    across hosts; one line (UsageError) when the hosts do not split the devices or the inner
    axes do not fit in a host."""
    axes = tuple(axes)
    devices = math.prod(n for _, n in axes)
    text = ','.join(f'{a}:{n}' for a, n in axes)
    fits = [h for h in range(1, devices + 1) if devices % h == 0 and _walk(axes, h)]
    if hosts < 1 or devices % hosts:
        raise UsageError(
            f'--hosts={hosts}: the {devices} devices of the mesh {text} do not split evenly over '
            f'{hosts} hosts; give one of {", ".join(map(str, fits))}'
        )
    across = _walk(axes, hosts)
    if across is None:
        raise UsageError(
            f'--hosts={hosts}: {devices // hosts} devices a host, but the inner axes of the mesh '
            f'{text} do not fit in a host (the outer axes go across hosts, the inner ones within); '
            f'give one of --hosts={",".join(map(str, fits))}, or put the axes that may cross '
            'hosts first in --mesh'
        )
    return Layout(hosts, axes, across)


def _walk(axes, hosts: int):
    """Each axis's share of the hosts, outermost first; None when an axis and what is left of
    the hosts divide neither way."""
    left, across = hosts, []
    for _, n in axes:
        if left % n == 0:
            across.append(n)
            left //= n
        elif n % left == 0:
            across.append(left)
            left = 1
        else:
            return None
    return tuple(across) if left == 1 else None


def op_crosses(op: dict, layout: Layout) -> bool:
    """Whether a collective (an analysed op: its replica groups or source-target pairs) has a
    group, or a pair, on more than one host."""
    groups = op['replica_groups']
    if groups.startswith('pairs='):
        pairs = re.findall(r'\{(\d+),(\d+)\}', groups)
        return any(layout.spans((int(s), int(t))) for s, t in pairs)
    found = device_groups(groups)
    if found == [[]]:  # every device in one group
        return layout.hosts > 1
    return any(layout.spans(g) for g in found)


def op_us(op: dict, hw, link=None) -> float:
    """One op's predicted time per step (x its trips), over `link` (an INTER_HOST Link) or the
    hardware's own."""
    on = link or hw
    hops, sent = cost.wire(op['kind'], op['bytes'], op['group_size'])
    each = hops * on.hop_us + sent / (on.link_gb_s * 1e9 * on.achievable) * 1e6
    return each * op['trip_count']


def price(result: dict, layout: Layout, hardware: str) -> None:
    """Reprices an analysed program (program.analyse's {'ops', 'predicted'}) in place: every op
    that crosses hosts at the inter-host link ('link': 'inter-host'), the others within a host
    ('link': 'host'); the comms total and the step band follow."""
    hw, link = cost.HARDWARE[hardware], INTER_HOST[hardware]
    for op in result['ops']:
        crosses = op_crosses(op, layout)
        op['link'] = 'inter-host' if crosses else 'host'
        op['predicted_us'] = round(op_us(op, hw, link if crosses else None), 3)
    p = result['predicted']
    p['comms_us'] = round(sum(op['predicted_us'] for op in result['ops']), 3)
    p['step_us'] = [round(t, 3) for t in cost.step_band(p['compute_us'], p['comms_us'])]


def axis_table(ops, layout: Layout, hardware: str) -> list[dict]:
    """Per mesh axis of size > 1: the collectives over it (an op over several axes counts for
    each), ops x trips, bytes per step, and their time within a host and across hosts."""
    hw, link = cost.HARDWARE[hardware], INTER_HOST[hardware]
    rows = []
    for axis, n in layout.axes:
        if n == 1:
            continue
        over = [op for op in ops if axis in names(op)]
        rows.append({
            'axis': axis,
            'size': n,
            'hosts': dict(layout.crossing()).get(axis, 1),
            'ops': sum(op['trip_count'] for op in over),
            'bytes': sum(op['bytes'] * op['trip_count'] for op in over),
            'within_us': round(sum(op_us(op, hw) for op in over), 3),
            'across_us': round(sum(op_us(op, hw, link) for op in over), 3),
        })  # fmt: skip
    return rows


def names(op: dict) -> set:
    """The mesh axes an op runs over: 'data/fsdp~2' (part of their groups) counts as both."""
    return {n for a in op['axes'] or () for n in a.split('~')[0].split('/')}


def report(programs: dict, layout: Layout, hardware: str) -> dict:
    """The report's 'hosts' section: the layout (as create_hybrid_device_mesh's arguments), the
    inter-host link, the axis table of the explicit twin's program, and the mesh ordered by
    that table (`suggested`: the axes whose collectives lose least across hosts first)."""
    link = INTER_HOST[hardware]
    ops = programs.get('explicit') or next(iter(programs.values()))
    table = axis_table(ops, layout, hardware)
    extra = {r['axis']: r['across_us'] - r['within_us'] for r in table}
    ordered = sorted(layout.axes, key=lambda a: (a[1] == 1, extra.get(a[0], 0.0)))
    return {
        'hosts': layout.hosts,
        'per_host': layout.per_host,
        'across': layout.crossing(),
        'mesh_shape': layout.within,
        'dcn_mesh_shape': layout.across,
        'link': dataclasses.asdict(link),
        'axes': table,
        'suggested': ','.join(f'{a}:{n}' for a, n in ordered),
        'note': "each axis's collectives priced within a host and across hosts: 'data' moves "
        "the gradient once a step, 'fsdp' each layer's weights (gathered forward and again "
        "backward, the gradient scattered), 'model' each layer's activations both ways, 'stage' "
        'one microbatch a tick, so the extra time across hosts ranks them; the outer axes of '
        '--mesh go across hosts.',
    }


def price_report(r: dict, layout: Layout) -> None:
    """Reprices every program of an inspector report (its 'programs' and 'predicted') over
    `layout` and adds the 'hosts' section: for a program of your own (--program)."""
    for name, ops in r['programs'].items():
        price({'ops': ops, 'predicted': r['predicted'][name]}, layout, r['hardware'])
    r['hosts'] = report(r['programs'], layout, r['hardware'])


def print_hosts(r: dict) -> None:
    """The text of the report's 'hosts' section."""
    h = r['hosts']
    across = ', '.join(f'{a} over {k}' for a, k in h['across'].items()) or 'none'
    print(
        f"\nOver {h['hosts']} hosts of {h['per_host']} devices (create_hybrid_device_mesh("
        f"mesh_shape={tuple(h['mesh_shape'])}, dcn_mesh_shape={tuple(h['dcn_mesh_shape'])})): "
        f"across hosts {across}; between hosts {h['link']['name']}, "
        f"{h['link']['link_gb_s']:g} GB/s per device."
    )
    print(f"{'axis':<8} {'size':>4} {'hosts':>5} {'ops/step':>8} {'bytes/step':>14} "
          f"{'within us':>10} {'across us':>10} {'extra us':>10}")  # fmt: skip
    for a in h['axes']:
        print(
            f"{a['axis']:<8} {a['size']:>4} {a['hosts']:>5} {a['ops']:>8} {a['bytes']:>14,} "
            f"{a['within_us']:>10.1f} {a['across_us']:>10.1f} "
            f"{a['across_us'] - a['within_us']:>10.1f}"
        )
    print(f"  {h['note']}")
    print(f"  least extra time across hosts first: --mesh={h['suggested']}")
