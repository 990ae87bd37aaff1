"""A run's history of plans: which twin and plan (mesh, strategy file, schedule, precision)
trained which steps.

A checkpoint restores onto any twin, mesh, schedule and precision policy, so one run may take 40
steps on data:2,fsdp:2,model:2 and, resumed with another --mesh, 20 more on stage:2,model:4.
config.json (and the config of every checkpoint) keeps the whole history as `segments`, one per
stretch of steps under one plan, oldest first, each the plan's own config.json keys
(shard_parity/plan.py's to_config) and the whole precision policy:

    "segments": [
      {"from_step": 0, "twin": "explicit", "strategy": "composed", "devices": 8,
       "mesh": {"data": 2, "fsdp": 2, "model": 2}, "precision": {"param": "float32", ...}},
      {"from_step": 40, "twin": "explicit", "strategy": "pp", "devices": 8,
       "mesh": {"stage": 2, "model": 4}, "microbatches": 4, "pp_schedule": "1f1b",
       "pp_virtual": 1, "precision": {...}}
    ]

Segment i trained steps from_step + 1 to the next segment's from_step (a step numbers the state
after it). A resume under the same plan continues its segment. A config.json written before
segments reads as one segment from step 0 (`of`). compare and bisect (tools/compare/pairing.py) pair two
runs segment by segment.
"""

import dataclasses

from shard_parity import UsageError
from shard_parity import plan as plans


def new(twin: str, plan: plans.Plan, from_step: int, device=None) -> dict:
    """The segment `twin` starts at `from_step` on `plan`, on `device`'s platform and kind
    where given (the train loop gives its mesh's first device): a TPU's float32 dot at
    --matmul_precision=default is one bfloat16 pass, so compare judges such a stretch as
    bfloat16 compute (tools/compare/pairing.py, `precision`)."""
    precision = dataclasses.asdict(plan.precision)
    where = {'platform': device.platform, 'device_kind': device.device_kind} if device else {}
    return {'from_step': from_step, 'twin': twin, **plan.to_config(), 'precision': precision,
            **where}  # fmt: skip


def plan_of(segment: dict) -> plans.Plan:
    """The plan a segment (or a config.json) records; UsageError if it records none."""
    p = segment.get('precision') or {}
    dtypes = {'dtype': p.get('compute', 'float32'), 'reduce_dtype': p.get('reduce', 'float32')}
    model = segment.get('model_config') or dtypes  # a config.json: the model's own dtypes
    matmul = {'matmul': p['matmul']} if 'matmul' in p else {}
    return plans.from_config({**segment, 'model_config': model, 'precision': matmul})


def of(saved: dict) -> list[dict]:
    """A config's segments; one from step 0 for a config written before segments were; none
    for one that records no plan (no strategy and mesh)."""
    found = saved.get('segments')
    if isinstance(found, list) and found and all(isinstance(s, dict) for s in found):
        return found
    try:
        return [new(saved.get('twin', '?'), plan_of(saved), 0)]
    except UsageError:
        return []


def same_plan(a: dict, b: dict) -> bool:
    """Whether two segments ran one twin on one plan (a mesh saved before named meshes, fsdp's
    axis then called 'data', is today's, and options the axes do not take are dropped)."""
    moved = {a.get('platform'), b.get('platform')} - {None}  # a run saved before: the same
    try:
        return a.get('twin') == b.get('twin') and plan_of(a) == plan_of(b) and len(moved) < 2
    except UsageError:
        return False


def extend(previous: dict | None, segment: dict) -> list[dict]:
    """The segments of a run resumed with `segment` from a checkpoint whose config is
    `previous` (None: a fresh run): the history up to its step, and `segment` if the plan
    changed."""
    history = [s for s in of(previous or {}) if s['from_step'] < segment['from_step']]
    if not history:  # a fresh run
        return [segment]
    return history + ([] if same_plan(history[-1], segment) else [segment])


def at(segments: list[dict], step: int) -> int:
    """The index of the segment that trained `step` (step 0, the start: the first)."""
    return max([i for i, s in enumerate(segments) if s['from_step'] < step] or [0])


def describe(s: dict) -> str:
    """'explicit pp (1f1b) on stage:2,model:4': the twin, the strategy file, its schedule, the
    mesh as --mesh names it, and a precision policy other than float32 throughout."""
    try:
        plan = plan_of(s)
    except UsageError:
        return f"{s.get('twin', '?')} (no plan recorded)"
    schedule = f' ({plan.schedule})' if plan.schedule != 'gpipe' else ''
    policy = f', {plan.precision.text()}' if plan.precision != plans.Precision() else ''
    where = f" ({s['device_kind']})" if s.get('platform') not in (None, 'cpu') else ''
    return f"{s.get('twin', '?')} {plan.strategy}{schedule} on {plan.text()}{where}{policy}"


def pairs(a: list[dict], b: list[dict]) -> list[tuple[int, int, int]]:
    """(from_step, index in a, index in b) at each step where either run's segment changes: the
    stretches over which two runs are compared segment against segment."""
    starts = sorted({s['from_step'] for s in a} | {s['from_step'] for s in b} | {0})
    return [(f, at(a, f + 1), at(b, f + 1)) for f in starts]
