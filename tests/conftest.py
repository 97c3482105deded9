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
