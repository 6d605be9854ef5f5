"""Pictures for the notebooks: one function per kind of figure, each returning its axes."""

import matplotlib.pyplot as plt
import numpy as np
from matplotlib.colors import ListedColormap


def plot_thread_map(ids, title="Which thread wrote each element", ax=None):
    """Draw a thread map (from ``attention_lib.measure.sanitizer.thread_map``) as a coloured grid.

    ids: (n,) or (rows, cols) int array, the id of the thread (or block) that wrote each
    element, -1 where none did (drawn grey). A 1-D array is drawn as one row. Cells carry
    their id when the grid is small enough to read. Returns the matplotlib axes.
    """
    ids = np.asarray(ids)
    if ids.ndim not in (1, 2):
        raise ValueError(f"ids must be 1-D or 2-D, got shape {ids.shape}")
    grid = ids.reshape(1, -1) if ids.ndim == 1 else ids
    if ax is None:
        _, ax = plt.subplots(figsize=(min(12, 1 + 0.45 * grid.shape[1]),
                                      min(8, 1 + 0.45 * grid.shape[0])))
    written = np.unique(grid[grid >= 0])
    if 0 < len(written) <= 20:
        # Few writers: one distinct colour each, so neighbouring threads never look alike.
        colours = ListedColormap(plt.get_cmap("tab20").colors[:len(written)])
        shown = np.searchsorted(written, grid)  # rank of each id among the writers
        vmin, vmax, dark_low = -0.5, len(written) - 0.5, False
    else:
        colours, shown, vmin, vmax = plt.get_cmap("viridis"), grid, 0, max(1, grid.max())
        dark_low = True  # viridis is dark at the low end: white text there
    colours = colours.with_extremes(bad="lightgrey")
    ax.imshow(np.ma.masked_where(grid < 0, shown), cmap=colours, vmin=vmin, vmax=vmax,
              interpolation="nearest")
    if grid.size <= 32 * 32 and grid.shape[1] <= 40:  # beyond that the numbers overlap
        for (row, col), value in np.ndenumerate(grid):
            if value < 0:
                continue
            dark = dark_low and (value - vmin) / (vmax - vmin) < 0.5
            ax.text(col, row, str(value), ha="center", va="center",
                    color="white" if dark else "black", fontsize=7 if value >= 100 else 8)
    ax.set_title(title)
    ax.xaxis.get_major_locator().set_params(integer=True)   # element indices: no 2.5
    ax.yaxis.get_major_locator().set_params(integer=True)
    ax.set_xlabel("column" if ids.ndim == 2 else "element")
    if ids.ndim == 1:
        ax.set_yticks([])
    else:
        ax.set_ylabel("row")
    return ax


# Colours for entries a colour scale cannot show: masked scores and never-written values.
NEG_INF_COLOUR = "#d0d0d0"
NAN_COLOUR = "#e8336d"


def plot_heatmap(matrix, title="", ax=None, xlabel="key position j", ylabel="query position i",
                 cmap="viridis", vmin=None, vmax=None, annotate=None, colorbar=True):
    """Draw a matrix (attention scores, attention weights) as a heatmap; returns the axes.

    matrix: (rows, cols) float. The colour scale covers the finite entries; -inf (a masked
    score) is drawn light grey and NaN (a value never computed) pink, each named in a legend,
    so that a mask and a bug never look like a small number. annotate: write each value in
    its cell (default: only when the matrix has at most 12 x 12 entries).
    """
    m = np.asarray(matrix, dtype=np.float64)
    if m.ndim != 2:
        raise ValueError(f"matrix must be 2-D (rows, cols), got shape {m.shape}")
    if ax is None:
        _, ax = plt.subplots(figsize=(min(7, 2 + 0.25 * m.shape[1]), min(6, 1.5 + 0.25 * m.shape[0])))
    finite = np.isfinite(m)
    image = ax.imshow(np.ma.masked_where(~finite, m), cmap=plt.get_cmap(cmap).with_extremes(bad="none"),
                      vmin=vmin, vmax=vmax, interpolation="nearest")
    from matplotlib.patches import Patch
    legend = []
    for special, colour, label in ((np.isneginf(m), NEG_INF_COLOUR, "-inf (masked)"),
                                   (np.isnan(m), NAN_COLOUR, "NaN")):
        if special.any():
            ax.imshow(np.ma.masked_where(~special, np.zeros_like(m)), cmap=ListedColormap([colour]),
                      interpolation="nearest")
            legend.append(Patch(color=colour, label=label))
    if annotate is None:
        annotate = m.shape[0] <= 12 and m.shape[1] <= 12
    if annotate:
        for (row, col), value in np.ndenumerate(m):
            if np.isfinite(value):
                red, green, blue, _ = image.cmap(image.norm(value))
                light = 0.299 * red + 0.587 * green + 0.114 * blue > 0.5   # perceived brightness
                text, colour = f"{value:.2f}", "black" if light else "white"
            else:
                text, colour = str(value).replace("inf", "∞"), "black"
            ax.text(col, row, text, ha="center", va="center", fontsize=7, color=colour)
    if colorbar and finite.any():
        plt.colorbar(image, ax=ax, fraction=0.046, pad=0.04)
    if legend:
        ax.legend(handles=legend, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=2,
                  frameon=False, fontsize=8)
    ax.set_title(title)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    return ax


def plot_roofline(points, peak_flop_per_s, bytes_per_s, roof_label="", ax=None, title="Roofline",
                  tensor_flop_per_s=None):
    """Draw a roofline, attainable FLOP/s = min(peak, bandwidth x intensity) on log-log axes, and kernels on it.

    points: list of dicts with "label", "intensity" (FLOP per byte of main memory) and
    "flop_per_s" (measured; None draws the point on the FP32 roof: the most that intensity
    allows), optionally "colour", "marker" and "hollow" (default: hollow when on the roof).
    peak_flop_per_s, bytes_per_s: the GPU's FP32 and memory limits. tensor_flop_per_s: a
    tensor-core peak, drawn dashed above (no Numba kernel can reach it).
    Returns the matplotlib axes; the legend sits to the right of it.
    """
    if ax is None:
        _, ax = plt.subplots(figsize=(10, 6))
    ridge = peak_flop_per_s / bytes_per_s
    xs = [p["intensity"] for p in points] + [ridge] + ([tensor_flop_per_s / bytes_per_s] if tensor_flop_per_s else [])
    x = np.logspace(np.log10(min(xs) / 4), np.log10(max(xs) * 4), 200)
    ax.loglog(x, np.minimum(peak_flop_per_s, bytes_per_s * x), color="black", lw=2,
              label=f"roof: {roof_label}".rstrip(": "))
    top = peak_flop_per_s
    if tensor_flop_per_s:
        ax.loglog(x, np.minimum(tensor_flop_per_s, bytes_per_s * x), color="black", lw=1.2, ls="--",
                  label=f"tensor cores, bf16 dense: {tensor_flop_per_s / 1e12:.0f} TFLOP/s")
        top = tensor_flop_per_s
    ax.axvline(ridge, color="grey", ls=":", lw=1)
    ax.text(ridge * 1.1, peak_flop_per_s / 30, f"ridge {ridge:.0f} FLOP/byte", color="grey", fontsize=8)
    middle = np.sqrt(x[0] * ridge)                   # halfway up the memory roof, on log axes
    ax.text(middle, bytes_per_s * middle * 3, f"memory {bytes_per_s / 1e12:.2g} TB/s", fontsize=8,
            ha="right")
    ax.text(ridge * 1.1, peak_flop_per_s * 1.15, f"FP32 peak {peak_flop_per_s / 1e12:.3g} TFLOP/s", fontsize=8)
    colours = plt.get_cmap("tab10").colors
    for i, p in enumerate(points):
        on_roof = p.get("flop_per_s") is None
        y = min(peak_flop_per_s, bytes_per_s * p["intensity"]) if on_roof else p["flop_per_s"]
        colour = p.get("colour", colours[i % len(colours)])
        ax.plot(p["intensity"], y, ls="none", marker=p.get("marker", "o"), markersize=8, color=colour,
                markerfacecolor="none" if p.get("hollow", on_roof) else colour, markeredgewidth=1.5,
                label=p["label"])
    ax.set_ylim(top=top * 2)
    ax.set_xlabel("arithmetic intensity (FLOP per byte of main memory)")
    ax.set_ylabel("FLOP/s")
    ax.set_title(title)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    return ax


STAGE_COLOURS = {"projection": "tab:blue", "scores": "tab:orange", "mask": "tab:olive",
                 "softmax": "tab:green", "weighted_sum": "tab:red", "attention": "tab:purple",
                 "multihead": "tab:brown", "flash": "tab:pink", "kv_cache": "tab:cyan"}
VERSION_MARKERS = {"v1": "o", "v2": "s", "v3": "^", "v4": "v"}


def bench_roofline_points(results, counted=True):
    """Points of a bench results dict for plot_roofline: colour by stage, marker by version.

    With times (a GPU): each kernel at its ideal intensity and measured FLOP/s, and PyTorch's
    time for the projection and for fused attention (MATH backend, the FP32 peer) as crosses.
    Without (the simulator, or formulas): each kernel hollow on the roof at its counted
    intensity (every request to main memory), and each stage's ideal intensity as a filled
    star. Kernels without arithmetic (the in-place mask) are left out.
    """
    points, stars = [], {}
    measured = any(k["flop_per_s"] for k in results["kernels"])
    for k in results["kernels"]:
        if not k["intensity"]:
            continue
        colour = STAGE_COLOURS.get(k["module"], "grey")
        marker = VERSION_MARKERS.get(k["name"].rsplit(" ", 1)[-1], "D")
        if measured and k["flop_per_s"]:
            points.append({"label": k["name"], "intensity": k["intensity"], "flop_per_s": k["flop_per_s"],
                           "colour": colour, "marker": marker})
            peer = k["baselines"].get("torch") or k["baselines"].get("torch_math")
            if peer and k["module"] in ("projection", "flash") and k["module"] not in stars:
                stars[k["module"]] = {"label": f"PyTorch ({k['module']})", "intensity": k["intensity"],
                                      "flop_per_s": k["flops"] / peer["median_s"], "colour": colour, "marker": "X"}
        elif not measured:
            if counted and k["counted"] and k["counted"].get("intensity"):
                points.append({"label": f"{k['name']} (counted)", "intensity": k["counted"]["intensity"],
                               "flop_per_s": None, "colour": colour, "marker": marker})
            stars.setdefault(k["module"], {"label": f"{k['module']} (ideal)", "intensity": k["intensity"],
                                           "flop_per_s": None, "hollow": False, "colour": colour, "marker": "*"})
    return points + list(stars.values())


def plot_bench_roofline(results, ax=None, counted=True, only=None, title=None):
    """The roofline of a bench results dict (run_bench's, bench.formula_results', or a loaded one).

    With times: measured points under the measuring GPU's roofs. Without: the reference GPU's
    roofs (an H200), each point on the FP32 roof by construction (no time says how far below it
    a kernel would sit). The tensor-core roof is drawn dashed. only: parts of kernel names to draw.
    """
    from attention_lib.measure.gpus import REFERENCE_GPU, GpuLimits
    if only:
        results = {**results, "kernels": [k for k in results["kernels"] if any(w in k["name"] for w in only)]}
    limits = REFERENCE_GPU if results["limits"] is None else GpuLimits(
        results["limits"]["name"], results["limits"]["fp32_flop_per_s"], results["limits"]["bytes_per_s"],
        results["limits"].get("tensor_flop_per_s"))
    if title is None and any(k["flop_per_s"] for k in results["kernels"]):
        title = f"Measured on {results['gpu'] or 'a GPU'}, {results['date'][:10]}"
    elif title is None:
        title = f"No times: each kernel on the {limits.name}'s FP32 roof, at {results['sizes']}"
    reference = results["limits"] is None
    return plot_roofline(bench_roofline_points(results, counted), limits.fp32_flop_per_s, limits.bytes_per_s,
                         roof_label=limits.name + (" (reference)" if reference else ""), ax=ax, title=title,
                         tensor_flop_per_s=limits.tensor_flop_per_s)


def plot_tiled_matmul(T, d_model, d_out, tile, block, step, ax=None, cells=False, distinct=False, thread=None):
    """The classic tiled-matmul figure: out = x @ w, one output tile, the strips it reads.

    T, d_model, d_out: the sizes (drawn to scale); tile: the tile width; block: (bx, by), the
    output tile drawn; step: which TILE-wide step along d_model is highlighted (None: no step, only
    the strips the block needs, as before an exercise that leaves the walk to the student). x (T, d_model)
    sits left of out (T, d_out), w (d_model, d_out) above it, so the block's strip of x (its
    rows) and of w (its columns) line up with its tile. cells: draw every element's cell;
    distinct: x's strip and tile in blues, w's in greens (both blue otherwise); thread: (row, col)
    of one output, whose row of x, column of w and cell of out are outlined. Returns the axes.
    """
    from matplotlib.patches import Rectangle
    bx, by = block
    if ax is None:
        _, ax = plt.subplots(figsize=(7, 7 * (T + d_model) / (d_model + d_out)))
    gap = max(1, d_model // 10)
    w_light, w_dark = ("#d3efcd", "#2ca02c") if distinct else ("#cfe3f7", "#1f77b4")
    # (x0, y0, width, height, colour, label) in element units; y grows downwards like a matrix
    boxes = [(0, d_model + gap, d_model, T, "whitesmoke", "x (T, d_model)"),
             (d_model + gap, 0, d_out, d_model, "whitesmoke", "w (d_model, d_out)"),
             (d_model + gap, d_model + gap, d_out, T, "whitesmoke", "out (T, d_out)"),
             (0, d_model + gap + by * tile, d_model, tile, "#cfe3f7", "the block's strip of x"),
             (d_model + gap + bx * tile, 0, tile, d_model, w_light, "the block's strip of w"),
             (d_model + gap + bx * tile, d_model + gap + by * tile, tile, tile, "#ff7f0e", f"out tile {block}")]
    if step is not None:
        boxes[-1:-1] = [(step * tile, d_model + gap + by * tile, tile, tile, "#1f77b4", f"x tile of step {step}"),
                        (d_model + gap + bx * tile, step * tile, tile, tile, w_dark, f"w tile of step {step}")]
    for x0, y0, width, height, colour, label in boxes:
        ax.add_patch(Rectangle((x0, y0), width, height, facecolor=colour, edgecolor="black", lw=0.8,
                               label=label if colour != "whitesmoke" else None))
    for x0, y0, width, height, _, label in boxes[:3]:
        ax.text(x0 + 1, y0 - 1, label, ha="left", va="bottom", fontsize=9)      # above the matrix
        if cells:                                                               # one cell per element
            ax.vlines(x0 + np.arange(1, width), y0, y0 + height, color="grey", lw=0.3)
            ax.hlines(y0 + np.arange(1, height), x0, x0 + width, color="grey", lw=0.3)
    if thread is not None:
        row, col = thread
        top, left = d_model + gap, d_model + gap
        for x0, y0, width, height, label in [(0, top + row, d_model, 1, f"row {row} of x: the thread's"),
                                             (left + col, 0, 1, d_model, f"column {col} of w: the thread's")]:
            ax.add_patch(Rectangle((x0, y0), width, height, fill=False, edgecolor="black", lw=2, label=label))
        ax.add_patch(Rectangle((left + col, top + row), 1, 1, facecolor="#d62728", edgecolor="black", lw=1,
                               label=f"out[{row}, {col}]: the thread's output"))
    if step is None:
        return _framed(ax, T, d_model, gap, d_out)
    ax.annotate("", xy=((step + 1.9) * tile, d_model + gap + (by + 0.5) * tile),
                xytext=((step + 1) * tile, d_model + gap + (by + 0.5) * tile),
                arrowprops=dict(arrowstyle="->", lw=1.5))
    ax.annotate("", xy=(d_model + gap + (bx + 0.5) * tile, (step + 1.9) * tile),
                xytext=(d_model + gap + (bx + 0.5) * tile, (step + 1) * tile),
                arrowprops=dict(arrowstyle="->", lw=1.5))
    return _framed(ax, T, d_model, gap, d_out)


def _framed(ax, T, d_model, gap, d_out):
    """plot_tiled_matmul's axes: limits around the three matrices, equal aspect, no frame, the legend."""
    ax.set_xlim(-1, d_model + gap + d_out + 1)
    ax.set_ylim(T + d_model + gap + 1, -gap)
    ax.set_aspect("equal")
    ax.axis("off")
    ax.legend(loc="upper left", fontsize=8, frameon=False)
    return ax
