"""JSON for control frames through the C codec under `json` (`_json`), without `json` itself:
importing `json` brings `re` and through it `enum`, `functools` and `collections`, a few ms on
every agent's start (docs/performance.md, "Start-up tricks"). Compact separators, ASCII only,
as `json.dumps(obj, separators=(",", ":"))` writes; where the C codec is missing or answers
otherwise (another Python), `json` itself."""

from __future__ import annotations

TYPE_CHECKING = False
if TYPE_CHECKING:
    from collections.abc import Callable

_CONSTANTS = {"NaN": float("nan"), "Infinity": float("inf"), "-Infinity": float("-inf")}


class _Reading:
    """What the C scanner reads from its context: json.JSONDecoder's defaults."""

    strict = True
    object_hook = None
    object_pairs_hook = None
    parse_float = float
    parse_int = int
    parse_constant = _CONSTANTS.__getitem__


def _refuse(value: object) -> object:
    raise TypeError(f"Object of type {type(value).__name__} is not JSON serializable")


def _from_c() -> tuple[Callable[[object], str], Callable[[str], object]] | None:
    try:
        from _json import encode_basestring_ascii, make_encoder, make_scanner

        encode = make_encoder(None, _refuse, encode_basestring_ascii, None, ":", ",", False, False, True)
        scan = make_scanner(_Reading())
    except (ImportError, TypeError):
        return None

    def dumps(obj: object) -> str:
        return "".join(encode(obj, 0))

    def loads(text: str) -> object:
        try:
            value, end = scan(text, 0)
        except StopIteration:
            raise ValueError("not JSON") from None
        except SystemError:  # bad JSON: the scanner names it with json.decoder's error, not loaded yet
            import json

            return json.loads(text)  # raises that error (and loads json.decoder for the next one)
        if end != len(text):
            raise ValueError(f"extra data at {end}")
        return value

    sample = {"op": "x", "n": [1, -2.5, None, True, "é\n"]}
    try:
        if loads(dumps(sample)) != sample:
            return None
    except (TypeError, ValueError):
        return None
    return dumps, loads


def _from_json() -> tuple[Callable[[object], str], Callable[[str], object]]:
    import json

    return (lambda obj: json.dumps(obj, separators=(",", ":"))), json.loads


dumps, loads = _from_c() or _from_json()
