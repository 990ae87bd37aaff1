"""Rows of docs/errors.md's table (parity_tests/errors_table.py): the collectives inspector
(--target, --program, --hosts, its outputs) and the benchmarks (python -m benchmarks.run).
"""

ROWS = [
    (
        'inspector: --program not MODULE:FUNCTION',
        '--program=mymod: expected MODULE:FUNCTION, e.g. mypkg.mymod:build',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --program module not importable',
        "--program: cannot import 'nosuchmodule'",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: unknown --hardware',
        'flag --hardware=a100: value should be one of',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'benchmarks: a --mesh that names no axes',
        '--mesh=4x2: name the axes, e.g. data:2,fsdp:2,model:2',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --hosts not dividing the devices',
        '--hosts=3: the 8 devices of the mesh data:4,model:2 do not split evenly over 3 hosts; '
        'give one of 1, 2, 4, 8',
        'test_bad_inputs.test_cli_row',
    ),
    (
        "inspector: a mesh whose inner axes do not fit in a host (--hosts)",
        '--hosts=2: 3 devices a host, but the inner axes of the mesh data:3,model:2 do not fit '
        'in a host',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: unknown --target',
        'flag --target=tpu-v9-8: value should be one of',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --target with --hardware (a target is priced on its own hardware)',
        "--hardware=h100x8 with --target=tpu-v5e-8: a target's program is priced on its own "
        'hardware (tpu-v5e-8); drop --hardware',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --target with --cpu_devices (a target compiles for its own devices)',
        '--cpu_devices=4 with --target=tpu-v5e-8: a target compiles for its own devices (8); '
        'drop --cpu_devices',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: --target=tpu-* without libtpu',
        'compiles with the TPU compiler, libtpu, which is not installed here: '
        'pip install -e ".[tpu]"',
        'test_target.test_without_libtpu_target_says_what_to_install',
    ),
    (
        "inspector: --target=h200x8 before a GPU's target config is captured",
        '--target=h200x8: no target config has been captured yet for this GPU',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'inspector: a mesh larger than the target',
        '--num_devices=8, but the target has 4 TPU devices: use 1..4',
        'test_target.test_cli_writes_json_and_html_naming_the_target_and_keeps_libtpu_quiet',
    ),
    (
        "inspector: a program the target's HBM cannot hold (--program; a twin's step is "
        'reported `DOES NOT FIT` beside the others)',
        'the program does not fit tpu-v5e-1: needs',
        'test_target.test_a_program_the_chips_hbm_cannot_hold_is_named_not_fitting',
    ),
    (
        'inspector: --html or --trace naming a folder (checked before the inspection)',
        'is a folder: name the file to write, e.g.',
        'test_inspector.test_html_and_trace_paths_are_checked_before_the_inspection',
    ),
    (
        'inspector: --html or --trace in a folder that does not exist',
        '/missing does not exist',
        'test_inspector.test_html_and_trace_paths_are_checked_before_the_inspection',
    ),
    (
        'inspector: --html or --trace in a folder it cannot write',
        '--html=/sys/r.html: cannot write in /sys',
        'test_inspector.test_html_and_trace_paths_are_checked_before_the_inspection',
    ),
    (
        'inspector --target: a row of expected against compiled bytes no mechanism found '
        'in the program explains (a surprise, not an error)',
        'no mechanism found in the program accounts for the difference',
        'test_target.test_a_planted_bug_stays_a_surprise_on_a_tpu',
    ),
    (
        'benchmarks: an empty --sections',
        '--sections is empty: name one or more of',
        'test_benchmark_run.test_bad_sections_and_outputs_are_refused_before_any_section',
    ),
    (
        'benchmarks: an --out it cannot write (before the first section)',
        '--out=/sys/x: cannot write in /sys',
        'test_benchmark_run.test_bad_sections_and_outputs_are_refused_before_any_section',
    ),
    (
        'benchmarks: an --out that is a file',
        'is a file, not a folder',
        'test_benchmark_run.test_bad_sections_and_outputs_are_refused_before_any_section',
    ),
    (
        "benchmarks: a bad input in section cli's child process (its line, passed on)",
        'section cli: ',
        'test_benchmark_run.test_section_clis_child_passes_on_its_one_line',
    ),
    (
        "benchmarks: Ctrl-C (exit 130; the finished sections' tables printed, nothing written)",
        'interrupted during section nanogpt (Ctrl-C): nothing written',
        'test_benchmark_run.test_ctrl_c_is_one_line_and_exit_130',
    ),
    (
        'benchmarks: a run of some sections into recorded results (a note: merged, not '
        'replaced)',
        'merged section(s) context into',
        'test_benchmark_run.test_a_run_of_one_section_merges_into_the_recorded_results',
    ),
    (
        'benchmarks: --target without --out (a note: nothing written into the checkout)',
        'nothing written (the tables follow)',
        'test_benchmark_run.test_a_target_run_leaves_the_checkout_alone_and_names_its_target',
    ),
    (
        'benchmarks: --platform=tpu where JAX finds no TPU',
        '--platform=tpu, but JAX finds no TPU (its devices: cpu',
        'test_benchmark_tpu.test_platform_tpu_without_a_tpu_is_one_line_and_exit_2',
    ),
    (
        'benchmarks: section mfu or chip_memory with --platform=cpu',
        'which need a chip',
        'test_benchmark_tpu.test_the_chip_sections_are_refused_on_the_cpu',
    ),
    (
        'inspector: --measure_memory off a chip, or beside --target or --program',
        "--measure_memory reads the device's memory_stats(), which cpu devices do not keep",
        'test_inspector_chip.test_measure_memory_is_refused_off_a_chip_and_beside_a_target',
    ),
]
