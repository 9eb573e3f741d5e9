"""W&B's offline run files read back with W&B's own record type: a run's ``run-ID.wandb`` is a log of W&B's
protobuf ``Record``s in LevelDB's log format (32 KiB blocks of records, each with a 7-byte header: checksum,
length, type full/first/middle/last), after a 7-byte file header (``:W&B``, 0xBEE1, version 0). W&B ships its
reader in its Go core only, so the tests read the format here."""

from __future__ import annotations

import json
import struct
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

BLOCK = 32768
HEADER = struct.Struct("<4sHB")
RECORD = struct.Struct("<IHB")
FULL, FIRST, MIDDLE, LAST = 1, 2, 3, 4


def _chunks(data: bytes) -> Iterator[bytes]:
    ident, magic, version = HEADER.unpack_from(data)
    assert (ident, magic, version) == (b":W&B", 0xBEE1, 0), "not a W&B run file"
    position, pending = HEADER.size, b""
    while position + RECORD.size <= len(data):
        left = BLOCK - position % BLOCK
        if left < RECORD.size:  # the block's tail is padding
            position += left
            continue
        _, length, kind = RECORD.unpack_from(data, position)
        if kind == 0 and length == 0:  # zeros to the block's end
            position += left
            continue
        chunk = data[position + RECORD.size:position + RECORD.size + length]
        position += RECORD.size + length
        if kind == FULL:
            yield chunk
        elif kind == FIRST:
            pending = chunk
        elif kind == MIDDLE:
            pending += chunk
        elif kind == LAST:
            yield pending + chunk
            pending = b""


@dataclass
class OfflineRun:
    run_ids: set[str] = field(default_factory=set)
    groups: set[str] = field(default_factory=set)
    history: list[dict[str, object]] = field(default_factory=list)  # each logged step: {"_step": N, key: value}


def read_run(path: Path) -> OfflineRun:
    from wandb.proto import wandb_internal_pb2

    found = OfflineRun()
    for chunk in _chunks(path.read_bytes()):
        record = wandb_internal_pb2.Record()
        record.ParseFromString(chunk)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            found.run_ids.add(record.run.run_id)
            found.groups.add(record.run.run_group)
        elif kind == "history":
            found.history.append({item.key or "/".join(item.nested_key): json.loads(item.value_json)
                                  for item in record.history.item})
    return found
