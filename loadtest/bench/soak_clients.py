#!/usr/bin/env python3
"""Misbehaving clients for loadtest/bench/soak.sh, on 127.0.0.1 only, for a
bounded time: four threads, each in turn

  - hangs up mid-stream (reads a little, closes);
  - stops reading (a 4 KiB receive buffer, nothing read for 10 s, then closes);
  - sends half a request head and waits for slogate to close it (at most 10 s).

    soak_clients.py HOST PORT SECONDS      -> prints a one-line summary
"""
import socket
import sys
import threading
import time

host, port, secs = sys.argv[1], int(sys.argv[2]), float(sys.argv[3])
assert host in ("127.0.0.1", "localhost"), "loopback only"
deadline = time.monotonic() + secs
counts = {"hang-ups": 0, "stopped readers": 0, "half heads": 0, "half heads closed by slogate": 0, "errors": 0}
lock = threading.Lock()
BODY = b'{"model":"sim-llama-8b","stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"soak"}]}'
REQ = (b"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\ncontent-length: "
       + str(len(BODY)).encode() + b"\r\n\r\n" + BODY)


def count(k):
    with lock:
        counts[k] += 1


def hang_up():
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(REQ)
        s.recv(300)
    count("hang-ups")


def stop_reading():
    s = socket.socket()
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.settimeout(10)
    s.connect((host, port))
    s.sendall(REQ)
    time.sleep(10)
    s.close()
    count("stopped readers")


def half_head():
    with socket.create_connection((host, port), timeout=10) as s:
        s.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\n")
        try:
            if s.recv(1024) == b"":
                count("half heads closed by slogate")
        except (socket.timeout, OSError):
            pass
    count("half heads")


def worker(i):
    kinds = [hang_up, stop_reading, half_head]
    n = i
    while time.monotonic() < deadline:
        try:
            kinds[n % 3]()
        except OSError:
            count("errors")
        n += 1


threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
for t in threads:
    t.start()
for t in threads:
    t.join()
print(", ".join(f"{k} {v}" for k, v in counts.items()))
