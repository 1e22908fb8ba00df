"""report.html in a real browser (headless Chromium): no network, no errors, charts drawn
with every stage's series, the failures listed, the hover read-out and legend working."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from conveyor.report import write_report
from tests.report.events import (
    FAILURE_MESSAGES,
    ODD_LOGS,
    STAGES,
    shared_cores_run,
    three_stage_run,
    with_host,
    write_events,
    write_rotated,
)

CHARTS = {
    "busy": ["busy"],
    "workers": ["ready", "target", "decisions"],
    "queue": ["queued"],
    "queue_bytes": ["queued_bytes"],
    "throughput": ["throughput"],
}


@dataclass
class Opened:
    page: Any
    requests: list[str] = field(default_factory=list)
    blocked: list[str] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


@pytest.fixture
def open_report(browser: Any) -> Iterator[Any]:
    """Opens a report in a new page that refuses every request but file:// and data:,
    recording what was asked for and every console error or uncaught page error."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})

    def open_(path: Path) -> Opened:
        page = context.new_page()
        opened = Opened(page)

        def route(route: Any) -> None:
            url = route.request.url
            if url.startswith(("file:", "data:")):
                route.continue_()
            else:
                opened.blocked.append(url)
                route.abort()

        page.route("**/*", route)
        page.on("request", lambda request: opened.requests.append(request.url))
        page.on(
            "console",
            lambda msg: (
                opened.errors.append(f"console: {msg.text}") if msg.type == "error" else None
            ),
        )
        page.on("pageerror", lambda exc: opened.errors.append(f"page error: {exc}"))
        page.goto(path.resolve().as_uri(), wait_until="load")
        return opened

    yield open_
    context.close()


def _series(page: Any) -> dict[str, dict[str, list[float]]]:
    """Per chart: its size, and the size of each of its series (by data-series)."""
    return page.evaluate(
        """() => {
          const out = {};
          for (const svg of document.querySelectorAll('svg.chart')) {
            const box = svg.getBoundingClientRect();
            const series = {};
            for (const el of svg.querySelectorAll('[data-series]')) {
              const r = el.getBoundingClientRect();
              series[el.getAttribute('data-series')] = [r.width, r.height];
            }
            out[svg.getAttribute('data-chart')] = {box: [box.width, box.height], series};
          }
          return out;
        }"""
    )


@pytest.mark.parametrize("kind", ["complete", "killed and rotated"])
def test_the_report_renders_offline_without_errors(
    tmp_path: Path, open_report: Any, kind: str
) -> None:
    run_dir = tmp_path / "run"
    if kind == "complete":
        write_events(run_dir / "events.jsonl", three_stage_run())
    else:
        write_rotated(run_dir, three_stage_run(end=False), parts=3)
        with (run_dir / "events.jsonl").open("a") as handle:
            handle.write('{"type": "snapshot", "t": 121.0, "stag')  # torn by the kill
    opened = open_report(write_report(run_dir))
    page = opened.page
    assert opened.errors == []
    assert opened.blocked == []
    assert all(url.startswith(("file:", "data:")) for url in opened.requests), opened.requests

    charts = _series(page)
    assert set(charts) == set(CHARTS)
    for chart, metrics in CHARTS.items():
        width, height = charts[chart]["box"]
        assert width > 300 and height > 50, (chart, width, height)
        for stage in STAGES:
            for metric in metrics:
                name = f"{stage}:{metric}"
                assert name in charts[chart]["series"], (chart, name)
                if metric != "decisions" or stage != "read":  # read's one marker is tiny
                    assert charts[chart]["series"][name][0] > 0, (chart, name)
    # the bottleneck is marked in the legend and on its busy row
    assert page.locator(".legend .key", has_text="infer").locator("em.bn").count() == 1
    assert "Bottleneck: infer" in page.locator(".verdict").inner_text()

    failures = page.locator("table.failures tbody tr")
    assert failures.count() == 2
    text = page.locator("table.failures").inner_text()
    for message in FAILURE_MESSAGES:
        assert message in text
    first = failures.nth(0).locator("details")
    first.locator("summary").click()
    assert first.locator("pre").is_visible()
    assert "RuntimeError: CUDA out of memory" in first.locator("pre").inner_text()
    if kind != "complete":
        assert "run did not finish (no run_end event)" in page.locator(".notices").inner_text()

    shot = tmp_path / "report.png"  # pytest's tmp_path: never the repository
    page.screenshot(path=str(shot), full_page=True)
    assert shot.stat().st_size > 10_000
    assert opened.errors == []


def test_hover_read_out_and_legend_toggle(tmp_path: Path, open_report: Any) -> None:
    write_events(tmp_path / "events.jsonl", three_stage_run())
    opened = open_report(write_report(tmp_path))
    page = opened.page
    chart = page.locator('svg.chart[data-chart="throughput"]')
    chart.scroll_into_view_if_needed()
    box = chart.bounding_box()
    assert box is not None
    page.mouse.move(box["x"] + box["width"] * 0.6, box["y"] + box["height"] * 0.5)
    tip = page.locator("#tip")
    assert tip.is_visible()
    read_out = tip.inner_text()
    assert "t = " in read_out and all(stage in read_out for stage in STAGES)
    # the crosshair shows on every chart at once
    shown = page.evaluate(
        "() => [...document.querySelectorAll('svg.chart .xhair')]"
        ".filter(l => l.style.display === 'block').length"
    )
    assert shown == len(CHARTS)
    page.locator('.legend .key[data-stage="write"]').click()
    hidden = page.locator('svg [data-stage="write"].hidden')
    assert hidden.count() >= len(CHARTS)
    assert not page.locator(
        'svg.chart[data-chart="queue"] [data-series="write:queued"]'
    ).is_visible()
    assert opened.errors == [] and opened.blocked == []


def test_odd_logs_open_without_errors(tmp_path: Path, open_report: Any) -> None:
    for name, events in ODD_LOGS.items():
        run_dir = tmp_path / name.replace(" ", "_")
        write_events(run_dir / "events.jsonl", events)
        opened = open_report(write_report(run_dir))
        assert opened.page.locator("section.run").count() >= 1, name
        assert opened.errors == [] and opened.blocked == [], name


def test_the_machine_verdict_reads_in_the_page(tmp_path: Path, open_report: Any) -> None:
    events = with_host(shared_cores_run(), cores=2, busy=1.9, run=1.85)
    write_events(tmp_path / "events.jsonl", events)
    opened = open_report(write_report(tmp_path))
    verdict = opened.page.locator(".verdict")
    assert verdict.get_attribute("data-limit") == "cpus"
    items = verdict.locator("li")
    assert (
        items.nth(0)
        .inner_text()
        .startswith("The machine's CPUs were the limit: 1.90 of 2 cores busy on average")
    )
    assert items.nth(0).is_visible()
    assert "a worker holds a share of the cores' time" in verdict.inner_text()
    assert opened.errors == [] and opened.blocked == []
