"""Charts as server-rendered SVG: geometry computed here, drawn by templates/overview/.

No script and no style attribute (the CSP allows neither): bars are <rect>s with numeric
attributes and a class per series, coloured by harness.css. The SVG scales to its box
(preserveAspectRatio="none"), so the axis's labels are a second SVG beneath it whose
ticks sit at percentages of the width (`Tick.x`), where their times are, and whose text
keeps its size on a phone.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

HEIGHT = 100.0
BAR = 10.0  # width of one bucket in SVG units
GAP = 0.15  # fraction of a bucket left empty


@dataclass
class Segment:
    series: str
    y: float
    height: float
    n: int


@dataclass
class Bar:
    x: float
    width: float
    label: str
    total: int
    segments: list[Segment] = field(default_factory=list)


@dataclass(frozen=True)
class Tick:
    """A tick at `x` percent of the chart's width (the time it names) and its label,
    drawn at `text_x` with SVG's `anchor`: beside the tick, or pulled in at an edge so
    that it stays inside the box (a label is about a tenth of a phone's chart wide)."""

    x: float
    label: str
    text_x: float
    anchor: str


@dataclass
class Chart:
    width: float
    height: float
    bars: list[Bar]
    peak: int
    ticks: list[Tick]

    @property
    def empty(self) -> bool:
        return self.peak == 0


def _scale(peak: int) -> float:
    return HEIGHT / peak if peak else 0.0


def stacked(
    buckets: Sequence[str],
    values: Callable[[str], dict[str, int]],
    order: Sequence[str],
    *,
    label: Callable[[str], str],
    ticks: list[Tick],
) -> Chart:
    """One stacked column per bucket, series stacked bottom-up in `order`; `ticks` from
    `bar_ticks` or `boundary_ticks` over the same buckets."""
    per = [(b, values(b)) for b in buckets]
    peak = max((sum(v.values()) for _, v in per), default=0)
    scale = _scale(peak)
    bars = []
    for i, (bucket, counts) in enumerate(per):
        bar = Bar(
            x=i * BAR + BAR * GAP / 2,
            width=BAR * (1 - GAP),
            label=label(bucket),
            total=sum(counts.values()),
        )
        top = HEIGHT
        for name in order:
            n = counts.get(name, 0)
            if n:
                h = n * scale
                top -= h
                bar.segments.append(Segment(name, round(top, 3), round(h, 3), n))
        bars.append(bar)
    return Chart(len(buckets) * BAR, HEIGHT, bars, peak, ticks)


def paired(
    buckets: Sequence[str],
    low: Sequence[float],
    high: Sequence[float],
    *,
    label: Callable[[str], str],
    ticks: list[Tick],
) -> Chart:
    """A column per bucket: `high` (p90) drawn behind `low` (p50)."""
    peak = max([*high, *low, 0.0])
    scale = HEIGHT / peak if peak else 0.0
    bars = []
    for i, bucket in enumerate(buckets):
        bar = Bar(x=i * BAR + BAR * GAP / 2, width=BAR * (1 - GAP), label=label(bucket), total=0)
        for name, value in (("p90", high[i]), ("p50", low[i])):
            h = value * scale
            bar.segments.append(Segment(name, round(HEIGHT - h, 3), round(h, 3), round(value)))
        bars.append(bar)
    return Chart(len(buckets) * BAR, HEIGHT, bars, int(peak + 0.999), ticks)


def bar_ticks(buckets: Sequence[str], label: Callable[[str], str], every: int) -> list[Tick]:
    """A tick under the middle of every `every`-th bar, counted back from the last (the
    current hour or today), so the newest bucket is always labelled."""
    n = len(buckets)
    return [
        _tick(100 * (i + 0.5) / n, label(buckets[i])) for i in range(n) if (n - 1 - i) % every == 0
    ]


def boundary_ticks(
    buckets: Sequence[str], starts: Callable[[str], bool], label: Callable[[str], str]
) -> list[Tick]:
    """A tick at the left edge of each bucket that `starts` a longer period (an hour
    bucket at midnight starts a day), its label reading rightwards into that period."""
    n = len(buckets)
    return [
        _tick(100 * i / n, label(b), anchor="start") for i, b in enumerate(buckets) if starts(b)
    ]


def _tick(x: float, label: str, anchor: str = "middle") -> Tick:
    x = round(x, 3)
    if x > (90 if anchor == "start" else 95):
        return Tick(x, label, 100.0, "end")
    if x < 5 and anchor == "middle":
        return Tick(x, label, 0.0, "start")
    return Tick(x, label, x, anchor)
