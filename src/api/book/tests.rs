//! The book's links hold: every link from one page (or the README) to another names a
//! file that is there and a heading it has. CI builds the book with mdBook too; this is
//! the check mdBook does not make.

use std::collections::{HashMap, HashSet};
use std::path::Path;

use pulldown_cmark::{Event, Options, Parser, Tag, TagEnd};

use super::*;

/// The ids of a page's headings, as [`render`] (and mdBook) gives them.
fn ids(source: &str) -> HashSet<String> {
    let mut seen = HashMap::new();
    let mut out = HashSet::new();
    let mut inside: Option<Vec<Event>> = None;
    for e in Parser::new_ext(source, Options::ENABLE_TABLES) {
        match e {
            Event::Start(Tag::Heading { .. }) => inside = Some(Vec::new()),
            Event::End(TagEnd::Heading(_)) => {
                let inner = inside.take().unwrap_or_default();
                out.insert(unique(&mut seen, heading_id(&plain(&inner))));
            }
            e => {
                if let Some(v) = inside.as_mut() {
                    v.push(e);
                }
            }
        }
    }
    out
}

/// The relative links and images of a page.
fn links(source: &str) -> Vec<String> {
    Parser::new_ext(source, Options::ENABLE_TABLES)
        .filter_map(|e| match e {
            Event::Start(Tag::Link { dest_url, .. } | Tag::Image { dest_url, .. })
                if is_relative(&dest_url) =>
            {
                Some(dest_url.to_string())
            }
            _ => None,
        })
        .collect()
}

/// What is wrong with a link from the book's page `from` to `to`, if anything.
fn broken(from: &str, to: &str) -> Option<String> {
    let dir = from.rsplit_once('/').map_or("", |(d, _)| d);
    let (name, anchor) = to.split_once('#').unwrap_or((to, ""));
    let target = match name {
        "" => from.to_string(),
        f => join(dir, f),
    };
    let Some(bytes) = file(&target) else {
        return Some(format!("{from}: {to}: no {target} in the book"));
    };
    if anchor.is_empty() {
        return None;
    }
    let source = std::str::from_utf8(bytes).ok()?;
    (!ids(source).contains(anchor)).then(|| format!("{from}: {to}: {target} has no #{anchor}"))
}

#[test]
fn every_link_in_the_book_names_a_page_and_a_heading_it_has() {
    assert!(text("SUMMARY.md").is_some(), "the book has its SUMMARY.md");
    let mut wrong = Vec::new();
    for (path, bytes) in FILES.iter().filter(|(p, _)| p.ends_with(".md")) {
        let source = std::str::from_utf8(bytes).unwrap();
        for to in links(source) {
            wrong.extend(broken(path, &to));
        }
    }
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
}

#[test]
fn every_link_from_the_readme_into_the_book_holds() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let readme = std::fs::read_to_string(root.join("README.md")).unwrap();
    let mut wrong = Vec::new();
    for to in links(&readme) {
        let (file, _) = to.split_once('#').unwrap_or((&to, ""));
        match file.strip_prefix("docs/src/") {
            // As if from a page at the book's root.
            Some(_) => wrong.extend(broken("README.md", to.trim_start_matches("docs/src/"))),
            None if !file.is_empty() && !root.join(file).exists() => {
                wrong.push(format!("README.md: {to}: no such file"));
            }
            None => {}
        }
    }
    assert!(wrong.is_empty(), "broken links:\n{}", wrong.join("\n"));
}

#[test]
fn every_page_is_in_the_contents() {
    let summary = text("SUMMARY.md").unwrap();
    let listed: HashSet<String> = links(summary)
        .into_iter()
        .map(|l| l.split('#').next().unwrap().to_string())
        .collect();
    let missing: Vec<&str> = FILES
        .iter()
        .map(|(p, _)| *p)
        .filter(|p| p.ends_with(".md") && *p != "SUMMARY.md" && !listed.contains(*p))
        .collect();
    assert!(missing.is_empty(), "pages not in SUMMARY.md: {missing:?}");
}

#[test]
fn a_page_is_served_as_html_with_mdbook_s_links_and_ids() {
    let settings = page("reference/settings.html");
    assert_eq!(settings.status(), 200);
    let html = layout(
        "guide/x.html",
        "# T\n\nSee [grace](../reference/settings.md#site_grace).\n\n## `site_grace`\n\n## site_grace\n",
    );
    assert!(
        html.contains("href=\"../reference/settings.html#site_grace\""),
        "{html}"
    );
    assert!(html.contains("<h2 id=\"site_grace\">"), "{html}");
    assert!(html.contains("<h2 id=\"site_grace-1\">"), "{html}");
    // The contents' links are the book root's, from a page one folder down.
    assert!(html.contains("<nav>"), "{html}");
    assert_eq!(page("nothing.html").status(), 404);
}

#[test]
fn links_resolve_against_the_page_s_folder() {
    assert_eq!(join("guide", "../reference/api.md"), "reference/api.md");
    assert_eq!(join("", "guide/sites.md"), "guide/sites.md");
    assert!(broken("SUMMARY.md", "no-such-page.md").is_some());
}

#[test]
fn the_walk_through_includes_the_readme_s_walk_as_mdbook_does() {
    let page = text("guide/walk-through.md").unwrap();
    assert!(page.contains("{{#include ../../../README.md:walk}}"));
    let expanded = includes("guide/walk-through.md", page);
    assert!(!expanded.contains("{{#include"), "{expanded}");
    assert!(!expanded.contains("ANCHOR"), "{expanded}");
    assert!(expanded.contains("curl"), "{expanded}");
    let html = page_text("guide/walk-through.html");
    assert!(html.contains("/v1/sensors"), "{html}");
}

fn page_text(path: &str) -> String {
    let source = text(&path.replace(".html", ".md")).unwrap();
    layout(path, source)
}
