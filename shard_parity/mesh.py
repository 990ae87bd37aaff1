"""The mesh of a plan, over this process's devices or a target's. The caller (CLI or test
fixture) builds the mesh and passes it down; JAX's set-up before the backend starts is
shard_parity/devices.py."""


import math

import jax
from jax.sharding import AxisType

from shard_parity import UsageError

from shard_parity.plan import DATA, EXPERT, FSDP, MODEL, SEQ, STAGE  # noqa: F401  (the axes)
def make_mesh(
    num_devices: int | None = None,
    shape: tuple[int, ...] | None = None,
    axes: tuple[str, ...] = (DATA, MODEL),
    axis_type: AxisType = AxisType.Auto,
    devices=None,
):
    """A mesh over the first devices: `shape` (from --mesh), or by default all `num_devices`
    (all of them) on the first axis and 1 on the others. `axes` names them, in order
    (shard_parity/plan.py: `mesh_for` builds one from a plan). An axis a strategy does not
    use holds copies (dp on 4x2: 2 copies of each shard).
    `axis_type`: the twin's AXIS_TYPE (its __init__.py). Auto for auto/ (the compiler decides
    how sharded values flow) and explicit/ (shard_map makes the axes Manual inside); Explicit
    for typed/ (every array's sharding is part of its type).
    `devices`: the devices to take them from (default: this process's, jax.devices()); the
    inspector's --target passes the compile-only devices of hardware that is not here.
    """
    given = devices
    devices = jax.devices() if devices is None else list(devices)
    if shape is None:
        shape = (len(devices) if num_devices is None else num_devices,) + (1,) * (len(axes) - 1)
    n = math.prod(shape)
    if not 1 <= n <= len(devices) or min(shape) < 1:
        asked = f'--mesh={"x".join(map(str, shape))}' if max(shape[1:], default=1) > 1 else f'--num_devices={n}'
        raise UsageError(too_many(asked, devices, target=given is not None))
    return jax.make_mesh(shape, axes, axis_types=(axis_type,) * len(axes), devices=devices[:n])


def too_many(asked: str, devices, target: bool = False) -> str:
    """The line that refuses more devices than there are: `asked` names the flag."""
    owner = 'the target has' if target else 'this process has'
    platform = devices[0].platform
    return (
        f'{asked}, but {owner} {len(devices)} {platform.upper()} devices: use 1..{len(devices)} '
        'in all' + (', or emulate more with --cpu_devices' if platform == 'cpu' else '')
    )


def mesh_for(plan, axis_type: AxisType = AxisType.Auto, devices=None):
    """The mesh of a plan (shard_parity/plan.py), over the first plan.devices devices (of
    `devices`, default this process's)."""
    return make_mesh(shape=plan.shape, axes=plan.names, axis_type=axis_type, devices=devices)


def with_axis_type(mesh, axis_type: AxisType):
    """The same devices and axes as `mesh`, with every axis of `axis_type` (a twin's AXIS_TYPE):
    for tools that compile several twins over one mesh."""
    return jax.sharding.Mesh(
        mesh.devices, mesh.axis_names, axis_types=(axis_type,) * len(mesh.axis_names)
    )


def local_rows(mesh, batch_size: int, rows=jax.sharding.PartitionSpec(DATA), devices=None) -> slice:
    """The rows of a global batch that this process's devices (or `devices`) hold, the batch laid
    out `rows` (placement.rows): all of them with one process, one contiguous block with several.
    The mesh lists each process's devices together, and the row axes' blocks follow the mesh's
    order (under P(('data', 'fsdp')) block 2d + f), so a process's devices hold adjacent blocks,
    or the same ones over an axis that splits no rows; anything else is refused, never loaded."""
    sharding = jax.sharding.NamedSharding(mesh, rows)
    if devices is None:
        devices = [d for d in mesh.devices.flat if d.process_index == jax.process_index()]
    held = sharding.devices_indices_map((batch_size,))
    spans = sorted({(b.start or 0, batch_size if b.stop is None else b.stop)
                    for d, (b, *_) in held.items() if d in set(devices)})  # fmt: skip
    stop = spans[0][0]
    for a, b in spans:
        if a > stop:
            raise UsageError(
                f'this process\'s devices hold rows {", ".join(f"{x}..{y - 1}" for x, y in spans)} '
                f'of the batch, not one block: lay the mesh out so that each process\'s devices '
                'are adjacent in its row axes (the process axis first)'
            )
        stop = max(stop, b)
    return slice(spans[0][0], stop)
