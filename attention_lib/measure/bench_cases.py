"""What the bench runs: one entry per stage launcher and version, its work, its check, its peers.

Each ``Entry`` of ``REGISTRY`` says how to call the library's launcher on random inputs
(``prepare``), the FLOPs and compulsory bytes of that work (formulas), the float64 reference
its output is checked against (``reference``, with a tolerance that grows with the length of
the sums involved), and the same work done by PyTorch or CuPy (``baselines``). ``TARGETS``
holds the course's speed targets. The traffic each kernel requests, counted and by formula,
is ``attention_lib.measure.traffic``'s business; timing and reporting are ``attention_lib.measure.bench``'s.

FLOPs: a multiply-add is 2; the scale of the scores 1 per score; a softmax 5 per score (max,
subtract, exp, add, multiply); whole attentions and decoding 4 d_k + 5 per visible (query, key)
pair (the two products and the softmax of its score), so that causal attention does about half the
work of full attention. Ideal bytes: every input read once and every output written once (fused
attention's log-sum-exp too), 4 bytes per float32.
"""

import math
from dataclasses import dataclass, field

import numpy as np

from attention_lib import reference
from attention_lib.platform import runtime

BYTES = 4                                   # float32


@dataclass(frozen=True)
class BenchSizes:
    """The sizes every entry is benched at: batch B, heads H, positions T, head width d_k."""

    B: int
    H: int
    T: int
    d_k: int

    @property
    def d_model(self):
        return self.H * self.d_k

    @property
    def BH(self):
        """Heads of all sequences: the leading axis of the per-head kernels."""
        return self.B * self.H

    @property
    def rows(self):
        """Positions of all sequences: the rows of the projections."""
        return self.B * self.T

    @classmethod
    def of(cls, model):
        """The sizes of a runtime.ModelSizes (ANDREA-120M, ANDREA-sim)."""
        return cls(model.batch, model.n_head, model.T, model.d_k)

    def __str__(self):
        return f"B {self.B}, H {self.H}, T {self.T}, d_k {self.d_k}, d_model {self.d_model}"


def notebook_sizes():
    """The sizes notebook 10 benches at: ANDREA-120M on a GPU; on the simulator ANDREA-sim with
    B, H, T and d_k each halved (B 1, H 2, T 16, d_k 8), so that counting every entry takes seconds."""
    s = BenchSizes.of(runtime.SIZES)
    if not runtime.ON_SIMULATOR:
        return s
    return BenchSizes(1, max(1, s.H // 2), max(1, s.T // 2), max(1, s.d_k // 2))


# Bytes of float64 output per pass of a reference computed in slices of its leading axis (heads,
# or sequences): a pass's temporaries stay small and NumPy reuses their memory, where whole
# (B*H, T, T) temporaries (800 MB each at ANDREA-120M) are fresh pages every time. Slicing the
# leading axis changes no arithmetic: every output element is the same sum.
SLICE_BYTES = 16 << 20


def by_slices(function, *arrays, nbytes=SLICE_BYTES):
    """function(*arrays) computed a few entries of the leading axis at a time (as many as give
    about nbytes of output, judged by the first), into one float64 array."""
    total, out, start, step = len(arrays[0]), None, 0, 1
    if total == 0:
        return np.asarray(function(*arrays), np.float64)
    while start < total:
        part = function(*(a[start:start + step] for a in arrays))
        if out is None:
            out = np.empty((total, *part.shape[1:]), np.float64)
            step = max(1, nbytes // max(1, part.nbytes))
        out[start:start + len(part)] = part
        start += len(part)
    return out


class Inputs:
    """Random float32 inputs at `sizes`, made on first use and shared by the entries (at
    ANDREA-120M the (B*H, T, T) scores alone are 400 MB), and the float64 references, each
    computed once. Weights are scaled by 1/sqrt(fan-in), so values stay of order 1."""

    def __init__(self, sizes, seed=0):
        self.s, self.rng, self._made, self._references, self._shared = sizes, np.random.default_rng(seed), {}, {}, {}

    def reference(self, entry, arrays):
        """The float64 result entry's output is checked against, computed once: shared(name) when
        entry.reference names one of SHARED (entries computing the same thing share it), else
        entry.reference(arrays, sizes), once per function."""
        if isinstance(entry.reference, str):
            return self.shared(entry.reference)
        if entry.reference not in self._references:
            self._references[entry.reference] = entry.reference(arrays, self.s)
        return self._references[entry.reference]

    def shared(self, name):
        """One of SHARED: a float64 result that several entries or inputs are checked against or made of."""
        if name not in SHARED:
            raise KeyError(f"no shared reference called {name!r}; there are {', '.join(SHARED)}")
        if name not in self._shared:
            self._shared.update(SHARED[name](self))
        return self._shared[name]

    def get(self, *names):
        """{name: array} for the inputs named (see _make below)."""
        for name in names:
            if name not in self._made:
                self._made[name] = self._make(name)
        return {name: self._made[name] for name in names}

    def _random(self, *shape, scale=1.0):
        return self.rng.standard_normal(shape, dtype=np.float32) * np.float32(scale)

    def _make(self, name):
        s = self.s
        if name == "x":                              # projection input, (B*T, d_model)
            return self._random(s.rows, s.d_model)
        if name == "w":                              # fused W_qkv, (d_model, 3 d_model)
            return self._random(s.d_model, 3 * s.d_model, scale=s.d_model ** -0.5)
        if name in ("q", "k", "v"):                  # (B*H, T, d_k) each
            return self._random(s.BH, s.T, s.d_k)
        if name == "s":                              # random scores, (B*H, T, T)
            return self._random(s.BH, s.T, s.T)
        if name == "masked":                         # causal scores, -inf above the diagonal
            return self.shared("causal_scores").astype(np.float32)
        if name == "a":                              # causal attention weights, (B*H, T, T)
            return self.shared("softmax").astype(np.float32)
        if name == "x3":                             # a layer's input, (B, T, d_model)
            return self.get("x")["x"].reshape(s.B, s.T, s.d_model)
        if name in ("w_q", "w_k", "w_v", "w_o"):     # (d_model, d_model)
            return self._random(s.d_model, s.d_model, scale=s.d_model ** -0.5)
        if name == "q1":                             # one new query per head, (B*H, d_k)
            return self._random(s.BH, s.d_k)
        raise KeyError(f"no bench input called {name!r}")


def _scores_and_causal_scores(inputs):
    """reference.scores(q, k), and reference.apply_causal_mask of that very array."""
    i = inputs.get("q", "k")
    raw = by_slices(reference.scores, i["q"], i["k"])
    return {"scores": raw, "causal_scores": by_slices(reference.apply_causal_mask, raw)}


def _softmax_of_the_masked_input(inputs):
    """reference.softmax of the float32 causal scores the softmax entries are given."""
    return {"softmax": by_slices(reference.softmax, inputs.get("masked")["masked"])}


def _causal_attention(inputs):
    """reference.attention(q, k, v) (causal), by the same steps: the weights (attention_weights:
    the softmax of the causal scores, shared with the scores entries), then weighted_sum."""
    v = inputs.get("v")["v"]
    return {"attention": by_slices(lambda s, v: reference.weighted_sum(reference.softmax(s), v),
                                   inputs.shared("causal_scores"), v)}


# The float64 results more than one entry (or input) needs, by name: function(inputs) -> {name: array}
# (a function may give several in one pass).
SHARED = {"scores": _scores_and_causal_scores, "causal_scores": _scores_and_causal_scores,
          "softmax": _softmax_of_the_masked_input, "attention": _causal_attention}


@dataclass(frozen=True)
class Entry:
    """One thing to bench: a stage's launcher at one version.

    prepare(module, sizes, inputs) -> (run, arrays): run() calls the launcher once and returns
    its output; arrays: the inputs it used, a dict that reference and baselines get.
    flops(sizes), ideal_bytes(sizes): the work and the compulsory traffic. reference: the name
    of a result in SHARED, or reference(arrays, sizes) -> the float64 result; depth(sizes):
    terms per output sum, setting the tolerance.
    baselines: {"torch" | "torch_math" | "torch_efficient" | "cupy": make(lib, arrays, sizes)
    -> a function doing the same work with that library and returning its result}.
    version: the launcher's version, skipped while the module has no such kernel.
    """

    name: str
    module: str
    notebook: str
    what: str
    prepare: object
    flops: object
    ideal_bytes: object
    reference: object = None
    depth: object = lambda s: 1
    baselines: dict = field(default_factory=dict)
    version: int = None

    def tolerance(self, sizes):
        """float32 rounding of sums of depth(sizes) terms: 1e-5 sqrt(depth), at least 1e-5."""
        return 1e-5 * math.sqrt(max(1, self.depth(sizes)))

    def missing(self):
        """Why this entry cannot run here (its module or version does not exist), or None."""
        import importlib
        try:
            module = importlib.import_module(f"attention_lib.stages.{self.module}")
        except ModuleNotFoundError as error:
            if error.name != f"attention_lib.stages.{self.module}":
                raise
            return f"attention_lib.stages.{self.module} does not exist"
        if self.version is not None and self.version not in getattr(module, "KERNELS", {self.version: 0}):
            return f"{self.module} has no version {self.version}"
        return None


def _visible_pairs(T):
    """(query, key) pairs a causal mask lets through in one head of T positions: T (T + 1) / 2."""
    return T * (T + 1) // 2


def attention_flops(s):
    """Causal attention of every head: 4 d_k + 5 FLOPs per visible pair (q . k and a . v, 2 d_k each,
    and the softmax of its score, 5)."""
    return (4 * s.d_k + 5) * s.BH * _visible_pairs(s.T)


def _call(launcher, *names, **options):
    """An Entry.prepare calling module.<launcher>(*inputs named, **options)."""
    def prepare(m, s, inputs):
        i = inputs.get(*names)
        return (lambda: getattr(m, launcher)(*i.values(), **options)), i
    return prepare


def _prepare_layer(m, s, inputs):
    i = inputs.get("x3", "w_q", "w_k", "w_v", "w_o")
    return (lambda: m.multi_head_attention(*i.values(), s.H, causal=True)), i


def _prepare_decode(version):
    def prepare(m, s, inputs):
        # One new token per sequence against a cache of T positions; the batch folded into the
        # heads (n_head = B * H), as kv_cache.KVCache allows for sequences of one length.
        i = inputs.get("q1", "k", "v")
        cache = m.KVCache(s.BH, s.T, s.d_k)
        cache.append(i["k"], i["v"])
        return (lambda: m.decode_step(i["q1"], cache, version=version)), i
    return prepare


# References of one entry's work or shared by the versions of a stage (module-level functions,
# so that the bench computes each once per size; the results several stages share are SHARED above).

def _projection_reference(i, s):
    return reference.project(i["x"], i["w"])


def _mask_reference(i, s):
    return by_slices(reference.apply_causal_mask, i["s"])


def _weighted_sum_reference(i, s):
    return by_slices(reference.weighted_sum, i["a"], i["v"])


def _decode_reference(i, s):
    q = i["q1"][:, None, :]                            # (B*H, 1, d_k): one query per head
    return by_slices(lambda q, k, v: reference.attention(q, k, v, causal=False)[:, 0, :], q, i["k"], i["v"])


def _layer_reference(i, s):
    # One sequence at a time: a layer mixes positions only within its sequence.
    return by_slices(lambda x: reference.multi_head_attention(x, i["w_q"], i["w_k"], i["w_v"], i["w_o"], s.H),
                     i["x3"])


# --- Baselines: the same work by PyTorch (TF32 off for matmuls) or CuPy, on the same inputs

def _torch(torch, i, *names):
    return [torch.from_numpy(np.ascontiguousarray(i[n])).cuda() for n in names]


def _matmul(a_name, b_name, transpose_b=False, scale=False):
    def make(lib, i, s):
        if hasattr(lib, "from_numpy"):
            a, b = _torch(lib, i, a_name, b_name)
        else:                                          # CuPy
            a, b = lib.asarray(i[a_name]), lib.asarray(i[b_name])
        b = b.swapaxes(-1, -2) if transpose_b else b
        factor = np.float32(1.0 / math.sqrt(s.d_k))
        return (lambda: lib.matmul(a, b) * factor) if scale else (lambda: lib.matmul(a, b))
    return make


def sdpa_backend(torch, backend):
    """torch.nn.attention.sdpa_kernel pinned to SDPBackend.<backend> ("MATH", "EFFICIENT_ATTENTION")."""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    return sdpa_kernel(getattr(SDPBackend, backend))


def _sdpa(backend, causal=True):
    def make(torch, i, s):
        q, k, v = (t.reshape(s.B, s.H, s.T, s.d_k) for t in _torch(torch, i, "q", "k", "v"))
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def run():
            with sdpa_backend(torch, backend):
                return sdpa(q, k, v, is_causal=causal).reshape(s.BH, s.T, s.d_k)
        return run
    return make


def _sdpa_decode(backend):
    def make(torch, i, s):
        q, k, v = _torch(torch, i, "q1", "k", "v")
        q = q.reshape(s.BH, 1, s.d_k)                  # one query per head; it sees every key
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def run():
            with sdpa_backend(torch, backend):
                return sdpa(q, k, v).reshape(s.BH, s.d_k)
        return run
    return make


def _torch_layer(backend):
    def make(torch, i, s):
        x, w_q, w_k, w_v, w_o = _torch(torch, i, "x3", "w_q", "w_k", "w_v", "w_o")
        w_qkv = torch.cat([w_q, w_k, w_v], dim=1)                  # (d_model, 3 d_model)
        sdpa = torch.nn.functional.scaled_dot_product_attention

        def layer():
            qkv = torch.matmul(x, w_qkv).reshape(s.B, s.T, 3, s.H, s.d_k)   # (B, T, 3, H, d_k)
            q, k, v = qkv.permute(2, 0, 3, 1, 4)                           # each (B, H, T, d_k)
            with sdpa_backend(torch, backend):
                heads = sdpa(q, k, v, is_causal=True)                      # (B, H, T, d_k)
            return torch.matmul(heads.transpose(1, 2).reshape(s.B, s.T, s.d_model), w_o)
        return layer
    return make


def _torch_mask(version):
    def make(torch, i, s):
        future = torch.triu(torch.ones(s.T, s.T, device="cuda"), diagonal=1).bool()   # True: masked
        if version == 1:
            (scores,) = _torch(torch, i, "s")
            return lambda: scores.masked_fill(future, -math.inf)
        q, k = _torch(torch, i, "q", "k")
        factor = 1.0 / math.sqrt(s.d_k)
        return lambda: (torch.matmul(q, k.swapaxes(-1, -2)) * factor).masked_fill(future, -math.inf)
    return make


def _torch_softmax(torch, i, s):
    (scores,) = _torch(torch, i, "masked")
    return lambda: torch.softmax(scores, dim=-1)


def baseline_libraries():
    """{"torch": module, "cupy": module} for those importable with a GPU. PyTorch's matmuls
    are set to full float32 (TF32 off): the same arithmetic as our kernels."""
    libraries = {}
    try:
        import torch
        if torch.cuda.is_available():
            torch.backends.cuda.matmul.allow_tf32 = False
            torch.backends.cudnn.allow_tf32 = False
            torch.set_float32_matmul_precision("highest")
            libraries["torch"] = torch
    except Exception as error:  # not installed, or built without CUDA: compare with nothing
        print(f"note: no PyTorch comparison ({type(error).__name__}: {error})".splitlines()[0])
    try:
        import cupy
        cupy.cuda.runtime.getDeviceCount()
        libraries["cupy"] = cupy
    except Exception as error:
        print(f"note: no CuPy comparison ({type(error).__name__}: {error})".splitlines()[0])
    return libraries


def cuda_kernel_names(torch, work):
    """Names of the CUDA kernels one run of `work` launches, from torch.profiler (sorted)."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        work()
        torch.cuda.synchronize()
    cuda_type = torch.autograd.DeviceType.CUDA
    return sorted({e.name for e in prof.events() if getattr(e, "device_type", None) == cuda_type})


def to_numpy(result):
    """A baseline's result on the host: a PyTorch tensor (.cpu()), a CuPy array (.get()), or NumPy."""
    if hasattr(result, "cpu"):
        return result.cpu().numpy()
    return result.get() if hasattr(result, "get") else np.asarray(result)


SDPA = {"torch_math": "MATH", "torch_efficient": "EFFICIENT_ATTENTION"}


def _build_registry():
    matmul = {"torch": _matmul("x", "w"), "cupy": _matmul("x", "w")}
    scores_peer = {key: _matmul("q", "k", transpose_b=True, scale=True) for key in ("torch", "cupy")}
    av = {"torch": _matmul("a", "v"), "cupy": _matmul("a", "v")}
    sdpa = {key: _sdpa(backend) for key, backend in SDPA.items()}
    entries = []
    for v, how in [(1, "one thread per output"), (2, "shared-memory tiles"), (3, "2 x 2 outputs per thread"),
                   (4, "128 x 128 tiles, 8 x 8 outputs per thread")]:
        entries.append(Entry(
            f"projection v{v}", "projection", "01",
            f"fused QKV x (B*T, d_model) @ W_qkv (d_model, 3 d_model), {how}",
            _call("project", "x", "w", version=v),
            lambda s: 2 * s.rows * s.d_model * 3 * s.d_model,
            lambda s: BYTES * (s.rows * s.d_model + s.d_model * 3 * s.d_model + s.rows * 3 * s.d_model),
            _projection_reference, lambda s: s.d_model, matmul, version=v))
    for v, how in [(1, "one thread per score"), (2, "tiled")]:
        entries.append(Entry(
            f"scores v{v}", "scores", "02", f"q k^T / sqrt(d_k) for B*H heads, {how}",
            _call("scores", "q", "k", version=v),
            lambda s: s.BH * s.T * s.T * (2 * s.d_k + 1),
            lambda s: BYTES * (2 * s.BH * s.T * s.d_k + s.BH * s.T * s.T),
            "scores", lambda s: s.d_k, scores_peer, version=v))
    entries.append(Entry(
        "mask v1", "mask", "03", "causal mask in place on (B*H, T, T) scores",
        _call("apply_causal_mask", "s"),
        lambda s: 0, lambda s: BYTES * s.BH * (s.T * s.T - _visible_pairs(s.T)),
        _mask_reference, baselines={"torch": _torch_mask(1)}))
    entries.append(Entry(
        "mask v2", "mask", "03", "causal scores, mask fused, future tiles skipped",
        _call("causal_scores", "q", "k"),
        lambda s: s.BH * _visible_pairs(s.T) * (2 * s.d_k + 1),
        lambda s: BYTES * (2 * s.BH * s.T * s.d_k + s.BH * s.T * s.T),
        "causal_scores", lambda s: s.d_k, {"torch": _torch_mask(2)}))
    for v, how in [(1, "one thread per row"), (2, "one block per row"), (3, "one warp per row")]:
        entries.append(Entry(
            f"softmax v{v}", "softmax", "04", f"row softmax of (B*H*T, T) masked scores, {how}",
            _call("softmax", "masked", version=v),
            lambda s: 5 * s.BH * s.T * s.T, lambda s: BYTES * 2 * s.BH * s.T * s.T,
            "softmax", lambda s: s.T, {"torch": _torch_softmax}, version=v))
    for v, how in [(1, "one thread per output, all heads in one launch"), (2, "tiled, all heads in one launch")]:
        entries.append(Entry(
            f"weighted_sum v{v}", "weighted_sum", "05", f"A (B*H, T, T) @ V (B*H, T, d_k), {how}",
            _call("weighted_sum", "a", "v", version=v),
            lambda s: 2 * s.BH * s.T * s.T * s.d_k,
            lambda s: BYTES * (s.BH * s.T * s.T + 2 * s.BH * s.T * s.d_k),
            _weighted_sum_reference, lambda s: s.T, av, version=v))
    entries.append(Entry(
        "attention pipeline", "attention", "05",
        "causal attention of B*H heads: scores, softmax, weighted sum (3 launches)",
        _call("attention", "q", "k", "v", causal=True),
        attention_flops, lambda s: BYTES * 4 * s.BH * s.T * s.d_k,
        "attention", lambda s: s.T * s.d_k, sdpa))
    entries.append(Entry(
        "multihead layer", "multihead", "06", "a whole layer: fused QKV, the heads read in place, W_O (5 launches)",
        _prepare_layer,
        lambda s: 2 * s.rows * s.d_model * 4 * s.d_model + attention_flops(s),
        lambda s: BYTES * (2 * s.rows * s.d_model + 4 * s.d_model * s.d_model),
        _layer_reference, lambda s: s.d_model * s.T, {k: _torch_layer(b) for k, b in SDPA.items()}))
    for v, how in [(1, "one thread per query"), (2, "tiled, online softmax in shared memory"),
                   (3, "FlashAttention-2 style, micro-tiles in registers")]:
        entries.append(Entry(
            f"flash v{v}", "flash", "07" if v < 3 else "08", f"fused causal attention of B*H heads, {how}",
            _call("flash_attention", "q", "k", "v", causal=True, version=v),
            attention_flops, lambda s: BYTES * (4 * s.BH * s.T * s.d_k + s.BH * s.T),    # q, k, v, out; the lse
            "attention", lambda s: s.T * s.d_k, sdpa, version=v))
    for v, how in [(1, "a block per key/value head, a thread per query head"), (2, "split over the cache, then merged")]:
        entries.append(Entry(
            f"decode v{v}", "kv_cache", "09", f"one new query per head against T cached keys and values, {how}",
            _prepare_decode(v),
            lambda s: (4 * s.d_k + 5) * s.BH * s.T, lambda s: BYTES * (2 * s.BH * s.T * s.d_k + 2 * s.BH * s.d_k),
            _decode_reference, lambda s: s.T * s.d_k, {k: _sdpa_decode(b) for k, b in SDPA.items()}))
    return entries


REGISTRY = _build_registry()

# The course's targets at ANDREA-120M on an H200: (key, what, our entries (the best counts),
# the baseline: a baseline key of theirs or another entry's name, ratio = its time / ours that
# meets it, None: reported, no target).
TARGETS = [
    ("flash_vs_sdpa_math", "fused attention vs PyTorch fp32 SDPA, MATH backend (SGEMM + softmax)",
     ["flash v2", "flash v3"], "torch_math", 1.0),
    ("flash_vs_sdpa_efficient", "fused attention vs PyTorch fp32 SDPA, EFFICIENT_ATTENTION (3xTF32 tensor cores)",
     ["flash v2", "flash v3"], "torch_efficient", None),
    ("flash_vs_pipeline", "fused attention vs the three-launch pipeline",
     ["flash v2", "flash v3"], "attention pipeline", 1.0),
    ("projection_vs_matmul", "tiled projection vs PyTorch fp32 torch.matmul (TF32 off)",
     ["projection v2", "projection v3", "projection v4"], "torch", 0.5),
]
