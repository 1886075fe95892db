//! A private PostgreSQL server on a free local port, in a folder of its own: a test that
//! restarts its database does it to this one, never to the shared server other tests use.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use crate::clickhouse_server::{ends_with_spawner, free_port, tail};

/// The folder of `initdb` and `postgres`: on `PATH`, else Debian's newest
/// `/usr/lib/postgresql/<version>/bin`.
fn bin_dir() -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    if let Some(d) = std::env::split_paths(&path).find(|d| d.join("initdb").is_file()) {
        return Some(d);
    }
    let mut versions: Vec<(u32, PathBuf)> = std::fs::read_dir("/usr/lib/postgresql")
        .ok()?
        .flatten()
        .filter_map(|e| {
            let v = e.file_name().to_string_lossy().parse().ok()?;
            let bin = e.path().join("bin");
            bin.join("initdb").is_file().then_some((v, bin))
        })
        .collect();
    versions.sort();
    versions.pop().map(|(_, bin)| bin)
}

/// The `postgres` account's uid and gid: PostgreSQL refuses to run as root.
fn postgres_account() -> anyhow::Result<(u32, u32)> {
    let passwd = std::fs::read_to_string("/etc/passwd")?;
    let line = passwd
        .lines()
        .find(|l| l.starts_with("postgres:"))
        .ok_or_else(|| anyhow::anyhow!("no postgres account to run PostgreSQL as"))?;
    let fields: Vec<&str> = line.split(':').collect();
    Ok((fields[2].parse()?, fields[3].parse()?))
}

/// A PostgreSQL server this process started; stopped at once when dropped.
pub struct LocalPostgres {
    data: PathBuf,
    bin: PathBuf,
    pub port: u16,
    /// Whom the server runs as (`postgres` when this process is root).
    account: Option<(u32, u32)>,
    child: Option<Child>,
}

impl LocalPostgres {
    /// Makes a database cluster in `dir` (trust authentication, no fsync: a test's) and
    /// starts its server. When this process is root, `dir` is handed to the `postgres`
    /// account, which must be able to reach it (a fresh temporary folder is fine).
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let bin = bin_dir().ok_or_else(|| {
            anyhow::anyhow!("PostgreSQL's initdb is not installed (apt-get install postgresql)")
        })?;
        // SAFETY: geteuid has no preconditions.
        let account = (unsafe { libc::geteuid() } == 0)
            .then(postgres_account)
            .transpose()?;
        let data = dir.join("pgdata");
        std::fs::create_dir_all(&data)?;
        if let Some((uid, gid)) = account {
            std::os::unix::fs::chown(dir, Some(uid), Some(gid))?;
            std::os::unix::fs::chown(&data, Some(uid), Some(gid))?;
        }
        let mut server = Self {
            data,
            bin,
            port: free_port(),
            account,
            child: None,
        };
        let out = server
            .command("initdb")
            // The C locale: whatever the environment names may not be installed.
            .args([
                "-A",
                "trust",
                "-U",
                "postgres",
                "--no-sync",
                "--locale=C",
                "-E",
                "UTF8",
            ])
            .arg("-D")
            .arg(&server.data)
            .output()?;
        if !out.status.success() {
            anyhow::bail!("initdb failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        server.resume().await?;
        Ok(server)
    }

    fn command(&self, program: &str) -> Command {
        use std::os::unix::process::CommandExt;
        let mut cmd = Command::new(self.bin.join(program));
        if let Some((uid, gid)) = self.account {
            cmd.uid(uid).gid(gid);
        }
        // Immediate shutdown: the postmaster ends its children before it exits. Set after
        // the account change (a change of credentials clears it).
        ends_with_spawner(&mut cmd, libc::SIGQUIT);
        cmd.stdin(Stdio::null());
        cmd
    }

    /// The URL of its `postgres` database.
    pub fn url(&self) -> String {
        format!("postgres://postgres@127.0.0.1:{}/postgres", self.port)
    }

    /// Starts the stopped server again, on the same port and data, and waits until it
    /// takes queries.
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        anyhow::ensure!(self.child.is_none(), "PostgreSQL is running already");
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.data.join("server.log"))?;
        let child = self
            .command("postgres")
            .arg("-D")
            .arg(&self.data)
            // TCP only: a socket in a long temporary path would pass the 107 bytes allowed.
            .args(["-p", &self.port.to_string(), "-k", ""])
            .args(["-c", "listen_addresses=127.0.0.1", "-c", "fsync=off"])
            .stdout(log.try_clone()?)
            .stderr(log)
            .spawn()?;
        self.child = Some(child);
        let (deadline, url) = (Instant::now() + Duration::from_secs(60), self.url());
        loop {
            let connect = tokio_postgres::connect(&url, tokio_postgres::NoTls);
            if let Ok(Ok((client, conn))) =
                tokio::time::timeout(Duration::from_secs(2), connect).await
            {
                tokio::spawn(conn);
                if client.simple_query("SELECT 1").await.is_ok() {
                    return Ok(());
                }
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                // Reaped: its pid is no longer ours to signal.
                self.child = None;
                let log = std::fs::read_to_string(self.data.join("server.log")).unwrap_or_default();
                anyhow::bail!("PostgreSQL exited at start ({status}): {}", tail(&log));
            }
            if Instant::now() > deadline {
                anyhow::bail!(
                    "PostgreSQL did not answer on port {} within 60 s",
                    self.port
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops the server as a maintenance restart would (fast shutdown: sessions are ended,
    /// what is committed stays) and waits for it.
    pub fn stop(&mut self) {
        self.signal(libc::SIGINT);
    }

    /// Stops and starts the server again.
    pub async fn restart(&mut self) -> anyhow::Result<()> {
        self.stop();
        self.resume().await
    }

    /// Sends `signal` to the server and waits for it to end: 30 s at most, then it is
    /// killed. (The postmaster ends its own children before it exits.)
    fn signal(&mut self, signal: libc::c_int) {
        let Some(mut c) = self.child.take() else {
            return;
        };
        if !matches!(c.try_wait(), Ok(None)) {
            return;
        }
        // SAFETY: kill with the pid of a child not yet waited for, so still ours.
        unsafe { libc::kill(c.id() as libc::pid_t, signal) };
        let deadline = Instant::now() + Duration::from_secs(30);
        while matches!(c.try_wait(), Ok(None)) {
            if Instant::now() > deadline {
                let _ = c.kill();
                let _ = c.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for LocalPostgres {
    fn drop(&mut self) {
        // Immediate shutdown: nothing of a test's database needs keeping.
        self.signal(libc::SIGQUIT);
    }
}
