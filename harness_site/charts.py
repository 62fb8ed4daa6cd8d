"""Charts as server-rendered SVG: geometry computed here, drawn by templates/overview/.

No script and no style attribute (the CSP allows neither): bars are <rect>s with numeric
attributes and a class per series, coloured by harness.css. The SVG scales to its box
(preserveAspectRatio="none"), so labels live in HTML beside it, readable on a phone.
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


@dataclass
class Chart:
    width: float
    height: float
    bars: list[Bar]
    peak: int
    ticks: list[str]  # evenly spaced labels under the chart

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
    ticks: int = 6,
) -> Chart:
    """One stacked column per bucket, series stacked bottom-up in `order`."""
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
    return Chart(len(buckets) * BAR, HEIGHT, bars, peak, _ticks(buckets, label, ticks))


def paired(
    buckets: Sequence[str],
    low: Sequence[float],
    high: Sequence[float],
    *,
    label: Callable[[str], str],
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
    return Chart(len(buckets) * BAR, HEIGHT, bars, int(peak + 0.999), _ticks(buckets, label, 7))


def _ticks(buckets: Sequence[str], label: Callable[[str], str], count: int) -> list[str]:
    if not buckets:
        return []
    step = max(1, len(buckets) // count)
    return [label(b) for b in buckets[::step]]
