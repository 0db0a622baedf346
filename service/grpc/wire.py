"""A bound on a protocol buffer message's structure, checked on its bytes before it is parsed.

grpcio bounds a message's size (``max_receive_message_length``), not what parsing it costs: a
field of two bytes (an empty requested output) becomes a message object of its own, so 64 MiB
of them are 33 million objects, 1.5 GiB and seconds of parsing. :func:`check_structure` walks
the wire format (tag, then a varint, 8 or 4 bytes, or a length and that many bytes) and counts
the fields of the message and of its sub-messages, as the message's descriptor says which
length-delimited fields are messages; it stops at the first field past the limit. Bytes,
strings and packed numbers (tensor data) are skipped by their length, not counted, so a
message of a few fields costs a few steps whatever its size. Bytes that are not wire format are
left to the parser, whose refusal says what is wrong.
"""

from __future__ import annotations

from google.protobuf.descriptor import Descriptor

from service.protocol.codec import ProtocolError

__all__ = ["check_structure"]

_VARINT, _FIXED64, _LENGTH, _FIXED32 = 0, 1, 2, 5


class _MalformedError(Exception):
    """Not wire format: the parser says so better."""


def _varint(data: bytes, pos: int, end: int) -> tuple[int, int]:
    """The varint at ``pos`` and the position after it."""
    value = shift = 0
    while pos < end and shift < 64:
        byte = data[pos]
        pos += 1
        value |= (byte & 0x7F) << shift
        if byte < 0x80:
            return value, pos
        shift += 7
    raise _MalformedError


def check_structure(data: bytes, descriptor: Descriptor, limit: int) -> None:
    """:class:`ProtocolError` (400) when the message in ``data`` (of type ``descriptor``) holds
    more than ``limit`` fields, its sub-messages' included."""
    count = 0
    spans = [(descriptor, 0, len(data))]
    try:
        while spans:
            kind, pos, end = spans.pop()
            while pos < end:
                key, pos = _varint(data, pos, end)
                count += 1
                if count > limit:
                    raise ProtocolError(
                        f"the {descriptor.name} message holds more than {limit:,} fields "
                        "(tensors, outputs, parameters and their parts); a request needs a "
                        "few dozen, and tensor data goes in raw_input_contents or packed contents"
                    )
                wire = key & 7
                if wire == _VARINT:
                    _, pos = _varint(data, pos, end)
                elif wire == _FIXED64:
                    pos += 8
                elif wire == _FIXED32:
                    pos += 4
                elif wire == _LENGTH:
                    size, pos = _varint(data, pos, end)
                    field = kind.fields_by_number.get(key >> 3)
                    if field is not None and field.message_type is not None:
                        spans.append((field.message_type, pos, min(pos + size, end)))
                    pos += size
                else:  # groups (proto2 only) or not wire format
                    raise _MalformedError
    except _MalformedError:
        return
