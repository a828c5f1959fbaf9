from boxd.manager.record.journal import story
from boxd.wire.event import EventKind
from boxd.wire.models.event_record import Event


def test_a_refusal_reads_as_a_sentence() -> None:
    event = Event(
        seq=3,
        task="t000000001",
        kind=EventKind.NET_REFUSED,
        at=0.0,
        data={"target": "other.test:80", "reason": "it is not in this task's hosts"},
    )
    assert story(event) == (
        "Task t000000001 was refused other.test:80: it is not in this task's hosts"
    )


def test_a_coalesced_refusal_says_how_many_it_stands_for() -> None:
    event = Event(
        seq=4,
        task="t000000001",
        kind=EventKind.NET_REFUSED,
        at=0.0,
        data={"target": "other.test:80", "reason": "it is not in this task's hosts", "count": 37},
    )
    assert story(event) == (
        "Task t000000001 was refused other.test:80 37 times: it is not in this task's hosts"
    )
