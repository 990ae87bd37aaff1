"""Byte generation from a trained transformer checkpoint, shared by every twin's generate CLI.

    python -m auto.generate --workdir=runs/auto_transformer --prompt="ROMEO:" --max_new_bytes=200
    python -m explicit.generate --workdir=runs/explicit_transformer --prompt="" --kv_cache

One prompt is not data-parallel, so generation runs on one device, whichever twin, strategy and
mesh wrote the checkpoint: it is restored replicated onto that one device. Two paths, both compiled once whatever the length:
- padded: the last `seq_len` bytes, padded to `seq_len`, go through the whole model for every new
  byte (one full forward per byte);
- KV cache (`--kv_cache`): the prompt fills a cache of keys and values once, then each new byte
  costs one single-position forward. Greedy output is identical to the padded path while prompt
  plus output fit in the context; past it, the padded path slides its window by one byte, while
  the cache path refills its cache from the last seq_len/2 bytes every seq_len/2 bytes (learned
  absolute positions cannot shift inside a cache), so the two then condition on different spans.
An empty prompt starts from a newline, as nanoGPT's sample.py does; it is not printed.
"""

import codecs
import functools
import signal
import sys
import traceback

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from shard_parity import UsageError, exit_status, quiet_on_broken_pipe, refuse


def sample(logits, key, temperature: float, top_k: int | None):
    """logits f32[V] -> one byte: greedy at temperature 0, else top-k softmax sampling. As the
    temperature goes to 0, sampling becomes greedy; a temperature so small (below ~1e-37) that
    logits / temperature overflows float32 is past that limit, and is greedy too: the overflowed
    +inf logits used to tie, and the first of them (byte 10) won every draw."""
    if temperature == 0:
        return jnp.argmax(logits)
    scaled = logits / temperature
    overflowed = ~jnp.isfinite(jnp.max(scaled))  # +inf, or every logit -inf
    if top_k:
        kth = jax.lax.top_k(scaled, top_k)[0][-1]
        scaled = jnp.where(scaled < kth, -jnp.inf, scaled)
    return jnp.where(overflowed, jnp.argmax(logits), jax.random.categorical(key, scaled))


def kv_cache_bytes_per_token(cfg) -> int:
    """Keys and values of one position, in every layer: 2 * L * K * D * itemsize."""
    return 2 * cfg.num_layers * cfg.num_kv_heads * cfg.head_dim * jnp.dtype(cfg.dtype).itemsize


class Generator:
    """Holds the compiled steps of both paths for one model; `generate` runs either."""

    def __init__(self, graphdef, params, temperature=0.0, top_k=None):
        self.params = params
        self.model = nnx.merge(graphdef, params)
        self.seq_len = self.model.cfg.seq_len
        pick = functools.partial(sample, temperature=temperature, top_k=top_k)

        @jax.jit
        def padded_step(params, window, length, key):  # window: i32[1, T], `length` real bytes
            logits, _ = nnx.merge(graphdef, params)(window)
            return pick(logits[0, length - 1], key)

        @jax.jit
        def prefill(params, window, length, key):  # fills the cache with the whole window
            model = nnx.merge(graphdef, params)
            logits, caches = model(window, model.init_caches(1), 0)
            return pick(logits[0, length - 1], key), caches

        @jax.jit
        def decode(params, caches, byte, index, key):  # one byte at position `index`
            logits, caches = nnx.merge(graphdef, params)(byte.reshape(1, 1), caches, index)
            return pick(logits[0, 0], key), caches

        self.padded_step, self.prefill, self.decode = padded_step, prefill, decode

    def window(self, context: list[int]):
        """The last seq_len bytes, zero-padded on the right to seq_len: one shape, one compile."""
        context = context[-self.seq_len :]
        padded = np.zeros((1, self.seq_len), np.int32)
        padded[0, : len(context)] = context
        return jnp.asarray(padded), len(context)

    def generate(
        self, prompt: bytes, n: int, seed: int = 0, kv_cache: bool = False, on_byte=None
    ) -> bytes:
        """`n` bytes after `prompt`; on_byte(b) is called with each as soon as it is drawn."""
        self.check_prompt(prompt)
        tokens, self._caches = list(prompt or b'\n'), None
        # One key per byte, folded in as it is drawn: bounded memory whatever n (a split into n
        # keys took 8 bytes each up front), and a shorter run's bytes begin a longer one's.
        base = jax.random.key(seed)
        step = self._cached if kv_cache else self._padded
        for i in range(n):
            tokens.append(step(tokens, jax.random.fold_in(base, i)))
            if on_byte:
                on_byte(tokens[-1])
        return bytes(tokens[len(prompt or b'\n') :])

    def check_prompt(self, prompt: bytes) -> None:
        """Refuses a prompt longer than the context (before anything is printed)."""
        if len(prompt) > self.seq_len:
            raise UsageError(
                f'--prompt is {len(prompt)} bytes, longer than the model\'s context of '
                f'{self.seq_len} bytes (its --seq_len): shorten it'
            )

    def _padded(self, tokens, key) -> int:
        window, length = self.window(tokens)
        return int(self.padded_step(self.params, window, length, key))

    def _cached(self, tokens, key) -> int:
        # (Re)fill the cache at the start and whenever it is full, from the last half window.
        if self._caches is None or self._index >= self.seq_len:
            keep = tokens if len(tokens) <= self.seq_len else tokens[-(self.seq_len // 2) :]
            window, length = self.window(keep)
            byte, self._caches = self.prefill(self.params, window, length, key)
            self._index = length
            return int(byte)
        byte, self._caches = self.decode(
            self.params, self._caches, jnp.asarray(tokens[-1], jnp.int32), self._index, key
        )
        self._index += 1
        return int(byte)


def main(twin):
    """The absl main of `python -m <twin>.generate`; its flags are in shard_parity/runtime/flags.py."""
    from absl import flags, logging

    from shard_parity.devices import configure_jax
    from shard_parity.mesh import make_mesh
    from shard_parity.runtime import checkpoint, declare_key_flags, plain_warnings
    from shard_parity.runtime import flags as F
    from shard_parity.runtime.loop import SIGNALS, stop_on_signals

    declare_key_flags(F.GENERATE_CLI)

    def _main(argv):
        stop_on_signals()  # Ctrl-C stops after the current byte: what was printed stays
        if len(argv) > 1:
            refuse(f'unexpected arguments {argv[1:]}: every setting is a --flag')
        if not flags.FLAGS['verbosity'].present:  # Orbax logs a lot at INFO
            logging.set_verbosity(logging.WARNING)
        if not F.VERBOSE.value:
            plain_warnings()
        show = Printer()
        try:
            configure_jax(F.CPU_DEVICES.value, libtpu_lines=F.VERBOSE.value)
            workdir = F.WORKDIR.value or f'runs/{twin.NAME}_transformer'
            saved, graphdef, state = checkpoint.restore(workdir, make_mesh(1))  # read-only
            if saved['model'] != 'transformer':
                raise UsageError(
                    f"{workdir} holds a {saved['model']} checkpoint: "
                    'generation needs --model=transformer'
                )
            gen = Generator(graphdef, state.params, F.TEMPERATURE.value, F.TOP_K.value)
            # A prompt that is not UTF-8 reaches Python as surrogates: take back its raw bytes.
            prompt = F.PROMPT.value.encode('utf-8', errors='surrogateescape')
            seed = F.TRAIN['seed'].value or 0
            gen.check_prompt(prompt)  # refused before anything is echoed
            show(prompt)

            def on_byte(byte):
                show(bytes([byte]))
                if SIGNALS:
                    raise KeyboardInterrupt

            gen.generate(prompt, F.MAX_NEW_BYTES.value, seed, F.KV_CACHE.value, on_byte)
        except UsageError as e:
            if F.VERBOSE.value:
                traceback.print_exc()
            refuse(str(e), exit_status(e))
        except KeyboardInterrupt:  # raised by on_byte: a Ctrl-C or SIGTERM
            show.end()
            sys.exit(128 + (SIGNALS or [signal.SIGINT])[0])  # 130 for Ctrl-C, 143 for SIGTERM
        show.end()
        if F.KV_CACHE.value:
            per_token = kv_cache_bytes_per_token(gen.model.cfg)
            print(
                f'[KV cache: {per_token} bytes per token, {per_token * gen.seq_len} in all]',
                file=sys.stderr,
            )

    return quiet_on_broken_pipe(_main)  # `... | head -c 5` stops quietly


class Printer:
    """Prints bytes as they come. A byte that is not valid UTF-8 (a sampled byte may cut a
    character) prints as \\xNN; a character's first bytes wait for its last."""

    def __init__(self):
        self.decoder = codecs.getincrementaldecoder('utf-8')(errors='backslashreplace')
        sys.stdout.reconfigure(errors='backslashreplace')  # a non-UTF-8 terminal too

    def __call__(self, chunk: bytes, final: bool = False):
        sys.stdout.write(self.decoder.decode(chunk, final))
        sys.stdout.flush()

    def end(self):
        self(b'', final=True)
        print()
