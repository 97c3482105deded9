"""The run directory: the one owner of every file name in it, of atomic writes and of checkpoint integrity.
Its modules: :mod:`.files` (names, errors, atomic writes), :mod:`.checkpoints`, :mod:`.records` (status,
metrics, evaluations, jobs) and :mod:`.lock`; every name is importable from here.

    {save}/config.yml                   the run's resolved config (written when training starts)
    {save}/status.json                  {"state": running|done|interrupted|failed, "step", "train_iters",
                                         "checkpoint" (the newest checkpoint's step, 0: none yet),
                                         "reason" (failed), "updated_at"}
    {save}/metrics.jsonl                one JSON object per logged step (training and validation rows)
    {save}/eval/*.json                  rolling-window evaluations ({"step", "corpora": {...}})
    {save}/run.json                     a sweep's record of the run (sweep, run, axes, configs, overrides)
    {save}/slurm_jobs.txt               SLURM job ids the run was submitted under, one per line
    {save}/wandb_run_id                 the W&B run id (a resumed run continues the same W&B run)
    {save}/run.lock                     held (flock) by the trainer writing the run: {"host", "pid", "since"}
    {save}/checkpoints/step_XXXXXXXX/   one complete checkpoint:
        model.safetensors               consolidated fp32 weights (Hugging Face names)
        model.yml                       the model section of the config alone (all that building the model needs)
        config.yml                      the resolved config of the run
        state.json                      step, consumed samples, provenance, and the manifest: every file of the
                                        checkpoint with its size and xxh3-64 checksum (written last), and the
                                        xxh3-64 checksum of its own contents
        rng_rankNNNNN.pt, DeepSpeed's model and optimizer files
    {save}/checkpoints/latest           name of the newest complete checkpoint (for people and external tools)
    {save}/checkpoints/.tmp-step_X/     a checkpoint being written; renamed to step_X once complete
    {save}/checkpoints/.del-step_X/     a checkpoint being deleted; renamed first, so a kill never leaves a
                                        half-deleted step_X behind

A checkpoint is *complete* when every file its manifest lists is there with the recorded size and checksum.
Resuming, evaluation and conversion all find checkpoints through :func:`newest_checkpoint` /
:func:`resolve_checkpoint` and refuse one that fails the check, saying why.
"""

from .checkpoints import (checkpoint_step, CheckpointHold, checkpoints_dir, clean_leftovers, held_checkpoint,
                          hold_checkpoint, is_checkpoint_dir, is_hf_folder, newest_checkpoint, prune, publish,
                          read_state, resolve_checkpoint, set_aside_newer, state_checksum, step_dir_name, step_dirs,
                          verify, write_manifest)
from .files import (CHECKPOINTS, CHECKSUM, CONFIG, DEL_PREFIX, EVAL_DIR, FAILED_PREFIX, FINAL_EVAL, JOBS, KILL_AT_ENV,
                    LATEST, LOCK, METRICS, MODEL_CONFIG, RUN_META, STATE, STATE_CHECKSUM, STATUS, STEP_PREFIX,
                    TMP_PREFIX, WANDB_ID, WANDB_STEP, WEIGHTS, append_text, check_own_folder, check_writable,
                    CheckpointError, fault_point, file_checksum, free_space, fsync_dir, fsync_tree, manifest,
                    open_run_file, remove_tree, RunFileError, RunWriteError, save_safetensors, staged_dir,
                    uninterrupted, write_error, write_output, write_text_atomic)
from .lock import (flock_held, lock_holder, lock_run_dir, RunLock, RunLockedError)
from .records import (job_ids, read_evals, read_json, read_metrics, read_status, record_job, recorded_checkpoint,
                      recovery, truncate_metrics, write_status)
