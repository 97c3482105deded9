"""Session-wide test settings.

Triton picks compiled or interpreted kernels when a ``@triton.jit`` function is defined, so the choice must
be made before anything imports Triton: without CUDA, the whole session uses the CPU interpreter
(``TRITON_INTERPRET=1``), whichever test module happens to import the kernels first; its per-call cost is cut by
tests/interpreter_calls.py.
"""

import os

import pytest

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"

if os.environ.get("TRITON_INTERPRET") == "1":
    import interpreter_calls  # the interpreter patches triton.language once per device function and launch

    interpreter_calls.install()


@pytest.fixture
def one_thread():
    """One intra-op thread: on a shared, loaded 2-core CPU, two threads are several times slower for tiny ops."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def tokenized_sample(tmp_path_factory) -> str:
    """Prefix of a tokenized slice (20k tokens) of the embedded C4 training sample, shared by the session."""
    from data_prep.tokenize import run
    from session_cache import built_once

    def tokenize(folder):
        run(["data/sample/c4_sample.jsonl", "--tokenizer", "data/20B_tokenizer.json", "--out", str(folder / "c4"),
             "--max-tokens", "20000", "--workers", "1", "--no-progress"])
        return str(folder / "c4")

    return built_once(tmp_path_factory, "tokenized_sample", tokenize)


@pytest.fixture(scope="session")
def byte_tokenized_sample(tmp_path_factory) -> str:
    """Prefix of the same slice under the byte tokenizer (trainrun.byte_sample), shared by the session."""
    from session_cache import built_once
    from trainrun import byte_sample

    return built_once(tmp_path_factory, "byte_tokenized_sample", byte_sample)


# ---------------------------------------------------------------------------------------------------------
# Test tiers. The end-to-end tier (marker ``e2e``) holds the README walkthroughs, the real SLURM cluster, the
# replication smoke, the exact-resume trainings and every test measured over ~10 s on the 2-core CPU; the fast tier
# is the rest: ``pytest -m "not e2e"`` (``bash scripts/test.sh --fast``). ``scripts/test.sh`` runs both. The tier is
# kept here, by test id, so that test files carry no tier decoration. An entry is a test file (every test in it), a
# test (every parametrization of it) or one parametrized case ``name[id]``.

E2E = {
    # every test of the file trains, or runs a real cluster
    "tests/test_slurm_cluster.py",
    "tests/test_checkpoints.py",
    "tests/test_train.py",
    "tests/test_run_tokenizer.py",
    "tests/test_eval_lm_eval.py",
    "tests/test_generate_lm_eval.py",
    "tests/test_bench.py",
    # README walkthroughs and the replication's scripts
    "tests/test_sweep.py::test_readme_experiments_walkthrough",
    "tests/test_finetune_demo.py::test_readme_walkthrough_runs",
    "tests/test_replicate.py::test_smoke_runs_the_whole_pipeline_and_the_report_reads_the_results",
    "tests/test_replicate.py::test_cpu_replication_at_toy_size_runs_resumes_and_reports",
    "tests/test_gpu_scripts.py::test_rehearsal_runs_every_step_on_the_cpu",
    # trainings, sweeps and evaluations run end to end
    "tests/test_attention_hybrid.py::test_a_hybrid_run_resumes_exactly",
    "tests/test_attention_training.py::test_tiny_model_learns",
    "tests/test_eval_sweeps.py::test_hub_source_through_the_command_line_and_the_sweep_manifest",
    "tests/test_data_bytes.py::test_a_byte_level_model_trains_on_enwik8_splits_and_is_evaluated",
    "tests/test_data_prep.py::test_sentencepiece_model_with_its_eos_as_eod",
    "tests/test_variant_plugin.py::test_train_sweep_evaluation_and_report",
    "tests/test_sweep.py::test_local_sweep_extends_runs_and_evaluates_newer_checkpoints",
    "tests/test_sweep.py::test_a_second_trainer_on_a_run_directory_exits_with_one_line",
    "tests/test_families.py::test_family_trains_resumes_exactly_and_evaluates",
    "tests/test_faults.py::test_a_stale_torch_extension_lock_never_hangs_a_start",
    "tests/test_faults.py::test_a_trainer_killed_in_its_first_seconds_starts_again",
    "tests/test_faults.py::test_a_stop_during_start_up_stops_at_the_first_step",
    "tests/test_faults.py::test_ctrl_c_stops_at_a_step_with_a_checkpoint_and_twice_aborts_in_one_line",
    "tests/test_faults.py::test_a_symlinked_run_lock_is_refused_and_its_target_kept",
    "tests/test_faults.py::test_a_refused_second_launch_writes_nothing_into_the_run",
    "tests/test_faults.py::test_a_full_disk_while_logging_is_one_line_and_failed",
    "tests/test_faults.py::test_a_full_disk_at_a_checkpoint_says_no_space_left",
    "tests/test_faults.py::test_bad_paths_and_values_are_one_line",
    "tests/test_finetune.py::test_stage_one_trains_only_the_bottleneck",
    "tests/test_finetune.py::test_stage_two_resets_step_schedule_optimizer_and_resumes_exactly",
    "tests/test_finetune.py::test_a_weights_only_load_needs_finetune",
    "tests/test_finetune.py::test_finetune_refuses_another_base_model",
    "tests/test_finetune.py::test_lora_run_trains_adapters_and_saves_merged_weights",
    "tests/test_dimpo_tasks.py::test_task_grid_runs_lm_eval_and_reads_its_results",
    "tests/test_loss_chunks.py::test_aha_aux_loss_unaffected",
    "tests/test_model.py::test_activation_checkpointing_gives_same_gradients",
    # measured over ~10 s on the 2-core CPU
    "tests/test_attention_describe.py::test_the_old_command_name_still_works",
    "tests/test_attention_edges.py::test_aha_router_gradient_is_the_ste_formula[triton-selected]",
    "tests/test_attention_edges.py::test_aha_router_gradient_is_the_ste_formula[triton-difference]",
    # the slowest of the fast tier's first measurement (60-280 s each on the 2-core CPU under load 8-16)
    "tests/test_kernels.py::test_kernels_compile_for_hopper_without_a_gpu",
    "tests/test_families.py::test_sharded_import_peak_memory_is_one_model",
    "tests/test_families.py::test_command_line_round_trip_with_the_tokenizer",
    "tests/test_downstream.py::test_short_prompts_are_dropped_and_the_rest_scored_as_lm_eval_scores_them",
    "tests/test_downstream.py::test_suites_name_lm_evals_tasks",
    "tests/test_downstream.py::test_the_shipped_demo_task_runs_from_any_directory",
    "tests/test_chat.py::test_bad_conversations_with_workers_give_one_line",
    "tests/test_chat.py::test_workers_give_the_same_files",
    "tests/test_chat.py::test_a_per_token_step_is_the_same_on_two_ranks_as_in_one_micro_batch",
    "tests/test_eval_perplexity.py::test_max_docs_per_corpus",
    "tests/test_eval_sweeps.py::test_runs_of_a_sweep_score_the_documents_of_its_manifest",
    "tests/test_attention_triton.py::test_triton_path_matches_reference_under_the_interpreter",
    "tests/test_data_prep.py::test_large_documents_are_cut_into_byte_shards_with_identical_output",
    "tests/test_data_prep.py::test_hugging_face_dataset_input_streams_offline",
    "tests/test_convert.py::test_cli_round_trip_keeps_every_weight",
    "tests/test_hf_export.py::test_fresh_process_without_neox_dar_generates_our_tokens",
    "tests/test_slurm.py::test_requeueing_stops_without_progress",
    "tests/test_dimpo_memory.py::test_fit_memory_is_bounded_where_per_query_copies_were_not",
    # over 5 s in the fast tier's quiet measurement (bench/results/test_fast_tier_cpu.json's run)
    "tests/test_convert.py::test_to_hf_tokenizer_follows_the_config_and_the_command_line",
    "tests/test_test_script.py",
    "tests/test_packaging.py",
    "tests/test_conformance.py::test_triton_paths_agree_or_are_refused_in_one_line",
    "tests/test_downstream_ruler.py::test_the_standin_runs_both_lengths_in_one_evaluation_with_the_models_tokenizer",
    "tests/test_family_records.py::test_a_new_family_is_one_record_and_its_preset",
    "tests/test_kernels.py::test_tiny_model_triton_matches_reference_and_compiles_in_one_graph",
    "tests/test_slurm.py::test_a_run_trained_past_its_evaluation_is_evaluated_again",
    "tests/test_gpu_scripts.py::test_a_copy_without_git_goes_past_a_failure_and_a_time_limit_and_records_its_commit",
    # trust round 3 and the decode kernel: trainings, commands killed mid-way, a model decoding under the interpreter
    "tests/test_trust_resume.py",
    "tests/test_trust_commands.py::test_ctrl_c_in_eval_convert_and_tokenize_is_one_line_and_writes_nothing",
    "tests/test_trust_commands.py::test_a_checkpoint_pruned_while_it_is_read_is_read_whole",
    "tests/test_kernels.py::test_aha_decode_on_the_kernel_equals_the_full_forward_without_host_syncs",
    "tests/test_sweep_plan.py::test_checkpoint_bytes_are_what_a_trained_checkpoint_holds",
}


# The slowest tests of the whole suite, measured on the quiet 2-core CPU (seconds, `PYTEST_ADDOPTS=--durations=120
# bash scripts/test.sh`, 2026-11-28, at 73f947c: an earlier bench/results/test_suite_cpu.json), collected first: the
# two workers (xdist's worksteal) start on them and end together on short tests, where one worker would otherwise
# finish a long test alone at the end.
SLOWEST_FIRST = [
    "tests/test_gpu_scripts.py::test_rehearsal_runs_every_step_on_the_cpu",  # 93
    "tests/test_replicate.py::test_smoke_runs_the_whole_pipeline_and_the_report_reads_the_results",  # 54
    "tests/test_slurm_cluster.py::test_sweep_on_local_slurm",  # 47
    "tests/test_sweep.py::test_readme_experiments_walkthrough",  # 42
    "tests/test_sweep.py::test_local_sweep_extends_runs_and_evaluates_newer_checkpoints",  # 40
    "tests/test_finetune_demo.py::test_readme_walkthrough_runs",  # 30
    "tests/test_replicate.py::test_cpu_replication_at_toy_size_runs_resumes_and_reports",  # 27
    "tests/test_bench.py::test_bench_script_runs_one_tiny_step_on_cpu[quickstart.py]",  # 25
    "tests/test_slurm_cluster.py::test_cluster_settings_reach_the_job_and_the_evaluation_uses_its_ranks",  # 20
]


def _e2e_entry(nodeid: str) -> str | None:
    """The E2E entry that covers ``nodeid``, if any."""
    path, _, name = nodeid.partition("::")
    for key in (nodeid, f"{path}::{name.split('[', 1)[0]}", path):
        if key in E2E:
            return key
    return None


def _stale_entries(root) -> list[str]:
    """Entries of :data:`E2E` and :data:`SLOWEST_FIRST` whose file or test function no longer exists (a renamed test
    would silently join the fast tier, or lose its place)."""
    import ast

    stale, names = [], {}
    for entry in sorted({*E2E, *SLOWEST_FIRST}):
        path, _, name = entry.partition("::")
        if path not in names:
            file = root / path
            names[path] = ({n.name for n in ast.walk(ast.parse(file.read_text())) if isinstance(n, ast.FunctionDef)}
                           if file.is_file() else None)
        if names[path] is None or (name and name.split("::")[-1].split("[", 1)[0] not in names[path]):
            stale.append(entry)
    return stale


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _e2e_entry(item.nodeid) is not None:
            item.add_marker(pytest.mark.e2e)
    first = {nodeid: rank for rank, nodeid in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: first.get(item.nodeid, len(first)))  # stable: the rest keep their order
    stale = _stale_entries(config.rootpath)
    if stale:
        import warnings

        warnings.warn(pytest.PytestWarning(f"tests/conftest.py names tests that do not exist: {', '.join(stale)}"))
