"""Where the records of a torch zip hold their bytes: the cuts of pieces.py.

`torch.save` writes one zip whose records are stored uncompressed, one record per tensor
storage. A DCP shard (`__<rank>_0.distcp`, FSDP2's format) is many of them end to end:
each tensor item is written as a `torch.save` of its own. Their local headers do not
carry the records' sizes (a data descriptor follows each record), so the sizes come from
each zip's central directory, which its end record (`PK\\x05\\x06`) locates relative to
the zip's own start.

The file is the job's and is not trusted: every signature is checked, every offset is
kept inside the file, the directories read are bounded, and whatever does not add up is
skipped. The cuts only say where to split the file; pieces.spans covers every byte
whatever they say.
"""

from __future__ import annotations

import struct

END = b"PK\x05\x06"
END_64 = b"PK\x06\x06"
LOCATOR_64 = b"PK\x06\x07"
CENTRAL = b"PK\x01\x02"
LOCAL = b"PK\x03\x04"
TAIL = 65_557  # an end record and the longest comment
READ = 8 * 1024**2


def cuts(source, size: int, max_records: int, max_directory: int) -> list[int]:
    """Offsets where records' data begin and end, for one zip or zips end to end."""
    last = _tail_end(source, size)
    if last is None:
        return []
    # The bytes of directories still to read, for all the zips together: a file of fake
    # end records cannot make this read more than that.
    budget = [max_directory]
    found = _zip_at(source, size, last, max_records, budget)
    if found is None:
        return []
    start, records = found
    if start == 0:  # one zip, the whole file: its directory says everything
        return records
    # Zips end to end (a DCP shard): every end record in the file, each checked.
    ends = _every_end(source, max_records)
    if ends is None:
        return []
    total: list[int] = []
    for end in ends:
        found = _zip_at(source, size, end, max_records, budget)
        if found is not None:
            total += found[1]
        if len(total) > 2 * max_records:
            return []
    return total


def _tail_end(source, size: int) -> int | None:
    at = max(0, size - TAIL)
    source.seek(at)
    tail = source.read()
    found = tail.rfind(END)
    return None if found < 0 else at + found


def _every_end(source, max_records: int) -> list[int] | None:
    """The offset of every END signature in the file (one read, found by bytes.find)."""
    ends: list[int] = []
    source.seek(0)
    position, carry = 0, b""
    while chunk := source.read(READ):
        data = carry + chunk
        base = position - len(carry)
        at = data.find(END)
        while at >= 0:
            ends.append(base + at)
            at = data.find(END, at + 1)
        if len(ends) > max_records:
            return None
        carry = data[-(len(END) - 1) :]
        position += len(chunk)
    return ends


def _read(source, at: int, n: int) -> bytes:
    source.seek(at)
    return source.read(n)


def _zip_at(source, size, end: int, max_records: int, budget: list[int]):
    """(start of the zip whose end record is at `end`, the cuts of its records), or None
    when what is there is not a consistent zip. `budget[0]`: the directory bytes this may
    still read, lowered by what it reads."""
    record = _read(source, end, 22)
    if len(record) < 22:
        return None
    count, directory_size, directory_offset = struct.unpack("<HII", record[10:20])
    directory_end = end
    locator = end - 20
    # torch writes the zip64 records whatever the sizes: they sit between the directory
    # and the end record, and then hold the true figures.
    if locator >= 56 and _read(source, locator, 4) == LOCATOR_64:
        directory_end = locator - 56
        record = _read(source, directory_end, 56)
        if record[:4] != END_64:
            return None
        count, directory_size, directory_offset = struct.unpack("<QQQ", record[32:56])
    elif 0xFFFFFFFF in (directory_size, directory_offset):
        return None
    start = directory_end - directory_size - directory_offset
    if start < 0 or count > max_records or directory_size > budget[0]:
        return None
    budget[0] -= directory_size
    directory = _read(source, start + directory_offset, directory_size)
    if len(directory) != directory_size:
        return None
    found, at = [], 0
    for _ in range(count):
        if directory[at : at + 4] != CENTRAL or at + 46 > len(directory):
            return None
        stored, name, extra, comment = struct.unpack("<I4xHHH", directory[at + 20 : at + 34])
        local = struct.unpack("<I", directory[at + 42 : at + 46])[0]
        fields = directory[at + 46 + name : at + 46 + name + extra]
        stored, local = _zip64_sizes(fields, stored, local, directory[at + 24 : at + 28])
        at += 46 + name + extra + comment
        header = _read(source, start + local, 30)
        if header[:4] != LOCAL:
            return None
        begin = start + local + 30 + sum(struct.unpack("<HH", header[26:30]))
        if begin + stored > size:
            return None
        found += [begin, begin + stored]
    return start, found


def _zip64_sizes(fields: bytes, stored: int, local: int, plain_size: bytes) -> tuple[int, int]:
    """The compressed size and local header offset, from the zip64 extra field when the
    directory entry says 0xFFFFFFFF."""
    at = 0
    while at + 4 <= len(fields):
        kind, length = struct.unpack("<HH", fields[at : at + 4])
        if kind == 1:
            values = fields[at + 4 : at + 4 + length]
            index = 0
            if struct.unpack("<I", plain_size)[0] == 0xFFFFFFFF:
                index += 8  # the uncompressed size comes first
            if stored == 0xFFFFFFFF and index + 8 <= len(values):
                stored = struct.unpack("<Q", values[index : index + 8])[0]
                index += 8
            if local == 0xFFFFFFFF and index + 8 <= len(values):
                local = struct.unpack("<Q", values[index : index + 8])[0]
            break
        at += 4 + length
    return stored, local
