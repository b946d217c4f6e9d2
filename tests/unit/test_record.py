"""Records (mpilaunch.protocol.record): what typing.NamedTuple gave the planner, without importing typing."""

from __future__ import annotations

import pickle

import pytest

from mpilaunch.plan.hosts import Host
from mpilaunch.plan.spec import Options
from mpilaunch.protocol.record import Record


class Point(Record):
    """A point."""

    x: int
    y: int = 0
    label: str | None = None

    @property
    def norm1(self) -> int:
        return abs(self.x) + abs(self.y)

    def moved(self, dx: int) -> Point:
        return self._replace(x=self.x + dx)


def test_a_record_is_a_named_tuple_with_its_defaults_methods_and_doc() -> None:
    p = Point(3)
    assert p == (3, 0, None) and isinstance(p, tuple)
    assert Point._fields == ("x", "y", "label")
    assert Point._field_defaults == {"y": 0, "label": None}
    assert p.norm1 == 3 and p.moved(-5) == Point(-2)
    assert Point.__doc__ == "A point."
    assert Point.__qualname__ == "Point" and Point.__module__ == __name__
    assert Point.__annotations__ == {"x": "int", "y": "int", "label": "str | None"}  # never evaluated
    with pytest.raises(AttributeError):
        p.x = 4  # type: ignore[misc]
    with pytest.raises(TypeError):
        Point()  # type: ignore[call-arg]


def test_records_pickle_and_compare_as_tuples() -> None:
    host = Host("node1", slots=2)
    assert pickle.loads(pickle.dumps(host)) == host
    assert Options()._replace(oversubscribe=True).oversubscribe
    assert Options().abort_on_failure  # a property of the class body


def test_a_field_without_default_after_one_with_default_is_refused() -> None:
    with pytest.raises(TypeError, match="without a default follows"):

        class Bad(Record):
            a: int = 1
            b: int
