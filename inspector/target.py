"""Hardware you have not got: the devices of a real TPU slice (or a GPU host whose target config
was captured), made by the compiler's own topology description, so that a program compiles for
that hardware from shapes alone on a machine without it (`--target`).

    devices = target.devices('tpu-v5e-8')          # 8 compile-only 'TPU v5 lite' devices
    mesh = jax.sharding.Mesh(np.array(devices).reshape(8, 1), ('data', 'model'))
    jax.jit(step).lower(<ShapeDtypeStructs with NamedShardings on mesh>).compile()

The TPU compiler is libtpu (`pip install -e ".[tpu]"`: jax[tpu], the libtpu release pinned to
the installed jax). libtpu accepts impossible slices (a 32x32 v5e, a 2x2x3 v5p) without a word,
so the slices here are the ones Google Cloud sells, each with the topology arguments that give
the devices JAX shows on it, and the HBM per chip that its compiler holds a program against (the
figure a RESOURCE_EXHAUSTED compile error names as "available HBM"). The chip's prices for the
cost model are `hardware`'s entry in inspector/cost.py; what the target's compiler says of a
program's memory and cost, inspector/target_figures.py. Generic: of the project it imports only
the core's libtpu set-up (shard_parity/devices.py).
"""

import contextlib
import dataclasses
import functools
import os
import re

import jax
import numpy as np

from shard_parity.devices import libtpu_installed, quiet_libtpu

GiB = 2**30


class TargetError(Exception):
    """A target that cannot be compiled for here: the CLI prints its one line."""


@dataclasses.dataclass(frozen=True)
class Target:
    name: str  # Google Cloud's accelerator type (tpu-v5e-8 is v5litepod-8), or NAMExCOUNT
    platform: str  # 'tpu' or 'cuda'
    topology: str  # libtpu's topology name: 'v5e:2x4', 'v5p:2x2x1'
    devices: int  # what jax.devices() lists on the real slice
    device_kind: str
    hbm_bytes: int  # per device, as the compiler holds a program against it
    hardware: str  # inspector/cost.py's entry with this chip's and link's figures
    chip_config: str = 'default'
    host_bounds: tuple = (2, 2, 1)  # chips per host: how the devices split into processes
    wrap: tuple = (False, False, False)  # a torus (wrap-around links) in each dimension
    note: str = ''
    here: bool = False  # the chips this process runs on (`here()`): compiled for them, not shapes


def _tpu(name, topology, devices, kind, hbm_gib, hardware, **kw) -> Target:
    return Target(name, 'tpu', topology, devices, kind, int(hbm_gib * GiB), hardware, **kw)


def _slices() -> dict:
    out = {}
    # v5e (Cloud: v5litepod-N): N chips, one device each, 2-D; an 8-chip host, else 4 per host
    for n, shape in ((1, '1x1'), (4, '2x2'), (8, '2x4'), (16, '4x4'), (32, '4x8'), (64, '8x8'),
                     (128, '8x16'), (256, '16x16')):  # fmt: skip
        bounds = {1: (1, 1, 1), 8: (2, 4, 1)}.get(n, (2, 2, 1))
        out[f'tpu-v5e-{n}'] = _tpu(f'tpu-v5e-{n}', f'v5e:{shape}', n, 'TPU v5 lite', 15.75,
                                   'tpu-v5e-8', host_bounds=bounds)  # fmt: skip
    # v5p and v4 (Cloud: v5p-N, v4-N with N = 2 x chips, TensorCores): one device per chip
    # (megacore), 3-D; a torus in every dimension from the 4x4x4 cube up
    for gen, kind, hbm, cfg in (('v5p', 'TPU v5', 95.74, 'default'),
                                ('v4', 'TPU v4', 30.75, 'megacore')):  # fmt: skip
        for shape in ('2x2x1', '2x2x2', '2x2x4', '2x4x4', '4x4x4'):
            chips = int(np.prod([int(d) for d in shape.split('x')]))
            torus = all(int(d) % 4 == 0 for d in shape.split('x'))
            out[f'tpu-{gen}-{2 * chips}'] = _tpu(
                f'tpu-{gen}-{2 * chips}', f'{gen}:{shape}', chips, kind, hbm, f'tpu-{gen}-8',
                chip_config=cfg, wrap=(torus,) * 3,
            )  # fmt: skip
    out['h200x8'] = Target(
        'h200x8', 'cuda', '1x1x8', 8, 'NVIDIA H200', 0, 'h200x8',
        note='needs a target config captured on an H200 (benchmarks/gpu.sh) and the CUDA plugin',
    )  # fmt: skip
    return out


TARGETS = _slices()
CONFIGS = os.path.join(os.path.dirname(os.path.abspath(__file__)), 'target_configs')


def install_hint(name: str) -> str:
    return (
        f'--target={name} compiles with the TPU compiler, libtpu, which is not installed here: '
        f'pip install -e ".[tpu]" (it pins the libtpu release that matches jax {jax.__version__})'
    )


def get(name) -> Target:
    if isinstance(name, Target):  # here()'s, or one built by a caller
        return name
    if name not in TARGETS:
        raise TargetError(f'--target={name}: expected one of {", ".join(TARGETS)}')
    return TARGETS[name]


@functools.cache
def devices(name: str, verbose: bool = False) -> tuple:
    """The compile-only devices of target `name`, in the order the real slice lists them.
    `verbose`: let libtpu print its start-up lines (they are otherwise kept off the screen)."""
    t = get(name)
    if t.here:
        return tuple(jax.devices())
    if t.platform == 'cuda':
        return _gpu_devices(t)
    if not libtpu_installed():
        raise TargetError(install_hint(name))
    if not verbose:
        quiet_libtpu()
    from jax.experimental import topologies

    try:
        found = topologies.get_topology_desc(
            platform='tpu', topology_name=t.topology, chip_config_name=t.chip_config,
            chips_per_host_bounds=t.host_bounds, num_slices=1, wrap=t.wrap,
        ).devices  # fmt: skip
    except Exception as e:  # e.g. another process holds this TPU host's chips (its lock file)
        if verbose:
            raise
        raise TargetError(
            f'--target={name}: the TPU compiler did not start: {str(e).splitlines()[0][:200]}'
        ) from e
    if len(found) != t.devices:  # this libtpu reads the topology another way: say so, not guess
        raise TargetError(
            f'--target={name}: libtpu made {len(found)} devices of {t.topology}, where the '
            f'slice has {t.devices}; this libtpu is not one this table was checked with'
        )
    return tuple(found)


def here() -> Target | None:
    """On a TPU host, the chips this process runs on as a Target (the inspector's default there,
    as `--target` is elsewhere): the slice of the table with their kind and count (one v5e chip:
    tpu-v5e-1), its cost model, and the HBM the runtime allows (memory_stats()' bytes_limit, else
    the table's). None off a TPU, or for a TPU kind the table has not got."""
    found = jax.devices()
    if found[0].platform != 'tpu':
        return None
    kind, n = found[0].device_kind, len(found)
    same = [t for t in TARGETS.values() if t.platform == 'tpu' and t.device_kind == kind]
    if not same:
        return None
    exact = next((t for t in same if t.devices == n), None)
    # a device count the table has not got: named by that count, priced and held alike
    base = exact or dataclasses.replace(same[0], name=f'{same[0].name.rsplit("-", 1)[0]}-{n}',
                                        devices=n)  # fmt: skip
    limit = (found[0].memory_stats() or {}).get('bytes_limit')
    return dataclasses.replace(base, hbm_bytes=int(limit or base.hbm_bytes), here=True)


@contextlib.contextmanager
def uncached(active: bool = True):
    """JAX's persistent compilation cache (where a user or the tests turned it on) would store a
    target's executable, which it cannot load back (a compile-only one: it warns, then compiles
    again): none is written while compiling for a target. (The cache's on/off switch is read
    once per process, so the write threshold is what can change here; compile_all's threads
    see a global setting, not a context's.)"""
    if not active:
        yield
        return
    before = jax.config.jax_persistent_cache_min_compile_time_secs
    jax.config.update('jax_persistent_cache_min_compile_time_secs', float('inf'))
    try:
        yield
    finally:
        jax.config.update('jax_persistent_cache_min_compile_time_secs', before)


def config_path(name: str) -> str:
    return os.path.join(CONFIGS, f'{name}.txtpb')


def _gpu_devices(t: Target) -> tuple:
    path = config_path(t.name)
    if not os.path.isfile(path):
        raise TargetError(
            f'--target={t.name}: no target config has been captured yet for this GPU (run '
            f'benchmarks/gpu.sh on an {t.device_kind}: it writes {os.path.relpath(path)})'
        )
    from jax.experimental import topologies

    try:
        topo = topologies.get_topology_desc(
            platform='cuda', topology=t.topology, target_config=open(path).read()
        )
    except Exception as e:  # no CUDA plugin, or one that cannot read the config
        raise TargetError(
            f'--target={t.name}: the GPU compiler did not start ({str(e).splitlines()[0][:160]}): '
            'it needs the CUDA plugin, pip install -e ".[gpu]"'
        ) from e
    return tuple(topo.devices)


def capture_gpu_config(folder: str = CONFIGS) -> str:
    """Writes this machine's GPU target config, what the GPU compiler needs to compile for these
    GPUs with none present, to `folder`/<target>.txtpb (h200x8 for 8 H200s: --target's name),
    with the jax version and the devices it came from on top; benchmarks/gpu.sh runs it. The
    config is the topology's `target_config` (xla_client.get_topology_for_devices); jax 0.10.2's
    topology object has none (its attributes: fingerprint, platform, platform_version), and
    then this says so in one line rather than write a guess."""
    from jax._src.lib import xla_client

    found = jax.devices()
    kind = found[0].device_kind
    topology = xla_client.get_topology_for_devices(found)
    config = getattr(topology, 'target_config', None)
    if not config:
        raise TargetError(
            f'jax {jax.__version__} exposes no target_config on the topology of {len(found)} x '
            f'{kind}: nothing captured'
        )
    text = config if isinstance(config, str) else config.decode()
    name = next((t.name for t in TARGETS.values() if t.platform == 'cuda' and
                 t.device_kind == kind and t.devices == len(found)), None)  # fmt: skip
    name = name or re.sub(r'\W+', '_', kind.lower()) + f'x{len(found)}'
    os.makedirs(folder, exist_ok=True)
    path = os.path.join(folder, f'{name}.txtpb')
    with open(path, 'w') as f:
        f.write(f'# captured by benchmarks/gpu.sh: jax {jax.__version__}, {len(found)} x {kind}\n')
        f.write(text)
    return path


def mesh_on(mesh, target_devices):
    """`mesh`'s shape, axis names and types, over the target's first devices."""
    n = mesh.devices.size
    if n > len(target_devices):
        raise TargetError(
            f'the mesh has {n} devices and the target {len(target_devices)}: build a mesh of at '
            'most that many'
        )
    grid = np.array(target_devices[:n], dtype=object).reshape(mesh.devices.shape)
    return jax.sharding.Mesh(grid, mesh.axis_names, axis_types=mesh.axis_types)


def onto(args, target_devices):
    """`args` (arrays or ShapeDtypeStructs) as ShapeDtypeStructs placed alike on the target's
    devices: a NamedSharding keeps its spec on the same mesh shape there; anything else goes
    to the target's first device."""
    meshes = {}

    def move(x):
        s = getattr(x, 'sharding', None)
        if isinstance(s, jax.sharding.NamedSharding):
            key = id(s.mesh)
            meshes.setdefault(key, mesh_on(s.mesh, target_devices))
            placed = jax.sharding.NamedSharding(meshes[key], s.spec)
        else:
            placed = jax.sharding.SingleDeviceSharding(target_devices[0])
        return jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=placed)

    return jax.tree.map(move, args)
