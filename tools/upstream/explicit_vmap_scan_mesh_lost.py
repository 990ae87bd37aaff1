"""Explicit mode, jax 0.12: vmap(spmd_axis_name=...) of a scan whose carry starts as zeros_like
fails with "Resource axis: stage ... is not found in mesh: ()" unless a mesh context is set.

Shows: x f32[S@stage, B@data, T] on an Explicit mesh stage:2, data:4, called through
jax.jit(jax.vmap(f, spmd_axis_name='stage')) with NO mesh context (the arrays carry their mesh in
their types, as the project's steps are called). f runs a jax.lax.scan whose initial carry is
jnp.zeros_like(x[:, 0]) (the blockwise attention's online-softmax state).

Expected: traces and runs, f32[2@stage, 8@data], as on jax 0.10.2 and as with a mesh context.
Actual on jax 0.12.0.1:
  ValueError: Resource axis: stage of P('stage', None) is not found in mesh: ().
raised from the scan's batching rule (_scan_batching_rule -> batching.batch_jaxpr_axes ->
core._unmap_shaped_array -> NamedSharding.update -> _check_mesh_resource_axis) when it promotes
the unbatched carry to batched and inserts 'stage' into the carry's sharding, whose mesh is
empty. Root cause seen here: on 0.12, jnp.zeros_like / ones_like / full_like of an Explicit-
sharded tracer inside jit with no mesh context return an unsharded array on the empty mesh
(f32[2,8,4]; under vmap the per-example zeros are f32[8,4] with AbstractMesh(())): for the
broadcast_in_dim of the scalar fill, jax/_src/lax/utils.py call_sharding_rule sees an empty
operand mesh and an empty context mesh and returns P() on the empty mesh, ignoring the
out_sharding (the input's NamedSharding) it was given; likewise jnp.zeros(shape,
out_sharding=NamedSharding(mesh, ...)) comes out unsharded there (sharded on 0.10.2).
On 0.10.2 zeros_like keeps f32[8@data,4] and the scan works (0.10.2 instead fails to *return*
such a zeros_like from jit without a mesh: "Length of device assignment 1 is not equal to the
size of the mesh 8", not this bug). Both versions raise the same "Resource axis" error when
the carry starts as an unsharded jnp.zeros(shape); with a mesh set that case is a genuine carry
type mismatch, so it is printed for information only.

Project work-round: shard_parity/pipeline.py `in_mesh` runs each stage's function under
jax.sharding.use_abstract_mesh(mesh.abstract_mesh) inside the vmap (commits 1208797, 44f802c,
7c310fb); the attention's softmax state also starts as zeros_like of the queries
(shard_parity/model/attention.py `_softmax_start`). Setting jax.set_mesh(mesh) around the call,
or starting the carry from x[:, 0] * 0, also avoids it (both shown below).

Upstream: none found. Related, not the same: jax-ml/jax#16080 "zeros_like does not preserve
sharding information" and #15600 "jit(jnp.zeros) and jit(jnp.zeros_like) should preserve the
sharding of the input" (2023, closed, pre-Explicit-mode); a third-party findings log (not an
issue) reports the same error text from batch_jaxpr_axes for grad(vmap(scan)) with a weak-typed
0.0 carry on jax 0.11. Queries tried (corpus "issues"): "vmap spmd_axis_name scan mesh not found
explicit", "Resource axis is not found in mesh: () vmap spmd_axis_name", "scan carry vmap sharded
axis Resource axis data not found in mesh batch_jaxpr_axes NamedSharding.update", "zeros_like
drops sharding explicit mode jit without mesh context", "full_like zeros_like loses sharding
explicit mesh jax 0.12 no mesh context", "jnp.zeros out_sharding NamedSharding ignored inside jit
no mesh context explicit"; find_string "is not found in mesh: ()".

Run: python tools/upstream/explicit_vmap_scan_mesh_lost.py (a few seconds, CPU only).
"""

import os

os.environ.setdefault('JAX_PLATFORMS', 'cpu')

import jax

jax.config.update('jax_num_cpu_devices', 8)

import jax.numpy as jnp
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

S, B, T = 2, 8, 4
MESH = jax.make_mesh((S, 4), ('stage', 'data'), axis_types=(AxisType.Explicit,) * 2)


def blockwise(x, init):  # x: [B@data, T] (one stage's slot); a loop over T with a carry [B]
    return jax.lax.scan(lambda c, xt: (c + xt, None), init(x), x.swapaxes(0, 1))[0]


def zeros_like_init(x):
    return jnp.zeros_like(x[:, 0])


def in_mesh(fn):  # the project's work-round (shard_parity/pipeline.py in_mesh)
    def run(*args):
        with jax.sharding.use_abstract_mesh(MESH.abstract_mesh):
            return fn(*args)

    return run


def attempt(label, fn, x, context=False):
    try:
        if context:
            with jax.set_mesh(MESH):
                y = fn(x)
        else:
            y = fn(x)
        print(f'  {label}: ok {jax.typeof(y)}')
        return None
    except Exception as e:  # noqa: BLE001
        line = f'{type(e).__name__}: {str(e).splitlines()[0]}'
        print(f'  {label}: {line[:200]}')
        return line


def main():
    print('jax', jax.__version__)
    x = jax.device_put(jnp.ones((S, B, T)), NamedSharding(MESH, P('stage', 'data')))

    def probe(x):  # what zeros_like gives without a mesh context, with and without vmap
        print(f'    zeros_like in jit, no mesh context: {jax.typeof(jnp.zeros_like(x))}')
        jax.vmap(
            lambda xi: print(f'    ... under vmap: {jax.typeof(jnp.zeros_like(xi))}') or xi,
            spmd_axis_name='stage',
        )(x)
        return x + 0

    print(f'  x: {jax.typeof(x)}')
    jax.jit(probe)(x)

    def stages(f):
        return jax.jit(jax.vmap(f, spmd_axis_name='stage'))

    error = attempt(
        'vmap(scan, carry zeros_like), no mesh context',
        stages(lambda xi: blockwise(xi, zeros_like_init)),
        x,
    )
    attempt(
        'the same under jax.set_mesh(mesh)',
        stages(lambda xi: blockwise(xi, zeros_like_init)),
        x,
        context=True,
    )
    attempt(
        'work-round: use_abstract_mesh inside the vmap (pipeline.in_mesh)',
        stages(in_mesh(lambda xi: blockwise(xi, zeros_like_init))),
        x,
    )
    attempt(
        'carry from x[:, 0] * 0, no mesh context',
        stages(lambda xi: blockwise(xi, lambda x: x[:, 0] * 0)),
        x,
    )
    attempt(
        '(info) carry jnp.zeros(shape), unsharded, no mesh context',
        stages(lambda xi: blockwise(xi, lambda x: jnp.zeros(x.shape[:1]))),
        x,
    )
    if error and 'not found in mesh' in error:
        print(
            f'REPRODUCED: jit(vmap(scan, spmd_axis_name=stage)) with a zeros_like carry and no '
            f'mesh context: {error}'
        )
    else:
        print('NOT REPRODUCED')


if __name__ == '__main__':
    main()
