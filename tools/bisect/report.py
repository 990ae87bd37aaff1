"""The bisector's report in words (`python -m tools.bisect`'s output, and the fuzzer's message
for a draw that diverges) or as one JSON object (--json): where two sides first part, or that
they agree, and how closely (bitwise identical, within round-off, each phase's largest error
against its budget).
"""

import dataclasses
import json


def as_dict(report) -> dict:
    out = dataclasses.asdict(report)
    out.pop('seen')  # every leaf's fraction of its budget: the calibration's, not the report's
    out.pop('suspect')  # the hints' input, said in the hints
    out['diverged'] = report.diverged
    return json.loads(json.dumps(out, default=str).replace('Infinity', '"inf"'))


def render(r) -> str:
    a, b = r.twins
    notes = ''.join(f'\nnote: {n}' for n in r.notes)  # run directories: what was paired
    notes += ''.join(
        f'\nnote: step {step}, {layer}: {count} token{"s" * (count > 1)} took other experts '
        '(bf16 moved its router logits across the top-k boundary): counted as flips, not a bug, '
        'and left out of the outputs after it'
        for step, layer, count in r.flips
    )
    notes += ''.join(
        f'\nnote: step {step}, {layer}: one side runs it inside its pipeline, where the forward '
        f'cannot compare it; by the other\'s router margins {expected:.2g} token'
        f'{"s" * (expected != 1)} may take other experts within bf16 rounding: the gradients\' '
        'budget allows for as many flips'
        for step, layer, expected in r.hidden_flips
        if expected >= 0.01
    )
    how = r.tolerance
    if r.model:  # --tolerance=model
        how = f'{r.model.name} error model'
    if not r.diverged and not r.steps and r.identical:
        return f'A={a} and B={b}: every figure both logged is bitwise identical.' + LOGS + notes
    if not r.diverged and not r.steps:
        within = (
            f'within {r.model.name} round-off (the band of docs/numerics.md)'
            if r.model
            else f'({how})'
        )
        return f'A={a} and B={b}: every figure both logged agrees {within}.' + LOGS + notes
    if not r.diverged and r.model and r.worst and not any(f for _, f in r.worst.values()):
        return f'A={a} and B={b} are bitwise identical for {r.steps} steps.' + notes
    if not r.diverged and r.model:
        worst = '; '.join(f'{phase} {path} at {f:.2g}' for phase, (path, f) in r.worst.items())
        return (
            f'A={a} and B={b} agree within {r.model.name} round-off for {r.steps} steps '
            f'(the error model, docs/numerics.md; each phase\'s largest error as a fraction of '
            f'its budget: {worst}).' + unseen(r) + notes
        )
    if not r.diverged:
        return f'A={a} and B={b} agree for {r.steps} steps ({how}).' + unseen(r) + notes
    lines = [f'A={a} and B={b} diverge at step {r.step}, phase {r.phase} ({how}).']
    if r.layer:
        lines.append(f'first layer whose output differs: {r.layer}')
    if r.phase == 'update':
        lines.append('(each side against the shared optimizer applied to its own gradient)')
    for leaf in r.leaves[:12]:
        what = (
            f'shapes A {leaf.shapes[0]}, B {leaf.shapes[1]}'
            if leaf.shapes
            else f'stored as {leaf.dtypes[1]} where the shared optimizer keeps '
            f'{leaf.dtypes[0]} (the precision policy: parameters and AdamW state in float32)'
            if leaf.dtypes
            else f'max abs err {leaf.max_abs:.3g}, max rel err {leaf.max_rel:.3g}'
            + (f', B/A = {leaf.ratio:.6g} everywhere' if leaf.ratio is not None else '')
        )
        if leaf.budgets is not None:
            what = (
                f'{leaf.budgets:.3g} budgets over (norm-wise error {leaf.error:.3g}, budget '
                f'{leaf.budget:.3g}); ' + what.replace(' everywhere', ' within the budget')
            )
        lines.append(f'  {leaf.path}: {what}')
    if len(r.leaves) > 12:
        lines.append(f'  ... and {len(r.leaves) - 12} more leaves')
    lines += [f'hint: {h}' for h in r.hints]
    return '\n'.join(lines) + notes


LIMIT = 0.01  # a detection limit above this is said, with the float32 comparison that sees more


LOGS = (  # an agree of the logs alone: no step was replayed, so no leaf was judged
    '\nIt could not see (no step replayed, docs/bisect.md "Reading an agree"): a difference in '
    'any parameter, gradient or update that moves no logged figure past its tolerance; '
    '--from=RUN_A@STEP replays a step both runs saved and states each leaf\'s detection limit.'
)


def unseen(r) -> str:
    """What an "agree" could not see: per phase, the smallest relative change of a leaf that
    this comparison would have caught at the last step compared (its detection limit: the
    leaf's budget), the range over the leaves and the leaf with the widest; above 1%, the
    same comparison in float32 (--shadow=float32)."""
    if not r.limits:
        return ''
    parts, wide = [], []
    for phase, limits in r.limits.items():
        if not limits:
            continue
        path, top = max(limits.items(), key=lambda kv: kv[1])
        low = min(limits.values())
        parts.append(f'{phase} {low:.2g}' + (f' to {top:.2g} ({path})' if top > low else ''))
        wide += [phase] if top > LIMIT else []
    out = (f'\nIt could not see (the detection limit, a relative change of one leaf at step '
           f'{r.steps - 1 + r.first}, docs/bisect.md "Reading an agree"): ' + '; '.join(parts) + '.')
    if wide and r.model:
        out += (f'\nAbove 1% in {", ".join(wide)}: a bug smaller than that reads "agree" here; '
                'compare the same twins in float32 too: --shadow=float32.')
    return out
