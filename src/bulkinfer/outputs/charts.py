"""The HTML report's charts: matplotlib figures rendered to inline SVG (no script, no network),
each with its own id salt so that several on one page never collide."""

from __future__ import annotations

import html
import io
from collections.abc import Mapping, Sequence
from typing import Any

__all__ = ["BLUE", "GREEN", "GREY", "ORANGE", "RED", "Charts", "num"]

BLUE, ORANGE, GREY, RED, GREEN = "#2f6db5", "#e07b39", "#8a8f98", "#c0392b", "#2e8b57"


def num(v: Any) -> str:
    if v is None:
        return "–"
    if isinstance(v, bool):
        return str(v).lower()
    if isinstance(v, int):
        return f"{v:,}"
    if isinstance(v, float):
        if v != 0 and (abs(v) < 0.001 or abs(v) >= 1e6):
            return f"{v:.3g}"
        return f"{v:,.4f}".rstrip("0").rstrip(".") if abs(v) < 100 else f"{v:,.1f}"
    return html.escape(str(v))


class Charts:
    """matplotlib figures as inline SVG (each with its own id salt, so ids never collide)."""

    def __init__(self) -> None:
        import matplotlib

        matplotlib.use("Agg", force=True)
        import matplotlib.pyplot as plt

        self.plt = plt
        self.n = 0

    def figure(self, height: float = 2.6) -> tuple[Any, Any]:
        fig, ax = self.plt.subplots(figsize=(7.6, height), dpi=96)
        ax.spines[["top", "right"]].set_visible(False)
        ax.tick_params(labelsize=9)
        return fig, ax

    def svg(self, fig: Any, label: str) -> str:
        import matplotlib

        self.n += 1
        buf = io.StringIO()
        with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"bulkinfer-{self.n}"}):
            fig.tight_layout()
            fig.savefig(buf, format="svg")
        self.plt.close(fig)
        text = buf.getvalue()
        text = text[text.index("<svg") :]
        return text.replace("<svg ", f'<svg role="img" aria-label="{html.escape(label)}" class="chart" ', 1)

    def bars(
        self,
        labels: Sequence[str],
        values: Sequence[float],
        title: str,
        unit: str = "",
        horizontal: bool = True,
        color: str = BLUE,
        limit: float | None = None,
    ) -> str:
        fig, ax = self.figure(max(1.6, 0.32 * len(labels) + 0.9) if horizontal else 2.6)
        if horizontal:
            pos = list(range(len(labels)))[::-1]
            ax.barh(pos, values, color=color)
            ax.set_yticks(pos, labels)
            top = max([*values, limit or 0, 1e-12])
            for p, v in zip(pos, values, strict=True):
                ax.text(v + top * 0.01, p, (f"{v:.1f}" if unit == "%" else num(v)) + unit, va="center", fontsize=9)
            ax.set_xlim(0, top * 1.18)
            if limit is not None:
                ax.axvline(limit, color=RED, linestyle="--", linewidth=1)
        else:
            ax.bar(labels, values, color=color)
            for i, v in enumerate(values):
                ax.text(i, v, num(v), ha="center", va="bottom", fontsize=8)
            ax.tick_params(axis="x", labelrotation=30 if len(labels) > 6 else 0)
        ax.set_title(title, fontsize=11, loc="left")
        return self.svg(fig, title)

    def line(self, xs: Sequence[float], ys: Sequence[float], title: str, xlabel: str, ylabel: str) -> str:
        fig, ax = self.figure()
        ax.plot(xs, ys, color=BLUE, linewidth=1.8, marker="o" if len(xs) < 40 else None, markersize=3)
        ax.fill_between(xs, ys, color=BLUE, alpha=0.12)
        ax.set_xlabel(xlabel, fontsize=9)
        ax.set_ylabel(ylabel, fontsize=9)
        ax.set_ylim(bottom=0)
        ax.set_title(title, fontsize=11, loc="left")
        return self.svg(fig, title)

    def quantiles(self, series: Mapping[str, Mapping[str, float] | None], title: str) -> str:
        """Quantile profiles (p1 ... p99) of one distribution, or two: OLD grey, NEW blue (the
        title says which is which)."""
        fig, ax = self.figure()
        colors = [GREY, BLUE]
        for qs, color in zip(series.values(), colors[-len(series) :], strict=True):
            if qs:
                keys = list(qs)
                ax.plot(keys, [qs[k] for k in keys], marker="o", color=color, linewidth=1.8, markersize=4)
        ax.set_ylabel("value", fontsize=9)
        ax.ticklabel_format(axis="y", useOffset=False, style="plain")  # never "1e-7+1" over ticks of -0.5..0.5
        values = [v for qs in series.values() if qs for v in qs.values()]
        if values and max(values) - min(values) <= 1e-6 * max(abs(max(values)), 1e-12):
            mid = (max(values) + min(values)) / 2  # a flat profile (unit-norm vectors): a flat line at its value
            ax.set_ylim(mid - max(abs(mid) * 0.05, 1e-9), mid + max(abs(mid) * 0.05, 1e-9))
        ax.set_title(title, fontsize=11, loc="left")
        return self.svg(fig, title)

    def heatmap(self, rows: Sequence[str], cols: Sequence[str], values: Sequence[Sequence[int]], title: str) -> str:
        fig, ax = self.figure(max(2.2, 0.45 * len(rows) + 1.2))
        ax.imshow(values, cmap="Blues", aspect="auto")
        ax.set_xticks(range(len(cols)), cols)
        ax.set_yticks(range(len(rows)), rows)
        ax.set_xlabel("NEW label", fontsize=9)
        ax.set_ylabel("OLD label", fontsize=9)
        top = max((v for row in values for v in row), default=1) or 1
        for i, row in enumerate(values):
            for j, v in enumerate(row):
                ax.text(j, i, str(v), ha="center", va="center", fontsize=9, color="white" if v > top / 2 else "black")
        ax.spines[["left", "bottom"]].set_visible(False)
        ax.set_title(title, fontsize=11, loc="left")
        return self.svg(fig, title)
