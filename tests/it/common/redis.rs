//! A real Redis server for the limit store's tests.

use std::time::Duration;

use super::*;

/// A real Redis server (Debian's `redis-server`, which `scripts/test`
/// installs) on a free loopback port, without persistence; stopped on drop.
pub struct Redis {
    pub port: u16,
    child: std::process::Child,
}

impl Redis {
    pub async fn start() -> Redis {
        let bin = which("redis-server").expect("redis-server not found: run scripts/test, which installs Debian's redis-server");
        for _ in 0..5 {
            // A free port: bound and released (a race with another process is retried).
            let port = std::net::TcpListener::bind("127.0.0.1:0").and_then(|l| l.local_addr()).expect("a free port").port();
            let mut child = std::process::Command::new(&bin)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"])
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .spawn()
                .expect("start redis-server");
            let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
            while tokio::time::Instant::now() < deadline {
                if let Ok(Some(_)) = child.try_wait() {
                    break; // it exited: the port was taken meanwhile
                }
                if Redis::ping(port).await {
                    return Redis { port, child };
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("redis-server did not start");
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/0", self.port)
    }

    /// Does something answer PING on `port`?
    pub async fn ping(port: u16) -> bool {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let Ok(mut s) = tokio::net::TcpStream::connect(("127.0.0.1", port)).await else { return false };
        if s.write_all(b"PING\r\n").await.is_err() {
            return false;
        }
        let mut buf = [0u8; 7];
        matches!(tokio::time::timeout(Duration::from_secs(1), s.read_exact(&mut buf)).await, Ok(Ok(_))) && &buf == b"+PONG\r\n"
    }

    /// Stop the server now (as an outage would).
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
