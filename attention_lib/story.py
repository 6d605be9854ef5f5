"""The running example: one short text, its tokens, embeddings and projection weights.

Every notebook attends over the same sentence, so the scores of 02, the mask of 03, the
weights of 04 and the outputs of 05 belong to the Q, K and V that 01 projected. The path is
the one of a GPT-2-like model's first layer:

    text -> tokens (words of VOCAB) -> ids (T,) int64
         -> token_embedding[ids] + position_embedding[:T]   (T, d_model)   the residual stream
         -> layer_norm                                        (T, d_model)   x, the input of attention
         -> x @ W_Q, x @ W_K, x @ W_V                         (T, d_model) each, all heads side by side

A layer l > 0 takes the previous block's output instead of the embeddings; only layer 0 is
built here. The tables and weights are random (seeded), as at the start of training: the
shapes and the sizes of the numbers are a real model's, the patterns are not learnt ones.

``make_story()`` builds it at ``runtime.SIZES`` (the simulator's small model or ANDREA-120M);
the TEXT has 32 tokens and is repeated to fill a longer context. Everything is NumPy: the
notebooks run the library's kernels on it.
"""

from dataclasses import dataclass

import numpy as np

from attention_lib.platform.runtime import SIZES, ModelSizes

# 32 tokens, so the simulator's context (T 32) holds it once; "it" refers back to "cat" twice.
TEXT = ("the cat sat on the mat because it was tired . the dog saw the cat and it ran to the door . "
        "then the old cat slept on the mat .")
# The toy vocabulary: every word of TEXT once, in order of first appearance, after a padding token.
VOCAB = ("<pad>",) + tuple(dict.fromkeys(TEXT.split()))
SEED = 2017                     # the year of "Attention is all you need"
# GPT-2's initial scales: token embeddings N(0, 0.02^2), position embeddings N(0, 0.01^2).
TOKEN_STD = 0.02
POSITION_STD = 0.01
LAYER_NORM_EPS = 1e-5


def tokenize(text: str) -> list[str]:
    """Split a text of VOCAB words on spaces; an unknown word raises a one-line error."""
    words = text.split()
    unknown = [w for w in words if w not in VOCAB]
    if unknown:
        raise ValueError(f"text: words {unknown} are not in the vocabulary of {len(VOCAB)} words")
    return words


def token_ids(tokens) -> np.ndarray:
    """tokens: list of T words -> (T,) int64, each word's row in the embedding table."""
    index = {word: i for i, word in enumerate(VOCAB)}
    return np.array([index[w] for w in tokens], dtype=np.int64)


def layer_norm(h: np.ndarray, eps: float = LAYER_NORM_EPS) -> np.ndarray:
    """h: (..., d_model) -> (..., d_model), each row shifted to mean 0 and divided by sqrt(var + eps):
    its variance becomes var / (var + eps), just under 1.

    The learnt gain and bias of a real layer norm start at 1 and 0, so they are left out.
    """
    h = np.asarray(h, dtype=np.float64)
    centred = h - h.mean(axis=-1, keepdims=True)
    return centred / np.sqrt((centred**2).mean(axis=-1, keepdims=True) + eps)


@dataclass(frozen=True)
class Story:
    """The running example at one model size; every array is float32 unless stated.

    tokens: T words; ids: (T,) int64; token_embedding: (len(VOCAB), d_model);
    position_embedding: (sizes.T, d_model); residual: (T, d_model), token + position rows;
    x: (T, d_model), the layer-normed residual; w_q, w_k, w_v: (d_model, d_model), all heads,
    head h in columns h * d_k : (h + 1) * d_k.
    """

    sizes: ModelSizes
    tokens: tuple
    ids: np.ndarray
    token_embedding: np.ndarray
    position_embedding: np.ndarray
    residual: np.ndarray
    x: np.ndarray
    w_q: np.ndarray
    w_k: np.ndarray
    w_v: np.ndarray

    @property
    def T(self) -> int:
        """Number of positions."""
        return len(self.tokens)

    def labels(self) -> list[str]:
        """Axis labels for heatmaps: "position:word", e.g. "7:it"."""
        return [f"{i}:{word}" for i, word in enumerate(self.tokens)]

    def head_weights(self, head: int = 0):
        """(W_Q, W_K, W_V) of one head, each (d_model, d_k) float32, C-contiguous copies."""
        d_k = self.sizes.d_k
        if not 0 <= head < self.sizes.n_head:
            raise ValueError(f"head: must be in 0..{self.sizes.n_head - 1}, got {head}")
        cols = slice(head * d_k, (head + 1) * d_k)
        return tuple(np.ascontiguousarray(w[:, cols]) for w in (self.w_q, self.w_k, self.w_v))

    def qkv(self, head: int = 0):
        """(Q, K, V) of one head, each (T, d_k) float32: x @ W in float64, rounded once.

        The kernels of notebook 01 give the same numbers to float32 rounding (about 1e-6).
        """
        x = self.x.astype(np.float64)
        return tuple((x @ w.astype(np.float64)).astype(np.float32) for w in self.head_weights(head))


def make_story(sizes: ModelSizes = SIZES, T: int | None = None, seed: int = SEED) -> Story:
    """The running example at `sizes` (default: this machine's SIZES), over the first T positions.

    T defaults to sizes.T; TEXT repeats when T is longer. The tables and weights depend only on
    (sizes, seed), so make_story(T=8).x equals make_story().x[:8].
    """
    T = sizes.T if T is None else T
    if not 1 <= T <= sizes.T:
        raise ValueError(f"T: must be in 1..{sizes.T} (the context of {sizes.name}), got {T}")
    words = tokenize(TEXT)
    tokens = tuple(words[i % len(words)] for i in range(T))
    ids = token_ids(tokens)
    rng = np.random.default_rng(seed)
    d_model = sizes.d_model
    token_embedding = (TOKEN_STD * rng.standard_normal((len(VOCAB), d_model))).astype(np.float32)
    position_embedding = (POSITION_STD * rng.standard_normal((sizes.T, d_model))).astype(np.float32)
    # W ~ N(0, 1/d_model): a unit-variance row of x gives unit-variance q, k and v components
    w_q, w_k, w_v = (rng.standard_normal((d_model, d_model)).astype(np.float32) / np.float32(np.sqrt(d_model))
                     for _ in range(3))
    residual = token_embedding[ids] + position_embedding[:T]          # (T, d_model)
    x = layer_norm(residual).astype(np.float32)                       # (T, d_model)
    return Story(sizes, tokens, ids, token_embedding, position_embedding, residual, x, w_q, w_k, w_v)
