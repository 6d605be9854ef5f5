"""Sizes and data for an exercise's cases, made from the constants that decide its branches.

A kernel's branches turn on sizes relative to its tiles and blocks (the last tile partly used, a
causal tile test whose offset T_k - T_q is one off a multiple of the tile, a sliding window whose
edge falls on a tile's first or last key), and its arithmetic on magnitudes (scores near ±1000,
log-sum-exps spread past 88, a first block of keys wholly masked). A check whose cases are fixed
numbers tests the tile of one configuration only; these functions make the cases from the tile
(the configuration's constant), so both configurations reach every residue that decides a branch.
Every function is deterministic.

- ``around(n)``: n - 1, n, n + 1 (those >= 1).
- ``edges(tile, tiles=2)``: 1, and each multiple of the tile up to `tiles` of them, one below and
  one above: every way the last tile can be filled.
- ``offsets(tile)``: (T_q, T_k) pairs whose T_k - T_q is -1, 0, +1, tile - 1, tile and tile + 1,
  and T_q > T_k (rows that see no key).
- ``window_edges(tile)``: (T, window) pairs whose window edge falls on a tile's first key, its last
  key, and one past each.
"""


def around(n):
    """n - 1, n, n + 1, those that are at least 1."""
    return [m for m in (n - 1, n, n + 1) if m >= 1]


def edges(tile, tiles=2):
    """1, then tile - 1, tile, tile + 1, ..., tiles * tile + 1: sizes that leave the last tile with
    one element, full, or one short, for 1 to `tiles` tiles."""
    sizes = [1]
    for count in range(1, tiles + 1):
        sizes += [m for m in around(count * tile) if m not in sizes]
    return sizes


def offsets(tile):
    """(T_q, T_k) pairs, each T at most 2 tiles + 1: the causal offset T_k - T_q at 0, ±1, and a tile
    ± 1 (a tile test written with >= for > is wrong exactly when the offset is 1 modulo the tile),
    and more queries than keys (rows that see no key)."""
    pairs = [(tile, tile), (tile, tile + 1), (tile + 1, tile), (tile, 2 * tile - 1), (tile, 2 * tile),
             (tile - 1, 2 * tile), (2 * tile + 1, tile - 1)]
    return [(t_q, t_k) for t_q, t_k in pairs if t_q >= 1 and t_k >= 1]


def window_edges(tile):
    """(T, window) pairs (T queries and keys) where a window of `window` keys ends on a tile's first
    key, on its last key, or one key either side of those: the tiles a band skips change there."""
    t = 3 * tile
    return [(t, w) for w in sorted({tile, tile + 1, tile - 1, 2 * tile, 2 * tile + 1}) if w >= 1]
