"""Where an open stream's memory goes: the live heap of a gateway built with
`--features heap-profile` (dhat), at its peak with N streams open, sorted by
what allocated it (each allocation's call stack, matched against the rules
below, first match wins) and divided by N.

Usage: scale_heap.py N PROTO=DHAT_JSON...   (a Markdown table on stdout)
"""
import json
import sys

# (item, frames that must all appear in the allocation's call stack)
RULES = [
    ("a panic's backtrace being printed (debug info; not per stream)", ["std::backtrace_rs"]),
    ("replica connection: hyper's request channel (a block of 32 request slots)", ["hyper::client::dispatch::channel", "tokio::sync::mpsc::block"]),
    ("replica connection: hyper's write buffer (8 KiB, fixed in hyper)", ["hyper::proto::h1::io::WriteBuf::new", "hyper::client::conn"]),
    ("replica connection: read buffer (4 KiB, `read_buf_exact_size`)", ["hyper::proto::h1::io::Buffered::poll_read_from_io", "hyper::client::conn"]),
    ("client HTTP/1.1 connection: write buffer (8 KiB, fixed in hyper)", ["hyper::proto::h1::io::WriteBuf::new"]),
    ("client HTTP/1.1 connection: read buffer", ["hyper::proto::h1::io::Buffered::poll_read_from_io"]),
    ("the request's future until its response head (routing, admission, connect)", ["tower::util::boxed_clone::BoxCloneService"]),
    ("stream observer (SSE parser, timings, outcome)", ["slogate::proxy::observe"]),
    ("request sent to the replica (its head and body)", ["slogate::proxy::build_upstream_request"]),
    ("request sent to the replica (its head and body)", ["slogate::proxy::body"]),
    ("replica connection: other (channels, socket registration, request queued)", ["slogate::upstream::conn"]),
    ("client HTTP/1.1 connection: other", ["hyper::server::conn::http1"]),
    ("client HTTP/2 connection: stream state (h2: streams, frames queued, headers)", [": h2::"]),
    ("client connection's task (hyper's connection and its state)", ["tokio::runtime::task::core::Cell", "slogate::server::serve::{{closure}} "]),
    ("other tasks (tokio: a stream's watchdog, a replica connection's)", ["tokio::runtime::task::core::Cell"]),
    ("socket registrations (tokio)", ["tokio::runtime::io::registration_set"]),
    ("request head as parsed (headers, extensions)", ["http::header::map"]),
    ("request head as parsed (headers, extensions)", ["http::extensions"]),
    ("other slogate", ["slogate::"]),
]
OTHER = "other"


def plain(frame):
    """A frame without generic arguments (`Foo<T>::new` -> `Foo::new`), as the rules name it."""
    out, depth = [], 0
    for i, ch in enumerate(frame):
        if ch == "<" and (depth > 0 or (i > 0 and (frame[i - 1].isalnum() or frame[i - 1] == "_"))):
            depth += 1
        elif ch == ">" and depth > 0:
            depth -= 1
        elif depth == 0:
            out.append(ch)
    return "".join(out)


def breakdown(path):
    d = json.load(open(path))
    ftbl = [plain(f) for f in d["ftbl"]]
    out = {}
    for pp in d["pps"]:
        if pp["gb"] == 0:
            continue
        stack = " | ".join(ftbl[i] for i in pp["fs"])
        item = next((name for name, need in RULES if all(n in stack for n in need)), OTHER)
        out[item] = out.get(item, 0) + pp["gb"]
    return out


def main():
    n = int(sys.argv[1])
    runs = []
    for arg in sys.argv[2:]:
        proto, path = arg.split("=", 1)
        runs.append((proto, breakdown(path)))
    items = [name for name, _ in RULES] + [OTHER]
    items = list(dict.fromkeys(i for i in items if any(b.get(i) for _, b in runs)))
    print(f"| item (bytes per open stream, {n} streams) | " + " | ".join(p for p, _ in runs) + " |")
    print("|---|" + "---:|" * len(runs))
    for item in items:
        print(f"| {item} | " + " | ".join(f"{b.get(item, 0) / n:,.0f}" for _, b in runs) + " |")
    print("| **live heap at the peak, per open stream** | " + " | ".join(f"**{sum(b.values()) / n:,.0f}**" for _, b in runs) + " |")


main()
