"""Session-wide test settings.

Triton picks compiled or interpreted kernels when a ``@triton.jit`` function is defined, so the choice must
be made before anything imports Triton: without CUDA, the whole session uses the CPU interpreter
(``TRITON_INTERPRET=1``), whichever test module happens to import the kernels first.
"""

import os

import pytest

if "TRITON_INTERPRET" not in os.environ:
    import torch

    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


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

    prefix = tmp_path_factory.mktemp("tokenized_sample") / "c4"
    run(["data/sample/c4_sample.jsonl", "--tokenizer", "data/20B_tokenizer.json", "--out", str(prefix),
         "--max-tokens", "20000", "--workers", "1", "--no-progress"])
    return str(prefix)
