"""The predicted step as Chrome trace-event JSON (open it in Perfetto or chrome://tracing): one
process per program, a compute lane (the step's FLOPs at the chip's peak) and a communication
lane (each collective, in program order, for its predicted time x its trip count)."""

import json
import os


def trace_events(r: dict) -> list[dict]:
    events = []
    for pid, (name, ops) in enumerate(r['programs'].items(), start=1):
        p = r['predicted'][name]
        events += [
            {'ph': 'M', 'pid': pid, 'name': 'process_name', 'args': {'name': name}},
            {'ph': 'M', 'pid': pid, 'tid': 1, 'name': 'thread_name', 'args': {'name': 'compute'}},
            {'ph': 'M', 'pid': pid, 'tid': 2, 'name': 'thread_name', 'args': {'name': 'comms'}},
            {
                'ph': 'X', 'pid': pid, 'tid': 1, 'ts': 0, 'dur': p['compute_us'],
                'name': 'compute', 'args': {'flops': p['flops'], 'hardware': p['hardware'],
                                            'target': r.get('target', '')},
            },
        ]  # fmt: skip
        t = 0.0
        for op in ops:
            events.append(
                {
                    'ph': 'X', 'pid': pid, 'tid': 2, 'ts': round(t, 3),
                    'dur': op['predicted_us'], 'name': f"{op['kind']} {op['file']}:{op['line']}",
                    'args': {k: op.get(k) for k in ('bytes', 'dtypes', 'axes', 'trip_count',
                             'phase', 'origin', 'function', 'op_name', 'async', 'overlaps')},
                }
            )  # fmt: skip
            t += op['predicted_us']
    return events


def write_trace(r: dict, path: str) -> str:
    """As html.write_html: written beside `path`, renamed over it, no temporary file left."""
    tmp = path + '.tmp'
    try:
        with open(tmp, 'w') as f:
            json.dump({'traceEvents': trace_events(r), 'displayTimeUnit': 'ns'}, f)
        os.replace(tmp, path)
    except BaseException:
        if os.path.isfile(tmp):
            os.unlink(tmp)
        raise
    return path
