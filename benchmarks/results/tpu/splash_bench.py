"""Splash attention against naive on the chip (benchmarks/results/tpu/splash.sh runs this).

    python3 benchmarks/results/tpu/splash_bench.py OUT_DIR [--small]

1. parity: forward and gradients in bf16 at a few shapes (MHA, GQA, MQA), each path's largest
   error relative to the largest value of naive in float32 (HIGHEST precision); naive in bf16
   beside it is the yardstick of bf16's own error.
2. memory: the compiled forward+backward's peak and temporary bytes against T (B=1, H=12,
   D=64): the compiler's own figures (memory_analysis), no run needed.
3. time: forward+backward at the GPT-2-small shape (B=16, T=1024, H=12, D=64) for splash at
   each block size, the kernel on pre-transposed [B, H, T, D] operands (the transposes' cost is
   the difference), naive and blockwise; achieved TFLOP/s counting causal attention's useful
   FLOPs: forward 2 matmuls x 2*B*H*T*T*D / 2, backward twice that (6*B*H*T^2*D in all).
--small: tiny shapes on a CPU (SHARD_PARITY_SPLASH=interpret), to check the script itself.
Each result is one JSON line in OUT_DIR/splash.jsonl (and on stdout).
"""

import json
import os
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np

from shard_parity.model import attention, splash

OUT, SMALL = sys.argv[1], '--small' in sys.argv
CPU = jax.devices()[0].platform == 'cpu'


def emit(**row):
    line = json.dumps(row)
    print(line, flush=True)
    with open(os.path.join(OUT, 'splash.jsonl'), 'a') as f:
        f.write(line + '\n')


def inputs(b, t, h, kh, d, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 4)
    q = jax.random.normal(ks[0], (b, t, h, d), jnp.float32)
    k = jax.random.normal(ks[1], (b, t, kh, d), jnp.float32)
    v = jax.random.normal(ks[2], (b, t, kh, d), jnp.float32)
    g = jax.random.normal(ks[3], (b, t, h, d), jnp.float32)  # the output's cotangent
    return [x.astype(dtype) for x in (q, k, v, g)]


def fwd_bwd(fn):
    """(q, k, v, g) -> (out, dq, dk, dv)."""

    def run(q, k, v, g):
        out, back = jax.vjp(fn, q, k, v)
        return (out, *back(g))

    return jax.jit(run)


def rel(a, ref):
    a, ref = np.asarray(a, np.float32), np.asarray(ref, np.float32)
    return float(np.abs(a - ref).max() / np.abs(ref).max())


def parity(shapes):
    names = ('out', 'dq', 'dk', 'dv')
    for b, t, h, kh, d in shapes:
        q, k, v, g = inputs(b, t, h, kh, d, jnp.bfloat16)
        with jax.default_matmul_precision('highest'):
            ref = fwd_bwd(attention.naive)(*(x.astype(jnp.float32) for x in (q, k, v, g)))
        for name, fn in (('naive_bf16', attention.naive), ('splash_bf16', splash.splash)):
            got = fwd_bwd(fn)(q, k, v, g)
            emit(part='parity', path=name, B=b, T=t, H=h, K=kh, D=d,
                 **{f'rel_err_{n}': rel(x, r) for n, x, r in zip(names, got, ref)})  # fmt: skip


def memory(ts, h=12, d=64, naive_up_to=8192):
    """The compiled forward+backward's temporaries and outputs (out, dq, dk, dv: 4 x T x H x D
    in bf16, linear in T by themselves); naive only up to `naive_up_to` (its scores at 16384
    would be 12 GiB)."""
    for t in ts:
        q, k, v, g = inputs(1, t, h, h, d, jnp.bfloat16)
        for name, fn in (('splash', splash.splash), ('naive', attention.naive),
                         ('blockwise', attention.blockwise)):  # fmt: skip
            if name == 'naive' and t > naive_up_to:
                continue
            m = fwd_bwd(fn).lower(q, k, v, g).compile().memory_analysis()
            emit(part='memory', path=name, B=1, T=t, H=h, D=d,
                 peak_MiB=round(m.peak_memory_in_bytes / 2**20, 2),
                 temp_MiB=round(m.temp_size_in_bytes / 2**20, 2),
                 output_MiB=round(m.output_size_in_bytes / 2**20, 2))  # fmt: skip


def timed(fn, args, n):
    out = fn(*args)
    jax.block_until_ready(out)
    times = []
    for _ in range(n):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args))
        times.append(time.perf_counter() - start)
    return float(np.median(times))


def pre_transposed(q, k, v):
    """The kernel alone, on operands already [B, H, T, D] (q already scaled)."""
    h, t = q.shape[1:3]
    return jax.vmap(splash.kernel(h, t, splash.block_size(t), splash.interpreted()))(q, k, v)


def speed(b, t, h, d, n):
    q, k, v, g = inputs(b, t, h, h, d, jnp.bfloat16)
    flops = 6 * b * h * t * t * d  # useful causal FLOPs, forward + backward
    rows = []
    for block in (128, 256, 512):
        if t % block:
            continue
        splash.BLOCK = block
        rows.append((f'splash_block{block}', fwd_bwd(splash.splash), (q, k, v, g)))
    splash.BLOCK, splash.FUSED_BACKWARD = 512, True
    rows.append(('splash_block512_fused_backward', fwd_bwd(splash.splash), (q, k, v, g)))
    splash.FUSED_BACKWARD = False
    heads_first = [x.transpose(0, 2, 1, 3) for x in (q, k, v, g)]
    rows.append(('kernel_pre_transposed', fwd_bwd(pre_transposed), heads_first))
    rows.append(('naive', fwd_bwd(attention.naive), (q, k, v, g)))
    rows.append(('blockwise', fwd_bwd(attention.blockwise), (q, k, v, g)))
    for name, fn, args in rows:
        s = timed(fn, args, n)
        emit(part='time', path=name, B=b, T=t, H=h, D=d, ms=round(s * 1e3, 3),
             tflops_per_s=round(flops / s / 1e12, 2))  # fmt: skip
    for name, fn in (('splash', splash.splash), ('naive', attention.naive)):
        s = timed(jax.jit(fn), (q, k, v), n)  # the forward alone: a third of the FLOPs
        emit(part='time', path=f'{name}_forward_only', B=b, T=t, H=h, D=d,
             ms=round(s * 1e3, 3), tflops_per_s=round(flops / 3 / s / 1e12, 2))  # fmt: skip


if __name__ == '__main__':
    os.makedirs(OUT, exist_ok=True)
    emit(part='env', jax=jax.__version__, device=str(jax.devices()[0]), block=splash.BLOCK)
    if SMALL:  # the script's logic on a CPU, interpreted
        parity([(1, 128, 2, 2, 32), (1, 256, 4, 1, 32)])
        memory([128, 256], naive_up_to=128)
        speed(1, 128, 2, 32, 2)
    else:
        parity([(4, 1024, 12, 12, 64), (2, 2048, 8, 2, 64), (2, 1024, 8, 1, 128)])
        memory([1024, 2048, 4096, 8192, 16384])
        speed(16, 1024, 12, 64, 20)
