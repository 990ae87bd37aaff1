"""One Markdown table, for the report (benchmarks/report.py) and the sections that bring their own
table (context.py): kept apart so that neither imports the other."""


def markdown_table(header, rows) -> str:
    lines = ['| ' + ' | '.join(header) + ' |', '|' + ' --- |' * len(header)]
    lines += ['| ' + ' | '.join(str(c) for c in row) + ' |' for row in rows]
    return '\n'.join(lines)
