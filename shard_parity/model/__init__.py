"""The models and their operations, in Flax NNX: mlp.py (the MNIST classifier), transformer.py
(the byte-level GPT, its blocks stacked), attention.py (causal attention, naive or fused),
moe.py (the mixture-of-experts feed-forward), ops.py (the products, GELU and LayerNorm with
their own backward; under typed/ a product's `out_sharding`, read from its operands' types) and
ring.py (context parallelism's ring attention).

The models know nothing of meshes: a strategy reaches into a model call only through the hooks
its strategy file passes (`sum_partials`, `attention` and `positions`, `experts`,
`layer_weights`, `pipeline`: Transformer.__call__ and run_stack say what each does). ring.py
alone names a mesh axis: it is the attention explicit/cp.py and typed/cp.py pass in, run inside
shard_map, and it sends its blocks on with the strategy file's own `pass_on`.
"""
