"""Explicit mode: splitting rows into microbatches moves a size-1 mesh axis onto the microbatches.

Shows: a batch f32[B, T, C] whose rows are split over two mesh axes, the second of SIZE 1
(mesh data:8, fsdp:1, rows P(('data', 'fsdp'))), reshaped to [B/M, M, T, C] (row r in microbatch
r mod M) and swapped to [M, B/M, T, C] for a jax.lax.scan over the M microbatches. JAX's reshape
rule (jax/_src/lax/lax.py `split_partitions`) hands the row axes out greedily: 'data' (8) fills
B/M = 8, and the left-over 'fsdp' (size 1) is attached to the next dimension still > 1, M.

Expected: [B/M, M] -> f32[8@(data,fsdp), 2, T, C] (the whole split stays on the rows; a mesh
axis of size 1 divides anything), so the swapped [M, B/M] array is f32[2, 8@(data,fsdp), ...]
and scan accepts it.
Actual (jax 0.10.2 and 0.12.0.1): f32[8@data, 2@fsdp, T, C]; after the swap
f32[2@fsdp, 8@data, ...], and jax.lax.scan raises
  ValueError: 0th dimension of all xs should be replicated. Got P('fsdp', 'data', None, None)
although 'fsdp' has size 1. The same with the project's mesh expert:2, data:4, fsdp:1 and rows
P(('expert', 'data', 'fsdp')) (P('fsdp', ('expert', 'data'), ...)). Control: with the size-1
axis first (mesh fsdp:1, data:8, rows P(('fsdp', 'data'))) the rule keeps the rows whole and the
scan runs. In the project's pipelines the same mis-sharding surfaced as a safe_zip length error.
Side note: reshaping directly to [M, B/M] from rows P(('data', 'fsdp')) is refused ("This
reshape is not supported. Please specify the sharding of the output via the `out_sharding`
argument of jax.lax.reshape"), also on both versions.

Project work-round: shard_parity/pipeline.py `split` / `join` go through
shard_parity/model/ops.py `split` / `merge`, which pass jax.lax.reshape an explicit out_sharding
in Explicit mode (the rows' split on B/M, None on M); commit 1208797.

Upstream: none found. Related, not the same: openxla/xla#13306 "HandleReshape in SPMD partitioner
splits sharding in some cases where it is unoptimal" (https://github.com/openxla/xla/issues/13306,
GSPMD, gradient-accumulation reshape, Auto mode). Queries tried (corpus "issues"): "0th dimension
of all xs should be replicated", "scan xs sharded leading dimension explicit sharding replicated
error", "reshape explicit sharding batch split microbatches gradient accumulation sharding moved
to wrong dimension", "explicit sharding reshape P(('data','fsdp')) fsdp size 1 leading dimension
sharded scan"; find_string "0th dimension of all xs should be replicated" (only jax's source and
unrelated project docs).

Run: python tools/upstream/explicit_microbatch_rows_size1_axis.py (a few seconds, CPU only).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax

jax.config.update('jax_num_cpu_devices', 8)

import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

B, T, C, M = 16, 4, 8, 2


def scan_over_microbatches(xs):
    """A scan over the leading (microbatch) dimension, as a pipeline or gradient accumulation."""
    return jax.lax.scan(lambda c, x: (c, x * 2), 0.0, xs)[1]


def try_mesh(shape, names, rows, fix=False):
    """Split rows P(rows) into [M, B/M, T, C] as the project does and scan; the error line."""
    mesh = jax.make_mesh(shape, names, axis_types=(AxisType.Explicit,) * len(shape))
    result = {}
    with jax.set_mesh(mesh):
        x = jax.device_put(jnp.ones((B, T, C)), P(rows))

        @jax.jit
        def run(x):
            if fix:  # the work-round: say the split's sharding
                out = NamedSharding(mesh, P(rows, None, None, None))
                a = jax.lax.reshape(x, (B // M, M, T, C), out_sharding=out)
            else:
                a = x.reshape(B // M, M, T, C)
            xs = a.swapaxes(0, 1)
            tag = 'work-round' if fix else 'reshape'
            print(
                f'  {dict(zip(names, shape))} rows {jax.typeof(x)}: {tag} [B/M,M] -> '
                f'{jax.typeof(a)}; [M,B/M] {jax.typeof(xs)}'
            )
            try:
                ys = scan_over_microbatches(xs)
                print(f'    scan ok -> {jax.typeof(ys)}')
            except ValueError as e:
                result['error'] = f'{type(e).__name__}: {str(e).splitlines()[0]}'
                print(f"    scan: {result['error']}")
            return x

        run(x)
    return result.get('error')


def main():
    print('jax', jax.__version__)
    error = try_mesh((8, 1), ('data', 'fsdp'), ('data', 'fsdp'))
    try_mesh((2, 4, 1), ('expert', 'data', 'fsdp'), ('expert', 'data', 'fsdp'))
    print('  control: the size-1 axis first')
    try_mesh((1, 8), ('fsdp', 'data'), ('fsdp', 'data'))
    print('  work-round: jax.lax.reshape(..., out_sharding=P(rows, None, ...))')
    fixed = try_mesh((8, 1), ('data', 'fsdp'), ('data', 'fsdp'), fix=True)
    if error and not fixed:
        print(
            "REPRODUCED: rows P(('data','fsdp')), fsdp:1, reshaped [B/M,M] -> "
            f"f32[8@data,2@fsdp,...]; scan over M raises {error}"
        )
    else:
        print('NOT REPRODUCED')


if __name__ == '__main__':
    main()
