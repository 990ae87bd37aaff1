"""`--attention=fused` on a TPU: Pallas' splash attention (Sparse FLASH attention), causal.

    q: [B, T, H, D]   k, v: [B, T, K, D]   (K divides H)   ->   [B, T, H, D]

The kernel (jax.experimental.pallas.ops.tpu.splash_attention) takes one sequence's heads first,
q [H, T, D] and k, v [K, T, D], and knows no batch: `local` transposes the model's [B, T, H, D]
to [B, H, T, D], scales q by 1/sqrt(D) (the kernel does not), and vmaps the kernel over B.
Its MHA form serves GQA and MQA too: query head h reads key/value head h // (H/K). Pallas'
flash_attention for TPU refuses unequal head counts, hence splash. The causal mask is a
CausalMask per head: blocks above the diagonal are skipped, not computed and masked.

A Mosaic kernel is a custom call XLA's partitioner cannot split (a custom call's sharded
operands would be gathered whole onto every device; jax refuses to lower one unwrapped). So
the kernel runs inside `jax.shard_map` over the mesh's row axes ('data', 'fsdp', 'expert')
and 'model' (the heads), each device on its own rows and heads (`sharded`). Inside the explicit
twin's shard_map every axis is already Manual: the kernel runs on the local shards as they are
(`unchecked`). A sequence split over devices (context parallelism's 'seq') or a stage axis
under vmap (auto and typed pipelines) keeps the blockwise path: `plan` says why, and
attention.py logs it once.

The kernel needs T a multiple of 128 (a vector register's lanes), equal query and key lengths
(the training window; generation's KV cache keeps blockwise) and bf16 or float32 inputs.

Tests force this path on a CPU, where Pallas interprets the kernel (slowly: small shapes only):
set `SHARD_PARITY_SPLASH=interpret` in the environment (read at each call).
"""

import functools
import os

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import AxisType, NamedSharding
from jax.sharding import PartitionSpec as P

from shard_parity.model.ops import partitions, typed, vary_like, varying

LANES = 128  # the kernel's key blocks are multiples of a vector register's 128 lanes
BLOCK = 512  # block_q = block_kv (forward and both backward kernels): the largest of
#              512, 256, 128 that divides T (benchmarks/results/tpu/splash.sh)
FUSED_BACKWARD = False  # dq and dk/dv in one backward kernel (splash.sh times both)
ROWS = ('data', 'fsdp', 'expert')  # the mesh axes that split the batch's rows
HEADS = 'model'  # the mesh axis that splits the heads (tensor parallelism)


def interpreted() -> bool:
    """Whether tests asked for the kernel on a CPU, in Pallas' interpret mode."""
    return os.environ.get('SHARD_PARITY_SPLASH', '') == 'interpret'


def platform(q) -> str:
    """The platform attention runs on: its mesh's devices' (which, compiled ahead of time for a
    --target, are not this machine's), else this process's first device's."""
    device = getattr(mesh_of(q), 'abstract_device', None)
    return device.platform if device is not None else jax.devices()[0].platform


def available(where: str) -> bool:
    """On platform `where`: a TPU, or a test's interpret mode."""
    return where == 'tpu' or interpreted()


def block_size(t: int) -> int:
    """The largest of BLOCK, BLOCK/2, ... down to 128 that divides t."""
    block = BLOCK
    while t % block:
        block //= 2
    return block


@functools.lru_cache(maxsize=64)
def kernel(heads: int, t: int, block: int, interpret: bool, fused_backward: bool = False):
    """The causal splash kernel for `heads` query heads of length t, blocks of `block` queries
    and keys in the forward and the backward (dq and dk/dv in two kernels, or one: `fused_
    backward`); its mask's block tables are built here, once per shape, in NumPy."""
    from jax.experimental.pallas.ops.tpu import splash_attention as sa

    dq = {} if fused_backward else {'block_q_dq': block, 'block_kv_dq': block}
    sizes = sa.BlockSizes(
        block_q=block, block_kv=block, block_kv_compute=block, block_q_dkv=block,
        block_kv_dkv=block, block_kv_dkv_compute=block, use_fused_bwd_kernel=fused_backward, **dq,
    )  # fmt: skip
    mask = sa.MultiHeadMask([sa.CausalMask((t, t)) for _ in range(heads)])
    with jax.ensure_compile_time_eval():  # concrete tables, not a trace's (this one is cached)
        return sa.make_splash_mha(
            mask, block_sizes=sizes, head_shards=1, q_seq_shards=1, interpret=interpret
        )


def local(q, k, v, scaled: bool = False):
    """The kernel on whole arrays (or one device's shards): [B, T, H, D] in and out; q scaled
    by 1/sqrt(D) here unless `scaled` already."""
    t, h, d = q.shape[1:]
    run = kernel(h, t, block_size(t), interpreted(), FUSED_BACKWARD)
    if not scaled:
        q = q * np.asarray(1 / np.sqrt(d), q.dtype)
    q = q.transpose(0, 2, 1, 3)  # [B, H, T, D]
    k, v = (x.transpose(0, 2, 1, 3) for x in (k, v))  # [B, K, T, D]
    return jax.vmap(run)(q, k, v).transpose(0, 2, 1, 3)


def mesh_of(q):
    """The mesh attention runs on: the context's (inside shard_map, or set by the caller), else
    the one q's type names (under jit, an Auto or Explicit mesh's abstract form)."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        mesh = getattr(jax.typeof(q).sharding, 'mesh', mesh)
    return mesh


def plan(q, k) -> tuple[str | None, tuple | None]:
    """(why not, the shard_map's spec of q, k, v and out) for this call: (None, None) runs the
    kernel as it is (one device, or every axis already Manual); a reason (what the kernel
    does not take, a noun phrase), the blockwise path."""
    b, t = q.shape[:2]
    if t % LANES:
        return f'a sequence length of {t} (not a multiple of {LANES})', None
    if k.shape[1] != t:
        return f'{k.shape[1]} keys for {t} queries', None
    if jnp.dtype(q.dtype) not in (jnp.bfloat16, jnp.float32):
        return f'{jnp.dtype(q.dtype).name} inputs', None
    mesh = mesh_of(q)
    manual = set(getattr(mesh, 'manual_axes', ()))
    axes = {a: n for a, n in mesh.shape.items() if a not in manual}
    free = {a: n for a, n in axes.items() if n > 1}
    if not free and not (axes and AxisType.Explicit in mesh.axis_types):
        return None, None  # (an Explicit mesh of size-1 axes still wants the shard_map: its
        #                    types name them, and the kernel's vmap under jit finds no mesh)
    other = sorted(set(free) - set(ROWS) - {HEADS})
    if other:
        return f'the mesh axis {other[0]!r}, which splits what the kernel needs whole', None
    if typed(q) is not None:  # Explicit mode: as q's type lays it out, if the kernel can take it
        return explicit_spec(q, k, mesh)
    rows = tuple(a for a in mesh.axis_names if a in axes and a in ROWS)  # as placement.rows
    if b % int(np.prod([axes[a] for a in rows])):
        rows = ()  # rows that do not split evenly: whole on every device
    heads = HEADS if HEADS in axes and k.shape[2] % axes[HEADS] == 0 else None
    return None, P(rows or None, None, heads, None)


def explicit_spec(q, k, mesh):
    """(None, q's own spec) where the kernel takes it per device: rows and heads split, the
    sequence and head_dim whole, and the key/value heads split as the query heads (GQA's groups
    stay on one device); else a reason. The output then has q's type, as the model expects
    (a size-1 'model' named on the heads would make the out-projection row-parallel)."""
    rows, seq, heads, dim = partitions(q, typed(q))
    if seq is not None or dim is not None:
        return f'queries split along {"the sequence" if seq else "head_dim"}', None
    split = int(np.prod([mesh.shape[a] for a in np.atleast_1d(heads or ())]))
    if k.shape[2] % split:
        return f'{k.shape[2]} key/value heads over {split} devices', None
    return None, P(rows, None, heads, None)


def sharded(q, k, v, spec):
    """`local` under shard_map over the mesh's Auto or Explicit axes that `spec` names."""
    mesh = mesh_of(q)
    manual = set(getattr(mesh, 'manual_axes', ()))
    free = frozenset(a for a in mesh.axis_names if a not in manual)
    if AxisType.Explicit in mesh.axis_types:  # q, k, v laid out as the shard_map takes them
        q, k, v = (jax.reshard(x, NamedSharding(mesh, spec)) for x in (q, k, v))
    return jax.shard_map(
        local, mesh=mesh, in_specs=(spec, spec, spec), out_specs=spec, axis_names=free,
        check_vma=False,
    )(q, k, v)  # fmt: skip


def splash(q, k, v):
    """Causal attention by the splash kernel; call `plan` first (None: it runs here)."""
    reason, spec = plan(q, k)
    assert reason is None, reason
    if spec is not None:
        return sharded(q, k, v, spec)
    manual = mesh_of(q).manual_axes or any(varying(x) for x in (q, k, v))
    return unchecked(q, k, v) if manual else local(q, k, v)


# --- inside the explicit twin's shard_map, where JAX checks which axes each array varies over


def unchecked(q, k, v):
    """`local` inside a shard_map that checks varying axes (check_vma, the default): the
    kernel's pallas_call declares its outputs without them, which JAX refuses there. So the
    kernel, forward and backward, is traced with the check off, on operands that vary over no
    axis by type (as its outputs), and the outputs and gradients are cast back to vary as the
    operands do: every value there is each device's own already, the casts only say so. JAX
    may trace that region again with the check on (jax.checkpoint in a scan: explicit/fsdp's
    layers), where an operation on two operands that vary differently fails: q is scaled
    before the region, and the operands are made plain by a product with a 1 made before it,
    which varies as they do. (jax 0.12 refuses the cleaner nested shard_map over no axes.)"""
    d = q.shape[-1]
    return _unchecked(q * np.asarray(1 / np.sqrt(d), q.dtype), k, v)


@jax.custom_vjp
def _unchecked(q, k, v):
    return _unchecked_fwd(q, k, v)[0]


def _vma_off():
    from jax._src import config  # jax 0.10 to 0.12: no public switch

    return config._check_vma(False)


def _ones(*refs):
    """A 1 for each of `refs`, varying as it does: made with the check on, before the region."""
    return [vary_like(jnp.ones((), x.dtype), x) for x in refs]


def _plain(x, one):
    """x times 1: with the check off, a result that varies over no axis by type; traced again
    with the check on, a product of two operands that vary alike."""
    return x * one


def _scaled(q, k, v):
    return local(q, k, v, scaled=True)


def _unchecked_fwd(q, k, v):
    ones = _ones(q, k, v)
    with _vma_off():
        out, back = jax.vjp(_scaled, *map(_plain, (q, k, v), ones))
    return vary_like(out, q), (back, q, k, v)


def _unchecked_bwd(saved, g):
    back, *primals = saved
    ones = _ones(g)
    with _vma_off():
        grads = back(_plain(g, *ones))
    return tuple(vary_like(d, x) for d, x in zip(grads, primals))


_unchecked.defvjp(_unchecked_fwd, _unchecked_bwd)
