//! A private Mosquitto on a free loopback port, for what the shared broker must never be
//! put through: a restart mid-stream, a login that refuses. Its data (persistence, the
//! password file, the log) lives in a temporary folder; it is killed when dropped.

use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::service_missing;

pub struct Mosquitto {
    child: Option<Child>,
    pub port: u16,
    dir: tempfile::TempDir,
}

impl Mosquitto {
    /// Starts one; `users` (name, password) make it refuse anonymous logins. `None`
    /// (outside CI) when mosquitto is not installed.
    pub async fn start(users: &[(&str, &str)]) -> Option<Self> {
        let dir = tempfile::tempdir().unwrap();
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut conf = format!(
            "listener {port} 127.0.0.1\npersistence true\npersistence_location {}/\n\
             log_dest file {}\nuser root\n",
            dir.path().display(),
            dir.path().join("mosquitto.log").display()
        );
        if users.is_empty() {
            conf.push_str("allow_anonymous true\n");
        } else {
            let pw = dir.path().join("passwords");
            for (i, (user, pass)) in users.iter().enumerate() {
                let mut cmd = Command::new("mosquitto_passwd");
                if i == 0 {
                    cmd.arg("-c");
                }
                let ok = cmd
                    .arg("-b")
                    .arg(&pw)
                    .arg(user)
                    .arg(pass)
                    .status()
                    .is_ok_and(|s| s.success());
                if !ok {
                    service_missing("mosquitto_passwd", "not installed");
                    return None;
                }
            }
            conf.push_str(&format!(
                "allow_anonymous false\npassword_file {}\n",
                pw.display()
            ));
        }
        std::fs::write(dir.path().join("mosquitto.conf"), conf).unwrap();
        let mut m = Self {
            child: None,
            port,
            dir,
        };
        if let Err(e) = m.spawn().await {
            service_missing("a private mosquitto", e);
            return None;
        }
        Some(m)
    }

    fn conf(&self) -> PathBuf {
        self.dir.path().join("mosquitto.conf")
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(self.dir.path().join("mosquitto.log")).unwrap_or_default()
    }

    async fn spawn(&mut self) -> Result<(), String> {
        let child = Command::new("mosquitto")
            .arg("-c")
            .arg(self.conf())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .map_err(|e| format!("mosquitto: {e}"))?;
        self.child = Some(child);
        for _ in 0..200 {
            if tokio::net::TcpStream::connect(("127.0.0.1", self.port))
                .await
                .is_ok()
            {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(25)).await;
        }
        Err(format!("did not listen on {}: {}", self.port, self.log()))
    }

    /// SIGTERM (it saves its sessions and queued messages), waits for it to exit, and
    /// starts it again on the same port and data.
    pub async fn restart(&mut self) {
        self.stop();
        self.resume().await;
    }

    /// Starts it again on the same port and data after [`Mosquitto::stop`].
    pub async fn resume(&mut self) {
        self.spawn().await.expect("mosquitto starts again");
    }

    /// SIGTERM (it saves its sessions and queued messages), and waits for it to exit.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(child.id().to_string())
                .status();
            let _ = child.wait();
        }
    }
}

impl Drop for Mosquitto {
    fn drop(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
