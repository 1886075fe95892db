//! The data folder keeps its secrets (clients' signing keys, broker passwords) from the
//! machine's other users whatever the umask latch runs under: the folder is 0700 and every
//! file latch writes in it 0600, backups too, and latch refuses a folder others can write.
//! The real binary, started as an operator's shell would (umask 022).

use std::os::unix::fs::PermissionsExt;
use std::path::Path;
use std::time::Duration;

use serde_json::json;

use crate::utils::{Process, database_url, unique, with_umask};

/// An operator's usual mask: files readable by everyone unless latch says otherwise.
const UMASK: u32 = 0o022;

fn mode(p: &Path) -> u32 {
    std::fs::metadata(p).unwrap().permissions().mode() & 0o777
}

/// Every file in `dir` whose mode is not 0600, with its mode; the log the test harness
/// itself makes there (latch's stdout) aside.
fn open_files(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap())
        .filter(|e| e.file_type().unwrap().is_file() && e.file_name() != "latch.log")
        .filter(|e| mode(&e.path()) != 0o600)
        .map(|e| format!("{:?} {:o}", e.file_name(), mode(&e.path())))
        .collect()
}

/// Runs `latch <args>` on the data folder `dir` under [`UMASK`]; its exit success and
/// output. `None` when it did not exit within a minute (it was killed).
async fn latch(dir: &Path, args: &[&str]) -> Option<(bool, String)> {
    latch_with(dir, args, &[]).await
}

/// [`latch`] with more variables set.
async fn latch_with(dir: &Path, args: &[&str], vars: &[(&str, &Path)]) -> Option<(bool, String)> {
    let mut cmd = std::process::Command::new(env!("CARGO_BIN_EXE_latch"));
    cmd.args(args).envs(vars.iter().copied());
    cmd.env("LATCH_DATA_DIR", dir)
        .env("LATCH_LISTEN", "127.0.0.1:0")
        .env_remove("LATCH_DATABASE_URL")
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped());
    with_umask(&mut cmd, UMASK);
    let mut child = cmd.spawn().expect("latch runs");
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while child.try_wait().unwrap().is_none() {
        if std::time::Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    let out = child.wait_with_output().unwrap();
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    Some((out.status.success(), text))
}

#[tokio::test]
async fn the_data_folder_its_files_and_backups_are_private_whatever_the_umask() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    let db = database_url(&dir).await;
    // The harness makes the folder (under the test's own mask) before latch starts: latch
    // closes it up.
    let p = Process::start_umask(&dir, db.clone(), &[], Some(UMASK));
    let http = reqwest::Client::new();
    p.ready(&http).await;
    // A client with its signing secret, and a reading: the store writes its log too.
    let id = unique("pv");
    let post = |path: &str, body: serde_json::Value| {
        http.post(format!("{}{path}", p.base)).json(&body).send()
    };
    assert!(
        post("/v1/sensors", json!({"id": id, "address": "a"}))
            .await
            .unwrap()
            .status()
            .is_success()
    );
    let client: serde_json::Value = post(
        "/v1/clients",
        json!({"name": "c", "url": "https://example.com/h"}),
    )
    .await
    .unwrap()
    .json()
    .await
    .unwrap();
    assert!(client["secret"].is_string(), "{client}");
    assert!(
        post("/v1/readings", json!({"sensor_id": id, "data": 1}))
            .await
            .unwrap()
            .status()
            .is_success()
    );

    assert_eq!(mode(&dir), 0o700, "the data folder");
    if db.is_none() {
        for f in ["latch.db", "latch.db-wal", "latch.db-shm", "archive.db"] {
            assert!(dir.join(f).exists(), "{f} made");
        }
    }
    assert_eq!(
        open_files(&dir),
        Vec::<String>::new(),
        "files others can read, while it runs"
    );
    assert!(p.terminate().await, "latch stops cleanly");
    assert_eq!(
        open_files(&dir),
        Vec::<String>::new(),
        "files others can read, once stopped"
    );

    if db.is_none() {
        // A backup holds every secret: 0600 too, and a restore makes a private folder.
        let backup = tmp.path().join("latch.backup");
        let (ok, out) = latch(&dir, &["backup", "--to", backup.to_str().unwrap()])
            .await
            .expect("latch backup ends");
        assert!(ok, "{out}");
        assert_eq!(mode(&backup), 0o600, "the backup");
        // The backup's key, kept beside it (as `latch restore` asks).
        let restored = tmp.path().join("restored");
        let key = [("LATCH_SECRET_KEY_FILE", dir.join("secret.key"))];
        let key: Vec<(&str, &Path)> = key.iter().map(|(k, v)| (*k, v.as_path())).collect();
        let from = ["restore", "--from", backup.to_str().unwrap()];
        let (ok, out) = latch_with(&restored, &from, &key)
            .await
            .expect("latch restore ends");
        assert!(ok, "{out}");
        assert_eq!(mode(&restored), 0o700, "the restored folder");
        assert_eq!(
            open_files(&restored),
            Vec::<String>::new(),
            "restored files"
        );
    }

    // A folder everyone may write to: someone could have put files there for latch to
    // use. latch refuses it, naming it, rather than serving from it.
    let shared = tmp.path().join("shared");
    std::fs::create_dir(&shared).unwrap();
    std::fs::set_permissions(&shared, std::fs::Permissions::from_mode(0o777)).unwrap();
    let refused = latch(&shared, &["serve"]).await;
    let Some((ok, out)) = refused else {
        panic!("latch served from a folder others can write");
    };
    assert!(!ok, "{out}");
    assert!(
        out.contains(&shared.display().to_string()) && out.contains("others can write"),
        "the error names the folder and why: {out}"
    );
    assert!(!shared.join("latch.db").exists(), "nothing made there");
}
