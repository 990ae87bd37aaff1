"""Claims about generation: greedy output is identical across the padded and KV-cache paths and
whatever mesh the checkpoint is restored onto, each path compiles once whatever the length, and
odd input is handled."""

import dataclasses
import signal
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest
from flax import nnx

from parity_tests.helpers import (
    REPO,
    TINY_TRANSFORMER,
    fresh_state,
    make_case,
    plan_of,
    run_cli,
    save_checkpoint,
)
from shard_parity import UsageError, typed
from shard_parity.mesh import make_mesh
from shard_parity.model.transformer import Transformer
from shard_parity.placement import place_state
from shard_parity.runtime import checkpoint, generate
from shard_parity import config as cfg


@pytest.fixture(scope='module')
def workdir(tmp_path_factory):
    """A tiny random transformer with its weights scaled up 10x, saved: the paths must compute
    the same function, and with large weights greedy decoding varies from byte to byte (a
    briefly trained tiny model only repeats its likeliest byte, which would prove little)."""
    case = make_case('transformer')
    _, _, state = fresh_state(case=case)
    state = state._replace(params=jax.tree.map(lambda p: 10 * p, state.params))
    path = tmp_path_factory.mktemp('gen')
    save_checkpoint(path, state, case)
    return path


def generator(workdir, devices=1, **kw):
    _, graphdef, state = checkpoint.restore(workdir, make_mesh(devices))
    return generate.Generator(graphdef, state.params, **kw)


def test_greedy_output_is_identical_across_meshes_and_paths(workdir):
    prompt = b'ROMEO:'
    n = TINY_TRANSFORMER.seq_len - len(prompt)  # prompt and output fill the context exactly
    outs = {
        (devices, kv): generator(workdir, devices).generate(prompt, n, kv_cache=kv)
        for devices in (1, 8)
        for kv in (False, True)
    }
    assert len(set(outs.values())) == 1, outs
    assert len(set(next(iter(outs.values())))) > 1  # not one byte repeated: the test can fail
    # the 10x weights make greedy and T=1 sampling nearly the same; T=10 flattens the odds
    sampled = generator(workdir, temperature=10.0).generate(prompt, n, seed=1)
    assert sampled != next(iter(outs.values()))


def test_fused_attention_generates_what_naive_does_on_both_paths(workdir):
    """--attention=fused (blockwise on the CPU) under jit, with the cache's traced offset."""
    _, graphdef, state = checkpoint.restore(workdir, make_mesh(1))
    fused = dataclasses.replace(TINY_TRANSFORMER, attention='fused')
    fused_graphdef = nnx.graphdef(Transformer(fused, rngs=nnx.Rngs(0)))
    prompt, n = b'ROMEO:', TINY_TRANSFORMER.seq_len - 6
    naive = generate.Generator(graphdef, state.params).generate(prompt, n)
    gen = generate.Generator(fused_graphdef, state.params)
    assert gen.generate(prompt, n) == naive
    assert gen.generate(prompt, n, kv_cache=True) == naive


def test_the_cache_holds_bf16_keys_and_values_in_bf16(workdir):
    """The cache takes the compute dtype: as many bytes as kv_cache_bytes_per_token says, and
    one dtype for query, keys and values (on a GPU cuDNN refused the float32 cache beside a
    bf16 query). Both paths then generate the same bytes in bf16 too."""
    _, _, state = checkpoint.restore(workdir, make_mesh(1))
    bf16 = dataclasses.replace(TINY_TRANSFORMER, dtype='bfloat16')
    model = Transformer(bf16, rngs=nnx.Rngs(0))
    caches = model.init_caches(1)
    assert {a.dtype for pair in caches for a in pair} == {jnp.dtype(jnp.bfloat16)}
    nbytes = sum(a.nbytes for pair in caches for a in pair)
    assert nbytes == generate.kv_cache_bytes_per_token(bf16) * bf16.seq_len
    gen = generate.Generator(nnx.graphdef(model), state.params)
    prompt, n = b'ROMEO:', bf16.seq_len - 6
    assert gen.generate(prompt, n, kv_cache=True) == gen.generate(prompt, n)


def test_sampling_is_the_same_on_both_paths_within_the_context(workdir):
    gen = generator(workdir, temperature=0.9, top_k=20)
    assert gen.generate(b'', 15, seed=3) == gen.generate(b'', 15, seed=3, kv_cache=True)


def test_sampling_streams_one_key_per_byte(workdir, monkeypatch):
    """Keys are folded in byte by byte, never split n ways up front (--max_new_bytes=10**9 took
    8 GB of keys before the first byte): a shorter run's bytes begin a longer one's."""
    gen = generator(workdir, temperature=10.0)
    monkeypatch.setattr(jax.random, 'split', None)  # any use of it fails
    long, short = gen.generate(b'', 12, seed=5), gen.generate(b'', 5, seed=5)
    assert long[:5] == short and len(set(long)) > 1
    assert gen.generate(b'', 5, seed=6) != short  # the seed still matters


@pytest.mark.parametrize('kv_cache', [False, True], ids=['padded', 'kv-cache'])
def test_each_path_compiles_once_whatever_the_length(workdir, kv_cache):
    gen = generator(workdir)
    compiled = lambda: [f._cache_size() for f in (gen.padded_step, gen.prefill, gen.decode)]  # noqa: E731
    assert compiled() == [0, 0, 0]
    gen.generate(b'To be', 5, kv_cache=kv_cache)
    after_5 = compiled()
    gen.generate(b'To be', 200, kv_cache=kv_cache)  # 12x the context: slides or refills
    assert sum(after_5) and compiled() == after_5


def test_prompt_longer_than_the_context_is_refused(workdir):
    with pytest.raises(UsageError, match='--prompt is 17 bytes, longer than the model.s context'):
        generator(workdir).generate(b'x' * 17, 5)


def test_kv_cache_bytes_per_token():
    per_token = {
        k: generate.kv_cache_bytes_per_token(cfg.TransformerConfig(num_kv_heads=k))
        for k in (4, 2, 1)
    }
    assert per_token == {4: 4096, 2: 2048, 1: 1024}  # 2 * 4 layers * K heads * 32 * 4 bytes


@pytest.mark.slow
def test_cli_prints_non_utf8_bytes_and_handles_an_empty_prompt(workdir):
    # A hot temperature makes bytes >= 128 likely: they are not valid UTF-8 on their own.
    result = subprocess.run(
        [
            sys.executable,
            '-m',
            'auto.generate',
            f'--workdir={workdir}',
            '--prompt=',
            '--temperature=20',
            '--max_new_bytes=100',
            '--kv_cache',
        ],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert '\\x' in result.stdout
    assert 'KV cache: 256 bytes per token' in result.stderr  # 2 * 2 layers * 2 * 8 * 4


@pytest.mark.slow
def test_cli_without_a_checkpoint_says_so(tmp_path):
    result = subprocess.run(
        [sys.executable, '-m', 'explicit.generate', f'--workdir={tmp_path}'],
        cwd=REPO,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode != 0 and 'no checkpoint in' in result.stderr
    assert 'Traceback' not in result.stderr


@pytest.mark.slow
def test_cli_streams_a_non_utf8_prompt_and_its_continuation(workdir):
    """A Latin-1 prompt (not UTF-8) is taken as its raw bytes; the output streams byte by byte,
    and Ctrl-C keeps what was printed (exit 130, no traceback)."""
    streamed = []
    gen = generator(workdir)
    out = gen.generate(b'To', 5, on_byte=streamed.append)
    assert bytes(streamed) == out
    proc = subprocess.Popen(
        [sys.executable, '-m', 'auto.generate', f'--workdir={workdir}', b'--prompt=caf\xe9']
        + ['--max_new_bytes=1000000000'],  # once 8 GB of keys before the first byte
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    first = proc.stdout.read(20)  # arrives long before the millionth byte
    proc.send_signal(signal.SIGINT)
    rest, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-2000:]
    assert first.startswith(b'caf\\xe9') and b'Traceback' not in err
    assert len(first + rest) > 20


@pytest.mark.slow
def test_typed_generate_reads_every_twins_checkpoint(workdir, tmp_path):
    """`python -m typed.generate` restores onto one device whichever twin's mesh wrote the
    checkpoint: auto/'s and explicit/'s Auto mesh, or typed/'s Explicit one; and the other twins'
    generate reads typed/'s. All print what the in-process generator gives."""
    case = make_case('transformer')
    _, _, state = checkpoint.restore(workdir, make_mesh(1))
    state = jax.device_get(state)
    for name, mesh, strategy in [
        ('auto_mesh', make_mesh(8), 'dp'),
        ('typed_mesh', make_mesh(shape=(4, 2), axis_type=typed.AXIS_TYPE), 'fsdp_tp'),
    ]:
        save_checkpoint(tmp_path / name, place_state(state, mesh, plan_of(mesh, strategy)), case)
    prompt, n = 'ROMEO:', TINY_TRANSFORMER.seq_len - 6
    want = generator(workdir).generate(prompt.encode(), n)
    assert len(set(want)) > 1  # not one byte repeated: the comparison can fail
    for twin, name in [('typed', 'auto_mesh'), ('typed', 'typed_mesh'), ('explicit', 'typed_mesh')]:
        flags = [
            f'--workdir={tmp_path / name}',
            f'--prompt={prompt}',
            f'--max_new_bytes={n}',
            '--temperature=0',
        ]
        result = run_cli(twin, *flags, program='generate')
        assert result.returncode == 0, result.stderr[-2000:]
        printed = (prompt.encode() + want).decode('utf-8', errors='backslashreplace')
        assert result.stdout.rstrip('\n') == printed, (twin, name)


def test_a_temperature_so_small_that_the_logits_overflow_samples_greedily():
    """Below ~1e-37 the logits divided by the temperature overflow float32: every positive one
    became +inf and the first of them (byte 10, the newline) won every draw. Such a temperature
    is past the limit where sampling becomes greedy, and is greedy."""
    logits = jnp.array([1.0, 5.0, 3.0, -2.0])
    key = jax.random.key(0)
    assert not jnp.isfinite(logits / 1e-40).all()  # the case: it overflows
    keys = [jax.random.fold_in(key, i) for i in range(8)]
    picks = {int(generate.sample(logits, k, 1e-40, None)) for k in keys}
    assert picks == {1} and int(generate.sample(logits, key, 1e-40, 2)) == 1
    assert int(generate.sample(-logits - 100, key, 1e-40, None)) == 3  # all -inf: still greedy
    hot = {int(generate.sample(logits, jax.random.fold_in(key, i), 10.0, None)) for i in range(32)}
    assert len(hot) > 1  # an ordinary temperature still samples


def generate_cli(workdir, *flags):
    return subprocess.Popen(
        [sys.executable, '-m', 'explicit.generate', f'--workdir={workdir}', *flags],
        cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
    )  # fmt: skip


@pytest.mark.slow
def test_cli_on_a_closed_pipe_a_sigterm_and_a_long_prompt(workdir):
    """`generate | head -c 5` ended in a BrokenPipeError traceback (exit 1); SIGTERM exited 130,
    Ctrl-C's code. A prompt longer than the context was echoed before its refusal."""
    piped = generate_cli(workdir, '--max_new_bytes=1000000000')
    piped.stdout.read(5)
    piped.stdout.close()  # as `head -c 5` does
    err = piped.communicate(timeout=60)[1]
    assert piped.returncode == 141 and err == b'', err[-2000:]  # 128 + SIGPIPE, nothing said
    termed = generate_cli(workdir, '--max_new_bytes=1000000000')
    termed.stdout.read(5)
    termed.send_signal(signal.SIGTERM)
    err = termed.communicate(timeout=60)[1]
    assert termed.returncode == 143 and b'Traceback' not in err, err[-2000:]
    long = generate_cli(workdir, '--prompt=' + 'x' * 17)
    out, err = long.communicate(timeout=60)
    assert long.returncode == 2 and out == b'', out
    assert b"--prompt is 17 bytes, longer than the model's context of 16 bytes" in err
