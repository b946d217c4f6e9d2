"""Frozen records: typing.NamedTuple for type checkers, a tuple subclass at run time.

Not typing.NamedTuple (importing typing, and evaluating every annotation, on every start) nor
collections.namedtuple (it compiles a `__new__` for each class): what each costs is in
docs/performance.md, "Start-up tricks". A subclass of Record is written like a
typing.NamedTuple (annotated fields, defaults last, methods, properties, a docstring) and type
checkers read it as one; here it becomes a tuple subclass with one getter per field and the
shared methods of `_Tuple`, its annotations kept as the strings `from __future__ import
annotations` leaves.
"""

from __future__ import annotations

TYPE_CHECKING = False

if TYPE_CHECKING:
    from typing import NamedTuple as Record
else:
    try:
        from _collections import _tuplegetter
    except ImportError:  # another Python than CPython
        from operator import itemgetter

        def _tuplegetter(index: int, doc: str) -> property:
            return property(itemgetter(index), doc=doc)

    class _Tuple(tuple):
        """What every record has, as namedtuple gives it: one `__new__` for all of them."""

        __slots__ = ()
        _fields: tuple = ()
        _field_defaults: dict = {}  # noqa: RUF012 (each record class sets its own)

        def __new__(cls, *args: object, **named: object) -> _Tuple:
            fields = cls._fields
            if len(args) != len(fields) or named:
                if len(args) > len(fields):
                    raise TypeError(f"{cls.__name__}() takes {len(fields)} arguments, {len(args)} given")
                values = list(args)
                defaults = cls._field_defaults
                for name in fields[len(args) :]:
                    if name in named:
                        values.append(named.pop(name))
                    elif name in defaults:
                        values.append(defaults[name])
                    else:
                        raise TypeError(f"{cls.__name__}() missing argument {name!r}")
                if named:
                    raise TypeError(f"{cls.__name__}() got unexpected or repeated arguments {sorted(named)}")
                args = tuple(values)
            return tuple.__new__(cls, args)

        @classmethod
        def _make(cls, iterable: object) -> _Tuple:
            return tuple.__new__(cls, iterable)  # type: ignore[arg-type]

        def _replace(self, **changes: object) -> _Tuple:
            made = tuple.__new__(type(self), [changes.pop(name, value) for name, value in zip(self._fields, self)])
            if changes:
                raise TypeError(f"{type(self).__name__} has no fields {sorted(changes)}")
            return made

        def _asdict(self) -> dict:
            return dict(zip(self._fields, self))

        def __getnewargs__(self) -> tuple:
            return tuple(self)

        def __repr__(self) -> str:
            inner = ", ".join(f"{name}={value!r}" for name, value in zip(self._fields, self))
            return f"{type(self).__name__}({inner})"

    class _RecordType(type):
        def __new__(mcs, name: str, bases: tuple, body: dict) -> type:
            if not bases:  # Record itself
                return super().__new__(mcs, name, bases, body)
            annotations = body.get("__annotations__", {})
            fields = tuple(annotations)
            defaults = {f: body[f] for f in fields if f in body}
            first_default = len(fields) - len(defaults)
            if any(f in body for f in fields[:first_default]):
                raise TypeError(f"{name}: a field without a default follows one with a default")
            namespace = {key: value for key, value in body.items() if key not in fields}
            namespace.update(__slots__=(), _fields=fields, _field_defaults=defaults, __match_args__=fields)
            namespace["__annotations__"] = annotations
            for index, field in enumerate(fields):
                namespace[field] = _tuplegetter(index, f"Alias for field number {index}")
            return type(name, (_Tuple,), namespace)

    class Record(metaclass=_RecordType):
        """Base of a frozen record: see the module's docstring."""
