"""The training engine: DeepSpeed ZeRO setup, Pythia optimizer and LR schedule, checkpoints, logs, validation.

    python train.py configs/tiny.yml configs/attention/vanilla.yml save=runs/tiny

Modules: ``distributed`` (process group, device), ``engine`` (DeepSpeed config and engine), ``optim``
(parameter groups, LR schedule), ``checkpointing`` (atomic checkpoints, resume), ``signals`` (SIGTERM/SIGUSR1),
``metrics`` (throughput, MFU, memory), ``logging_sinks`` (terminal, metrics.jsonl, W&B, TensorBoard),
``validation`` (held-out loss), ``loop`` (the training loop).
"""
