"""What the expectation reads of one train step (inspector/expect.py): each parameter's bytes and
the mesh axes its layout splits it over (`Array`, from shard_parity/placement.py), the plan and
the step's shapes (`Step`: rows per device, microbatches (a pipeline's M, or
--gradient_accumulation_steps' K), ticks, layers, activations, and the precision policy's
dtypes: weights gathered in --dtype, gradients reduced in --reduce_dtype), and the record
the pieces return (`Expected`: identical collectives of one axis's piece).
"""

import dataclasses
import math

import jax
import numpy as np

from shard_parity import plan as plans
from shard_parity.mesh import FSDP, SEQ, STAGE
from shard_parity.model.moe import capacity
from shard_parity.placement import is_expert, layer_dims, state_specs, update_specs

TWINS = ('auto', 'explicit', 'typed')


@dataclasses.dataclass(frozen=True)
class Expected:
    """Identical collectives of one axis's piece: `trips` ops (or loop trips) of `bytes` each."""

    piece: str  # the axis whose piece it is ('gradient': the batch axes' reduction)
    kind: str
    axes: tuple[str, ...]  # the mesh axes it runs over
    phase: str  # 'forward', 'backward' or 'outside-grad', as the inspector attributes ops
    bytes: int  # one op's result
    trips: int  # how many run per step
    what: str
    twins: tuple[str, ...] = TWINS  # the twins that write it (auto has no ring, no ppermute)

    @property
    def total(self) -> int:
        return self.bytes * self.trips

    def json(self) -> dict:
        return dataclasses.asdict(self) | {'total': self.total}


@dataclasses.dataclass(frozen=True)
class Array:
    """One parameter: its bytes whole, the mesh axes its layout splits it over."""

    whole: int
    axes: tuple[str, ...]
    stacked: bool  # one of the transformer's stacked blocks' arrays, [L, ...]
    expert: bool  # a mixture of experts' expert weights
    zero1: bool = False  # ZeRO-1 splits its moments (and its update) over 'data' too

    def shard(self, plan) -> int:
        """The bytes each device holds (and its gradient, once reduced)."""
        return self.whole // math.prod(plan.size(a) for a in self.axes)


@dataclasses.dataclass(frozen=True)
class Step:
    """What the pieces read: the plan, each parameter's layout, the step's shapes."""

    plan: plans.Plan
    model: str
    arrays: tuple[Array, ...]
    batch_size: int
    c: object  # the TransformerConfig (unused by the MLP)
    microbatches: int
    k: int = 1  # --gradient_accumulation_steps: the layers run once per microbatch (no 'stage')

    @property
    def rows(self) -> int:  # each device's rows of the batch
        return self.batch_size // math.prod(self.plan.size(a) for a in self.plan.rows)

    @property
    def m(self) -> int:  # microbatches: under 'stage' M, else K (a pipeline refuses K > 1)
        return self.microbatches if self.plan.uses(STAGE) else self.k

    @property
    def ticks(self) -> int:
        """How often the layers run in a step: GPipe's M + S - 1 ticks; without a pipeline
        once per microbatch, K (the first before the accumulation's loop, K - 1 in it)."""
        return self.m + self.plan.size(STAGE) - 1 if self.plan.uses(STAGE) else self.k

    @property
    def layers(self) -> int:  # each device's layers: L, or a stage's L/S
        return self.c.num_layers // self.plan.size(STAGE)

    @property
    def per_layer(self) -> int:
        """How often a per-layer op runs in a step: L per microbatch (L x K under
        --gradient_accumulation_steps), or each stage's L/S layers every tick."""
        return self.layers * self.ticks

    @property
    def one_layer_units(self) -> bool:
        """Whether 1F1B's or interleaved's units are one layer each (L/(SV) = 1): then a
        backward unit's vjp runs its forward and backward in one computation, no loop over
        layers between them, and XLA shares what both compute (common subexpressions)."""
        schedule = self.plan.uses(STAGE) and self.plan.schedule != 'gpipe'
        return schedule and self.layers // self.plan.chunks == 1

    @property
    def activation(self) -> tuple[int, ...]:  # x: [b, T, C] of one microbatch, my positions
        return (self.rows // self.m, self.c.seq_len // self.plan.size(SEQ), self.c.embed_dim)

    @property
    def itemsize(self) -> int:  # the compute dtype's (--dtype): activations, gathered weights
        return np.dtype(self.plan.precision.compute).itemsize

    def weights(self, nbytes: int) -> int:
        """`nbytes` of parameters (held in the policy's param dtype) gathered in --dtype."""
        return nbytes * self.itemsize // np.dtype(self.plan.precision.param).itemsize

    def grads(self, nbytes: int) -> int:
        """`nbytes` of parameters' gradients, reduced in --reduce_dtype."""
        reduce = np.dtype(self.plan.precision.reduce).itemsize
        return nbytes * reduce // np.dtype(self.plan.precision.param).itemsize

    @property
    def slots(self) -> tuple[int, ...]:  # a MoE layer's slots, [E, b, cap, C]
        c = self.c
        return (c.num_experts, self.rows // self.m, capacity(c, c.seq_len), c.embed_dim)

    @property
    def moe(self) -> bool:
        return self.model == 'transformer' and bool(self.c.num_experts)

    @property
    def remat(self) -> bool:
        """Whether each layer runs again in the backward: under 'fsdp' the layer is checkpointed
        (Transformer.run_stack), so that only one layer's weights are whole at a time."""
        return self.model == 'transformer' and self.plan.uses(FSDP) and self.plan.size(FSDP) > 1


def step_of(plan, model, params, mesh, batch_size, c, k: int = 1) -> Step:
    """The Step of `plan` over `params`' layout; `k`: --gradient_accumulation_steps."""
    specs = jax.tree.leaves(state_specs(params, plan, mesh))
    moments = jax.tree.leaves(update_specs(params, plan, mesh))  # ZeRO-1's, else the same
    arrays = []
    for (path, p), spec, to in zip(jax.tree_util.tree_leaves_with_path(params), specs, moments,
                                   strict=True):  # fmt: skip
        axes = tuple(a for d in spec if d for a in (d if isinstance(d, tuple) else (d,)))
        arrays.append(
            Array(int(np.prod(p.shape)) * p.dtype.itemsize, axes, bool(layer_dims(path)),
                  is_expert(path), to != spec)
        )  # fmt: skip
    return Step(plan, model, tuple(arrays), batch_size, c, plan.microbatches, k)


def nbytes(shape, itemsize: int = 4) -> int:
    return int(np.prod(shape)) * itemsize


def averaged_over(plan, array: Array) -> tuple[str, ...]:
    """The batch axes a gradient is all-reduced over: not those it is split over, nor 'fsdp'
    (its reduce-scatter averages), as explicit/composed.py's `averaged_over`."""
    return tuple(a for a in plan.batch_axes if a not in array.axes and a != FSDP)
