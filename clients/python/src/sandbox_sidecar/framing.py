"""Frames of the sandbox-sidecar protocol: a 4-byte big-endian length, then one msgpack map.

Pure functions, no sockets: the client's reader feeds them, and tests can too.
"""

from __future__ import annotations

import struct
from typing import Any, Mapping, Optional

import msgpack

from .errors import SidecarError, SidecarProtocolError

PROTOCOL_VERSION = 1
HEADER_SIZE = 4
DEFAULT_MAX_FRAME_BYTES = 16 << 20
# A length prefix is an unsigned 32-bit integer, so no frame can be larger.
_MAX_ENCODABLE = 0xFFFFFFFF

_HEADER = struct.Struct(">I")


def pack_frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length."""
    if len(body) > _MAX_ENCODABLE:
        raise ValueError(f"a frame body of {len(body)} bytes cannot be length-prefixed")
    return _HEADER.pack(len(body)) + body


def encode_request(request_id: int, op: str, args: Optional[Mapping[str, Any]] = None) -> bytes:
    """The msgpack body of one request envelope (without its length prefix).

    ``bytes`` travel as msgpack ``bin``, ``str`` as ``str``; ``None`` values in
    ``args`` are dropped, since the daemon treats null as absent anyway.
    """
    envelope: dict[str, Any] = {"v": PROTOCOL_VERSION, "id": request_id, "op": op}
    if args:
        cleaned = {k: v for k, v in args.items() if v is not None}
        if cleaned:
            envelope["args"] = cleaned
    try:
        return msgpack.packb(envelope, use_bin_type=True)
    except (TypeError, ValueError, OverflowError) as exc:  # UnicodeEncodeError is a ValueError
        # Refused here rather than sent: e.g. a path holding surrogate escapes,
        # which no msgpack str can carry.
        raise SidecarError(
            "bad_request", f"the {op} request cannot be encoded: {exc}", {"op": op}
        ) from None


def parse_length(header: bytes, max_frame_bytes: int) -> int:
    """Check a length prefix before a single byte of the body is read.

    A length above ``max_frame_bytes`` is never trusted: the stream is either
    corrupt or hostile, and allocating for it is how a client runs out of memory.
    """
    if len(header) != HEADER_SIZE:
        raise SidecarProtocolError(f"a frame header is {HEADER_SIZE} bytes, got {len(header)}")
    (length,) = _HEADER.unpack(header)
    if length == 0:
        raise SidecarProtocolError("the daemon sent an empty frame")
    if length > max_frame_bytes:
        raise SidecarProtocolError(
            f"the daemon announced a {length}-byte frame, more than the {max_frame_bytes} bytes "
            "this connection accepts; the stream is corrupt or not a sandbox-sidecar daemon",
            {"frame_bytes": length, "max_frame_bytes": max_frame_bytes},
        )
    return length


def decode_body(body: bytes) -> dict:
    """Decode one frame body, which must be exactly one msgpack map.

    Strings that are not valid UTF-8 keep their bytes as surrogate escapes
    rather than failing the whole frame.
    """
    try:
        message = msgpack.unpackb(
            body,
            raw=False,
            strict_map_key=False,
            unicode_errors="surrogateescape",
        )
    except Exception as exc:  # msgpack raises several unrelated types for bad input
        raise SidecarProtocolError(f"the daemon sent a frame that is not valid msgpack ({exc})") from None
    if not isinstance(message, dict):
        raise SidecarProtocolError(f"the daemon sent a {type(message).__name__} where a map was expected")
    return message


def is_event(message: Mapping[str, Any]) -> bool:
    """Whether a frame is a streaming event (output of a call that asked for it; others are ignored)."""
    return "event" in message


def error_from_response(message: Mapping[str, Any]) -> SidecarError:
    """The :class:`SidecarError` an ``ok: false`` response stands for."""
    error = message.get("error")
    if not isinstance(error, Mapping):
        return SidecarProtocolError("the daemon sent a failure response without an error map")
    code = error.get("code")
    text = error.get("message")
    details = {k: v for k, v in error.items() if k not in ("code", "message")}
    return SidecarError(
        code if isinstance(code, str) and code else "unknown",
        text if isinstance(text, str) else "",
        details,
    )


def result_from_response(message: Mapping[str, Any]) -> dict:
    """The ``result`` map of a response, or the error it carries, raised."""
    ok = message.get("ok")
    if ok is True:
        result = message.get("result")
        if result is None:
            return {}
        if not isinstance(result, dict):
            raise SidecarProtocolError("the daemon sent a success response whose result is not a map")
        return result
    if ok is False:
        raise error_from_response(message)
    raise SidecarProtocolError("the daemon sent a response without a boolean 'ok'")
