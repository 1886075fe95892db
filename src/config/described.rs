//! Each setting as the book's reference describes it: read from the commented defaults (the
//! meaning, the default or an example), [`super::bounds`] (what it takes) and the
//! declaration (whether it is a secret), so the reference says what the code does.

use super::bounds::bound_of;
use super::declared::secret_settings;
use super::{DEFAULTS, known_keys};

/// One setting, described.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Described {
    /// Its key in `latch.toml`.
    pub key: String,
    /// Its environment variable.
    pub variable: String,
    /// The default as the defaults file writes it; `None`: unset by default.
    pub default: Option<String>,
    /// For a setting unset by default, the defaults file's example value.
    pub example: Option<String>,
    /// What it takes, when it is bounded.
    pub bounds: Option<String>,
    /// Whether `latch config` masks it.
    pub secret: bool,
    /// What it means: the defaults file's comment, as Markdown.
    pub meaning: String,
}

/// Every setting, in the defaults file's order. Settings under one comment share it.
pub fn described() -> Vec<Described> {
    let known = known_keys();
    let secrets = secret_settings();
    let mut out: Vec<Described> = Vec::new();
    let mut comment: Vec<&str> = Vec::new();
    let mut shared = String::new();
    // The first paragraph is the file's own header.
    let body = DEFAULTS.split_once("\n\n").map_or("", |(_, rest)| rest);
    for line in body.lines() {
        if line.trim().is_empty() {
            comment.clear();
            shared.clear();
            continue;
        }
        let commented = line.strip_prefix("# ");
        let setting = commented
            .unwrap_or(line)
            .split_once(" = ")
            .filter(|(k, _)| known.iter().any(|n| n == k));
        match setting {
            Some((key, value)) if !out.iter().any(|d| d.key == key) => {
                if !comment.is_empty() {
                    shared = markdown(&comment);
                    comment.clear();
                }
                let value = value.trim().to_string();
                out.push(Described {
                    key: key.to_string(),
                    variable: format!("LATCH_{}", key.to_uppercase()),
                    default: commented.is_none().then(|| value.clone()),
                    example: commented.is_some().then_some(value),
                    bounds: bound_of(key).map(|b| b.describe()),
                    secret: secrets.contains(&key),
                    meaning: shared.clone(),
                });
            }
            _ => comment.push(commented.unwrap_or(line.trim_start_matches('#'))),
        }
    }
    out
}

/// Comment lines as Markdown: prose joined into a paragraph, indented lines (a table of
/// values, a command) kept as a block.
fn markdown(lines: &[&str]) -> String {
    let mut out = String::new();
    let mut block = false;
    for line in lines {
        let indented = line.starts_with("  ");
        match (indented, block) {
            (true, false) => out.push_str("\n\n```text\n"),
            (false, true) => out.push_str("```\n\n"),
            (false, false) if !out.is_empty() && !out.ends_with('\n') => out.push(' '),
            _ => {}
        }
        block = indented;
        match indented {
            true => {
                out.push_str(line.trim_end());
                out.push('\n');
            }
            false => out.push_str(line.trim()),
        }
    }
    if block {
        out.push_str("```");
    }
    out.trim().to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_declared_setting_is_described_once_with_its_meaning() {
        let all = described();
        let mut keys: Vec<&str> = all.iter().map(|d| d.key.as_str()).collect();
        let mut declared = super::super::declared::settings().to_vec();
        keys.sort();
        declared.sort();
        assert_eq!(keys, declared);
        for d in &all {
            assert!(!d.meaning.is_empty(), "{} has no meaning", d.key);
            assert_eq!(d.default.is_some(), d.example.is_none(), "{}", d.key);
        }
    }

    #[test]
    fn a_description_carries_the_default_the_bounds_and_a_shared_comment() {
        let all = described();
        let get = |k: &str| all.iter().find(|d| d.key == k).unwrap().clone();
        let grace = get("site_grace");
        assert_eq!(grace.variable, "LATCH_SITE_GRACE");
        assert_eq!(grace.default.as_deref(), Some("\"30s\""));
        assert_eq!(grace.bounds.as_deref(), Some("`0s` to `1h`"));
        // The three site settings share one comment.
        assert_eq!(get("site_min_sensors").meaning, grace.meaning);
        assert!(grace.meaning.contains("gateway"), "{}", grace.meaning);
        let token = get("api_token");
        assert!(token.secret && token.default.is_none());
        assert!(get("retry_policy").meaning.contains("```text\n"));
    }
}
