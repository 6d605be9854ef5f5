"""The online softmax in float64, with its usual mistakes as switches: the one model that the checks
of notebooks 07 and 08 compare a wrong answer with, to name what it left out.

A row folds its key tiles in order into a running max m, sum l and weighted sum acc (notebook 07's
update): m_new = max(m, the tile's max); l and acc are rescaled by base^(m - m_new), then the tile's
base^(s - m_new) terms are added. While m_new is still -inf (no key seen yet) the shift is 0, so a
tile of masked keys adds nothing instead of NaN.
"""

import math

import numpy as np


def fold(s, v, tiles, *, base=math.e, rescale_l=True, rescale_acc=True, keep_max=True, guard=True,
         factor=None, rescaled=None):
    """(m, l, acc) of one row: s (T_k,) float64 scores, -inf where masked; v (T_k, d_v); tiles: the
    key indices of each tile (slices or lists), in the order they are folded. The mistakes:
    rescale_l / rescale_acc False: l or acc never rescaled; keep_max False: m never updated; guard
    False: a tile folded with the shift -inf while no key is seen yet (NaN); factor(m, shift): the
    rescale factor in place of base^(m - shift); rescaled: bool (d_v,), the columns of acc the factor
    reaches (None: all)."""
    m, l, acc = -np.inf, 0.0, np.zeros(v.shape[1])
    for keys in tiles:
        scores = s[keys]
        m_new = max(m, scores.max()) if scores.size else m
        shift = 0.0 if (guard and m_new == -np.inf) else m_new
        with np.errstate(invalid="ignore", over="ignore"):
            scale = factor(m, shift) if factor else base ** (m - shift)
            l = l * scale if rescale_l else l
            if rescale_acc:
                acc = acc * scale if rescaled is None else np.where(rescaled, acc * scale, acc)
            p = base ** (scores - shift)
            l, acc = l + p.sum(), acc + p @ v[keys]
        m = m_new if keep_max else m
    return m, l, acc


def rescale_mistakes(acc, row, exp):
    """[(code, fold's switches, message)] of the rescale's usual mistakes, in the words of the exercise
    that names them: `acc` the weighted sum's name ("acc", "o"), `row` what folds ("query", "row"),
    `exp` the factor's base as written ("exp", "2^")."""
    return [
        ("online_softmax_no_rescale", dict(rescale_l=False, rescale_acc=False),
         f"neither l nor {acc} was rescaled when a tile raised the max: the sums so far were taken against "
         f"the old max and must be multiplied by {exp}(m - m_new) before the tile's terms are added"),
        ("rescale_l_only", dict(rescale_acc=False),
         f"l was rescaled when a tile raised the max, {acc} was not: its sums were taken against the same old max"),
        ("rescale_o_only", dict(rescale_l=False),
         f"{acc} was rescaled when a tile raised the max, l was not: its sum was taken against the same old max"),
        ("max_not_updated", dict(keep_max=False),
         f"each {row} kept only its last tile of keys: the new max was never kept as m, so every tile's "
         "rescale against the old one wiped what came before"),
    ]


def normalised(l, acc):
    """A row's output from its fold: acc / l, zeros for a row that saw no key (l 0), NaN passed on."""
    with np.errstate(invalid="ignore"):
        return acc / l if (l > 0 or np.isnan(l)) else np.zeros_like(acc)
