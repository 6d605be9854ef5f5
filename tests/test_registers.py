"""Notebook 10's stage: the row-scores kernels against NumPy at awkward sizes, their global traffic
counted by the sanitizer, and the launcher's refusals. The exercises' planted answers are in
test_exercises_10.py."""

import numpy as np
import pytest
from attention_lib import reference
from attention_lib.measure import sanitizer
from attention_lib.stages import registers
from attention_lib.stages.registers import D, ROWS_PER_BLOCK

KEY_TILE = ROWS_PER_BLOCK          # row_scores_kernel_v3's tile: as many keys as its block has rows

# (T_q, T_k): one row and one key; a partial block of rows against a key tile one short; a block one row
# short against a tile and one key; a block and one row against exactly one tile; two tiles and one key.
SIZES = [(1, 1), (7, KEY_TILE - 1), (ROWS_PER_BLOCK - 1, KEY_TILE + 1), (ROWS_PER_BLOCK + 1, KEY_TILE),
         (3, 2 * KEY_TILE + 1)]


@pytest.mark.parametrize("version", sorted(registers.KERNELS))
@pytest.mark.parametrize("t_q, t_k", SIZES)
def test_row_scores_match_the_reference(rng, version, t_q, t_k):
    q, k = rng.standard_normal((t_q, D)), rng.standard_normal((t_k, D))
    got = registers.row_scores(q, k, version=version)
    assert got.dtype == np.float32 and got.shape == (t_q, t_k)
    np.testing.assert_allclose(got, reference.scores(q, k, scale=False), rtol=1e-5, atol=1e-4)


@pytest.mark.parametrize("version", sorted(registers.KERNELS))
@pytest.mark.parametrize("t_q, t_k", [(7, KEY_TILE + 1), (ROWS_PER_BLOCK + 3, 5)])
def test_the_traffic_formula_is_what_the_sanitizer_counts(rng, version, t_q, t_k):
    """v1 and v2 read k once per row; v3 once per block of rows, through its shared tile."""
    q = rng.standard_normal((t_q, D)).astype(np.float32)
    k = rng.standard_normal((t_k, D)).astype(np.float32)
    out = np.zeros((t_q, t_k), np.float32)
    grid, block = registers.row_scores_grid(t_q)
    report = sanitizer.count_memory(registers.KERNELS[version], grid, block, q, k, out)
    want = registers.row_scores_traffic(t_q, t_k, version=version)
    assert int(report.loads("q").sum()) == want["q"] and int(report.loads("k").sum()) == want["k"]
    assert int(report.stores("out").sum()) == want["out"]
    assert int(report.loads("k").max()) == (-(-t_q // ROWS_PER_BLOCK) if version == 3 else t_q)


def test_the_launcher_refuses_another_width():
    with pytest.raises(ValueError, match=rf"^q must have shape \(T_q, {D}\) \(D, the compiled width\); got \(3, 8\)$"):
        registers.row_scores(np.zeros((3, 8)), np.zeros((2, D)))
    with pytest.raises(ValueError, match=r"version"):
        registers.row_scores(np.zeros((3, D)), np.zeros((2, D)), version=4)
