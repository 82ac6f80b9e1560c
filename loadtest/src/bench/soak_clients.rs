//! `bench soak-clients`: misbehaving clients for the soak benchmark, on
//! loopback only, for a bounded time. Four workers, each in turn:
//!
//! - hangs up mid-stream (reads a little of a streamed answer, closes);
//! - stops reading (a 4 KiB receive buffer, nothing read for 10 s, then
//!   closes);
//! - sends half a request head and waits for the gateway to close it (at
//!   most 10 s).
//!
//! It prints a one-line summary of what each did.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};
use tokio::net::{TcpSocket, TcpStream};
use tokio::time::{timeout, Instant};

/// How long a client waits on a connect or a read, and how long a stopped
/// reader holds its unread stream.
const PATIENCE: Duration = Duration::from_secs(10);

const BODY: &str = r#"{"model":"sim-llama-8b","stream":true,"max_tokens":2000,"messages":[{"role":"user","content":"soak"}]}"#;

/// What the workers did, in the order the summary prints it.
#[derive(Default)]
struct Counts {
    hang_ups: AtomicU64,
    stopped_readers: AtomicU64,
    half_heads: AtomicU64,
    half_heads_closed: AtomicU64,
    errors: AtomicU64,
}

impl Counts {
    fn summary(&self) -> String {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        format!(
            "hang-ups {}, stopped readers {}, half heads {}, half heads closed by slogate {}, errors {}",
            n(&self.hang_ups),
            n(&self.stopped_readers),
            n(&self.half_heads),
            n(&self.half_heads_closed),
            n(&self.errors)
        )
    }
}

fn request() -> Vec<u8> {
    format!(
        "POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{BODY}",
        BODY.len()
    )
    .into_bytes()
}

fn io_err(what: &str) -> std::io::Error {
    std::io::Error::new(std::io::ErrorKind::TimedOut, what.to_string())
}

async fn connect(addr: SocketAddr) -> std::io::Result<TcpStream> {
    timeout(PATIENCE, TcpStream::connect(addr)).await.map_err(|_| io_err("connect timed out"))?
}

/// Sends a streamed request, reads at most 300 bytes of the answer, closes.
async fn hang_up(addr: SocketAddr, counts: &Counts) -> std::io::Result<()> {
    let mut s = connect(addr).await?;
    s.write_all(&request()).await?;
    let mut buf = [0u8; 300];
    timeout(PATIENCE, s.read(&mut buf)).await.map_err(|_| io_err("read timed out"))??;
    counts.hang_ups.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Sends a streamed request on a small receive buffer and reads nothing.
async fn stop_reading(addr: SocketAddr, hold: Duration, counts: &Counts) -> std::io::Result<()> {
    let socket = if addr.is_ipv4() { TcpSocket::new_v4()? } else { TcpSocket::new_v6()? };
    socket.set_recv_buffer_size(4096)?;
    let mut s = timeout(PATIENCE, socket.connect(addr)).await.map_err(|_| io_err("connect timed out"))??;
    s.write_all(&request()).await?;
    tokio::time::sleep(hold).await;
    drop(s);
    counts.stopped_readers.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

/// Sends half a request head and waits for the gateway to close.
async fn half_head(addr: SocketAddr, counts: &Counts) -> std::io::Result<()> {
    let mut s = connect(addr).await?;
    s.write_all(b"POST /v1/chat/completions HTTP/1.1\r\nhost: soak\r\n").await?;
    let mut buf = [0u8; 1024];
    // A timeout or a reset is not a close the gateway chose: not counted as one.
    if let Ok(Ok(0)) = timeout(PATIENCE, s.read(&mut buf)).await {
        counts.half_heads_closed.fetch_add(1, Ordering::Relaxed);
    }
    counts.half_heads.fetch_add(1, Ordering::Relaxed);
    Ok(())
}

async fn worker(i: usize, addr: SocketAddr, deadline: Instant, counts: Arc<Counts>) {
    let mut n = i;
    while Instant::now() < deadline {
        let done = match n % 3 {
            0 => hang_up(addr, &counts).await,
            1 => stop_reading(addr, PATIENCE, &counts).await,
            _ => half_head(addr, &counts).await,
        };
        if done.is_err() {
            counts.errors.fetch_add(1, Ordering::Relaxed);
        }
        n += 1;
    }
}

/// Runs the four workers against `host:port` for `seconds`; returns the summary.
pub fn run(host: &str, port: u16, seconds: f64) -> Result<String, String> {
    // The benchmarks' one loopback rule (the timeline's), then the address.
    super::timeline::loopback(&format!("http://{host}:{port}"))?;
    let ip: std::net::IpAddr = match host {
        "localhost" => std::net::Ipv4Addr::LOCALHOST.into(),
        h => h.trim_matches(['[', ']']).parse().map_err(|_| format!("{h}: not an address"))?,
    };
    if !(seconds.is_finite() && seconds >= 0.0) {
        return Err(format!("{seconds}: not a duration in seconds"));
    }
    let addr = SocketAddr::new(ip, port);
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build().map_err(|e| e.to_string())?;
    let counts = Arc::new(Counts::default());
    rt.block_on(async {
        let deadline = Instant::now() + Duration::from_secs_f64(seconds);
        let workers: Vec<_> = (0..4).map(|i| tokio::spawn(worker(i, addr, deadline, counts.clone()))).collect();
        for w in workers {
            w.await.map_err(|e| e.to_string())?;
        }
        Ok::<_, String>(())
    })?;
    Ok(counts.summary())
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::net::TcpListener;

    #[test]
    fn refuses_a_host_off_this_machine() {
        assert!(run("10.0.0.1", 80, 1.0).unwrap_err().contains("loopback only"));
        assert!(run("example.com", 80, 1.0).is_err());
    }

    #[test]
    fn request_is_one_whole_http_request() {
        let r = String::from_utf8(request()).unwrap();
        let (head, body) = r.split_once("\r\n\r\n").unwrap();
        assert!(head.starts_with("POST /v1/chat/completions HTTP/1.1\r\n"));
        assert!(head.contains(&format!("content-length: {}", body.len())));
        assert!(serde_json::from_str::<serde_json::Value>(body).is_ok());
    }

    /// Against a server that answers a little and closes a half head at
    /// once, each kind is counted as what it did.
    #[tokio::test]
    async fn each_kind_is_counted() {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let addr = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buf = vec![0u8; 4096];
                    let n = s.read(&mut buf).await.unwrap_or(0);
                    if buf[..n].ends_with(b"}") {
                        let _ = s.write_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n\r\ndata: {}\n\n").await;
                        tokio::time::sleep(Duration::from_secs(60)).await;
                    }
                });
            }
        });
        let counts = Counts::default();
        hang_up(addr, &counts).await.unwrap();
        stop_reading(addr, Duration::from_millis(1), &counts).await.unwrap();
        half_head(addr, &counts).await.unwrap();
        assert_eq!(counts.summary(), "hang-ups 1, stopped readers 1, half heads 1, half heads closed by slogate 1, errors 0");
    }
}
