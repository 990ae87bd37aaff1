"""A run's history of plans: which twin, strategy, mesh and schedule trained which steps.

A checkpoint restores onto any twin, mesh and schedule, so one run may take 40 steps on
data:2,fsdp:2,model:2 and, resumed with another --mesh, 20 more on stage:2,model:4. config.json
(and the config of every checkpoint) keeps the whole history as `segments`, one per stretch of
steps under one plan, oldest first:

    "segments": [
      {"from_step": 0, "twin": "explicit", "strategy": "composed",
       "mesh": {"data": 2, "fsdp": 2, "model": 2}, "precision": null},
      {"from_step": 40, "twin": "explicit", "strategy": "pp", "mesh": {"stage": 2, "model": 4},
       "microbatches": 4, "pp_schedule": "1f1b", "pp_virtual": 1, "precision": null}
    ]

Segment i trained steps from_step + 1 to the next segment's from_step (a step numbers the state
after it). A resume under the same plan continues its segment; 'precision' is the slot of the
precision policy to come (null: the model's dtype throughout). A config.json written before
segments reads as one segment from step 0 (`of`). compare and bisect (tools/) pair two runs
segment by segment (`pairs`).
"""

# What a segment records of config.json: the plan, the options its axes take, and the precision
PLAN = ('twin', 'strategy', 'mesh', 'cp_layout', 'microbatches', 'pp_schedule', 'pp_virtual')


def segment(saved: dict, from_step: int) -> dict:
    """The segment a run with config `saved` starts at `from_step`."""
    plan = {k: saved[k] for k in PLAN if k in saved}
    return {'from_step': from_step, **plan, 'precision': saved.get('precision')}


def of(saved: dict) -> list[dict]:
    """A config's segments; one from step 0 for a config written before segments were."""
    found = saved.get('segments')
    if isinstance(found, list) and found and all(isinstance(s, dict) for s in found):
        return found
    return [segment(saved, 0)]


def same_plan(a: dict, b: dict) -> bool:
    """Whether two segments ran one plan (a mesh saved before named meshes, fsdp's axis then
    called 'data', is the same as today's name for it)."""
    return _plan(a) == _plan(b)


def _plan(s: dict) -> dict:
    from shard_parity import plan as plans

    plan = {k: v for k, v in s.items() if k != 'from_step'}
    if isinstance(s.get('strategy'), str) and isinstance(s.get('mesh'), dict):
        plan['mesh'] = plans.from_saved(s['strategy'], s['mesh']).axes
    return plan


def extend(previous: dict | None, saved: dict, start: int) -> list[dict]:
    """The segments of a run resumed at `start` with config `saved` from a checkpoint whose config
    is `previous` (None: a fresh run): the history up to `start`, and a new segment from `start`
    if the plan changed."""
    new = segment(saved, start)
    if previous is None:
        return [new]
    history = [s for s in of(previous) if s['from_step'] < start] or of(previous)[:1]
    return history + ([] if same_plan(history[-1], new) else [new])


def at(segments: list[dict], step: int) -> int:
    """The index of the segment that trained `step` (step 0, the start: the first)."""
    return max([i for i, s in enumerate(segments) if s['from_step'] < step] or [0])


def describe(s: dict) -> str:
    """'explicit pp (1f1b) on stage:2,model:4': the twin, the strategy file, its schedule, and
    the mesh as --mesh names it (a run saved before named meshes as today's would be)."""
    from shard_parity import plan as plans

    if not (isinstance(s.get('strategy'), str) and isinstance(s.get('mesh'), dict)):
        return f"{s.get('twin', '?')} (no mesh recorded)"
    plan = plans.from_saved(s['strategy'], s['mesh'])
    schedule = f" ({s['pp_schedule']})" if s.get('pp_schedule') else ''
    precision = f", precision {s['precision']}" if s.get('precision') else ''
    return f"{s.get('twin', '?')} {plan.strategy}{schedule} on {plan.text()}{precision}"


def pairs(a: list[dict], b: list[dict]) -> list[tuple[int, int, int]]:
    """(from_step, index in a, index in b) at each step where either run's segment changes: the
    stretches over which two runs are compared segment against segment."""
    starts = sorted({s['from_step'] for s in a} | {s['from_step'] for s in b} | {0})
    return [(f, at(a, f + 1), at(b, f + 1)) for f in starts]
