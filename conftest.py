"""Test-session settings shared by the test suite and the doctests.

The tests use tiny tensors, for which torch's intra-op threads cost more than they save (and on a
loaded 2-core machine they make the suite many times slower), so the whole session runs on one
thread. Tests that need more set it themselves.
"""

import pytest
import torch

torch.set_num_threads(1)


@pytest.fixture(autouse=True)
def _one_thread():
    """Every test starts on one thread, and a test that sets its own count leaves none behind."""
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(1)
