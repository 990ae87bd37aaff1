"""Claim: each entry of the bug zoo (tools/zoo/) is its original plus the bug. A function an entry
defines again differs from the original's function of that name only in statements marked
`# BUG`; so no entry keeps teaching an old version of its file (scatter_no_div.py was the
explicit/fsdp.py of before the layer scan, 25 of 53 code lines apart). Statements are compared
token by token, so comments and line breaks do not count; a statement the bug deletes leaves a
`# BUG` comment in its place."""

import ast
import importlib
import io
import pkgutil
import textwrap
import tokenize
from difflib import SequenceMatcher

from shard_parity.tools import zoo

BUG = '<a statement deleted by the bug>'


def statements(source: str) -> list[tuple[str, bool]]:
    """(the statement's code tokens with its indentation depth, whether a `# BUG` comment is on
    it) for each logical line of `source`; a `# BUG` comment on a line of its own is BUG."""
    out, code, bug, depth = [], [], False, 0
    for tok in tokenize.generate_tokens(io.StringIO(textwrap.dedent(source)).readline):
        if tok.type == tokenize.COMMENT:
            bug = bug or tok.string.startswith('# BUG')
        elif tok.type in (tokenize.INDENT, tokenize.DEDENT):
            depth += 1 if tok.type == tokenize.INDENT else -1
        elif tok.type == tokenize.NL and code:  # a line break inside a statement
            continue
        elif tok.type in (tokenize.NEWLINE, tokenize.NL, tokenize.ENDMARKER):
            if code or bug:  # a statement, or a comment line marked BUG (NL: no code on it)
                out.append((f'{depth}: {" ".join(code)}' if code else BUG, bug))
            code, bug = [], False
        else:
            code.append(tok.string)
    return out


def drift(original: str, entry: str) -> list[str]:
    """The statements of function `entry` that differ from those of `original` and carry no
    `# BUG` mark (or stand for an unmarked deletion or addition)."""
    a, b = statements(original), statements(entry)
    matcher = SequenceMatcher(None, [s for s, _ in a], [s for s, _ in b], autojunk=False)
    out = []
    for op, i1, i2, j1, j2 in matcher.get_opcodes():
        if op == 'equal':
            continue
        marked = [s for s, bug in b[j1:j2] if bug]
        # every statement put in is marked, and each one taken out leaves a mark of its own
        if not marked or len(marked) < j2 - j1 or i2 - i1 > j2 - j1:
            out += [f'- {s}' for s, _ in a[i1:i2]] + [f'+ {s}' for s, _ in b[j1:j2]]
    return out


def functions(source: str) -> dict[str, str]:
    """The module's top-level functions by name: their source, decorators included."""
    lines = source.splitlines(keepends=True)
    out = {}
    for node in ast.parse(source).body:
        if isinstance(node, ast.FunctionDef):
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            out[node.name] = ''.join(lines[first - 1 : node.end_lineno])
    return out


def after_planted(source: str) -> set[str]:
    """The names of what the module's top level defines after its `planted(...)` call; a
    statement other than a function definition there is named by its line."""
    body = ast.parse(source).body
    call = next(i for i, node in enumerate(body) if 'planted(' in ast.unparse(node)
                and isinstance(node, ast.Expr))  # fmt: skip
    return {
        n.name if isinstance(n, ast.FunctionDef) else f'line {n.lineno}' for n in body[call + 1 :]
    }


def entries():
    return [name for _, name, _ in pkgutil.iter_modules(zoo.__path__)]


ORIGINAL = '''
def scatter(grad, spec):  # the mean for my shard
    if DATA not in spec:
        return jax.lax.pmean(grad, DATA)  # all-reduce
    return (
        jax.lax.psum_scatter(grad, DATA, scatter_dimension=spec.index(DATA), tiled=True)
        / jax.lax.axis_size(DATA)  # the mean of the n gradients
    )
'''


def test_the_check_catches_a_copy_that_drifted():
    planted = ORIGINAL.replace(
        '/ jax.lax.axis_size(DATA)  # the mean of the n gradients', '# BUG: no / n'
    )
    assert drift(ORIGINAL, planted) == []
    assert drift(ORIGINAL, planted.replace('# BUG: no / n', '')) == ['- 1: return ( jax . lax . '
        'psum_scatter ( grad , DATA , scatter_dimension = spec . index ( DATA ) , tiled = True ) '
        '/ jax . lax . axis_size ( DATA ) )', '+ 1: return ( jax . lax . psum_scatter ( grad , '
        'DATA , scatter_dimension = spec . index ( DATA ) , tiled = True ) )']  # fmt: skip
    # the zoo's scatter of before the layer scan: another signature, its division marked
    old = '''
def scatter(grad, spec, n):
    if DATA not in spec:
        return jax.lax.pmean(grad, DATA)
    return jax.lax.psum_scatter(
        grad, DATA, scatter_dimension=spec.index(DATA), tiled=True
    )  # BUG: / n
'''
    assert drift(ORIGINAL, old) == ['- 0: def scatter ( grad , spec ) :',
                                    '+ 0: def scatter ( grad , spec , n ) :']  # fmt: skip
    deleted = ORIGINAL.replace('        return jax.lax.pmean(grad, DATA)  # all-reduce\n', '')
    assert drift(ORIGINAL, deleted) == ['- 2: return jax . lax . pmean ( grad , DATA )']
    # one BUG line in place of two statements: the second is an unmarked deletion
    two = ORIGINAL.replace('    if DATA not in spec:\n        return jax.lax.pmean(grad, DATA)  # all-reduce\n',
                           '    pass  # BUG: no branch\n')  # fmt: skip
    assert drift(ORIGINAL, two) != []
    reformatted = ORIGINAL.replace('scatter_dimension=spec.index(DATA),', '\n scatter_dimension='
                                   'spec.index(DATA),')  # fmt: skip
    assert drift(ORIGINAL, reformatted) == []  # line breaks inside a statement do not count


def test_every_entry_is_its_original_plus_its_bug_lines():
    names = entries()
    assert {'scatter_no_div', 'tp_pmean', 'dropout_key'} <= set(names), names
    changes_none = set()
    for name in names:
        entry = importlib.import_module(f'{zoo.__name__}.{name}')
        ours = functions(open(entry.__file__).read())
        theirs = functions(open(entry.ORIGINAL.__file__).read())
        redefined = sorted(ours.keys() & theirs.keys())
        for function in redefined:
            assert drift(theirs[function], ours[function]) == [], f'{name}.{function}'
        if not redefined:
            changes_none.add(name)
            continue
        # the bug is planted: some statement is marked, and nothing after planted() but the
        # functions it redefines (a constant changed there would escape the comparison)
        assert any(bug for f in redefined for _, bug in statements(ours[f])), name
        assert after_planted(open(entry.__file__).read()) == set(redefined), name
        assert entry.__doc__ and 'bug zoo' in entry.__doc__, name  # its own, not the original's
    # dropout.py is no bug but a variant of explicit/dp.py, the reference for dropout_key.py:
    # it adds functions (and replaces the imported bind) and defines none of dp.py's again.
    assert changes_none == {'dropout'}
    # the check can fail: a constant set after planted() is named by its line
    assert after_planted('planted(globals(), dp)\nDATA = "model"\ndef f():\n    pass\n') == {
        'line 2', 'f'
    }


def test_scatter_no_div_plants_the_missing_division_in_todays_fsdp():
    from shard_parity.explicit import fsdp
    from shard_parity.tools.zoo import scatter_no_div

    assert scatter_no_div.ORIGINAL is fsdp
    assert scatter_no_div.gather_layer.__code__.co_filename == fsdp.__file__  # today's, planted
    assert scatter_no_div.scatter is not fsdp.scatter
    theirs = functions(open(fsdp.__file__).read())['scatter']
    ours = functions(open(scatter_no_div.__file__).read())['scatter']
    assert [s for s, bug in statements(ours) if bug] == [
        '1: return ( jax . lax . psum_scatter ( as_dtype ( grad , plan . precision . reduce ) , '
        'FSDP , scatter_dimension = spec . index ( FSDP ) , tiled = True ) )'
    ]
    code = [' '.join(s for s, _ in statements(f)) for f in (theirs, ours)]
    assert 'axis_size' in code[0] and 'axis_size' not in code[1]  # the division by n, gone
