"""Suspect nodes: avoided from their last loss until they leave or ``SUSPECT_NODE_S`` later."""

from __future__ import annotations

import logging

import pytest

from conveyor.engine.suspects import SUSPECT_NODE_S, Suspects


def test_a_node_that_lost_a_payload_is_avoided_and_said_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    suspects = Suspects()
    assert not suspects and suspects.avoid == frozenset()
    with caplog.at_level(logging.WARNING, logger="conveyor.engine.suspects"):
        suspects.suspect("b", now=1.0)
        suspects.suspect("b", now=2.0)  # again: its clock starts over, nothing said
    assert suspects and suspects.avoid == {"b"} and suspects.since == {"b": 2.0}
    assert len(caplog.records) == 1 and "node b was lost" in caplog.records[0].getMessage()


def test_a_suspect_is_forgotten_after_a_while_from_its_last_loss() -> None:
    suspects = Suspects()
    suspects.suspect("a", now=0.0)
    suspects.suspect("b", now=10.0)
    suspects.expire(now=SUSPECT_NODE_S - 1)
    assert suspects.avoid == {"a", "b"}
    suspects.expire(now=SUSPECT_NODE_S)
    assert suspects.avoid == {"b"}
    suspects.expire(now=10.0 + SUSPECT_NODE_S)
    assert not suspects and suspects.avoid == frozenset()


def test_a_suspect_that_left_the_node_list_is_suspect_no_more() -> None:
    suspects = Suspects()
    suspects.suspect("a", now=0.0)
    suspects.suspect("b", now=0.0)
    suspects.keep_present({"a": object(), "c": object()})
    assert suspects.since == {"a": 0.0} and suspects.avoid == {"a"}
