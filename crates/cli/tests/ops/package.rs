//! The Debian package from `scripts/package`: what it holds, its systemd unit checked by
//! `systemd-analyze`, and the binary it installs serving the README's walk-through with
//! the configuration and data folder it installs.
//!
//! The package is unpacked into a temporary root rather than installed: these tests run on
//! a developer's machine too, and no systemd runs here to start the unit. So the unit's
//! sandbox is checked by `systemd-analyze` (verify, and the offline security review), and
//! the binary is started with the unit's own environment, paths moved into that root.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use crate::utils::{self, Latch, Receiver, run, tool};

/// The package, built once per test run from the binary cargo built for the tests
/// (`--fast`: gzip instead of xz, the same files).
fn package() -> Option<&'static Path> {
    tool("dpkg-deb", "dpkg")?;
    tool("strip", "binutils")?;
    static DEB: OnceLock<PathBuf> = OnceLock::new();
    let deb = DEB.get_or_init(|| {
        let out = tempfile::tempdir().expect("a temporary folder").keep();
        let printed = run(Command::new(utils::repo().join("scripts/package"))
            .arg("--fast")
            .arg("--binary")
            .arg(utils::latch_binary())
            .arg("--out")
            .arg(&out));
        PathBuf::from(printed.trim())
    });
    Some(deb)
}

/// The package's files under a fresh temporary root.
fn unpacked(deb: &Path) -> tempfile::TempDir {
    let root = tempfile::tempdir().expect("a temporary root");
    run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(root.path()));
    root
}

fn field(deb: &Path, name: &str) -> String {
    run(Command::new("dpkg-deb").arg("-f").arg(deb).arg(name))
        .trim()
        .to_string()
}

#[test]
fn the_package_holds_the_binary_the_unit_the_conffile_and_the_docs() {
    let Some(deb) = package() else { return };
    let version = env!("CARGO_PKG_VERSION");
    assert!(
        deb.ends_with(format!(
            "latch_{version}_{}.deb",
            field(deb, "Architecture")
        )),
        "{}",
        deb.display()
    );
    assert_eq!(field(deb, "Package"), "latch");
    assert_eq!(field(deb, "Version"), version);
    let depends = field(deb, "Depends");
    assert!(depends.starts_with("libc6 (>= 2."), "{depends}");

    let listing = run(Command::new("dpkg-deb").arg("-c").arg(deb));
    for path in [
        "./usr/bin/latch",
        "./lib/systemd/system/latch.service",
        "./etc/latch/latch.toml",
        "./usr/share/doc/latch/README.md.gz",
        "./usr/share/doc/latch/examples/latch-rules.yml",
        "./usr/share/doc/latch/examples/grafana-latch.json",
    ] {
        assert!(
            listing.lines().any(|l| l.ends_with(&format!(" {path}"))),
            "{path} missing from:\n{listing}"
        );
    }
    assert!(
        listing.lines().all(|l| l.contains(" root/root ")),
        "every file owned by root:\n{listing}"
    );
    assert!(
        listing
            .lines()
            .any(|l| l.starts_with("-rwxr-xr-x") && l.ends_with(" ./usr/bin/latch")),
        "an executable binary:\n{listing}"
    );

    let control = tempfile::tempdir().expect("a temporary folder");
    run(Command::new("dpkg-deb")
        .arg("-e")
        .arg(deb)
        .arg(control.path()));
    let conffiles = std::fs::read_to_string(control.path().join("conffiles")).expect("conffiles");
    assert_eq!(
        conffiles.trim(),
        "/etc/latch/latch.toml",
        "kept across upgrades"
    );
    for script in ["postinst", "prerm", "postrm"] {
        run(Command::new("sh")
            .arg("-n")
            .arg(control.path().join(script)));
    }

    // The conffile is `latch config --defaults` with the data folder the unit's sandbox
    // allows.
    let root = unpacked(deb);
    let conf = std::fs::read_to_string(root.path().join("etc/latch/latch.toml")).expect("conffile");
    let defaults =
        run(Command::new(root.path().join("usr/bin/latch")).args(["config", "--defaults"]));
    let settings = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| !l.starts_with('#') && !l.trim().is_empty())
            .map(str::to_string)
            .collect()
    };
    let expected: Vec<String> = settings(&defaults)
        .into_iter()
        .map(|l| {
            if l.starts_with("data_dir =") {
                "data_dir = \"/var/lib/latch\"".into()
            } else {
                l
            }
        })
        .collect();
    assert_eq!(settings(&conf), expected);
    let comments = |text: &str| -> Vec<String> {
        text.lines()
            .filter(|l| l.starts_with('#'))
            .map(str::to_string)
            .collect()
    };
    let kept = comments(&conf);
    assert!(
        comments(&defaults).iter().all(|c| kept.contains(c)),
        "the defaults' comments kept"
    );
}

#[test]
fn the_unit_passes_systemd_analyze_and_is_sandboxed() {
    let Some(deb) = package() else { return };
    let Some(analyze) = tool("systemd-analyze", "systemd") else {
        return;
    };
    let root = unpacked(deb);
    let unit = std::fs::read_to_string(root.path().join("lib/systemd/system/latch.service"))
        .expect("the unit");
    for line in [
        "ExecStart=/usr/bin/latch serve",
        "Environment=LATCH_CONFIG=/etc/latch/latch.toml",
        "Environment=LATCH_DATA_DIR=/var/lib/latch",
        "DynamicUser=yes",
        "StateDirectory=latch",
        "ProtectSystem=strict",
        "NoNewPrivileges=yes",
        "Restart=on-failure",
        "WantedBy=multi-user.target",
    ] {
        assert!(
            unit.lines().any(|l| l == line),
            "{line} missing from the unit"
        );
    }
    // `verify` resolves the unit's dependencies (sysinit.target, …) under --root: give the
    // unpacked root this system's units beside the package's.
    let units = root.path().join("lib/systemd/system");
    for entry in std::fs::read_dir("/lib/systemd/system").expect("this system's units") {
        let entry = entry.expect("a unit");
        let to = units.join(entry.file_name());
        if !to.exists() {
            run(Command::new("cp").arg("-a").arg(entry.path()).arg(&to));
        }
    }
    // Unknown keys and bad values are warnings with exit status 0: the output must be empty.
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .arg("latch.service")
        .output()
        .expect("systemd-analyze runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "verify: {said}"
    );
    // Issue #69: the unit shows how a PostgreSQL node gets its key from outside the data
    // folder; the drop-in its comments show passes `verify` too.
    let drop_in: Vec<&str> = unit
        .lines()
        .skip_while(|l| *l != "#   [Service]")
        .take_while(|l| l.starts_with("#   "))
        .map(|l| &l[4..])
        .collect();
    assert_eq!(
        drop_in,
        [
            "[Service]",
            "LoadCredential=secret.key:/etc/latch/secret.key",
            "Environment=LATCH_SECRET_KEY_FILE=%d/secret.key",
        ],
        "the unit's comments show the key's drop-in"
    );
    let dir = root.path().join("etc/systemd/system/latch.service.d");
    std::fs::create_dir_all(&dir).expect("the drop-in folder");
    std::fs::write(dir.join("secret-key.conf"), drop_in.join("\n") + "\n").expect("a drop-in");
    let out = Command::new(&analyze)
        .arg("verify")
        .arg(format!("--root={}", root.path().display()))
        .arg("latch.service")
        .output()
        .expect("systemd-analyze runs");
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && said.trim().is_empty(),
        "verify with the key's drop-in: {said}"
    );
    // The offline review scores the sandbox: 2.0 ("OK") at most, on systemd's 0–10 scale.
    run(Command::new(&analyze)
        .arg("security")
        .arg("--offline=yes")
        .arg("--threshold=20")
        .arg(format!("--root={}", root.path().display()))
        .arg("latch.service"));
}

#[tokio::test]
async fn the_installed_latch_serves_the_walk_through_from_its_config_and_data_folder() {
    let Some(deb) = package() else { return };
    let root = unpacked(deb);
    let unit = std::fs::read_to_string(root.path().join("lib/systemd/system/latch.service"))
        .expect("the unit");
    // The unit's command and environment, with its paths moved into the unpacked root.
    let exec = unit
        .lines()
        .find_map(|l| l.strip_prefix("ExecStart="))
        .expect("ExecStart");
    let (program, args) = exec.split_once(' ').expect("a command with arguments");
    assert_eq!(args, "serve");
    let inside = |p: &str| root.path().join(p.trim_start_matches('/'));
    let env: Vec<(&str, String)> = unit
        .lines()
        .filter_map(|l| l.strip_prefix("Environment="))
        .map(|kv| {
            let (k, v) = kv.split_once('=').expect("NAME=value");
            (k, inside(v).display().to_string())
        })
        .collect();
    assert_eq!(env.len(), 2, "{env:?}");
    let data = inside("/var/lib/latch");

    let hook = Receiver::start().await;
    let latch = Latch::start(&inside(program), &data, &env);
    let http = reqwest::Client::new();
    latch.ready(&http).await;
    let walk = utils::walk_through(&http, &latch.base, &hook.url).await;
    utils::delivered(&http, &latch.base, &walk, &hook).await;
    assert!(
        data.join("latch.db").is_file(),
        "the store in the unit's data folder"
    );
    assert!(latch.proc.terminate(), "SIGTERM stops it cleanly");
}
