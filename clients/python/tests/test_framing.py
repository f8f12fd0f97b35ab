from __future__ import annotations

import struct

import msgpack
import pytest

from sandbox_sidecar import SidecarError, SidecarProtocolError
from sandbox_sidecar.framing import (
    decode_body,
    encode_request,
    error_from_response,
    is_event,
    pack_frame,
    parse_length,
    result_from_response,
)


def test_pack_frame_prefixes_big_endian_length():
    assert pack_frame(b"\x81\xa1a\x01") == b"\x00\x00\x00\x04\x81\xa1a\x01"


def test_encode_request_envelope_drops_null_args_and_sends_bytes_as_bin():
    body = encode_request(7, "write_file", {"sandbox": "sc-1", "data": b"\x00\xff", "mode": None})
    raw = msgpack.unpackb(body, raw=True)
    assert raw[b"v"] == 1 and raw[b"id"] == 7 and raw[b"op"] == b"write_file"
    assert raw[b"args"] == {b"sandbox": b"sc-1", b"data": b"\x00\xff"}
    # bin, not str: the first byte of the data value's encoding is bin8 (0xc4)
    assert b"\xc4\x02\x00\xff" in body


def test_encode_request_without_args_has_no_args_key():
    assert "args" not in msgpack.unpackb(encode_request(1, "health", {"x": None}), raw=False)
    assert "args" not in msgpack.unpackb(encode_request(1, "health"), raw=False)


def test_encode_request_refuses_what_msgpack_cannot_carry():
    with pytest.raises(SidecarError) as info:
        encode_request(1, "read_file", {"path": "caf\udce9"})
    assert info.value.code == "bad_request"


@pytest.mark.parametrize("length", [1, 1024])
def test_parse_length_accepts_up_to_the_maximum(length):
    assert parse_length(struct.pack(">I", length), 1024) == length


def test_parse_length_never_trusts_more_than_the_maximum():
    with pytest.raises(SidecarProtocolError) as info:
        parse_length(struct.pack(">I", 1025), 1024)
    assert info.value.details == {"frame_bytes": 1025, "max_frame_bytes": 1024}
    with pytest.raises(SidecarProtocolError):
        parse_length(b"\xff\xff\xff\xff", 16 << 20)


def test_parse_length_refuses_empty_frames_and_short_headers():
    with pytest.raises(SidecarProtocolError):
        parse_length(b"\x00\x00\x00\x00", 1024)
    with pytest.raises(SidecarProtocolError):
        parse_length(b"\x00\x01", 1024)


@pytest.mark.parametrize(
    "body",
    [
        msgpack.packb([1, 2, 3]),  # an array, not a map
        b"\xc1",  # never-used msgpack byte
        msgpack.packb({"a": 1}) + b"\x00",  # trailing bytes
        msgpack.packb({"a": "long string"})[:-3],  # truncated
        b"not msgpack at all",
    ],
)
def test_decode_body_refuses_anything_but_exactly_one_map(body):
    with pytest.raises(SidecarProtocolError):
        decode_body(body)


def test_decode_body_keeps_bin_as_bytes_and_tolerates_bad_utf8():
    body = msgpack.packb({"data": b"\xff", "s": "x"}, use_bin_type=True)
    assert decode_body(body) == {"data": b"\xff", "s": "x"}
    # a str holding invalid UTF-8 (0xa2 = fixstr of 2 bytes) survives as surrogate escapes
    assert decode_body(b"\x81\xa1s\xa2\xc3\x28") == {"s": "\udcc3("}


def test_event_frames_are_recognised():
    assert is_event({"v": 1, "id": 3, "event": "stdout", "data": b"x"})
    assert not is_event({"v": 1, "id": 3, "ok": True})


def test_error_response_carries_code_message_and_details():
    err = error_from_response(
        {"id": 1, "ok": False, "error": {"code": "file_too_large", "message": "too big", "size_bytes": 9, "max_bytes": 4}}
    )
    assert (err.code, err.message, err.details) == ("file_too_large", "too big", {"size_bytes": 9, "max_bytes": 4})
    assert str(err) == "file_too_large: too big"


def test_result_from_response():
    assert result_from_response({"ok": True, "result": {"a": 1}, "later_key": 2}) == {"a": 1}
    assert result_from_response({"ok": True}) == {}
    with pytest.raises(SidecarError) as info:
        result_from_response({"ok": False, "error": {"code": "not_found", "message": "gone"}})
    assert info.value.code == "not_found"
    with pytest.raises(SidecarProtocolError):
        result_from_response({"id": 1})
    with pytest.raises(SidecarProtocolError):
        result_from_response({"ok": True, "result": [1]})
