//! The container image from `scripts/image` (deploy/container/Containerfile), run with
//! podman: the README walk-through against latch in the container, as its own user, with
//! its data in the image's volume.

use std::process::Command;

use crate::utils::{self, Latch, Proc, Receiver, free_port, run, tool};

/// Removes the test's container (and its anonymous volume) and image, however it ends.
struct Cleanup {
    podman: std::path::PathBuf,
    container: String,
    image: String,
}

impl Drop for Cleanup {
    fn drop(&mut self) {
        let podman = |args: &[&str]| {
            let _ = Command::new(&self.podman).args(args).output();
        };
        podman(&["rm", "--force", "--volumes", &self.container]);
        podman(&["rmi", "--force", &self.image]);
    }
}

#[tokio::test]
async fn the_container_image_serves_the_walk_through() {
    let Some(podman) = tool("podman", "podman") else {
        return;
    };
    let Some(_) = tool("strip", "binutils") else {
        return;
    };
    let id = ulid::Ulid::new().to_string().to_lowercase();
    let cleanup = Cleanup {
        podman: podman.clone(),
        container: format!("latch-test-{id}"),
        image: format!("localhost/latch-test:{id}"),
    };
    let built = run(Command::new(utils::repo().join("scripts/image"))
        .env("CONTAINER_ENGINE", &podman)
        .args(["--tag", &cleanup.image])
        .arg("--binary")
        .arg(utils::latch_binary()));
    assert_eq!(built.trim(), cleanup.image);

    // The host's network, so the container reaches the test's receiver on loopback and
    // the test reaches latch there, and no traffic leaves loopback.
    let port = free_port();
    let mut cmd = Command::new(&podman);
    // A sandboxed machine (CI's) may lack CAP_SYS_RESOURCE, so the runtime cannot raise
    // the open-files limit to podman's default, and may mix cgroup v1 and v2, which crun
    // refuses: runc when installed, and limits at most what the machine allows.
    if tool("runc", "runc").is_some() {
        cmd.args(["--runtime", "runc"]);
    }
    cmd.args([
        "run",
        "--rm",
        "--name",
        &cleanup.container,
        "--network",
        "host",
    ])
    .args([
        "--ulimit",
        "nofile=4096:4096",
        "--ulimit",
        "nproc=4096:4096",
    ])
    .args(["--env", &format!("LATCH_LISTEN=127.0.0.1:{port}")])
    .args(["--env", "LATCH_DELIVERY_ALLOW_NETS=127.0.0.0/8"])
    .arg(&cleanup.image);
    let dir = tempfile::tempdir().expect("a temporary folder");
    let latch = Latch {
        proc: Proc::spawn(&mut cmd, dir.path().join("container.log")),
        base: format!("http://127.0.0.1:{port}"),
    };
    let http = reqwest::Client::new();
    latch.ready(&http).await;
    let hook = Receiver::start().await;
    let walk = utils::walk_through(&http, &latch.base, &hook.url).await;
    utils::delivered(&http, &latch.base, &walk, &hook).await;

    // It runs as the image's user, not root.
    let user = run(Command::new(&podman).args(["top", &cleanup.container, "user"]));
    assert_eq!(user.lines().nth(1).map(str::trim), Some("latch"), "{user}");
    // `podman stop` sends SIGTERM: latch drains and exits 0.
    run(Command::new(&podman).args(["stop", "--time", "30", &cleanup.container]));
    let mut proc = latch.proc;
    assert!(proc.child.wait().is_ok_and(|s| s.success()), "a clean exit");
}
