"""The lab over time: jobs waiting and GPUs busy, as a terminal chart or a PNG.

A simulation of a month of Philly takes hundreds of thousands of samples, far more than a terminal
has columns or a PNG has pixels, so both charts first gather them into equal slices of time
(``downsample``): the most jobs waiting at any moment of a slice, so a short burst stays visible,
and the GPUs busy averaged over the slice's time, so a slice full of samples taken in one busy
instant does not outweigh the quiet hours around it. A sample's values hold until the next sample.

Times are seconds on the virtual clock; ``epoch`` is the Unix time of virtual 0, shown as UTC dates.
An epoch of 0 means the workload has no calendar, and times show as time since the start (``+6h00m``).
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from itertools import islice
from pathlib import Path

from labq.render.tables import format_duration
from labq.sim.model import Sample

_BLOCKS = " ▁▂▃▄▅▆▇█"  #: eighths of a cell, empty to full
PNG_BUCKETS = 1000  #: slices of time in a PNG: about one per pixel column of a 10-inch figure at 100 dpi


@dataclass(frozen=True)
class Buckets:
    """Samples gathered into ``len(queued)`` equal slices of time starting at ``start``."""

    start: float
    width: float  #: seconds per slice
    queued: list[int]  #: the most jobs waiting at any moment in the slice
    busy: list[float]  #: GPUs busy, averaged over the slice's time

    def time_at(self, index: float) -> float:
        return self.start + index * self.width


def downsample(samples: Sequence[Sample], buckets: int) -> Buckets:
    """Samples in time order (as the engine takes them), at least two of them spanning some time.

    One pass, no lists built on the way: 200,000 samples take about a tenth of a second.
    """
    if len(samples) < 2 or samples[-1].t <= samples[0].t:
        raise ValueError("downsampling needs samples spanning some time")
    t0, t1 = samples[0].t, samples[-1].t
    scale = buckets / (t1 - t0)  # slices per second: positions below are in slices
    queued = [0] * buckets
    area = [0.0] * buckets  # busy GPUs × the fraction of the slice they held, summed
    last = buckets - 1
    x0, k0 = 0.0, 0
    q, b = samples[0].queued, samples[0].busy_gpus  # what holds from x0 until the next sample
    for s in islice(samples, 1, None):
        x1 = (s.t - t0) * scale
        k1 = min(int(x1), last)
        if q > queued[k0]:
            queued[k0] = q
        if k0 == k1:
            area[k0] += b * (x1 - x0)
        else:  # what held spans slice boundaries
            area[k0] += b * (k0 + 1 - x0)
            for k in range(k0 + 1, k1):
                area[k] += b
                queued[k] = q
            if x1 > k1:
                area[k1] += b * (x1 - k1)
                if q > queued[k1]:
                    queued[k1] = q
        x0, k0 = x1, k1
        q, b = s.queued, s.busy_gpus
    if q > queued[last]:
        queued[last] = q
    return Buckets(start=t0, width=(t1 - t0) / buckets, queued=queued, busy=area)


def peak_queue(samples: Sequence[Sample], buckets: Buckets) -> tuple[int, float]:
    """The most jobs ever waiting and when that first happened; looks only at the peak's slice."""
    peak = max(buckets.queued)
    k = buckets.queued.index(peak)
    first = max(0, bisect_left(samples, buckets.time_at(k), key=_time) - 1)  # the one holding at its start
    end = bisect_right(samples, buckets.time_at(k + 1), key=_time)
    at = next((s.t for s in islice(samples, first, end + 1) if s.queued == peak), buckets.time_at(k))
    return peak, max(at, buckets.start)


def _time(sample: Sample) -> float:
    return sample.t


# --- terminal -------------------------------------------------------------------------------------

def _moment(t: float, epoch: float) -> str:
    """A point in time in full: a UTC date with an epoch, else time since the start."""
    if epoch:
        return datetime.fromtimestamp(epoch + t, UTC).strftime("%Y-%m-%d %H:%M UTC")
    return "+" + format_duration(t)


def _tick_label(t: float, epoch: float, span: float) -> str:
    """Short enough for an axis; as precise as the span needs."""
    if not epoch:
        return "+" + format_duration(t)
    when = datetime.fromtimestamp(epoch + t, UTC)
    if span <= 2 * 86400:
        return when.strftime("%H:%M")
    if span <= 7 * 86400:
        return when.strftime("%m-%d %Hh")
    if span <= 366 * 86400:
        return when.strftime("%b %d")
    return when.strftime("%Y-%m")


def _count(n: int) -> str:
    """At most six characters, to fit the y axis's labels."""
    return f"{n:,}" if n < 100_000 else f"{n // 1000:,}k" if n < 10_000_000 else f"{n // 1_000_000:,}M"


def _bars(values: Sequence[float], top: float, rows: int) -> list[str]:
    """Rows of block characters, top row first; any value above zero shows at least an eighth."""
    eighths = [0 if v <= 0 else max(1, round(v / top * rows * 8)) for v in values]
    lines = []
    for r in range(rows):
        floor = (rows - 1 - r) * 8
        lines.append("".join(_BLOCKS[min(8, max(0, e - floor))] for e in eighths))
    return lines


def _panel(bars: list[str], top_label: str, bottom_label: str, label_w: int) -> list[str]:
    """The bars behind a y axis with the top value on the first row and the bottom on the last."""
    lines = []
    for i, row in enumerate(bars):
        label = top_label if i == 0 else bottom_label if i == len(bars) - 1 else ""
        lines.append(f"{label.rjust(label_w)} {'┤' if label else '│'}{row}")
    return lines


def _marked_title(name: str, note: str, width: int, mark: int) -> str:
    """``name`` at the left and ``note`` beside a ▼ over column ``mark``, on whichever side it fits."""
    right, left = f"▼ {note}", f"{note} ▼"
    free = len(name) + 1
    line = list(name.ljust(width)[:width])
    if free <= mark and mark + len(right) <= width:
        line[mark:mark + len(right)] = right
    elif mark - len(left) + 1 >= free:
        start = mark - len(left) + 1
        line[start:mark + 1] = left
    else:  # no room beside the mark: the note follows the name and the mark stands alone if it can
        text = f"{name} · {note}"
        line = list(text.ljust(width)[:width])
        if len(text) < mark < width:
            line[mark] = "▼"
    return "".join(line)


def _time_axis(buckets: Buckets, label_w: int, plot_w: int, epoch: float) -> list[str]:
    """A rule with ticks and, under it, the tick times: the first and last at the chart's ends."""
    span = buckets.width * plot_w
    n = max(2, plot_w // 16 + 1)
    cols = [round(j * (plot_w - 1) / (n - 1)) for j in range(n)]
    rule = ["─"] * plot_w
    labels = [" "] * plot_w
    taken = -1  # the last column a label covers, so labels never run into each other
    for j, col in enumerate(cols):
        rule[col] = "┬"
        t = buckets.start if j == 0 else buckets.start + span if j == n - 1 else buckets.time_at(col + 0.5)
        text = _tick_label(t, epoch, span)
        start = 0 if j == 0 else col - len(text) + 1 if j == n - 1 else col - len(text) // 2
        start = max(0, min(start, plot_w - len(text)))
        if start <= taken + 1 and j:
            continue
        labels[start:start + len(text)] = text
        taken = start + len(text) - 1
    pad = " " * (label_w + 1)
    return [pad + "└" + "".join(rule), pad + " " + "".join(labels)]


def terminal_plot(samples: Sequence[Sample], gpus: int, *, width: int = 72, height: int = 12,
                  epoch: float = 0.0) -> str:
    """Two panels, jobs waiting over GPUs busy, sharing a time axis: ``height`` lines of ``width``.

    Fewer than two samples (or all at one moment) draw no chart but say so in a line.
    """
    if width < 30 or height < 6:
        raise ValueError(f"a terminal plot needs at least 30x6 characters, not {width}x{height}")
    if not samples:
        return "no samples"
    if len(samples) < 2 or samples[-1].t <= samples[0].t:
        s = samples[-1]
        return (f"no samples over time to chart, one moment only ({_moment(s.t, epoch)}): "
                f"{s.queued:,} queued, {s.running:,} running, {s.busy_gpus:,}/{gpus:,} GPUs busy")
    label_w = 6  # room for the y labels: "100%" and up to "99,999" jobs waiting
    plot_w = width - label_w - 2
    buckets = downsample(samples, plot_w)
    peak, peak_at = peak_queue(samples, buckets)
    peak_col = buckets.queued.index(peak)
    queue_rows = (height - 4 + 1) // 2
    busy_rows = height - 4 - queue_rows
    capacity = max(gpus, 1)
    mean_busy = sum(buckets.busy) / plot_w / capacity
    lines = [_marked_title("jobs waiting", f"peak {peak:,} at {_moment(peak_at, epoch)}", width,
                           label_w + 2 + peak_col)]
    lines += _panel(_bars(buckets.queued, max(peak, 1), queue_rows), _count(peak), "0", label_w)
    lines.append(f"GPUs busy, of {gpus:,} · {mean_busy:.0%} on average"[:width])
    lines += _panel(_bars(buckets.busy, capacity, busy_rows), "100%", "0%", label_w)
    lines += _time_axis(buckets, label_w, plot_w, epoch)
    return "\n".join(line.ljust(width) for line in lines)


# --- PNG ------------------------------------------------------------------------------------------

def png_plot(samples: Sequence[Sample], gpus: int, path: str | Path, *, title: str = "",
             epoch: float = 0.0) -> Path:
    """The same two panels as a PNG at ``path``, drawn with matplotlib's Agg backend (no display)."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as e:
        raise RuntimeError("PNG plots need matplotlib: pip install 'labq[plot]'") from e
    path = Path(path)
    fig = Figure(figsize=(10, 5.5), dpi=100, layout="constrained")
    FigureCanvasAgg(fig)  # a Figure without pyplot: no global state, no GUI backend, thread-safe
    ax_queue, ax_busy = fig.subplots(2, 1, sharex=True)
    if title:
        fig.suptitle(title)
    ax_queue.set_ylabel("jobs waiting")
    ax_busy.set_ylabel(f"GPUs busy, % of {gpus:,}")
    ax_busy.set_ylim(0, 100)
    if len(samples) < 2 or samples[-1].t <= samples[0].t:
        ax_queue.text(0.5, 0.5, "no samples", ha="center", va="center", transform=ax_queue.transAxes)
    else:
        _draw_panels(ax_queue, ax_busy, samples, gpus, epoch)
    fig.savefig(path, format="png")
    return path


def _draw_panels(ax_queue, ax_busy, samples: Sequence[Sample], gpus: int, epoch: float) -> None:
    buckets = downsample(samples, PNG_BUCKETS)
    seconds = [buckets.time_at(i) for i in range(len(buckets.queued) + 1)]
    if epoch:
        from matplotlib import dates

        edges = dates.date2num([datetime.fromtimestamp(epoch + t, UTC) for t in seconds])
        locator = dates.AutoDateLocator(tz=UTC)
        ax_busy.xaxis.set_major_locator(locator)
        ax_busy.xaxis.set_major_formatter(dates.ConciseDateFormatter(locator, tz=UTC))
        ax_busy.set_xlabel("UTC")
    else:
        edges = [t / 3600 for t in seconds]
        ax_busy.set_xlabel("hours since the start")
    busy = [100 * b / max(gpus, 1) for b in buckets.busy]
    # fill_between, not stairs: stairs bounds its patch curve by curve, a quarter second for 1,000 steps
    ax_queue.fill_between(edges, [*buckets.queued, buckets.queued[-1]], step="post", color="tab:orange", lw=0)
    ax_busy.fill_between(edges, [*busy, busy[-1]], step="post", color="tab:blue", lw=0)
    peak, _ = peak_queue(samples, buckets)
    at = buckets.queued.index(peak)
    ax_queue.annotate(f"peak {peak:,}", xy=((edges[at] + edges[at + 1]) / 2, peak),
                      xytext=(0, 4), textcoords="offset points", ha="center", va="bottom")
    ax_queue.set_ylim(0, max(peak, 1) * 1.15)
    ax_queue.set_xlim(edges[0], edges[-1])
