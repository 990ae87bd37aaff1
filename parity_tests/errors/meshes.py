"""Rows of docs/errors.md's table (parity_tests/errors_table.py): Meshes and plans: --mesh, --strategy, the axes and what each must divide, the
pipeline's schedules and microbatches, the context ring, the experts, the precision policy.
"""

ROWS = [
    (
        'warm-up as long as the schedule',
        '--warmup_steps=100 must be below the length of the schedule',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'malformed --mesh',
        '--mesh=4by2: expected DATAxMODEL, two positive integers such as 4x2',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--mesh and --num_devices disagree',
        '--num_devices=4 and --mesh=4x2 (8 devices) disagree',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'heads not divisible by the model axis (tp)',
        "--num_heads=4 is not divisible by the mesh's model axis (8)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--seq_len not divisible by the sequence axis (cp)',
        "--seq_len=30 is not divisible by the mesh's sequence axis (4)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--seq_len not divisible by 2 x the sequence axis (cp, zigzag layout)',
        '--seq_len=36 is not divisible by 2 x the sequence axis (8)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--strategy=cp with the MLP',
        '--strategy=cp splits sequences, and --model=mlp has none',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--experts_per_token above --num_experts',
        '--experts_per_token=5 must be between 1 and --num_experts=4',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--num_experts not divisible by the expert axis (ep)',
        "--num_experts=6 is not divisible by the mesh's expert axis (4)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--strategy=ep without experts',
        '--strategy=ep splits the experts of a mixture-of-experts transformer',
        'test_ep.test_bad_expert_settings_are_refused',
    ),
    (
        '--capacity_factor of 0 or below with experts on',
        '--capacity_factor=0.0 must be above 0 with --num_experts=4',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--num_experts under a strategy other than dp or ep',
        '--strategy=pp with --num_experts=4: the mixture of experts runs under --strategy=dp '
        'or ep, or on a named mesh',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a sequence axis of 1 (cp; a warning, not an error)',
        'splits no sequence: it runs as dp',
        'test_cp.test_a_sequence_axis_of_1_warns_and_bad_inputs_are_refused',
    ),
    (
        '--num_layers not divisible by the stage axis (pp)',
        "--num_layers=6 is not divisible by the mesh's stage axis (4)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--batch_size not divisible into the microbatches (pp)',
        '--batch_size=12 does not split into --microbatches=4 on each of the 2 devices',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--strategy=pp with the MLP',
        '--strategy=pp splits a stack of equal layers into stages, and --model=mlp has none',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a stage axis of 1 (pp; a warning, not an error)',
        'makes no pipeline: one stage holds every layer',
        'test_pp.test_a_stage_axis_of_1_warns_and_bad_inputs_are_refused',
    ),
    (
        'tp on a mesh whose model axis is 1 (a warning)',
        "on a mesh whose 'model' axis is 1 splits nothing over it",
        'test_cli.test_settings_that_change_nothing_warn_once',
    ),
    (
        'a strategy the twin does not have, or none of that name',
        'value should be one of <dp|fsdp|tp|fsdp_tp',
        'test_cli.test_each_train_cli_offers_exactly_its_twins_strategies',
    ),
    (
        '--mesh with non-ASCII digits',
        '--mesh=²x1: expected DATAxMODEL',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'a named mesh whose sizes do not multiply to the device count',
        '--mesh=data:2,fsdp:2 has 4 devices (2 x 2), but 8 are in use: the sizes must multiply to 8',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'heads not divisible by a named mesh\'s model axis',
        "--num_heads=3 is not divisible by the mesh's model axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'KV heads not divisible by a named mesh\'s model axis',
        "--num_kv_heads=1 is not divisible by the mesh's model axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'layers not divisible by a named mesh\'s stage axis',
        "--num_layers=3 is not divisible by the mesh's stage axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'experts not divisible by a named mesh\'s expert axis',
        "--num_experts=3 is not divisible by the mesh's expert axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'the sequence not divisible by a named mesh\'s seq axis',
        "--seq_len=31 is not divisible by the mesh's sequence axis (2)",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'the batch not divisible by a named mesh\'s row axes',
        "--batch_size=6 is not divisible by the 4 devices of the mesh's row axes ('data' x 'fsdp')",
        'test_bad_inputs.test_cli_row',
    ),
    (
        'the batch not splitting into the microbatches on a named mesh',
        '--batch_size=8 does not split into --microbatches=4 on each of the 4 devices of the '
        "mesh's row axes ('data' x 'fsdp')",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--pp_virtual without --pp_schedule=interleaved',
        '--pp_virtual=2 needs --pp_schedule=interleaved (it is --pp_schedule=1f1b)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'layers not divisible by the stage axis x --pp_virtual',
        '--num_layers=4 is not divisible by the stage axis x --pp_virtual (2 x 4 = 8)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'fewer microbatches than stages under 1f1b',
        '--microbatches=2 is fewer than the stage axis (4): 1F1B reaches its steady state',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'interleaved microbatches not a multiple of the stage axis',
        '--microbatches=3 is not a multiple of the stage axis (2)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--pp_schedule other than gpipe on a mesh without a stage axis',
        '--pp_schedule=1f1b orders the microbatches of a pipeline, and --strategy=dp has no stage axis',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--pp_virtual=1 under --pp_schedule=interleaved',
        '--pp_virtual=1 must be 2 or more: each stage runs V chunks (V = 1 is --pp_schedule=1f1b)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'layers not divisible by the stage axis x --pp_virtual on a named mesh',
        '--num_layers=6 is not divisible by the stage axis x --pp_virtual (2 x 2 = 4)',
        'test_bad_inputs.test_cli_row',
    ),
    (
        'interleaved microbatches not a multiple of the stage axis on a named mesh',
        '--microbatches=3 is not a multiple of the stage axis (2): the interleaved schedule',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--mesh not name:size pairs separated by commas',
        "--mesh=data:2;model:4: 'data:2;model:4' is not name:size; expected name:size pairs separated by commas",
        'test_named_meshes.test_a_mesh_is_refused_naming_what_the_user_gave',
    ),
    (
        '--strategy=composed without a --mesh',
        '(their sizes multiplying to the 8 devices), and no --mesh was given',
        'test_named_meshes.test_a_mesh_is_refused_naming_what_the_user_gave',
    ),
    (
        'an expert axis on a dense model',
        'the expert axis of --mesh=expert:8 splits the experts of a mixture-of-experts transformer',
        'test_named_meshes.test_a_mesh_is_refused_naming_what_the_user_gave',
    ),
    (
        '--reduce_dtype=bfloat16 where nothing is reduced',
        '--reduce_dtype=bfloat16 on --mesh=stage:2,model:4: nothing is reduced there',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--shard_optimizer_over_data without a data axis of 2 or more',
        "--shard_optimizer_over_data splits AdamW's moments over the 'data' axis, and "
        "--mesh=fsdp:8 has no 'data' axis of 2 or more devices",
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--reduce_dtype=bfloat16 in auto or typed',
        '--reduce_dtype=bfloat16 in the typed twin: its partitioner reduces each gradient where it is '
        'formed, before any line of the twin can cast it; use explicit.train',
        'test_bad_inputs.test_cli_row',
    ),
    (
        '--reduce_dtype=bfloat16 on one device (no --mesh, no --strategy given)',
        '--reduce_dtype=bfloat16 on one device: nothing is reduced there',
        'test_named_meshes.test_one_number_is_that_many_devices_on_the_first_axis_and_no_flag_is_named_unasked',
    ),
]
