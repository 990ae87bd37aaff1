"""Rows of docs/errors.md's table (parity_tests/errors_table.py): the fuzzer, python -m tools.fuzz
(its flags, its corpus, Ctrl-C and its own faults).
"""

ROWS = [
    (
        'fuzz: --twins with nothing to compare with one device',
        'name a twin or module to compare with one_device',
        'test_fuzz.test_a_bad_twins_flag_is_one_line_exit_2',
    ),
    (
        'fuzz: --target of another chip count than --devices (or not a TPU slice)',
        '--target=tpu-v5e-4: expected tpu or a TPU slice of --devices=8 chips',
        'test_fuzz.test_a_target_of_other_chips_is_one_line_exit_2',
    ),
    (
        'fuzz: --target without libtpu',
        '--target=tpu compiles with the TPU compiler, libtpu, which is not installed here',
        'test_fuzz.test_a_target_without_libtpu_says_what_to_install',
    ),
    (
        'fuzz: Hypothesis not installed (no test extra)',
        'tools.fuzz draws with Hypothesis, which is not installed',
        'test_fuzz.test_without_hypothesis_the_fuzzer_says_what_it_needs',
    ),
    (
        'fuzz: a corpus file that breaks the schema (half-saved, a merge marker, a field of the '
        'wrong type, missing or unknown, a misspelt status); refused before anything runs',
        'tools/fuzz/corpus/NAME.json: "status": "fixd": expected "fixed" or "known"',
        'test_fuzz.test_a_corpus_entry_that_breaks_the_schema_is_named_with_its_field',
    ),
    (
        'fuzz: a corpus file that is not JSON (exit 2; --nocorpus or a zoo entry\'s run reads none)',
        'is not JSON (line 1, column 27: Expecting property name enclosed in double quotes): fix '
        'or remove it',
        'test_fuzz.test_a_broken_corpus_file_is_one_line_exit_2_and_a_run_without_the_corpus_reads_none',
    ),
    (
        'fuzz: Ctrl-C while shrinking or in the corpus replay (exit 130; the summary so far, each '
        'failure found with its command)',
        'NOT fully shrunk (interrupted): the smallest draw so far',
        'test_fuzz.test_ctrl_c_while_shrinking_prints_the_failure_so_far_and_exits_130',
    ),
    (
        'fuzz: an empty --target (it started a full default run)',
        '--target is empty: expected tpu or a TPU slice of --devices=8 chips',
        'test_fuzz.test_an_empty_target_is_one_line_exit_2',
    ),
    (
        'fuzz: --entries naming no corpus entry, or one that replays under other flags',
        'does not replay in this run: add --target=tpu-v4-16',
        'test_fuzz.test_one_corpus_entry_replays_alone_with_its_command',
    ),
    (
        "fuzz: a fault of the fuzzer's own while running (exit 1, after the summary so far; "
        '--verbose: the traceback)',
        "the fuzzer stopped on a fault of its own, RuntimeError: a planted fault (--verbose shows "
        'where); what it found so far is above',
        'test_fuzz.test_a_fault_of_the_fuzzers_own_is_one_line_exit_1_after_the_summary',
    ),
]
