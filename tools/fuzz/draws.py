"""What the fuzzer draws (python -m tools.fuzz): a model, a mesh and the rest of a plan, as one
frozen Draw, and the flags that run it.

The strategy is written so that Hypothesis's shrinking runs in the domain's order: the MLP
before the transformer, fewer mesh axes before more ('data' first), the devices on the first
axis (the others halved towards 1), fewer and smaller layers, heads and experts, GPipe before
1F1B, float32 before bfloat16, the seed's state before a trained one. Sizes are powers of two mostly, so that most draws are ones the
project accepts; an odd size, a stray axis or a batch off by one are drawn now and then, so
that its refusals are tested too (tools/fuzz/table.py). Under --bf16 one draw in four starts
from a short trained run (`trained`: TRAINED steps of one device from the seed, as the
bisector's `--steps=TRAINED+1` walks them), where the gradients are mostly noise and the error
model's budgets are tested where a bug in a long run is found (docs/detection.md). After every
other choice (`step_options`): --gradient_accumulation_steps (K), --shard_optimizer_over_data
(ZeRO-1) and --remat_policy, their defaults mostly; where K is 2 or 4, two steps are compared,
the second a partial window half the time, and a transformer's on --variable_length documents
half the time (`window_options`: chosen from the draw itself, so a seed's draws stay as they were).
"""

import dataclasses
import random

from hypothesis import strategies as st

from .table import violations

ORDER = ('data', 'fsdp', 'model', 'seq', 'stage', 'expert')  # the simplest first
DENSE = ('data', 'fsdp', 'model')  # the MLP's axes (and the transformer's, with seq, stage)
TRAINED = 20  # a trained draw's steps of one device before the step compared


@dataclasses.dataclass(frozen=True)
class Draw:
    model: str = 'mlp'
    mesh: tuple = (('data', 8),)
    batch: int = 8
    layers: int = 1
    heads: int = 1
    kv_heads: int = 1
    embed: int = 8
    seq_len: int = 8
    experts: int = 0
    k: int = 1
    capacity: float = 1.25
    attention: str = 'naive'
    microbatches: int = 4
    schedule: str = 'gpipe'
    virtual: int = 2
    layout: str = 'zigzag'
    dtype: str = 'float32'
    reduce_dtype: str = 'float32'
    matmul: str = 'default'
    trained: int = 0  # steps of one device from the seed before the step compared
    accumulation: int = 1  # --gradient_accumulation_steps: K microbatches per optimizer step
    zero1: bool = False  # --shard_optimizer_over_data: AdamW's moments split over 'data'
    remat: str | None = None  # --remat_policy (None: unset, each path's default)
    partial: int = 0  # K > 1: the second step compared a window of this many of K microbatches
    variable_length: bool = False  # --variable_length: the transformer's documents (K > 1)

    @property
    def steps(self) -> int:
        """The steps compared: two where K > 1 (a gradient carried from one step into the next
        shows at the second), else one."""
        return 2 if self.accumulation > 1 else 1

    @property
    def devices(self) -> int:
        n = 1
        for _, size in self.mesh:
            n *= size
        return n

    def flags(self) -> list[str]:
        """The train CLI's flags for this draw (those at their defaults left out)."""
        axes = dict(self.mesh)
        out = [f'--model={self.model}', f'--mesh={mesh_text(self.mesh)}']
        out.append(f'--batch_size={self.batch}')
        if self.model == 'transformer':
            out += [f'--seq_len={self.seq_len}', f'--num_layers={self.layers}',
                    f'--num_heads={self.heads}', f'--num_kv_heads={self.kv_heads}',
                    f'--embed_dim={self.embed}']  # fmt: skip
            if self.attention != 'naive':
                out.append(f'--attention={self.attention}')
            if self.experts:
                out += [f'--num_experts={self.experts}', f'--experts_per_token={self.k}',
                        f'--capacity_factor={self.capacity:g}']  # fmt: skip
        if 'stage' in axes:
            out.append(f'--microbatches={self.microbatches}')
        if self.schedule != 'gpipe':
            out.append(f'--pp_schedule={self.schedule}')
        if self.schedule == 'interleaved':
            out.append(f'--pp_virtual={self.virtual}')
        if 'seq' in axes and self.layout != 'zigzag':
            out.append(f'--cp_layout={self.layout}')
        for flag, value in (('dtype', self.dtype), ('reduce_dtype', self.reduce_dtype)):
            if value != 'float32':
                out.append(f'--{flag}={value}')
        if self.matmul != 'default':
            out.append(f'--matmul_precision={self.matmul}')
        if self.accumulation != 1:
            out.append(f'--gradient_accumulation_steps={self.accumulation}')
        if self.zero1:
            out.append('--shard_optimizer_over_data')
        if self.remat is not None:
            out.append(f'--remat_policy={self.remat}')
        if self.variable_length:
            out.append('--variable_length')
        return out

    def to_json(self) -> dict:
        return {**dataclasses.asdict(self), 'mesh': mesh_text(self.mesh)}

    @classmethod
    def from_json(cls, saved: dict) -> 'Draw':
        mesh = tuple((a, int(n)) for a, n in (p.split(':') for p in saved['mesh'].split(',')))
        return cls(**{**saved, 'mesh': mesh})


def mesh_text(mesh) -> str:
    return ','.join(f'{a}:{n}' for a, n in mesh)


# the package the fuzzer was run from: 'tools.' in a checkout, 'shard_parity.tools.' (whose
# commands work from any folder where the project is installed) where it was run as that
TOOLS = __package__.removesuffix('fuzz')
PACKAGE = TOOLS.removesuffix('tools.')  # '' or 'shard_parity.': the inspector's


def command(draw: Draw, twin: str) -> str:
    """The one command that replays a draw against one device for a step, in the package the
    fuzzer was run from (python -m tools.bisect, or python -m shard_parity.tools.bisect). A
    trained draw's: its TRAINED steps and those compared, each from one device's state
    after the steps before (the bisector's walk, the worker's training, bitwise the same); a
    draw whose second step is a partial window: --partial_window, the last step's."""
    devices = f' --cpu_devices={draw.devices}' if draw.devices != 8 else ''
    window = f' --partial_window={draw.partial}' if draw.partial else ''
    return (f'python -m {TOOLS}bisect --twins=one_device,{twin} ' + ' '.join(draw.flags())
            + f'{window} --steps={draw.trained + draw.steps}{devices}')  # fmt: skip


def inspect(draw: Draw, target: str) -> str:
    """The command that compiles a draw for a TPU slice and shows its collectives."""
    return f'python -m {PACKAGE}inspector {" ".join(draw.flags())} --target={target}'


def up(x: int, n: int) -> int:
    """The least multiple of n that is x or more."""
    return -(-x // n) * n


def pow2(low: int, high: int):
    """2**low .. 2**high, shrinking towards 2**low."""
    return st.integers(low, high).map(lambda e: 2**e)


@st.composite
def meshes(draw, devices: int, pool, required=()):
    """Axes from `pool` in a drawn order (the `required` ones always), sizes whose product is
    `devices` (a power of two): each factor 2 goes to a drawn axis, the first by default."""
    names = draw(st.lists(st.sampled_from(pool), min_size=0 if required else 1,
                          max_size=len(pool), unique=True))  # fmt: skip
    names += [a for a in required if a not in names]
    owners = draw(st.lists(st.integers(0, len(names) - 1), min_size=devices.bit_length() - 1,
                           max_size=devices.bit_length() - 1))  # fmt: skip
    return tuple((a, 2 ** owners.count(i)) for i, a in enumerate(names))


@st.composite
def draws(draw, devices: int = 8, required=(), bf16: bool = False, models=('mlp', 'transformer'),
          schedules=None):  # fmt: skip
    """One Draw over `devices` devices; `required`: the axes a strategy module of yours (a zoo
    entry) needs on every mesh (then only those are drawn); `models`, `schedules` (those a
    'stage' axis takes; default all, GPipe mostly): what a module of yours can run."""
    model, own = draw(st.sampled_from(models)), required  # own: a strategy module's axes
    t = model == 'transformer'
    only_1f1b = bool(schedules) and not {'gpipe'} & set(schedules)  # a data x stage pipeline
    experts = draw(st.sampled_from([0, 2, 4, 8, 3])) if t and not only_1f1b else 0
    # a pipeline of data and stage alone (what 1F1B and interleaved run on) a quarter of the time
    pipeline = t and not experts and (only_1f1b or not required and draw(st.integers(0, 3)) == 3)
    if required and not pipeline:
        pool = list(required)
    elif pipeline:
        pool, required = ['data', 'stage'], ('stage',)
    else:  # experts route per whole sequence: 'seq' with them only as a stray axis
        pool = list(DENSE + (('stage',) if t else ()) + (('seq',) if t and not experts else ()))
        pool += ['expert'] if experts else []
        if draw(st.integers(0, 7)) == 7:  # now and then an axis it cannot take
            pool += [a for a in ORDER if a not in pool][:1]
    mesh = draw(meshes(devices, pool, required))
    axes = dict(mesh)
    # three draws in four fit their mesh (what an axis splits rounded up to a multiple of it),
    # the fourth is left as drawn: mostly accepted draws, and refusals enough to test them
    fit = draw(st.integers(0, 3)) != 3
    n = {a: axes.get(a, 1) if fit else 1 for a in ORDER}
    heads = up(draw(pow2(0, 3)), n['model'])
    kind = draw(st.sampled_from(['mha', 'gqa', 'mqa']))
    kv = up({'mha': heads, 'gqa': max(1, heads // 2), 'mqa': 1}[kind], n['model'])
    chosen, schedules = schedules, ['gpipe', '1f1b', 'interleaved']
    if not (pipeline or draw(st.integers(0, 7)) == 7):  # else now and then one on any mesh
        schedules = ['gpipe']
    schedules = [x for x in schedules if x in (chosen or schedules)] or list(chosen)
    schedule = draw(st.sampled_from(schedules)) if 'stage' in axes else 'gpipe'
    virtual = draw(st.sampled_from([2, 3])) if schedule == 'interleaved' else 2
    chunks = virtual if schedule == 'interleaved' else 1
    layers = up(draw(st.sampled_from([1, 2, 4, 3, 8])), n['stage'] * chunks) if t else 1
    m = draw(st.sampled_from([1, 2, 4, 3, 8])) if 'stage' in axes else 4
    m = max(m, n['stage']) if schedule == '1f1b' else m
    m = up(m, n['stage']) if schedule == 'interleaved' else m
    layout = draw(st.sampled_from(['zigzag', 'contiguous'])) if 'seq' in axes else 'zigzag'
    seq_len = draw(st.sampled_from([8, 16, 32, 12])) if t else 8
    seq_len = up(seq_len, n['seq'] * (2 if layout == 'zigzag' else 1))
    experts = up(experts, n['expert']) if experts else 0
    rows = 1
    for a in ('data', 'fsdp', 'expert'):
        rows *= axes.get(a, 1)
    per = draw(st.integers(1, 2))
    odd = int(draw(st.integers(0, 15)) == 15)  # now and then a batch that does not split
    batch = rows * (m if 'stage' in axes else 1) * per + odd
    dtypes = ['float32', 'bfloat16'] if bf16 else ['float32']
    out = Draw(
        model=model, mesh=mesh, batch=batch, layers=layers, heads=heads, kv_heads=kv,
        embed=heads * draw(st.sampled_from([8, 4, 16])), seq_len=seq_len,
        experts=experts, k=draw(st.integers(1, min(2, experts))) if experts else 1,
        capacity=draw(st.sampled_from([1.25, 1.0, 2.0])) if experts else 1.25,
        attention=draw(st.sampled_from(['naive', 'fused'])) if t else 'naive',
        microbatches=m, schedule=schedule, virtual=virtual, layout=layout,
        dtype=draw(st.sampled_from(dtypes)), reduce_dtype=draw(st.sampled_from(dtypes)),
        matmul=draw(st.sampled_from(['default', 'high', 'highest'])),
    )  # fmt: skip
    if bf16:  # (drawn after the rest, and only here: the float32 search's choices as they were)
        out = dataclasses.replace(out, trained=draw(st.sampled_from([0, 0, 0, TRAINED])))
    return step_options(draw, out, rows * (m if 'stage' in axes else 1) * per, odd, own)


ACCUMULATION = (1,) * 22 + (2,) * 4 + (4,) * 4 + (3, 0)  # K: 1 mostly; 3 and 0 refused
REMAT = (None,) * 8 + ('none', 'full', 'dots', 'dots_no_batch')  # unset mostly


def step_options(draw, out: Draw, rows: int, odd: int, required=()) -> Draw:
    """The draw with K, ZeRO-1 and the remat policy, drawn after every other choice (a seed's
    first draws stay as they were; docs/fuzzing.md). K of 2 or 4 makes each row device's rows
    (`rows`: the batch's whole multiple of the row devices, and of M under 'stage'; `odd`: the
    stray row) K times as many, so that K divides them; 3 never does, and 0 is no count. A
    mixture of experts keeps K = 1: each microbatch routes its own tokens, which one device's
    pass over the whole batch does not (docs/accumulation.md). ZeRO-1 on a mesh with 'data'
    one time in four (not for a module of yours that runs one strategy, `required`: ZeRO-1
    runs the composed step); a remat policy on the transformer."""
    k = draw(st.sampled_from(ACCUMULATION))
    if k in (2, 4) and out.model == 'transformer' and out.experts:
        k = 1  # not one device's step under K (docs/accumulation.md): not drawn
    batch = rows * k + odd if k in (2, 4) else out.batch
    # (drawn on every mesh: shrinking prefers fewer choices, and a mesh without 'data' must
    # not be simpler for it)
    zero1 = draw(st.integers(0, 3)) == 3 and 'data' in dict(out.mesh) and not required
    remat = draw(st.sampled_from(REMAT)) if out.model == 'transformer' else None
    out = dataclasses.replace(out, accumulation=k, zero1=zero1, remat=remat, batch=batch)
    return window_options(out)


def window_options(out: Draw) -> Draw:
    """A draw of K 2 or 4 (compared over two steps: `Draw.steps`) with its second step a
    partial window of 1 to K-1 microbatches half the time (`partial`), and a transformer's
    documents (`variable_length`: microbatches of unequal token counts) half the time. Chosen
    from the draw itself (a random.Random of its flags), not from Hypothesis's stream: every
    draw of a seed is as it was before these existed (a choice drawn from the stream moves the
    later draws of a seed; docs/fuzzing.md), and the same draw always gets the same."""
    if out.accumulation not in (2, 4):
        return out
    rng = random.Random(' '.join(out.flags()))
    partial = rng.choice([0, rng.randrange(1, out.accumulation)])
    documents = out.model == 'transformer' and rng.random() < 0.5
    return dataclasses.replace(out, partial=partial, variable_length=documents)


def other_mesh(draw: Draw, rng) -> tuple:
    """Another mesh of the draw's devices that its model can be placed on (the refusal table
    holds it: the heads split over 'model', the layers over 'stage'...), drawn with `rng` (a
    random.Random): where the checkpoint round trip restores what the draw's mesh saved."""
    pool = [a for a in ORDER if a in (DENSE if draw.model == 'mlp' else ORDER)]
    pool = [a for a in pool if a != 'expert' or draw.experts]
    pool = [a for a in pool if a != 'seq' or not draw.experts]
    for _ in range(50):
        names = rng.sample(pool, rng.randint(1, len(pool)))
        owners = [rng.randrange(len(names)) for _ in range(draw.devices.bit_length() - 1)]
        mesh = tuple((a, 2 ** owners.count(i)) for i, a in enumerate(names))
        m = draw.microbatches if 'stage' in names else 1
        placed = dataclasses.replace(
            draw, mesh=mesh, schedule='gpipe', batch=draw.devices * m, accumulation=1, partial=0
        )  # (K: the run's, not the checkpoint's)
        if mesh != draw.mesh and not violations(placed):
            return mesh
    data = (('data', draw.devices),)
    return data if draw.mesh != data else (('fsdp', draw.devices),)
