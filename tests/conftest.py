"""Shared fixtures. attention_lib is imported first: it chooses GPU or simulator before numba.cuda loads."""

import attention_lib  # noqa: F401  (must precede any numba.cuda import)
import numpy as np
import pytest


@pytest.fixture
def rng():
    """A fresh, seeded generator per test: random data, the same on every run."""
    return np.random.default_rng(12345)
