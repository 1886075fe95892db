//! What `latch config` prints: the commented defaults, each setting at the value the
//! layers give it (marked with the file or variable it came from), secrets masked. The
//! output is itself a valid settings file.

use std::path::Path;

use super::declared::secret_settings;
use super::{DEFAULTS, Layers, known_keys, redact_userinfo};

/// The effective settings of `path` (or `./latch.toml` when present) and `env`, as a
/// commented settings file. `Err` when they are not valid, with the message `serve` would
/// stop with.
pub fn show(path: Option<&Path>, env: &[(String, String)]) -> anyhow::Result<String> {
    let layers = Layers::read(path, env)?;
    layers.config()?;
    let known = known_keys();
    let mut shown = std::collections::BTreeSet::new();
    let mut out = String::with_capacity(DEFAULTS.len() + 512);
    let mut lines = DEFAULTS.lines();
    // The defaults' own first line says they are the defaults: true only when nothing is set.
    if let Some(first) = lines.next() {
        out.push_str(&title(first, &layers));
        out.push('\n');
    }
    for line in lines {
        let setting = line
            .strip_prefix("# ")
            .unwrap_or(line)
            .split_once(" = ")
            .map(|(k, _)| k)
            .filter(|k| known.iter().any(|n| n == k));
        match setting {
            Some(key) if layers.origin.contains_key(key) && shown.insert(key) => {
                let value = masked(key, &layers.table[key]);
                out.push_str(&format!("{key} = {value}  # from {}\n", layers.origin[key]));
            }
            _ => {
                out.push_str(line);
                out.push('\n');
            }
        }
    }
    Ok(out)
}

/// The first line: the defaults' own, or, when a file or variables set values, what they
/// are and where they came from.
fn title(defaults: &str, layers: &Layers) -> String {
    let mut sources: Vec<&str> = Vec::new();
    for origin in layers.origin.values() {
        if !sources.contains(&origin.as_str()) {
            sources.push(origin);
        }
    }
    // The file first, then the variables, as they are layered.
    sources.sort_by_key(|s| s.starts_with("LATCH_"));
    match sources.as_slice() {
        [] => defaults.to_string(),
        _ => format!(
            "# latch configuration as latch would run with it: the embedded defaults, and the \
             values marked `# from …` set by {}.",
            sources.join(", ")
        ),
    }
}

/// A value as TOML, with a secret replaced and a URL's password masked. Which settings are
/// secrets is the declaration's word ([`super::declared`]), not a list kept here.
fn masked(key: &str, value: &toml::Value) -> String {
    if secret_settings().contains(&key) {
        return "\"***\"".into();
    }
    match value {
        toml::Value::String(s) => toml::Value::String(redact_userinfo(s)).to_string(),
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn env(pairs: &[(&str, &str)]) -> Vec<(String, String)> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn nothing_set_prints_the_defaults() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("empty.toml");
        std::fs::write(&file, "").unwrap();
        assert_eq!(show(Some(&file), &[]).unwrap(), DEFAULTS);
    }

    #[test]
    fn set_values_replace_their_lines_with_secrets_masked() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("my.toml");
        std::fs::write(
            &file,
            "listen = \"127.0.0.1:9000\"\nretry_max_attempts = 3\n",
        )
        .unwrap();
        let text = show(
            Some(&file),
            &env(&[
                ("LATCH_DATA_DIR", "/srv/latch"),
                ("LATCH_API_TOKEN", "very-secret-token"),
                (
                    "LATCH_DATABASE_URL",
                    "postgres://latch:hunter22@db.example/latch",
                ),
                (
                    "LATCH_SECRET_KEY",
                    "AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=",
                ),
            ]),
        )
        .unwrap();
        let from = format!("# from {}", file.display());
        assert!(
            text.contains(&format!("listen = \"127.0.0.1:9000\"  {from}\n")),
            "{text}"
        );
        assert!(
            text.contains(&format!("retry_max_attempts = 3  {from}\n")),
            "{text}"
        );
        assert!(
            text.contains("data_dir = \"/srv/latch\"  # from LATCH_DATA_DIR\n"),
            "{text}"
        );
        assert!(
            text.contains("api_token = \"***\"  # from LATCH_API_TOKEN\n"),
            "{text}"
        );
        assert!(
            text.contains("database_url = \"postgres://latch:***@db.example/latch\""),
            "{text}"
        );
        assert!(!text.contains("very-secret-token") && !text.contains("hunter22"));
        assert!(
            text.contains("\nretry_base = \"30s\"\n"),
            "defaults stay: {text}"
        );
        // What it prints is a settings file that gives the same settings.
        let again = dir.path().join("again.toml");
        let key = "\"AQIDBAUGBwgJCgsMDQ4PEBESExQVFhcYGRobHB0eHyA=\"";
        // Taken as it is, the masks are refused: they are not the secrets.
        std::fs::write(&again, &text).unwrap();
        let e = crate::config::Config::load_from(Some(&again), &[]).unwrap_err();
        assert!(e.to_string().contains("***"), "{e}");
        let text = text.replacen("secret_key = \"***\"", &format!("secret_key = {key}"), 1);
        let text = text.replace("\"***\"", "\"x\"").replace(":***@", ":x@");
        std::fs::write(&again, text).unwrap();
        let c = crate::config::Config::load_from(Some(&again), &[]).unwrap();
        assert_eq!(c.listen.to_string(), "127.0.0.1:9000");
        assert_eq!(c.retry_max_attempts, 3);
    }

    /// Issue #69: every setting the declaration marks secret is set, one at a time, to a
    /// value it takes, and `latch config` prints it as `***` and never in clear.
    #[test]
    fn every_secret_setting_is_masked() {
        use base64::Engine as _;
        let key = base64::engine::general_purpose::STANDARD.encode([5u8; 32]);
        let mut walked = 0;
        for setting in super::super::declared::settings() {
            if !super::super::declared::secret_settings().contains(setting) {
                continue;
            }
            let name = format!("LATCH_{}", setting.to_ascii_uppercase());
            // A shared store, which the cluster settings need, with its key from outside.
            let base = [
                ("LATCH_DATABASE_URL", "postgres://latch@db.example/latch"),
                ("LATCH_SECRET_KEY", key.as_str()),
            ];
            let probe = format!("probe-value-of-{setting}");
            let shown = [probe.as_str(), key.as_str()]
                .into_iter()
                .find_map(|value| {
                    let mut pairs: Vec<(&str, &str)> =
                        base.iter().filter(|(k, _)| *k != name).copied().collect();
                    pairs.push((&name, value));
                    show(None, &env(&pairs)).ok().map(|text| (value, text))
                });
            let (value, text) = shown.unwrap_or_else(|| panic!("{setting}: no value taken"));
            let line = format!("{setting} = \"***\"  # from {name}\n");
            assert!(text.contains(&line), "{setting} not masked:\n{text}");
            assert!(!text.contains(value), "{setting} in clear:\n{text}");
            walked += 1;
        }
        assert!(walked >= 3, "the secret settings were walked");
    }

    #[test]
    fn invalid_settings_are_refused_as_serve_refuses_them() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("typo.toml");
        std::fs::write(&file, "retry_bse = \"5s\"\n").unwrap();
        let e = show(Some(&file), &[]).unwrap_err().to_string();
        assert!(e.contains("unknown key `retry_bse`"), "{e}");
        let e = show(None, &env(&[("LATCH_HEARTBEAT_TIMEOUT", "soon")]))
            .unwrap_err()
            .to_string();
        assert!(e.contains("heartbeat_timeout"), "{e}");
    }
}
