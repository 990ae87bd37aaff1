"""Devices and the mesh. The caller (CLI or test fixture) builds the mesh and passes it down."""

import os

import math

import jax
from jax.sharding import AxisType

from shard_parity import UsageError

from shard_parity.plan import DATA, EXPERT, FSDP, MODEL, SEQ, STAGE  # noqa: F401  (the axes)
NO_FMA = '--xla_cpu_max_isa=AVX'  # AVX has no fused multiply-add instructions


def configure_jax(cpu_devices: int | None, *, cpu_fma: bool = False, libtpu_lines=False) -> None:
    """Settings that only take effect before JAX's backend starts.

    cpu_devices: emulate this many CPU devices and run on the CPU; None keeps the default
      platform (a GPU if there is one) and still emulates 8 CPU devices for CPU-only machines.
    cpu_fma: let XLA's CPU code generator contract a*b+c into fused multiply-adds. Whether it does
      depends on how each program was fused, so the auto and explicit programs would round the
      optimizer update differently in the last bit, and those bits grow over hundreds of steps
      into visibly different runs. Without FMA the two twins are bitwise identical on the CPU.
    libtpu_lines: with libtpu installed (the [tpu] extra) on a machine without a TPU, JAX's
      backend start and every --target compile load it, and it prints five lines of warnings
      about the TPU it cannot find; they are kept off the screen unless this is set (--verbose).
    """
    if not libtpu_lines:
        from shard_parity.inspector.target import quiet_libtpu

        quiet_libtpu()
    try:
        if cpu_devices is not None:
            jax.config.update('jax_platforms', 'cpu')
        jax.config.update('jax_num_cpu_devices', cpu_devices or 8)
    except RuntimeError as e:
        raise UsageError(
            f'--cpu_devices={cpu_devices} came too late: JAX has already started with '
            f'{jax.device_count()} devices, and the device count is fixed from then on. '
            'Set it before anything touches JAX (the train CLIs do it first thing).'
        ) from e
    if not cpu_fma and NO_FMA not in os.environ.get('XLA_FLAGS', ''):
        os.environ['XLA_FLAGS'] = f"{os.environ.get('XLA_FLAGS', '')} {NO_FMA}".strip()


def use_matmul_precision(name: str) -> None:
    """The plan's --matmul_precision for every dot traced from now on (jax's
    default_matmul_precision): 'default' leaves JAX's default (on a TPU one bfloat16 pass for
    float32 operands; on a GPU, TF32 where allowed), 'high' and 'highest' ask for more."""
    jax.config.update('jax_default_matmul_precision', None if name == 'default' else name)


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
    owner = 'this process has' if devices is None else 'the target has'
    devices = jax.devices() if devices is None else list(devices)
    if shape is None:
        shape = (len(devices) if num_devices is None else num_devices,) + (1,) * (len(axes) - 1)
    n = math.prod(shape)
    if not 1 <= n <= len(devices) or min(shape) < 1:
        asked = f'--mesh={"x".join(map(str, shape))}' if max(shape[1:], default=1) > 1 else f'--num_devices={n}'
        raise UsageError(
            f'{asked}, but {owner} {len(devices)} '
            f'{devices[0].platform.upper()} devices: use 1..{len(devices)} in all'
            + (', or emulate more with --cpu_devices' if devices[0].platform == 'cpu' else '')
        )
    return jax.make_mesh(shape, axes, axis_types=(axis_type,) * len(axes), devices=devices[:n])


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
