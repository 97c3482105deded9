"""The demo task's documents, found beside this file (so the task runs from any working directory)."""

from pathlib import Path


def load(**_):
    """``{"test": Dataset}`` of ``neox_dar_demo.jsonl``: lm-eval's ``custom_dataset`` hook."""
    from datasets import load_dataset

    return load_dataset("json", data_files={"test": str(Path(__file__).with_name("neox_dar_demo.jsonl"))})
