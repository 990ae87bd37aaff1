"""The bug zoo: the classic mistakes of hand-written collectives, each a strategy module that is
a copy of an explicit/ file with one thing changed (marked `# BUG:`), for
`python -m tools.bisect --twins=explicit,tools.zoo.<name>` to find. test_bisect.py
asserts what the bisector says about each.

    tp_pmean        explicit/tp.py, pmean over 'model' where the psum belongs
    dp_psum         explicit/dp.py, psum of the gradients where the pmean belongs
    no_pcast        explicit/dp.py without the pcast before grad
    replicated_batch  explicit/dp.py with the batch's in_spec P(): every device takes all of it
    scatter_no_div  explicit/fsdp.py, the reduce-scatter without its division by n
    ep_swapped_axes explicit/ep.py, the all_to_alls over 'data' where 'expert' belongs (a 2x2
                    mesh, so that the shapes fit)
    pp_wrong_way    explicit/pp.py, the stages' ppermute from i + 1 to i, not i to i + 1
    dropout         input dropout drawn per global row: correct, the reference for...
    dropout_key     ...the same, with the key folded with the device's local row index
"""
