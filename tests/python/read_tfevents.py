#!/usr/bin/env python3
"""Reads a TensorBoard event file without TensorFlow: an independent check of lockstep's writer.

usage: read_tfevents.py FILE

Checks both CRCs of every TFRecord and prints one JSON line:
  {"file_version": "brain.Event:2", "scalars": [{"tag", "step", "value", "wall_time"}, ...]}
Exits 1 with a message naming the record and its byte offset on a bad CRC or a truncated record.
Standard library only; the CRC and the protobuf decoding are written from their specifications,
not from the C++ writer.
"""

import json
import struct
import sys


def crc32c(data):
    """CRC-32C (Castagnoli): reflected polynomial 0x82F63B78, computed bit by bit."""
    crc = 0xFFFFFFFF
    for byte in data:
        crc ^= byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1
    return crc ^ 0xFFFFFFFF


def masked_crc32c(data):
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def read_varint(buf, pos):
    result, shift = 0, 0
    while True:
        byte = buf[pos]
        pos += 1
        result |= (byte & 0x7F) << shift
        if byte < 0x80:
            return result, pos
        shift += 7


def fields(buf):
    """Yields (field_number, wire_type, value) of a protobuf message. Value: int for varint,
    bytes for fixed64 (8), fixed32 (4) and length-delimited."""
    pos = 0
    while pos < len(buf):
        key, pos = read_varint(buf, pos)
        number, wire_type = key >> 3, key & 7
        if wire_type == 0:
            value, pos = read_varint(buf, pos)
        elif wire_type == 1:
            value, pos = buf[pos:pos + 8], pos + 8
        elif wire_type == 2:
            length, pos = read_varint(buf, pos)
            value, pos = buf[pos:pos + length], pos + length
        elif wire_type == 5:
            value, pos = buf[pos:pos + 4], pos + 4
        else:
            raise ValueError(f"unsupported wire type {wire_type} for field {number}")
        yield number, wire_type, value


def decode_event(buf):
    """Event{wall_time=1 double, step=2 int64, file_version=3 string, summary=5 Summary}."""
    event = {"wall_time": 0.0, "step": 0, "file_version": None, "values": []}
    for number, _, value in fields(buf):
        if number == 1:
            event["wall_time"] = struct.unpack("<d", value)[0]
        elif number == 2:
            event["step"] = value - (1 << 64) if value >= 1 << 63 else value  # two's complement
        elif number == 3:
            event["file_version"] = value.decode("utf-8")
        elif number == 5:
            # Summary{repeated Value value=1}; Value{tag=1 string, simple_value=2 float}
            for summary_field, _, value_msg in fields(value):
                if summary_field != 1:
                    continue
                tag, simple_value = None, None
                for value_field, _, v in fields(value_msg):
                    if value_field == 1:
                        tag = v.decode("utf-8")
                    elif value_field == 2:
                        simple_value = struct.unpack("<f", v)[0]
                event["values"].append((tag, simple_value))
    return event


def read_records(data):
    """Yields the payload of each TFRecord: u64 length, u32 masked CRC of the length bytes,
    payload, u32 masked CRC of the payload (little-endian)."""
    pos, index = 0, 0
    while pos < len(data):
        if pos + 12 > len(data):
            raise ValueError(f"record {index} at byte {pos}: truncated header")
        header = data[pos:pos + 8]
        (length,) = struct.unpack("<Q", header)
        (length_crc,) = struct.unpack("<I", data[pos + 8:pos + 12])
        if masked_crc32c(header) != length_crc:
            raise ValueError(f"record {index} at byte {pos}: length CRC mismatch "
                             f"(stored {length_crc:#010x}, computed {masked_crc32c(header):#010x})")
        end = pos + 12 + length + 4
        if end > len(data):
            raise ValueError(f"record {index} at byte {pos}: truncated payload")
        payload = data[pos + 12:pos + 12 + length]
        (data_crc,) = struct.unpack("<I", data[end - 4:end])
        if masked_crc32c(payload) != data_crc:
            raise ValueError(f"record {index} at byte {pos}: data CRC mismatch "
                             f"(stored {data_crc:#010x}, computed {masked_crc32c(payload):#010x})")
        yield payload
        pos, index = end, index + 1


def main():
    if len(sys.argv) != 2:
        sys.exit("usage: read_tfevents.py FILE")
    with open(sys.argv[1], "rb") as f:
        data = f.read()
    file_version, scalars = None, []
    try:
        for payload in read_records(data):
            event = decode_event(payload)
            if event["file_version"] is not None:
                file_version = event["file_version"]
            for tag, value in event["values"]:
                scalars.append({"tag": tag, "step": event["step"], "value": value,
                                "wall_time": event["wall_time"]})
    except (ValueError, IndexError, struct.error, UnicodeDecodeError) as e:
        sys.exit(f"{sys.argv[1]}: {e}")
    print(json.dumps({"file_version": file_version, "scalars": scalars}))


if __name__ == "__main__":
    main()
