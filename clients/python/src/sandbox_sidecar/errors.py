"""Exceptions raised by the plain client.

An error response from the daemon becomes a :class:`SidecarError` carrying the
daemon's ``code``, ``message`` and details. Failures the client detects itself
(the socket is missing, the connection broke, a call outlived its deadline, the
daemon sent something that is not a valid frame) use the subclasses below, with
codes of their own that the daemon never sends.
"""

from __future__ import annotations

from typing import Any, Mapping, Optional

# Codes the client produces itself. They never come from the daemon.
DAEMON_UNREACHABLE = "daemon_unreachable"
CONNECTION_LOST = "connection_lost"
CLIENT_TIMEOUT = "client_timeout"
PROTOCOL_ERROR = "protocol_error"
CLIENT_CLOSED = "client_closed"


class SidecarError(Exception):
    """An error response from the daemon, or a failure to get one.

    ``code`` is the stable string to switch on (docs/protocol.md lists the
    daemon's), ``message`` a sentence for a person, ``details`` the extra keys
    the daemon sent beside them (``size_bytes`` for ``file_too_large``,
    ``holder`` for ``held_by_other``, ...).
    """

    def __init__(self, code: str, message: str, details: Optional[Mapping[str, Any]] = None) -> None:
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})
        super().__init__(f"{code}: {message}")

    def __reduce__(self):  # keep code/message/details through pickling
        return (type(self), (self.code, self.message, self.details))


class SidecarConnectionError(SidecarError):
    """The daemon could not be reached, or the connection broke before the answer came."""


class SidecarTimeoutError(SidecarError):
    """No answer arrived within the call's deadline (its own timeout plus a grace)."""

    def __init__(self, message: str, details: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(CLIENT_TIMEOUT, message, details)

    def __reduce__(self):
        return (type(self), (self.message, self.details))


class SidecarProtocolError(SidecarError):
    """The daemon sent bytes that are not a valid frame; the connection was dropped."""

    def __init__(self, message: str, details: Optional[Mapping[str, Any]] = None) -> None:
        super().__init__(PROTOCOL_ERROR, message, details)

    def __reduce__(self):
        return (type(self), (self.message, self.details))
