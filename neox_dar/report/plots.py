"""Plots that need no run files, and the helpers every report figure is drawn with: per-head tables as heatmaps and
sorted values (AHA Fig. 3 and 4), text shaded token by token (AHA Fig. 1), grids of metric curves (DimPO Fig. 4).
:mod:`.figures` draws the report's figures of runs with them; ``eval.aha_gates`` and :mod:`neox_dar.dimpo` draw theirs.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
from matplotlib.patches import Rectangle  # noqa: E402
from matplotlib.ticker import FixedLocator, FuncFormatter, NullLocator  # noqa: E402


def check_figure_path(path: str | Path, option: str = "--out") -> None:
    """ValueError (one line naming ``option``) unless a figure can be written at ``path``, checked before any work:
    a file name whose extension matplotlib writes (a folder, or a name without one, was written as ``NAME.png``
    beside what it named while the tool printed NAME), in a writable place."""
    from ..rundir import check_writable

    kinds = plt.gcf().canvas.get_supported_filetypes()
    plt.close()
    suffix = Path(path).suffix.lstrip(".").lower()
    if Path(path).is_dir() or suffix not in kinds:
        raise ValueError(f"{option} {path}: name an image file ending in .png (or {', '.join(sorted(kinds))})")
    check_writable(path, option)


def panel_row(n: int, width: float = 5.5, height: float = 3.8):
    """A figure of ``n`` panels side by side, each ``width`` x ``height`` inches: ``(fig, [axes])``."""
    fig, axes = plt.subplots(1, n, figsize=(width * n, height), squeeze=False)
    return fig, list(axes[0])


def label_axes(ax, xlabel: str, ylabel: str, title: str, legend: bool = True) -> None:
    """Name a panel's axes and title it (and add the legend of its labelled lines)."""
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title, fontsize=10)
    if legend:
        ax.legend(fontsize=7)


def save_figure(fig, path: Path, rect=None) -> Path:
    """Lay out the panels inside ``rect`` (figure fractions; default the whole figure), write the PNG to ``path``
    and close the figure; returns ``path``."""
    fig.tight_layout(rect=rect)
    fig.savefig(path, dpi=120)
    plt.close(fig)
    return path


def titled(fig, title: str, caption: list[str]) -> tuple[float, float, float, float]:
    """Put ``title`` above the panels and the ``caption`` paragraphs (wrapped to the figure's width) below them;
    returns the rectangle left for the panels (for :func:`save_figure`)."""
    width = int(fig.get_figwidth() * 15)
    text = "\n".join(textwrap.fill(line, width) for line in caption)
    rows = text.count("\n") + 1 if text else 0
    height = fig.get_figheight()
    fig.suptitle(title, fontsize=10)
    if text:
        fig.text(0.01, 0.01, text, fontsize=7, va="bottom", ha="left")
    bottom = (rows * 0.13 + 0.1) / height if text else 0.0
    return (0, bottom, 1, 1 - 0.35 / height)


def head_heatmaps(panels: list[tuple[str, list[list[float]]]], title: str, path: Path) -> Path:
    """One heatmap panel per ``(name, table)``, a table of per-head values in [0, 1] (L x H: layers as rows, heads
    as columns; AHA's Fig. 3 for ``mu_f``), under ``title``."""
    fig, axes = panel_row(len(panels), 4.8, 3.8)
    for ax, (name, t) in zip(axes, panels):
        im = ax.imshow(t, vmin=0.0, vmax=1.0, cmap="Blues_r", aspect="auto")
        ax.set_xticks(range(len(t[0])))
        ax.set_yticks(range(len(t)))
        label_axes(ax, "head", "layer", name, legend=False)
        fig.colorbar(im, ax=ax, fraction=0.046)
    fig.suptitle(title, fontsize=8)
    return save_figure(fig, path, rect=(0, 0, 1, 0.92))


def sorted_heads(panels: list[tuple[str, list[list[float]]]], ylabel: str, title: str, path: Path) -> Path:
    """Every head's value of each ``(name, table)`` (L x H), sorted in decreasing order, one line per name (AHA's
    Fig. 4 for ``mu_f``)."""
    fig, axes = panel_row(1, 6.5, 4.0)
    for name, t in panels:
        values = sorted((v for row in t for v in row), reverse=True)
        axes[0].plot(range(1, len(values) + 1), values, marker=".", label=name)
    label_axes(axes[0], "head rank", ylabel, title)
    return save_figure(fig, path)


def token_shading(texts: list[tuple[str, list[str], list[float]]], title: str, caption: list[str], path: Path,
                  columns: int = 90) -> Path:
    """AHA's Fig. 1: each ``(name, tokens, values)`` a panel of its text, token by token, every token on a
    background shaded by its value in [0, 1] (light: 0, dark blue: 1), wrapped at ``columns`` characters
    (monospaced; a newline in a token starts a new line)."""
    cmap = plt.get_cmap("Blues")
    placed = []  # per text: [(line, column, text, value)]
    for _, tokens, values in texts:
        line, col, cells = 0, 0, []
        for tok, v in zip(tokens, values):
            parts = tok.split("\n")
            for i, part in enumerate(parts):
                if i:
                    line, col = line + 1, 0
                if col + len(part) > columns and col:
                    line, col = line + 1, 0
                if part:
                    cells.append((line, col, part, v))
                    col += len(part)
        placed.append((cells, line + 1))
    heights = [0.4 + 0.16 * n for _, n in placed]  # inches: 0.16 a line, 0.06 a character (7 pt monospace)
    fig, axes = plt.subplots(len(texts), 1, figsize=(columns * 0.06 + 0.4, sum(heights) + 1.2), squeeze=False,
                             gridspec_kw={"height_ratios": heights})
    for ax, (name, _, _), (cells, n_lines) in zip(axes[:, 0], texts, placed):
        ax.set_xlim(0, columns)
        ax.set_ylim(n_lines, 0)
        ax.axis("off")
        ax.set_title(name, fontsize=8, loc="left")
        for line, col, part, v in cells:
            ax.add_patch(Rectangle((col, line), len(part), 1, color=cmap(0.1 + 0.9 * v), lw=0))
            ax.text(col, line + 0.75, part, fontsize=7, family="monospace", color="white" if v > 0.6 else "black")
    return save_figure(fig, path, rect=titled(fig, title, caption))


def metric_grid(columns: list[tuple[str, dict[str, dict[str, list[tuple[float, float]]]]]], rows: dict[str, str],
                xlabel: str, title: str, caption: list[str], path: Path) -> Path:
    """A grid of line plots: one column per ``(name, series)``, one row per metric of ``rows`` (key -> axis label);
    ``series``: line label -> metric -> ``[(x, y)]`` (DimPO's Fig. 4). x on a log2 axis."""
    fig, axes = plt.subplots(len(rows), len(columns), figsize=(4.6 * len(columns), 3.2 * len(rows) + 0.8),
                             squeeze=False)
    for col, (name, series) in enumerate(columns):
        for row, (metric, ylabel) in enumerate(rows.items()):
            ax = axes[row][col]
            for label, metrics in series.items():
                points = sorted(metrics[metric])
                ax.plot([x for x, _ in points], [y for _, y in points], marker="o", label=label)
            ax.set_xscale("log", base=2)
            ax.xaxis.set_major_locator(FixedLocator(sorted({x for m in series.values() for x, _ in m[metric]})))
            ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
            ax.xaxis.set_minor_locator(NullLocator())
            label_axes(ax, xlabel, ylabel, name if row == 0 else "", legend=row == 0)
    return save_figure(fig, path, rect=titled(fig, title, caption))
