"""Scraping a PrometheusMonitor while a run goes, with a real HTTP client and parser."""

from __future__ import annotations

import threading
import time
import urllib.request
from collections.abc import Callable
from typing import Any

from prometheus_client.parser import text_string_to_metric_families

Samples = dict[tuple[str, tuple[tuple[str, str], ...]], float]


def scrape(url: str) -> Samples:
    """Every sample of one scrape, keyed by name and sorted labels; the exposition must
    parse."""
    with urllib.request.urlopen(url, timeout=10) as response:
        assert response.status == 200
        assert response.headers["Content-Type"].startswith("text/plain")
        text = response.read().decode()
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples[(sample.name, tuple(sorted(sample.labels.items())))] = sample.value
    return samples


def value(samples: Samples, name: str, **labels: str) -> float | None:
    return samples.get((name, tuple(sorted(labels.items()))))


def scrape_during(url: str, run: Callable[[], Any], every_s: float = 0.2) -> tuple[Any, list]:
    """Run ``run()`` in a thread while scraping ``url``; returns its result and the scrapes
    taken while it ran (the last one after it ended)."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["result"] = run()
        except BaseException as exc:  # noqa: BLE001 - re-raised below
            box["error"] = exc

    thread = threading.Thread(target=target)
    thread.start()
    scrapes = []
    while thread.is_alive():
        scrapes.append(scrape(url))
        time.sleep(every_s)
    thread.join()
    scrapes.append(scrape(url))
    if "error" in box:
        raise box["error"]
    return box["result"], scrapes
