//! The real `latch` binary as a child process, for what an in-process server cannot be put
//! through: SIGKILL, SIGTERM, and a pause (SIGSTOP) that outlives its leases.

use std::path::Path;

use super::eventually;

/// A running `latch serve`; killed when dropped, so a test that fails midway leaves none.
pub struct Process {
    child: std::process::Child,
    pub base: String,
}

impl Process {
    pub fn start(dir: &Path, database_url: Option<String>) -> Self {
        Self::start_env(dir, database_url, &[])
    }

    /// As [`Process::start`], with more `LATCH_*` settings.
    pub fn start_env(dir: &Path, database_url: Option<String>, env: &[(&str, String)]) -> Self {
        Self::start_umask(dir, database_url, env, None)
    }

    /// As [`Process::start_env`], under the file-creation mask `umask` when given (an
    /// operator's shell, say, rather than the packaged unit's).
    pub fn start_umask(
        dir: &Path,
        database_url: Option<String>,
        env: &[(&str, String)],
        umask: Option<u32>,
    ) -> Self {
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_latch"));
        // Its receivers are on loopback, which the SSRF guard refuses by default.
        cmd.env("LATCH_DELIVERY_ALLOW_NETS", "127.0.0.0/8");
        if let Some(url) = database_url {
            cmd.env("LATCH_DATABASE_URL", url);
            // Nodes of one database share its key (a test may give its own in `env`).
            cmd.env("LATCH_SECRET_KEY", super::test_secret_key());
        }
        cmd.env("LATCH_RETRY_BASE", "300ms")
            .env("LATCH_RETRY_MAX_DELAY", "1s")
            .env("LATCH_DELIVERY_TIMEOUT", "1s")
            .env("LATCH_LOG", "warn");
        cmd.envs(env.iter().map(|(k, v)| (k, v)));
        if let Some(mask) = umask {
            with_umask(&mut cmd, mask);
        }
        // Latch makes its data folder itself; the log goes there before it does.
        std::fs::create_dir_all(dir).unwrap();
        let child = cmd
            .arg("serve")
            .env("LATCH_LISTEN", format!("127.0.0.1:{port}"))
            .env("LATCH_DATA_DIR", dir)
            // Its log, for a test that fails to show (`Process::log`).
            .stdout(std::fs::File::create(dir.join("latch.log")).unwrap())
            .spawn()
            .unwrap();
        Self {
            child,
            base: format!("http://127.0.0.1:{port}"),
        }
    }

    pub async fn ready(&self, http: &reqwest::Client) {
        self.answers(http, "/readyz", "latch process ready").await;
    }

    /// Waits until it answers `/healthz` (it may not be ready: a broker it cannot reach).
    pub async fn alive(&self, http: &reqwest::Client) {
        self.answers(http, "/healthz", "latch process alive").await;
    }

    /// Waits until `path` answers 2xx. A minute: on a busy machine a process on PostgreSQL
    /// with a 1 s `database_timeout` was once seen to take more than 20 s to be ready.
    async fn answers(&self, http: &reqwest::Client, path: &str, what: &str) {
        eventually(60, what, || async {
            http.get(format!("{}{path}", self.base))
                .send()
                .await
                .ok()
                .filter(|r| r.status().is_success())
                .map(|_| ())
        })
        .await;
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn kill9(mut self) {
        self.child.kill().unwrap(); // SIGKILL on Unix
        self.child.wait().unwrap();
    }

    /// SIGTERM, then waits for it to exit; `true` when it exited with success.
    pub async fn terminate(mut self) -> bool {
        self.signal("TERM");
        let mut child = std::mem::replace(&mut self.child, dummy_child());
        tokio::task::spawn_blocking(move || child.wait().map(|s| s.success()).unwrap_or(false))
            .await
            .unwrap()
    }

    /// SIGSTOP: the process stays, but neither runs nor answers, until [`Process::resume`].
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// SIGCONT after [`Process::pause`].
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let status = std::process::Command::new("kill")
            .arg(format!("-{name}"))
            .arg(self.child.id().to_string())
            .status()
            .expect("kill runs");
        assert!(status.success(), "kill -{name} {}", self.child.id());
    }
}

/// Runs `cmd` under the file-creation mask `mask`.
pub fn with_umask(cmd: &mut std::process::Command, mask: u32) {
    use std::os::unix::process::CommandExt;
    // SAFETY: umask(2) between fork and exec touches no memory and cannot fail.
    unsafe {
        cmd.pre_exec(move || {
            libc::umask(mask as libc::mode_t);
            Ok(())
        });
    }
}

/// A finished child to leave in place of one [`Process::terminate`] took away to wait on.
fn dummy_child() -> std::process::Child {
    let mut c = std::process::Command::new("true")
        .spawn()
        .expect("true runs");
    let _ = c.wait();
    c
}

impl Drop for Process {
    fn drop(&mut self) {
        // SIGKILL ends a paused process too.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
