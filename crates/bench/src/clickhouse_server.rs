//! A private ClickHouse server on free local ports, in a folder of its own: the benchmark's
//! outage and the integration tests stop and start it without disturbing a shared server.

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// The server binary: `clickhouse-server` (Debian's packages), else `clickhouse server`.
fn binary() -> Option<(PathBuf, Vec<&'static str>)> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    let dirs = std::env::split_paths(&path).chain(["/usr/sbin".into(), "/usr/bin".into()]);
    let dirs: Vec<PathBuf> = dirs.collect();
    for (name, args) in [
        ("clickhouse-server", vec![]),
        ("clickhouse", vec!["server"]),
    ] {
        if let Some(p) = dirs.iter().map(|d| d.join(name)).find(|p| p.is_file()) {
            return Some((p, args));
        }
    }
    None
}

/// Whether a ClickHouse server binary is installed here.
pub fn installed() -> bool {
    binary().is_some()
}

/// Has `cmd`'s process get `signal` when the thread that spawns it ends, so that a test
/// process killed outright (a CI job's timeout) leaves no private server behind. The
/// signal follows the spawning thread, not the process: spawn from a thread that outlives
/// the server (a test's own, or a runtime's worker), never from a blocking pool's, whose
/// idle threads end.
pub(crate) fn ends_with_spawner(cmd: &mut Command, signal: libc::c_int) {
    use std::os::unix::process::CommandExt;
    // SAFETY: getpid has no preconditions.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs between fork and exec and calls only prctl and getppid,
    // both async-signal-safe; it allocates nothing.
    unsafe {
        cmd.pre_exec(move || {
            if libc::prctl(libc::PR_SET_PDEATHSIG, signal as libc::c_ulong, 0, 0, 0) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            // The spawner ended before the flag was set: nothing would signal us.
            if libc::getppid() != parent {
                return Err(std::io::Error::from_raw_os_error(libc::ESRCH));
            }
            Ok(())
        });
    }
}

/// A free port below Linux's ephemeral range (32768–60999), so no outgoing connection or
/// port-0 listener takes it between a stop and a restart of the server.
pub(crate) fn free_port() -> u16 {
    use rand::Rng;
    let mut rng = rand::thread_rng();
    for _ in 0..1000 {
        let port = rng.gen_range(20_000..32_000);
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
    panic!("no free local port between 20000 and 32000");
}

/// A ClickHouse server this process started; killed when dropped.
pub struct LocalClickHouse {
    dir: PathBuf,
    pub http_port: u16,
    child: Option<Child>,
}

impl LocalClickHouse {
    /// Starts a server with its data in `dir` and waits until it answers.
    pub async fn start(dir: &Path) -> anyhow::Result<Self> {
        let (http_port, tcp_port) = (free_port(), free_port());
        let d = dir.display();
        // `<yandex>` is the root element 18.16 knows; later releases still accept it.
        let config = format!(
            "<?xml version=\"1.0\"?>\n<yandex>\n\
             <logger><level>warning</level><log>{d}/server.log</log><errorlog>{d}/server.err.log</errorlog></logger>\n\
             <http_port>{http_port}</http_port>\n<tcp_port>{tcp_port}</tcp_port>\n\
             <listen_host>127.0.0.1</listen_host>\n<path>{d}/data/</path>\n\
             <tmp_path>{d}/tmp/</tmp_path>\n<user_files_path>{d}/user_files/</user_files_path>\n\
             <format_schema_path>{d}/format_schemas/</format_schema_path>\n\
             <users_config>{d}/users.xml</users_config>\n\
             <mark_cache_size>268435456</mark_cache_size>\n</yandex>\n"
        );
        let users = "<?xml version=\"1.0\"?>\n<yandex>\n\
             <profiles><default></default></profiles>\n\
             <users><default><password></password>\
             <networks><ip>127.0.0.1</ip><ip>::1</ip></networks>\
             <profile>default</profile><quota>default</quota></default></users>\n\
             <quotas><default></default></quotas>\n</yandex>\n";
        std::fs::create_dir_all(dir)?;
        std::fs::write(dir.join("config.xml"), config)?;
        std::fs::write(dir.join("users.xml"), users)?;
        let mut server = Self {
            dir: dir.to_path_buf(),
            http_port,
            child: None,
        };
        server.resume().await?;
        Ok(server)
    }

    pub fn url(&self) -> String {
        format!("http://127.0.0.1:{}", self.http_port)
    }

    /// Starts the stopped server again, on the same ports and data.
    pub async fn resume(&mut self) -> anyhow::Result<()> {
        let (bin, args) = binary().ok_or_else(|| {
            anyhow::anyhow!(
                "clickhouse-server is not installed (apt-get install clickhouse-server)"
            )
        })?;
        let mut cmd = Command::new(bin);
        ends_with_spawner(&mut cmd, libc::SIGKILL);
        let child = cmd
            .args(args)
            .arg(format!(
                "--config-file={}",
                self.dir.join("config.xml").display()
            ))
            .current_dir(&self.dir)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        self.child = Some(child);
        let ping = format!("{}/ping", self.url());
        let http = reqwest::Client::new();
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if let Ok(r) = http.get(&ping).send().await
                && r.status().is_success()
            {
                return Ok(());
            }
            if let Some(Ok(Some(status))) = self.child.as_mut().map(|c| c.try_wait()) {
                let log =
                    std::fs::read_to_string(self.dir.join("server.err.log")).unwrap_or_default();
                anyhow::bail!("ClickHouse exited at start ({status}): {}", tail(&log));
            }
            if Instant::now() > deadline {
                anyhow::bail!("ClickHouse did not answer on {ping} within 60 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Kills the server (SIGKILL: an outage, not a maintenance stop) and waits for it.
    pub fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Runs one query over HTTP and returns its text answer.
    pub async fn query(&self, sql: &str) -> anyhow::Result<String> {
        query(&self.url(), sql).await
    }
}

impl Drop for LocalClickHouse {
    fn drop(&mut self) {
        self.stop();
    }
}

/// One query against ClickHouse's HTTP interface at `url`; the text answer, trimmed.
pub async fn query(url: &str, sql: &str) -> anyhow::Result<String> {
    let r = reqwest::Client::new()
        .post(format!("{url}/"))
        .body(sql.to_string())
        .timeout(Duration::from_secs(30))
        .send()
        .await?;
    let ok = r.status().is_success();
    let text = r.text().await?;
    if !ok {
        anyhow::bail!("ClickHouse: {}", text.trim());
    }
    Ok(text.trim().to_string())
}

pub(crate) fn tail(s: &str) -> &str {
    let start = s.len().saturating_sub(2000);
    let start = (start..s.len())
        .find(|&i| s.is_char_boundary(i))
        .unwrap_or(s.len());
    &s[start..]
}
