#!/usr/bin/env python3
"""Writes the seed corpora under fuzz/seeds/<target>/. Run from anywhere; rerun after changing
an input format. The formats are documented in the fuzz targets' sources."""
import os
import struct

HERE = os.path.dirname(os.path.abspath(__file__))


def out(target, name, data):
    d = os.path.join(HERE, target)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(bytes(data))


# ---- state_machine: engine byte, then opcode (mod 17) + arguments, u16 little-endian.
def task(id_=b"t"):
    return [0, len(id_)] + list(id_)


def writer(t=0):
    return [1, t]


def small(n):  # 0..255
    return n


def mid(n):  # 0..8191
    return 0x4000 | n


def big(n):  # ~n, up to 208 KiB, multiple of 13
    return 0x8000 | (n // 13)


def edge(i):  # index into the boundary table
    return 0xC000 | i


KIND = {"bytes": 0, "slice": 1, "async": 2, "slot": 3, "slot_drop": 4}


def write(w, code, kind="bytes"):
    return [2, w] + list(struct.pack("<H", code)) + [KIND[kind]]


def finish(w=0, is_async=False):
    return [3, w, int(is_async)]


def drop_writer(w=0):
    return [4, w]


def reader(s=0):
    return [5, s]


def into_reader(s=0):
    return [6, s]


def read(r=0, n=32, keep=False):
    return [7, r, n - 1, int(keep)]


def drop_reader(r=0):
    return [8, r]


def clone(s=0):
    return [9, s]


def drop_state(s=0):
    return [10, s]


def publish(s=0):
    return [11, s]


def cancel(t=0):
    return [12, t]


def close(t=0):
    return [13, t]


def cancel_soon(t=0, delay=0):
    return [14, t, delay]


def drop_task(t=0):
    return [15, t]


def fault(kind, times=1, skip=0):
    return [16, kind, times - 1, skip]


IO_WRITE_EIO, IO_WRITE_ENOSPC = 0, 4
CREATE_EIO, CREATE_ENOSPC_AFTER = 1, 1 | (1 << 2) | 0x80
IO_UNLINK, CLEANUP_UNLINK = 2, 3

mixed = (
    write(0, small(10))
    + write(0, edge(2), "slice")
    + write(0, mid(5000), "async")
    + write(0, small(100), "slot")
    + write(0, small(50), "slot_drop")
    + write(0, edge(8))
    + write(0, big(200 << 10))
    + write(0, edge(9), "slot")
    + write(0, small(0))
)
for engine in (0, 1):
    e = [engine]
    out("state_machine", f"roundtrip-{engine}",
        e + task(b"round") + writer() + mixed + finish() + reader() + read(n=32, keep=True)
        + clone() + reader(1) + read(1, 5) + drop_reader(0) + drop_reader(0) + drop_state(1)
        + publish() + reader() + into_reader())
    out("state_machine", f"cancel-mid-write-{engine}",
        e + task() + writer() + mixed + cancel() + write(0, small(3)) + finish())
    out("state_machine", f"cancel-soon-{engine}",
        e + task() + writer() + cancel_soon(0, 3) + mixed + mixed + finish() + reader()
        + read(n=32))
    out("state_machine", f"cancel-mid-read-{engine}",
        e + task() + writer() + [b for _ in range(8) for b in write(0, mid(8000))] + finish()
        + reader() + read(n=3) + clone() + cancel() + read(n=3) + reader(1))
    out("state_machine", f"io-write-fault-{engine}",
        e + fault(IO_WRITE_EIO, 1, 2) + task() + writer() + mixed + finish() + reader()
        + read(n=32))
    out("state_machine", f"create-fault-{engine}",
        e + fault(CREATE_ENOSPC_AFTER, 1, 1) + task() + writer() + mixed + write(0, big(100 << 10))
        + finish() + reader() + read(n=32))
    out("state_machine", f"unlink-fault-{engine}",
        e + fault(IO_UNLINK, 2) + fault(CLEANUP_UNLINK, 1) + task() + writer() + mixed + finish()
        + drop_state() + task(b"two") + writer(1) + mixed + drop_writer())
    out("state_machine", f"two-tasks-{engine}",
        e + task(b"a") + task(b"b/../c") + writer(0) + writer(1) + mixed + write(1, big(150 << 10))
        + finish(0, True) + close(1) + write(0, small(1)) + reader() + read(n=20) + drop_task(0))

# ---- segment_reader: the raw part wants a valid segment (header + frames).
CRC_TABLE = []
for i in range(256):
    c = i
    for _ in range(8):
        c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
    CRC_TABLE.append(c)


def crc32c(data, crc=0):
    crc ^= 0xFFFFFFFF
    for b in data:
        crc = CRC_TABLE[(crc ^ b) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def segment(seg, engine, records):
    h = bytearray(64)
    h[0:8] = b"SPILLRNG"
    h[8:10] = struct.pack("<H", 1)
    h[10:12] = struct.pack("<H", 64)
    h[12:16] = struct.pack("<I", seg)
    h[16:24] = struct.pack("<Q", engine)
    h[60:64] = struct.pack("<I", crc32c(bytes(h[:60])))
    v = bytes(h)
    for r in records:
        ln = struct.pack("<I", len(r))
        v += ln + struct.pack("<I", crc32c(r, crc32c(ln))) + r
    return v


assert crc32c(b"123456789") == 0xE3069283
out("segment_reader", "valid-3", segment(7, 0xABCD, [b"hello", b"", b"world!"]))
out("segment_reader", "valid-empty", segment(0, 1, []))
out("segment_reader", "valid-1k", segment(1, 2, [bytes(range(256)) * 4]))
out("segment_reader", "name", b"spill-segment-000042.bin")
