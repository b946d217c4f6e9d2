"""The one exception type that becomes a one-line message and an exit status."""

from __future__ import annotations


class LaunchError(Exception):
    """Bad input or an impossible request: printed as one line, never a traceback."""

    def __init__(self, message: str, status: int = 2) -> None:
        super().__init__(message)
        self.status = status
