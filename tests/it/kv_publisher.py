"""A KV-event publisher built as vLLM's is, on the same libraries (pyzmq,
msgspec): tagged msgspec structs encoded as maps, a PUB socket sending
(topic, 8-byte big-endian sequence number, payload), and a ROUTER socket
that answers a replay request (the first number wanted) with every batch
it kept from there, then number -1. It prints its two endpoints as JSON,
then publishes one batch every 20 ms, each storing one block chained to
the last, until the time given (seconds) has passed.
"""

import hashlib
import json
import sys
import time

import msgspec
import zmq


class Batch(msgspec.Struct, omit_defaults=True, gc=False):
    ts: float
    events: list
    data_parallel_rank: "int | None" = None


class Event(msgspec.Struct, tag=True, omit_defaults=True, gc=False):
    pass


class BlockStored(Event):
    block_hashes: list
    parent_block_hash: "bytes | None"
    token_ids: list
    block_size: int
    lora_id: "int | None"
    medium: "str | None"
    lora_name: "str | None"


def main():
    ctx = zmq.Context()
    pub = ctx.socket(zmq.PUB)
    port = pub.bind_to_random_port("tcp://127.0.0.1")
    router = ctx.socket(zmq.ROUTER)
    replay_port = router.bind_to_random_port("tcp://127.0.0.1")
    print(json.dumps({"events": f"tcp://127.0.0.1:{port}", "replay": f"tcp://127.0.0.1:{replay_port}"}), flush=True)
    enc = msgspec.msgpack.Encoder()
    kept, seq, parent = [], 0, None
    deadline = time.time() + float(sys.argv[1])
    while time.time() < deadline:
        while router.poll(0):
            ident, _, start = router.recv_multipart()
            first = int.from_bytes(start, "big")
            for s, payload in kept:
                if s >= first:
                    router.send_multipart([ident, b"", s.to_bytes(8, "big"), payload])
            router.send_multipart([ident, b"", (-1).to_bytes(8, "big", signed=True), b""])
        digest = hashlib.sha256(seq.to_bytes(8, "big")).digest()
        stored = BlockStored([digest], parent, [2 * seq + 1, 2 * seq + 2], 2, None, "GPU", None)
        payload = enc.encode(Batch(time.time(), [stored], 0))
        pub.send_multipart([b"", seq.to_bytes(8, "big"), payload])
        kept.append((seq, payload))
        parent, seq = digest, seq + 1
        time.sleep(0.02)


main()
