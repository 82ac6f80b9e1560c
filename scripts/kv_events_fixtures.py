"""Writes the KV-event payloads src/upstream/kv_events/wire/tests.rs decodes.

The structs below have the shapes vLLM gives its KV events (the module
vllm.distributed.kv_events): msgspec structs, tagged by class name, encoded
with msgspec's msgpack encoder as vLLM's publisher does. Current vLLM
encodes them as maps; releases before it as arrays (array_like=True).
Run with a Python that has msgspec:

    python3 scripts/kv_events_fixtures.py > src/upstream/kv_events/wire/fixtures.txt
"""

import msgspec


def shapes(array_like):
    opts = dict(omit_defaults=True, gc=False, array_like=array_like)

    class EventBatch(msgspec.Struct, **opts):
        ts: float
        events: list
        data_parallel_rank: "int | None" = None

    class Event(msgspec.Struct, tag=True, **opts):
        pass

    if array_like:
        # The earlier release: no lora_name, extra_keys or groups.
        class BlockStored(Event):
            block_hashes: list
            parent_block_hash: "int | bytes | None"
            token_ids: list
            block_size: int
            lora_id: "int | None"
            medium: "str | None"

        class BlockRemoved(Event):
            block_hashes: list
            medium: "str | None"
    else:
        class BlockStored(Event):
            block_hashes: list
            parent_block_hash: "int | bytes | None"
            token_ids: list
            block_size: int
            lora_id: "int | None"
            medium: "str | None"
            lora_name: "str | None"
            extra_keys: "list | None" = None
            group_idx: "int | None" = None
            kv_cache_spec_kind: "str | None" = None
            kv_cache_spec_sliding_window: "int | None" = None

        class BlockRemoved(Event):
            block_hashes: list
            medium: "str | None"
            group_idx: "int | None" = None

    class AllBlocksCleared(Event):
        pass

    class SomethingNew(Event):
        what: int

    return EventBatch, BlockStored, BlockRemoved, AllBlocksCleared, SomethingNew


def main():
    enc = msgspec.msgpack.Encoder()
    d1, d2, d3 = (bytes([i]) * 32 for i in (1, 2, 3))  # sha256-sized digests

    Batch, Stored, Removed, Cleared, New = shapes(array_like=False)
    current = Batch(
        ts=1764000000.25,
        events=[
            Stored([d1, d2], None, [1, 2, 3, 4], 2, None, "GPU", None),
            Stored([d3], d2, [5, 6], 2, None, "GPU", None, group_idx=1, kv_cache_spec_kind="full_attention"),
            Stored([b"\x09" * 32], None, [7, 8], 2, None, None, "my-adapter"),
            Stored([b"\x0a" * 32], None, [7, 8], 2, None, None, None, extra_keys=[["mm-hash-1"]]),
            Removed([d1], "GPU"),
            Removed([d3], "CPU", group_idx=1),
            New(what=1),
            Cleared(),
        ],
        data_parallel_rank=0,
    )
    print("current", enc.encode(current).hex())

    Batch, Stored, Removed, Cleared, New = shapes(array_like=True)
    earlier = Batch(
        ts=1750000000.5,
        events=[
            Stored([11, -12], None, [1, 2, 3, 4], 2, None, None),
            Stored([13], -12, [5, 6], 2, 3, None),
            Removed([11], None),
            Cleared(),
        ],
    )
    print("earlier", enc.encode(earlier).hex())


main()
