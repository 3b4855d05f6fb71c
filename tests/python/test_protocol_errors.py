"""Protocol violations sent over a raw socket after a valid handshake.
Each must be answered with the close code from the contract."""

from __future__ import annotations

import pytest

from rawws import (
    OP_BINARY,
    OP_CLOSE,
    OP_CONT,
    OP_PING,
    OP_TEXT,
    Closed,
    encode_frame,
    ws_connect,
)


def expect_close_code(c, expected, what):
    try:
        code, reason = c.expect_close(timeout=5)
    except Closed as e:
        raise AssertionError(f"{what}: TCP closed ({e}) without a close frame; expected close {expected}") from e
    except TimeoutError as e:
        raise AssertionError(f"{what}: no close frame within 5s; expected close {expected}") from e
    assert code == expected, f"{what}: expected close {expected}, got {code} {reason!r}"
    # After its close frame the server drops the TCP connection.
    c.wait_closed(timeout=5)


@pytest.fixture
def conn(shared_server):
    c = ws_connect(shared_server.port)
    yield c
    c.close()


@pytest.mark.parametrize("code", [0, 999, 1004, 1005, 1006, 1015, 1016, 2000, 2999, 5000])
def test_invalid_close_code_gets_1002(conn, code):
    conn.send_close(code)
    expect_close_code(conn, 1002, f"close code {code}")


def test_close_payload_of_one_byte_gets_1002(conn):
    conn.send_frame(OP_CLOSE, b"\x03")
    expect_close_code(conn, 1002, "1-byte close payload")


def test_invalid_utf8_text_gets_1007(conn):
    conn.send_frame(OP_TEXT, b"ok \xff\xfe bad")
    expect_close_code(conn, 1007, "invalid UTF-8 text")


def test_overlong_utf8_gets_1007(conn):
    conn.send_frame(OP_TEXT, b"\xc0\xaf")
    expect_close_code(conn, 1007, "overlong UTF-8")


def test_utf16_surrogate_in_text_gets_1007(conn):
    conn.send_frame(OP_TEXT, b"\xed\xa0\x80")
    expect_close_code(conn, 1007, "encoded surrogate")


def test_invalid_utf8_across_fragments_gets_1007(conn):
    # "\xe2\x82" (start of a 3-byte sequence) followed by an ASCII byte: invalid.
    conn.send_frame(OP_TEXT, b"abc\xe2\x82", fin=False)
    conn.send_frame(OP_CONT, b"(def", fin=True)
    expect_close_code(conn, 1007, "invalid UTF-8 across fragments")


def test_truncated_utf8_at_end_of_message_gets_1007(conn):
    conn.send_frame(OP_TEXT, b"abc\xe2\x82", fin=False)
    conn.send_frame(OP_CONT, b"", fin=True)
    expect_close_code(conn, 1007, "message ending inside a UTF-8 sequence")


def test_valid_utf8_split_across_fragments_is_fine(conn):
    data = "€uro 🚀".encode()
    conn.send_frame(OP_TEXT, data[:1], fin=False)
    conn.send_frame(OP_CONT, data[1:6], fin=False)
    conn.send_frame(OP_CONT, data[6:], fin=True)
    assert conn.read_message() == (OP_TEXT, data)


def test_unmasked_frame_gets_1002(conn):
    conn.send_frame(OP_TEXT, b"not masked", mask=False)
    expect_close_code(conn, 1002, "unmasked client frame")


@pytest.mark.parametrize("rsv", [1, 2, 4])
def test_rsv_bits_get_1002(conn, rsv):
    conn.send_frame(OP_TEXT, b"rsv", rsv=rsv)
    expect_close_code(conn, 1002, f"RSV bits {rsv:03b}")


@pytest.mark.parametrize("opcode", [0x3, 0x7, 0xB, 0xF])
def test_reserved_opcode_gets_1002(conn, opcode):
    conn.send_frame(opcode, b"x")
    expect_close_code(conn, 1002, f"reserved opcode {opcode:#x}")


def test_fragmented_control_frame_gets_1002(conn):
    conn.send_frame(OP_PING, b"frag", fin=False)
    expect_close_code(conn, 1002, "ping with FIN=0")


def test_control_frame_over_125_bytes_gets_1002(conn):
    conn.send_frame(OP_PING, b"p" * 126)
    expect_close_code(conn, 1002, "126-byte ping")


def test_continuation_without_start_gets_1002(conn):
    conn.send_frame(OP_CONT, b"orphan", fin=True)
    expect_close_code(conn, 1002, "continuation without a start")


def test_new_data_frame_during_fragmented_message_gets_1002(conn):
    conn.send_frame(OP_TEXT, b"start", fin=False)
    conn.send_frame(OP_BINARY, b"interleaved", fin=True)
    expect_close_code(conn, 1002, "new data frame while a fragmented message is open")


def test_server_still_serves_after_protocol_errors(shared_server):
    """Violations on one connection do not affect others."""
    bad = ws_connect(shared_server.port)
    good = ws_connect(shared_server.port)
    try:
        bad.send(encode_frame(OP_TEXT, b"x", mask=False))
        expect_close_code(bad, 1002, "unmasked")
        good.send_frame(OP_TEXT, b"still alive")
        assert good.read_message() == (OP_TEXT, b"still alive")
    finally:
        bad.close()
        good.close()
