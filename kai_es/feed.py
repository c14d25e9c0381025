"""Scenario objects to observed events: the scenario's stand-in for the informer's first list.

Contract: pure given the scenario; ids are uuid5 of the scenario name and the object's order, so
the same file always gives the same bytes.
"""

from __future__ import annotations

from kai_es.events import Envelope
from kai_es.events.factory import derived_id, make_envelope
from kai_es.ingest.translate import subject_of
from kai_es.scenario import Scenario, ScenarioObject

SOURCE = "kai-es/scenario"


def object_events(scenario: Scenario, objects: list[ScenarioObject], logicaltime: int,
                  salt: str = "initial") -> list[Envelope]:
    """Observed events for `objects`, in order, at `logicaltime`."""
    return [
        make_envelope(o.payload, event_id=derived_id(f"{scenario.name}/{salt}", i), source=SOURCE,
                      subject=subject_of(o.payload), logicaltime=logicaltime)
        for i, o in enumerate(objects)
    ]
