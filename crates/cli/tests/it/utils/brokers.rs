//! Private brokers a test starts on free ports and stops when it wants to: an outage of a
//! broker latch ingests from, without touching the shared services other tests use.
//! Each is killed when dropped, so a failing test leaves none behind.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// A port free on loopback now.
pub fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Waits until something accepts connections on `port` (`Err` after `secs`).
async fn listening(port: u16, secs: u64) -> Result<(), String> {
    let deadline = Instant::now() + Duration::from_secs(secs);
    loop {
        if tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .is_ok()
        {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("nothing listened on port {port} within {secs} s"));
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Kills `child` and every process of its group (SIGKILL): `rabbitmq-server` runs the
/// Erlang VM as a child of its own, which would live on without its script.
fn kill(child: &mut Option<Child>) {
    if let Some(mut c) = child.take() {
        // The group was made for the child (`process_group(0)`): its id is the child's.
        // SAFETY: kill(2) with a group id and a signal number touches no memory.
        unsafe {
            libc::kill(-(c.id() as libc::pid_t), libc::SIGKILL);
        }
        let _ = c.wait();
    }
}

/// A command in a process group of its own, so [`kill`] takes all it starts.
fn command(program: &str) -> Command {
    use std::os::unix::process::CommandExt;
    let mut c = Command::new(program);
    c.process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    c
}

/// A Mosquitto of its own on a free loopback port.
pub struct Mosquitto {
    pub port: u16,
    child: Option<Child>,
}

impl Mosquitto {
    /// Starts one; `Err` when Mosquitto cannot be run here.
    pub async fn start() -> Result<Self, String> {
        let mut m = Self {
            port: free_port(),
            child: None,
        };
        m.resume().await?;
        Ok(m)
    }

    /// Starts it again on the same port after [`Mosquitto::stop`].
    pub async fn resume(&mut self) -> Result<(), String> {
        let child = command("mosquitto")
            .args(["-p", &self.port.to_string()])
            .spawn()
            .map_err(|e| format!("mosquitto: {e}"))?;
        self.child = Some(child);
        listening(self.port, 10).await
    }

    /// Kills it: every connection to it drops at once.
    pub fn stop(&mut self) {
        kill(&mut self.child);
    }

    pub fn url(&self, client_id: &str) -> String {
        format!("mqtt://127.0.0.1:{}?client_id={client_id}", self.port)
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        self.stop();
    }
}

/// A RabbitMQ node of its own (its own name, ports and data folder) on a free loopback
/// port, with the default `guest` user.
pub struct Rabbit {
    pub port: u16,
    dist_port: u16,
    dir: PathBuf,
    _tmp: tempfile::TempDir,
    child: Option<Child>,
}

impl Rabbit {
    /// Starts one (about ten seconds); `Err` when RabbitMQ cannot be run here.
    pub async fn start() -> Result<Self, String> {
        Self::start_with(&[]).await
    }

    /// [`Rabbit::start`] with `plugins` enabled (the shared broker's are not ours to change).
    pub async fn start_with(plugins: &[&str]) -> Result<Self, String> {
        let tmp = tempfile::tempdir().map_err(|e| e.to_string())?;
        std::fs::write(
            tmp.path().join("enabled_plugins"),
            format!("[{}].", plugins.join(",")),
        )
        .map_err(|e| e.to_string())?;
        let mut r = Self {
            port: free_port(),
            dist_port: free_port(),
            dir: tmp.path().to_path_buf(),
            _tmp: tmp,
            child: None,
        };
        r.resume().await?;
        Ok(r)
    }

    fn env(dir: &Path, name: &str) -> PathBuf {
        dir.join(name)
    }

    /// Starts it again on the same port and data after [`Rabbit::stop`]: what was durable
    /// (the queue) is there again.
    pub async fn resume(&mut self) -> Result<(), String> {
        let d = &self.dir;
        let child = command("/usr/lib/rabbitmq/bin/rabbitmq-server")
            .env("HOME", d)
            .env(
                "RABBITMQ_NODENAME",
                format!("latchit{}@localhost", self.port),
            )
            .env("RABBITMQ_NODE_IP_ADDRESS", "127.0.0.1")
            .env("RABBITMQ_NODE_PORT", self.port.to_string())
            .env("RABBITMQ_DIST_PORT", self.dist_port.to_string())
            .env("RABBITMQ_MNESIA_BASE", Self::env(d, "mnesia"))
            .env("RABBITMQ_LOG_BASE", Self::env(d, "log"))
            .env(
                "RABBITMQ_ENABLED_PLUGINS_FILE",
                Self::env(d, "enabled_plugins"),
            )
            .env("RABBITMQ_PLUGINS_EXPAND_DIR", Self::env(d, "plugins"))
            .env("RABBITMQ_PID_FILE", Self::env(d, "pid"))
            .env("RABBITMQ_CONFIG_FILE", Self::env(d, "none"))
            .spawn()
            .map_err(|e| format!("rabbitmq-server: {e}"))?;
        self.child = Some(child);
        listening(self.port, 60).await
    }

    /// Kills it (SIGKILL): every connection to it drops at once.
    pub fn stop(&mut self) {
        kill(&mut self.child);
    }

    pub fn url(&self) -> String {
        format!("amqp://guest:guest@127.0.0.1:{}/%2f", self.port)
    }
}

impl Drop for Rabbit {
    fn drop(&mut self) {
        self.stop();
    }
}
