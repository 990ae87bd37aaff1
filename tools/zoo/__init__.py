"""The bug zoo: the classic mistakes of hand-written collectives, each a strategy module for
`python -m tools.bisect --twins=explicit,tools.zoo.<name>` to find. test_bisect.py asserts what
the bisector says of the dp, fsdp, tp and ep entries and of composed_no_data; the pipeline
entries are tested beside their schedules: pp_wrong_way in test_pp.py, pp_1f1b_wrong_slot in
test_pp_schedules.py (the gradients compared with one device's, and the bisector's verdict);
test_composed.py catches each composed entry against the one-device run.

An entry is its original plus the bug: `planted(globals(), original)` runs the original module's
source in the entry's own namespace, and the entry then defines again only the function it
changes, the changed lines marked `# BUG:`. A function looks its globals up when it runs, so the
original's other functions call the planted one, and the entry follows the original as it
changes: test_zoo.py checks that each function an entry defines again differs from the
original's only in its BUG lines.

    tp_pmean          explicit/tp.py, pmean over 'model' where the psum belongs (sum_partials)
    dp_psum           explicit/dp.py, psum of the gradients where the pmean belongs
    no_pcast          explicit/dp.py without the pcast before grad
    replicated_batch  explicit/dp.py with the batch's in_spec P(): every device takes all of it
    scatter_no_div    explicit/fsdp.py, the reduce-scatter without its division by n (scatter)
    ep_swapped_axes   explicit/ep.py, the all_to_alls over 'data' where 'expert' belongs (a 2x2
                      mesh, so that the shapes fit)
    pp_wrong_way      explicit/pp.py, the stages' ppermute from i + 1 to i, not i to i + 1
    pp_1f1b_wrong_slot  explicit/pp_1f1b.py, each backward on the next slot's saved input
                      (another microbatch's): the loss right, the gradients wrong
    composed_no_data  explicit/composed.py, the gradients not averaged over 'data' (HSDP's
                      replicas each keep their own)
    composed_too_many explicit/composed.py, the gradients averaged over 'model' and 'stage'
                      too, whose devices hold different shards of them
    composed_data_only  explicit/composed.py, the gradients averaged over 'data' alone (not
                      over 'seq' nor the experts' rows)
    zero1_wrong_shard explicit/composed.py under ZeRO-1, each reduce-scattered gradient shard
                      handed to the neighbour: the update on the wrong shard (test_zero1.py)
    zero1_local_clip  explicit/composed.py under ZeRO-1 with the update in shard_map: each
                      device's clip takes its own shard's norm (--grad_clip; test_zero1.py)
    reduce_bf16       explicit/dp.py with the gradients all-reduced in bf16 whatever
                      --reduce_dtype says: within a bf16 round-off, caught by the inspector's
                      dtype audit (test_dtype_audit.py)
    loss_one_short    explicit/dp.py with the loss averaged over one position too few (sum /
                      B(T - 1)): 6% at T = 16, within a bf16 gradient's round-off, caught
                      by the loss's budget (docs/numerics.md; test_numerics.py)
    adamw_bf16        explicit/dp.py with AdamW's moments stored in bf16 where the policy
                      keeps float32: within bf16's round-off, caught by the state's dtypes
                      (divergence.compare_step; test_numerics.py)
    accum_per_microbatch_mean  explicit/dp.py under --gradient_accumulation_steps with each
                      microbatch's loss divided by its own token count (docs/accumulation.md)
    accum_partial_by_k  ...with a partial last window normalised as if all K were there
    accum_carried_over  ...with the accumulator not reset: the last step's last microbatch in
    accum_reduced_in_loop  ...with a pmean per microbatch: equal values, the inspector's to
                      flag (test_accumulation_zoo.py tests the four)
    Small effects (docs/detection.md: each caught in float32, and in bf16 caught or within a
    detection limit above its effect; parity_tests/test_detection.py):
    gelu_tanh         explicit/dp.py with the transformer's GELU in its tanh approximation
    grads_scaled      explicit/dp.py with the gradients' mean 2% short (x 0.98)
    decay_all         explicit/dp.py with AdamW's weight decay on the norms and biases too
    microbatch_dropped  explicit/pp.py with the last microbatch's backward skipped (one of
                      16 with --microbatches=16)
    update_1pct       explicit/dp.py with every update 1% too large (a learning rate 1% high)
    dropout           explicit/dp.py with input dropout drawn per global row: no bug, a variant
                      (it adds functions and changes none of dp.py's), the reference for...
    dropout_key       ...dropout.py with the key folded with the device's local row index
"""


def planted(namespace: dict, original) -> None:
    """Runs the source of the module `original` in `namespace`, an entry's globals(): the
    original's functions become the entry's own, and those the entry defines after this call
    replace them for every caller. The entry keeps its docstring; ORIGINAL names the module."""
    doc, package = namespace.get('__doc__'), namespace.get('__package__')
    namespace['__package__'] = original.__package__  # its relative imports: its siblings
    with open(original.__file__) as f:
        exec(compile(f.read(), original.__file__, 'exec'), namespace)
    namespace['__doc__'], namespace['ORIGINAL'] = doc, original
    namespace['__package__'] = package
