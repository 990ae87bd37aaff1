"""The analytic collectives of one train step of this repository's strategies: what the twins'
compiled programs are compared against (the gradient all-reduce, tensor parallelism's activation
all-reduces, context parallelism's ring)."""

import math

import jax
import numpy as np

from shard_parity import plan as plans
from shard_parity.mesh import DATA, EXPERT, MODEL, SEQ, STAGE
from shard_parity.model.moe import capacity
from shard_parity.placement import is_expert, state_specs


def expectation(strategy: str, model: str, params, mesh, batch_size: int, model_config) -> dict:
    """The analytic collectives of one step: the gradient's over 'data', the activations' over
    'model' (tensor parallelism only), the keys' and values' round the 'seq' ring (cp only)."""
    if strategy == 'cp':
        return cp_expectation(params, mesh, batch_size, model_config)
    if strategy == 'pp':
        return pp_expectation(params, mesh, batch_size, model_config)
    if strategy == 'ep':
        return ep_expectation(params, mesh, batch_size, model_config)
    plan = plans.of(mesh, strategy)
    d, m = math.prod(plan.size(a) for a in plan.rows), plan.size(MODEL)
    specs = jax.tree.leaves(state_specs(params, strategy, mesh))
    # each device's share of the gradient after tensor parallelism's split (all of it without)
    grad_bytes = sum(
        int(np.prod(p.shape)) * p.dtype.itemsize // (m if MODEL in spec else 1)
        for p, spec in zip(jax.tree.leaves(params), specs, strict=True)
    )
    expected = {
        'kind': 'all-reduce',
        'group_size': d,
        'gradient_bytes': grad_bytes,
        'ring_bytes_per_device': 2 * (d - 1) / d * grad_bytes,
        'note': f"one all-reduce of the gradients over '{plan.rows[0]}' (plus the averaged metric scalars) "
        'per step; XLA may combine it into one tuple-shaped op. A ring moves 2(N-1)/N of it.',
        'activations': None,
    }
    if strategy in ('fsdp', 'fsdp_tp'):
        expected |= {
            'kind': 'all-gather + reduce-scatter',
            'note': 'each sharded weight all-gathered over \'fsdp\' where it is used (the whole '
            'weight comes back, (N-1)/N of it over the wire) and its gradient reduce-scattered '
            '((N-1)/N again): the same bytes as one all-reduce, in two halves. Small unsharded '
            'arrays (biases whose size N does not divide) are all-reduced as in dp.',
        }
    if strategy in ('tp', 'fsdp_tp') and m > 1:
        expected['activations'] = activation_all_reduces(model, batch_size // d, m, model_config)
    return expected


def activation_all_reduces(model: str, rows: int, m: int, c) -> dict:
    """Tensor parallelism's all-reduces over 'model', each of a [rows, ..., width] activation:
    forward, one after every row-parallel layer; backward, one for the gradient of every
    column-parallel layer's input (none for the MLP's first layer: its input is the data)."""
    if model == 'mlp':
        count, shape = 1, (rows, 512)
        note = (
            'forward: the partial sums of the row-parallel second layer; no backward one: the '
            "first (column-parallel) layer's input is the data, which needs no gradient."
        )
    else:
        # forward: attention out, ffn down; backward: query, key_value and ffn up inputs
        count, shape = 5 * c.num_layers, (rows, c.seq_len, c.embed_dim)
        note = (
            'forward: the partial sums of each row-parallel layer (attention out, ffn down); '
            'backward: the input gradient of each column-parallel layer. query and key_value '
            'read the same input but are two layers, so its gradient is all-reduced twice.'
        )
    each = int(np.prod(shape)) * 4
    return {
        'kind': 'all-reduce',
        'group_size': m,
        'count': count,
        'shape': shape,
        'bytes': count * each,
        'ring_bytes_per_device': 2 * (m - 1) / m * count * each,
        'note': note,
    }


def cp_expectation(params, mesh, batch_size: int, c) -> dict:
    """Context parallelism: the gradient all-reduce over both axes (every device's loss is a
    different term), and explicit's ring (shard_parity/model/ring.py): per attention layer, a
    loop of n - 1 passes of this device's K/V block f32[B/d, T/n, K, D] (keys, values) forward;
    in the backward a loop of n - 1 passes of the keys, values and their gradients so far, and
    one more pass of the gradients: 8 collective-permutes in the program, 6n - 4 run. auto/ has
    no ring: XLA picks its own collectives for attention."""
    d, n = mesh.shape[DATA], mesh.shape[SEQ]
    grad_bytes = sum(int(np.prod(p.shape)) * p.dtype.itemsize for p in jax.tree.leaves(params))
    block = (batch_size // d, c.seq_len // n, c.num_kv_heads, c.head_dim)
    each = int(np.prod(block)) * 4  # one key or value block, float32 inside the ring
    per_layer = 2 + 4 + 2  # ops: forward loop (k, v), backward loop (k, v, dk, dv), last (dk, dv)
    runs = 2 * (n - 1) + 4 * (n - 1) + 2  # the loops run n - 1 times
    return {
        'kind': 'all-reduce',
        'group_size': d * n,
        'gradient_bytes': grad_bytes,
        'ring_bytes_per_device': 2 * (d * n - 1) / (d * n) * grad_bytes,
        'note': "one all-reduce of the gradients over 'data' and 'seq' together (plus the "
        'averaged metric), as dp over all the devices. A ring moves 2(N-1)/N of it.',
        'activations': None,
        'ring': {
            'kind': 'collective-permute',
            'group_size': d * n,  # d rings of n devices, one permute: a source->target pair each
            'ring_size': n,
            'count': per_layer * c.num_layers,
            'per_layer': per_layer,
            'shape': block,
            'bytes_each': each,
            'runs_per_layer': runs,
            'bytes': runs * c.num_layers * each,
            'note': f'explicit only: per attention layer, {n - 1} passes of the keys and values '
            f'round each ring of {n} (forward, one loop), {n - 1} of the keys, values and their '
            'gradients so far (backward, one loop), and one more of the gradients, home; one '
            'collective-permute per array and pass; each device sends and receives one block '
            'per permute.',
        },
    }


def ep_expectation(params, mesh, batch_size: int, c) -> dict:
    """Expert parallelism: the gradient all-reduce of the replicated weights over both axes
    (every device's loss is a different term), the experts' over 'data' alone (each device holds
    E/n of them), and per MoE layer two all-to-alls over 'expert' forward (each device's slots
    to the experts' devices, the outputs back) and two backward (their gradients, the same ways
    reversed). Each moves this device's slots, f32[E, B/(d n), capacity, C]: (n-1)/n of them
    over the wire. No expert weight is ever gathered."""
    d, n = mesh.shape[DATA], mesh.shape[EXPERT]
    sizes = [
        (is_expert(p), int(np.prod(x.shape)) * x.dtype.itemsize)
        for p, x in jax.tree_util.tree_leaves_with_path(params)
    ]
    grad_bytes = sum(size for expert, size in sizes if not expert)
    expert_bytes = sum(size for expert, size in sizes if expert) // n  # my E/n experts'
    slots = (c.num_experts, batch_size // (d * n), capacity(c, c.seq_len), c.embed_dim)
    each = int(np.prod(slots)) * 4
    return {
        'kind': 'all-reduce',
        'group_size': d * n,
        'gradient_bytes': grad_bytes,
        'expert_gradient_bytes': expert_bytes,
        'ring_bytes_per_device': 2 * (d * n - 1) / (d * n) * grad_bytes
        + 2 * (d - 1) / d * expert_bytes,
        'note': "one all-reduce of the replicated weights' gradients over 'data' and 'expert' "
        "together (plus the averaged metrics), and one of this device's experts' over 'data' "
        'alone (none on a mesh of one data row). A ring moves 2(N-1)/N of each.',
        'activations': None,
        'all_to_all': {
            'kind': 'all-to-all',
            'group_size': n,
            'per_layer': 4,
            'count': 4 * c.num_layers,
            'shape': slots,
            'bytes_each': each,
            'bytes': 4 * c.num_layers * each,
            'wire_bytes_per_device': 4 * c.num_layers * each * (n - 1) / n,
            'note': "per MoE layer: forward, every device's slots to the experts' devices and "
            'the outputs back; backward, the gradients of both, reversed. Each device keeps '
            '1/n of its slots (its own experts) and sends the rest.',
        },
    }


def pp_expectation(params, mesh, batch_size: int, c, microbatches: int = 4) -> dict:
    """Pipeline parallelism (GPipe, <twin>/pp.py with its default M): the gradient all-reduce
    over 'data' of each device's share (its stage's layers, and everything outside the blocks);
    and explicit's stage-to-stage passes: one collective-permute of one microbatch's
    activations f32[B/dM, T, C] per tick, M + S - 1 ticks, in the forward's loop (stage i to
    i + 1) and in the backward's (i + 1 to i: the ppermute's transpose). No weight moves."""
    d, s = mesh.shape[DATA], mesh.shape[STAGE]
    specs = jax.tree.leaves(state_specs(params, 'pp', mesh))
    grad_bytes = sum(
        int(np.prod(p.shape)) * p.dtype.itemsize // (s if STAGE in spec else 1)
        for p, spec in zip(jax.tree.leaves(params), specs, strict=True)
    )
    shape = (batch_size // (d * microbatches), c.seq_len, c.embed_dim)
    each, ticks = int(np.prod(shape)) * 4, microbatches + s - 1
    return {
        'kind': 'all-reduce',
        'group_size': d,
        'gradient_bytes': grad_bytes,
        'ring_bytes_per_device': 2 * (d - 1) / d * grad_bytes,
        'note': "one all-reduce over 'data' of each device's gradients: its stage's layers "
        '(1/S of the blocks) and the embeddings, final norm and head, whole (plus the metric).',
        'activations': None,
        'stages': {
            'kind': 'collective-permute',
            'stages': s,
            'microbatches': microbatches,
            'ticks': ticks,
            'shape': shape,
            'bytes_each': each,
            'count': 2,  # in the program: the forward's and the backward's
            'runs': 2 * ticks,
            'bytes': 2 * ticks * each,
            'bubble': (s - 1) / ticks,
            'note': f'explicit: one collective-permute of one microbatch activation per tick, '
            f'{ticks} ticks (M + S - 1), stage i to i + 1 in the forward and i + 1 to i in the '
            f"backward (its transpose); {s - 1} of {s} devices of each 'stage' group send. No "
            "all-gather of the stages' weights.",
        },
    }
