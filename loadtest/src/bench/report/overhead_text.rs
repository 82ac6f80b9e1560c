//! The words of the overhead report (`bench report overhead`): what each
//! part measures and how to read it.

pub(super) const SEPARATE_HEAD: [&str; 5] = [
    "## Latency at 200 concurrent streams",
    "",
    "Upstream: every engine step 20 ms, 32-token prompts, 64 output tokens, closed loop, direct, then through slogate; the first 3 s of each run (200 simultaneous connects) are left out. \
The simulator stamps every chunk with when its request arrived and when the chunk left (`vllm-sim --stamp-events`), so each request's TTFT splits into the engine's share and the path's (request in, first chunk out: loopback, HTTP, and slogate when it is in the path), and each inter-token gap into the gap as the replica sent it and what the path added to it. \
Comparing the path's share removes the engine's step-phase noise: a request that arrives just after a step began waits up to 20 ms more, which moves a raw TTFT p99 by milliseconds from run to run. Raw client-side numbers are shown too.",
    "",
    "| round | path | requests | failed | TTFT p50 / p99 ms | path's share of TTFT p50 / p99 ms | ITL p50 / p99 ms | replica's ITL p99 ms | path's share of a gap p99 ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|",
];

pub(super) const SEPARATE_AFTER: &str = "Separate runs differ in more than the path: the replica and the client share a core and write and read 200 events in a burst every step, and where a stream falls in that burst changes from run to run (compare the direct rows between runs). The next table compares both paths within one run.";

pub(super) const SIDE_HEAD: [&str; 4] = [
    "### Side by side in one run",
    "",
    "One load: N streams through slogate and N straight to the same replica at the same time (2N sequences in every 20-ms engine step; the first 5 s, the connects, left out), so both see the same steps and the same load on the client's and replica's core; only the path differs. The group listed first starts first and fares worse (the control below measures by how much), so odd runs list slogate first and even runs direct first. At N = 200:",
    "\n| round | path | requests | failed | TTFT p99 ms | path's share of TTFT p50 / p99 ms | ITL p99 ms | replica's ITL p99 ms | path's share of a gap p99 ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|",
];

pub(super) const SIDE_ADDED_HEAD: [&str; 4] = [
    "",
    "Added by slogate, side by side, by streams per path:",
    "",
    "| streams per path | TTFT p50 ms | TTFT p99 ms | ITL p99 ms | path's share of a gap p99 ms | CPU 0 / CPU 1 busy |\n|---:|---|---|---|---|---|",
];

pub(super) const SIDE_AFTER: &str = "TTFT: the path's share of TTFT, slogate minus direct. ITL: how much further the path moves the client's ITL p99 from the replica's, slogate minus direct. \
The control row runs the same way with both groups direct (the group listed first minus the second): how far apart two identical paths land in this method, by the order alone. ";

pub(super) const SIDE_CORES_PINNED: &str = "CPU 0 runs the simulator and the load generator, CPU 1 slogate alone: the busy shares show which side is the bottleneck (when CPU 0 is near 100 %, every event waits its turn behind the whole step's burst there, and events that took the extra hop through slogate reach the back of that queue).";

pub(super) const SIDE_CORES_SHARED: &str = "Busy share of each core over the run (all three processes on both).";

pub(super) const MIX_HEAD: [&str; 4] = [
    "### Interleaved in one group",
    "",
    "One load of 400 closed-loop streams whose requests take the two paths in turn: one through slogate, the next straight to the replica, and so on (about 200 in flight on each). Nothing starts first, and every step's burst alternates between the paths, so both meet the same moment on the client's and the replica's core. The A/A run does the same with both paths direct: how far apart two identical paths land in this method. Rounds:",
    "\n| round | path | requests | failed | TTFT p99 ms | path's share of TTFT p50 / p99 ms | ITL p99 ms | replica's ITL p99 ms | path's share of a gap p99 ms |\n|---|---|---:|---:|---:|---:|---:|---:|---:|",
];

/// The head of the tables of what a proxy adds, interleaved.
pub(super) const ADDED_TABLE: &str =
    "| run | TTFT p50 ms | of which in / out, p50 ms | TTFT p99 ms | ITL p99 ms | path's share of a gap p99 ms | CPU 0 / CPU 1 busy |\n|---|---|---|---|---|---|---|";

pub(super) const MIX_ADDED_HEAD: [&str; 4] = [
    "",
    "Added by slogate, interleaved (the p50 split at the replica into the request's way in and the first chunk's way out, from the client's send time and the simulator's arrival stamp on the shared wall clock):",
    "",
    ADDED_TABLE,
];

pub(super) const MIX_ROUNDS: &str = "Each round at 200 per path, slogate minus direct, TTFT p99 / ITL p99 in ms, with the time the hypervisor took CPU 0 / CPU 1 away during the run (steal, from /proc/stat; this machine is a VM on a shared host): ";

pub(super) const MIX_HOP: &str = "At 32 per path the cores are mostly idle and the added time is the hop itself (two more loopback crossings and slogate's work on the request and on each event). At 200 the client's and replica's core is busy for milliseconds after every step, and a request or event that crosses slogate meanwhile waits in that same line rather than after it, so much of the hop is hidden; what remains is what a caller sees at that load.";

pub(super) const MIX_WAVES: &str = "In a wave slogate takes in a hundred or more new requests (about 30 us of work each) in the same few milliseconds as it relays the final events of the streams ending, and those gaps are enough to move a p99 (one gap in 63 is 1.6 %). Callers do not run in lockstep; the 32-96 row shows the hop without the waves. \
Between steps slogate's core has nothing to do for most of the 20 ms, and on this VM an idle vCPU halts (the guest does not poll before halting), so the first events of every step also wait for the hypervisor to wake slogate's core; the `server.busy_poll` runs below keep it awake, and what they remove is what those wake-ups cost.";

pub(super) const MIX_TARGETS: &str =
    "Targets at 200 streams, interleaved (the method the checks are read on: its A/A control is far tighter than the side-by-side one). ";

pub(super) const BUSY_ABOUT: &str = "The same interleaved loads in the same run through a second slogate whose workers poll for I/O instead of sleeping while streams are open (started for these runs only, so it never shares CPU 1 with the default one). \
On this VM an idle vCPU halts (the guest's `cpuidle-haltpoll` has `guest_halt_poll_ns` 0), and the first event after every pause wakes it through the hypervisor; polling keeps slogate's core awake. The price is slogate's CPU, in seconds over a run of ";

pub(super) const HAP_ABOUT: &str = " in slogate's place, placed as slogate is, in the same run and the same interleaved method (HAProxy vs direct, 200 each). \
In `mode tcp` HAProxy relays bytes and parses nothing: what one more loopback hop costs on this machine, whatever the proxy. In `mode http` (`option http-no-delay`, connections to the replica reused) it parses each request and response as slogate does, without reading the events. \
The relay does the least work any proxy can, one read and one write per event.";

pub(super) const TPUT_ABOUT: &str = "Upstream: 1 ms engine steps, 16 output tokens (18 SSE events per stream); closed loop; direct, then slogate, at each concurrency. slogate CPU is its user+system time over the run divided by the requests it served: the cost per streamed request, independent of how busy the other two processes keep the cores. CPU 0 time per request is that core's busy time over the run divided by the requests served";

pub(super) const TPUT_PINNED: &str =
    ": with slogate on CPU 1, the simulator's and load generator's own cost per request, which decides the rate once CPU 0 is saturated.";

pub(super) const TPUT_TABLE: &str = "| round | concurrency | direct req/s | slogate req/s | ratio | failed (direct/slogate) | slogate CPU per request | CPU 0 / CPU 1 busy, direct | CPU 0 / CPU 1 busy, slogate | CPU 0 time per request, direct / slogate |\n|---:|---:|---:|---:|---:|---|---:|---|---|---|";

pub(super) const PAIR_ABOUT: &str = "One load: N streams through slogate and N straight to the same replica at the same time (the same 1-ms steps, 16 tokens; the first 5 s left out), so both paths share the engine and the client's and replica's CPU and only the path differs; the order of the two groups alternates between runs. \
The separate runs above answer a different question: how the whole machine's rate moves when every request takes the extra hop, which on this machine includes how the client and replica, sharing a core, fare with or without it. \
The A/A run puts two groups of 256 straight to the replica: how far apart two identical groups land in this method.";

pub(super) const PAIR_TABLE: &str = "| round | streams per path | direct req/s | slogate req/s | ratio | failed (direct/slogate) | CPU 0 / CPU 1 busy | A/A at 256: ratio |\n|---:|---:|---:|---:|---:|---|---|---:|";
