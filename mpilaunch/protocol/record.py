"""Frozen records: typing.NamedTuple for type checkers, collections.namedtuple at run time.

Importing typing (which pulls in contextlib and warnings) and evaluating every field's
annotation cost each launcher start about 5 ms, a tenth of what a local job's launcher does
before its ranks start. A subclass of Record is written like a typing.NamedTuple (annotated
fields, defaults last, methods, properties, a docstring) and type checkers read it as one;
here it becomes a collections.namedtuple with the class body's attributes copied over, its
annotations kept as the strings `from __future__ import annotations` leaves.
"""

from __future__ import annotations

TYPE_CHECKING = False  # True for type checkers, which treat the name specially: no typing import here

if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    from collections import namedtuple

    # What the class statement itself puts in a body; everything else is the record's own.
    _CLASS_KEYS = frozenset(("__module__", "__qualname__", "__annotations__", "__doc__"))

    class _RecordType(type):
        def __new__(mcs, name: str, bases: tuple, body: dict) -> type:
            if not bases:  # Record itself
                return super().__new__(mcs, name, bases, body)
            fields = tuple(body.get("__annotations__", ()))
            defaults = [body[f] for f in fields if f in body]
            first_default = len(fields) - len(defaults)
            if any(f in body for f in fields[:first_default]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            cls = namedtuple(name, fields, defaults=defaults, module=body["__module__"])
            cls.__qualname__ = body["__qualname__"]
            cls.__doc__ = body.get("__doc__") or cls.__doc__
            cls.__annotations__ = body.get("__annotations__", {})
            for key, value in body.items():
                if key not in _CLASS_KEYS and key not in fields:
                    setattr(cls, key, value)
            return cls

    class Record(metaclass=_RecordType):
        """Base of a frozen record: see the module's docstring."""
