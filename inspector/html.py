"""The report as one self-contained HTML file (no network: its style and script are inline):
the predicted step per program, the surprises, the differences between twins, then one sortable
table of collectives per program, side by side, each above its source pane (the strategy file,
or the user's file, with the bytes each line moves per step)."""

import html
import json
import os

from .attribute import REPO

_STYLE = """
body{font:13px system-ui,sans-serif;margin:16px;color:#222}
h1{font-size:18px}h2{font-size:15px;margin:12px 0 4px}
.twins{display:flex;gap:12px;align-items:flex-start}
.twin{flex:1 1 0;min-width:0;overflow-x:auto}.twin.empty{flex:0 0 auto}
table{border-collapse:collapse}
th,td{border:1px solid #ccc;padding:1px 4px;text-align:left;white-space:nowrap;font-size:12px}
th{background:#eee;cursor:pointer;user-select:none}
th.asc::after{content:' \\25B2'}th.desc::after{content:' \\25BC'}
td.num{text-align:right;font-variant-numeric:tabular-nums}
tr.diff td{background:#fff1c6}tr.surprise td:first-child{border-left:4px solid #d33}
.note{color:#555}pre.source{border:1px solid #ccc;max-height:420px;overflow:auto;margin:6px 0}
pre.source span.moved{background:#e3efff;display:block}pre.source b{color:#06c}
ul{margin:4px 0}
"""

_SCRIPT = """
document.querySelectorAll('table.ops th').forEach(function (th) {
  th.addEventListener('click', function () {
    var table = th.closest('table'), body = table.tBodies[0], col = th.cellIndex;
    var desc = !th.classList.contains('desc');
    table.querySelectorAll('th').forEach(function (h) { h.classList.remove('asc', 'desc'); });
    th.classList.add(desc ? 'desc' : 'asc');
    var num = th.dataset.type === 'num';
    var rows = Array.prototype.slice.call(body.rows);
    rows.sort(function (a, b) {
      var x = a.cells[col].dataset.sort, y = b.cells[col].dataset.sort;
      var c = num ? parseFloat(x) - parseFloat(y) : x.localeCompare(y);
      return desc ? -c : c;
    });
    rows.forEach(function (r) { body.appendChild(r); });
  });
});
document.querySelectorAll('pre.source').forEach(function (pre) {
  var first = pre.querySelector('span.moved');  // open each file at its first busy line
  if (first) { pre.scrollTop = Math.max(0, first.offsetTop - pre.offsetTop - 40); }
});
"""

COLUMNS = [  # header, sort type, value of an op
    ('kind', 'str', lambda op: op['kind']),
    ('axes', 'str', lambda op: '/'.join(op['axes']) if op['axes'] is not None else '?'),
    ('bytes', 'num', lambda op: op['bytes']),
    ('x trip', 'num', lambda op: op['trip_count']),
    ('pred us', 'num', lambda op: op['predicted_us']),
    ('file:line', 'str', lambda op: f"{op['file']}:{op['line']}"),
    ('phase', 'str', lambda op: op['phase']),
    ('origin', 'str', lambda op: op['origin']),
    ('consumed at', 'str', lambda op: op['consumer'].partition(' ')[0]),
    ('dtype', 'str', lambda op: ','.join(sorted(set(op['dtypes'])))),
    # what the partitioned program asked for (inspector/asked.py), where a backend changed it
    ('asked', 'str', lambda op: ','.join(sorted({d or '?' for d in op.get('asked', [])}))),
    # a TPU's or GPU's asynchronous collectives: how many ops run before it is awaited
    ('async: overlaps', 'num', lambda op: len(op.get('overlaps', [])) if op.get('async') else -1),
]


def _cell(kind, value, title='') -> str:
    shown = f'{value:,}' if kind == 'num' and isinstance(value, int) else str(value)
    shown = '' if value == -1 else shown  # a synchronous collective has no overlap column
    if kind == 'num' and not isinstance(value, int):
        shown = f'{value:,.2f}'
    title = f' title="{html.escape(title)}"' if title else ''
    cls = ' class="num"' if kind == 'num' else ''
    return f'<td{cls} data-sort="{html.escape(str(value))}"{title}>{html.escape(shown)}</td>'


def _table(name, ops) -> str:
    head = ''.join(f'<th data-type="{t}">{h}</th>' for h, t, _ in COLUMNS)
    rows = []
    for op in ops:
        flags = op.get('flags', [])
        cls = ' '.join(['op'] + (['diff'] if 'twin-difference' in flags else [])
                       + (['surprise'] if set(flags) - {'twin-difference'} else []))  # fmt: skip
        stack = 'called from ' + ' <- '.join(op['stack']) + f"; consumed at {op['consumer']}"
        tips = {'file:line': stack, 'async: overlaps': ', '.join(op.get('overlaps', [])),
                'asked': '; '.join(dict.fromkeys(w for w in op.get('asked_why', []) if w))}
        cells = ''.join(_cell(t, f(op), tips.get(h, '')) for h, t, f in COLUMNS)
        rows.append(f'<tr class="{cls}" title="{html.escape(op["op_name"])}">{cells}</tr>')
    if not ops:
        return ''
    return (
        f'<table class="ops" data-program="{name}"><thead><tr>{head}</tr></thead>'
        f'<tbody>{"".join(rows)}</tbody></table>'
    )


def _source(source: dict) -> str:
    """The file with each line's bytes per step beside it."""
    candidates = [os.path.join(root, source.get('file') or '') for root in ('', REPO)]
    path = next((p for p in candidates if source.get('file') and os.path.isfile(p)), None)
    if path is None:
        return ''
    moved = source.get('bytes_by_line', {})
    out = []
    with open(path) as f:
        lines = f.read().splitlines()
    for i, text in enumerate(lines, start=1):
        b = moved.get(str(i))
        mark = f'<b>{b:>12,}</b>' if b else ' ' * 12
        row = f'{mark} {i:>4}  {html.escape(text)}'
        out.append(f'<span class="moved">{row}</span>' if b else row + '\n')
    return f'<h2>{html.escape(source["file"])}</h2><pre class="source">{"".join(out)}</pre>'


def _memory(r: dict) -> str:
    """Per device on the target: memory_analysis()'s figures against the chip's HBM."""
    head = ''.join(f'<th>{h}</th>' for h in ('program', 'arguments MiB', 'outputs MiB',
                   'aliased MiB', 'temp MiB', 'compiler peak MiB', 'HBM MiB',
                   'verdict'))  # fmt: skip

    def mib(b) -> str:
        return '-' if b is None else f'{b / 2**20:,.1f}'  # None: not compiled, did not fit

    rows = []
    for name, m in r['memory'].items():
        cells = [mib(m[k]) for k in ('arguments', 'outputs', 'aliased', 'temp', 'compiler_peak')]
        verdict = 'fits' if m.get('fits') else 'does not fit'
        verdict += f": {m['reason']}" if m.get('reason') else ''
        rows.append(
            f'<tr><td>{name}</td>' + ''.join(f'<td class=num>{c}</td>' for c in cells)
            + f"<td class=num>{mib(m.get('hbm', 0))}</td><td class=verdict>"
            f'{html.escape(verdict)}</td></tr>'
        )  # fmt: skip
    return (
        f"<h2>Memory per device on {html.escape(r['target'])}</h2><p class=note>"
        "memory_analysis(); compiler peak is the compiler's own peak_memory_in_bytes</p>"
        f'<table id="memory"><tr>{head}</tr>{"".join(rows)}</table>'
    )


def render(r: dict) -> str:
    title = f"Collectives: {r.get('model', 'program')} {r.get('strategy', '')}".strip()
    title += f" on {r['target']}" if r.get('target') else ''
    diffs = r.get('difference_lines', [])
    surprises = [(n, s) for n, found in r['surprises'].items() for s in found]
    target = (
        f"compiled for <b id=target>{html.escape(r['target'])}</b> "
        f"({html.escape(r['device_kind'])}) "
        f"{'on this host' if r.get('target_here') else 'from shapes alone'}; "
        if r.get('target') else ''
    )  # fmt: skip
    parts = [
        f'<h1>{html.escape(title)}</h1>',
        (
            f"<p class=note>{target}{r['devices']} devices ({' x '.join(r['axes'])}); predicted "
            f"on {html.escape(r['hardware'])}: {html.escape(r['hardware_note'])}</p>"
        ),
        (
            '<h2>Predicted step</h2><table id="steps"><tr><th>program</th><th>compute us</th>'
            '<th>comms us</th><th>step band us</th><th>measured here us (emulation)</th></tr>'
        ),
    ]
    for name, p in r['predicted'].items():
        parts.append(
            f"<tr><td>{name}</td><td class=num>{p['compute_us']:,.1f}</td><td class=num>"
            f"{p['comms_us']:,.1f}</td><td class=num>{p['step_us'][0]:,.1f} .. "
            f"{p['step_us'][1]:,.1f}</td><td class=num>{p.get('measured_us', '')}</td></tr>"
        )
    parts.append('</table>')
    if r.get('memory'):
        parts.append(_memory(r))
    parts.append(f'<h2>Surprises (<span id="surprise-count">{len(surprises)}</span>)</h2><ul>')
    parts += [
        f"<li>{n}: [{s['kind']}] {html.escape(s['file'])}:{s['line']}: {html.escape(s['what'])}"
        for n, s in surprises
    ]
    parts.append(f'</ul><h2>Differences between twins (<span id="difference-count">'
                 f'{len(diffs)}</span>)</h2><ul id="differences">')  # fmt: skip
    parts += [f"<li>{html.escape(d['what'])}</li>" for d in diffs]
    if same := r.get('same_as_written'):  # a compiled form named for what it does
        parts.append('</ul><h2>The same as written, in another form</h2><ul id="same">')
        parts += [f"<li>{html.escape(d['what'])}</li>" for d in same]
    parts.append('</ul><div class="twins">')
    for name, ops in r['programs'].items():
        empty = ' empty' if not ops else ''
        parts.append(f'<div class="twin{empty}"><h2>{name} ({len(ops)} collectives)</h2>')
        parts.append(_table(name, ops) + _source(r.get('sources', {}).get(name, {})) + '</div>')
    parts.append('</div>')
    data = json.dumps(r).replace('</', '<\\/')
    return (
        f'<!DOCTYPE html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>'
        f'<style>{_STYLE}</style></head><body>{"".join(parts)}'
        f'<script type="application/json" id="report">{data}</script>'
        f'<script>{_SCRIPT}</script></body></html>'
    )


def write_html(r: dict, path: str) -> str:
    """Writes the page beside `path`, then renames it over `path`: a failure leaves neither a
    half-written page nor the temporary file."""
    tmp = path + '.tmp'
    try:
        with open(tmp, 'w') as f:
            f.write(render(r))
        os.replace(tmp, path)
    except BaseException:
        if os.path.isfile(tmp):
            os.unlink(tmp)
        raise
    return path
