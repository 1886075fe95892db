//! The book (issue #75) at `/docs/`, beside the console: its Markdown sources are embedded
//! in the binary (`build.rs`) and rendered here, so a node without network or mdBook still
//! serves the documentation of the version it runs. The pages are the ones `mdbook build
//! docs` makes a website of; links between them and their headings' ids are mdBook's, so one
//! link works in both.

use std::collections::HashMap;

use axum::Router;
use axum::extract::Path;
use axum::http::header;
use axum::response::{Html, IntoResponse, Redirect, Response};
use axum::routing::get;
use pulldown_cmark::{CowStr, Event, HeadingLevel, Options, Parser, Tag, TagEnd, html};

use super::AppState;
use super::error::ApiError;
use super::reference::heading_id;

/// The book's files: their paths under `docs/src`, and their bytes.
const FILES: &[(&str, &[u8])] = include!(concat!(env!("OUT_DIR"), "/book_files.rs"));

/// The routes: `/docs/` (the first chapter) and `/docs/<page>.html`, images as they are.
pub fn router() -> Router<AppState> {
    Router::new()
        .route("/docs", get(|| async { Redirect::permanent("/docs/") }))
        .route("/docs/", get(|| async { page(first_chapter()) }))
        .route(
            "/docs/{*path}",
            get(|Path(path): Path<String>| async move { page(&path) }),
        )
}

fn file(path: &str) -> Option<&'static [u8]> {
    FILES.iter().find(|(p, _)| *p == path).map(|(_, b)| *b)
}

fn text(path: &str) -> Option<&'static str> {
    file(path).and_then(|b| std::str::from_utf8(b).ok())
}

/// The README, which the walk-through page includes (mdBook's `{{#include}}`): the one copy
/// of the five-minute walk, whose commands the tests run.
const README: &str = include_str!("../../README.md");

/// The text of a file named from the repository's root: the README, or a page of the book.
fn at_root(path: &str) -> Option<&'static str> {
    match path {
        "README.md" => Some(README),
        p => p.strip_prefix("docs/src/").and_then(text),
    }
}

/// `source` (the page at `path`) with mdBook's `{{#include FILE}}` and
/// `{{#include FILE:ANCHOR}}` replaced by the file, or its lines between `ANCHOR: name` and
/// `ANCHOR_END: name` (anchor lines themselves left out, as mdBook leaves them).
fn includes(path: &str, source: &str) -> String {
    let mut out = String::with_capacity(source.len());
    let mut rest = source;
    while let Some(at) = rest.find("{{#include ") {
        out.push_str(&rest[..at]);
        let Some(end) = rest[at..].find("}}") else {
            break;
        };
        let arg = rest[at + "{{#include ".len()..at + end].trim();
        rest = &rest[at + end + 2..];
        let (file, anchor) = arg.split_once(':').unwrap_or((arg, ""));
        let dir = format!("docs/src/{}", path.rsplit_once('/').map_or("", |(d, _)| d));
        let Some(included) = at_root(&join(&dir, file)) else {
            out.push_str(&format!("*(missing: {arg})*"));
            continue;
        };
        let lines: Vec<&str> = included.lines().collect();
        let start = format!("ANCHOR: {anchor}");
        let stop = format!("ANCHOR_END: {anchor}");
        let from = match anchor {
            "" => 0,
            _ => lines
                .iter()
                .position(|l| l.contains(&start))
                .map_or(lines.len(), |i| i + 1),
        };
        for line in lines[from..]
            .iter()
            .take_while(|l| anchor.is_empty() || !l.contains(&stop))
            .filter(|l| !l.contains("ANCHOR:") && !l.contains("ANCHOR_END:"))
        {
            out.push_str(line);
            out.push('\n');
        }
    }
    out.push_str(rest);
    out
}

/// `rel` from the folder `dir` (both `/`-separated paths).
pub(crate) fn join(dir: &str, rel: &str) -> String {
    let mut parts: Vec<&str> = dir.split('/').filter(|p| !p.is_empty()).collect();
    for p in rel.split('/') {
        match p {
            ".." => {
                parts.pop();
            }
            "." | "" => {}
            p => parts.push(p),
        }
    }
    parts.join("/")
}

/// The page SUMMARY.md names first.
fn first_chapter() -> &'static str {
    static FIRST: std::sync::OnceLock<String> = std::sync::OnceLock::new();
    FIRST.get_or_init(|| {
        let summary = text("SUMMARY.md").unwrap_or("");
        Parser::new(summary)
            .find_map(|e| match e {
                Event::Start(Tag::Link { dest_url, .. }) => Some(dest_url.replace(".md", ".html")),
                _ => None,
            })
            .unwrap_or_else(|| "SUMMARY.html".into())
    })
}

fn page(path: &str) -> Response {
    if let Some(md) = path.strip_suffix(".html").map(|p| format!("{p}.md"))
        && let Some(source) = text(&md)
    {
        return (
            [(header::CONTENT_SECURITY_POLICY, CSP)],
            Html(layout(path, source)),
        )
            .into_response();
    }
    match file(path) {
        Some(bytes) => (
            [
                (header::CONTENT_TYPE, media_type(path)),
                (header::CONTENT_SECURITY_POLICY, CSP),
            ],
            bytes,
        )
            .into_response(),
        None => ApiError::not_found("page").into_response(),
    }
}

/// Pages run no script and load nothing but the book's own images; their style is inline.
const CSP: &str = "default-src 'none'; img-src 'self'; style-src 'unsafe-inline'";

fn media_type(path: &str) -> &'static str {
    match path.rsplit('.').next() {
        Some("png") => "image/png",
        Some("svg") => "image/svg+xml",
        Some("jpg" | "jpeg") => "image/jpeg",
        Some("css") => "text/css; charset=utf-8",
        Some("md") => "text/markdown; charset=utf-8",
        _ => "application/octet-stream",
    }
}

/// A page: the table of contents beside the chapter.
fn layout(path: &str, source: &str) -> String {
    // Links in the contents are relative to the book's root; this page may be deeper.
    let up = "../".repeat(path.matches('/').count());
    let contents = render(text("SUMMARY.md").unwrap_or(""), &up);
    let chapter = render(&includes(path, source), "");
    let title = source
        .lines()
        .find_map(|l| l.strip_prefix("# "))
        .unwrap_or("latch");
    format!(
        "<!doctype html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\
         <title>{} — latch</title><style>{STYLE}</style></head><body>\
         <nav>{contents}</nav><main>{chapter}</main></body></html>\n",
        escape(title)
    )
}

const STYLE: &str = "body{display:flex;margin:0;font:16px/1.5 system-ui,sans-serif;color:#222}\
nav{width:17rem;flex:none;padding:1rem;background:#f4f4f6;min-height:100vh;font-size:14px}\
nav ol,nav ul{padding-left:1.1rem}main{max-width:52rem;padding:1rem 2rem;overflow-x:auto}\
pre{background:#f6f8fa;padding:.7rem;overflow-x:auto}code{font-size:90%}\
table{border-collapse:collapse}td,th{border:1px solid #ddd;padding:.2rem .5rem;vertical-align:top}\
img{max-width:100%}a{color:#0b5cad}";

fn escape(text: &str) -> String {
    text.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// Markdown as HTML, as mdBook renders it: `.md` links to `.html` (prefixed by `prefix`
/// when relative), headings with mdBook's ids (a repeated one numbered).
fn render(source: &str, prefix: &str) -> String {
    let options = Options::ENABLE_TABLES
        | Options::ENABLE_FOOTNOTES
        | Options::ENABLE_STRIKETHROUGH
        | Options::ENABLE_TASKLISTS;
    let events: Vec<Event> = Parser::new_ext(source, options).collect();
    let mut out: Vec<Event> = Vec::with_capacity(events.len());
    let mut seen: HashMap<String, usize> = HashMap::new();
    let mut i = 0;
    while i < events.len() {
        match &events[i] {
            Event::Start(Tag::Heading { level, .. }) => {
                let level = *level;
                let end = events[i..]
                    .iter()
                    .position(|e| matches!(e, Event::End(TagEnd::Heading(_))))
                    .map_or(events.len(), |n| i + n);
                let inner = &events[i + 1..end];
                let id = unique(&mut seen, heading_id(&plain(inner)));
                let n = level_number(level);
                out.push(Event::Html(format!("<h{n} id=\"{id}\">").into()));
                out.extend(inner.iter().cloned().map(|e| link(e, prefix)));
                out.push(Event::Html(format!("</h{n}>\n").into()));
                i = end + 1;
            }
            e => {
                out.push(link(e.clone(), prefix));
                i += 1;
            }
        }
    }
    let mut html_out = String::with_capacity(source.len() * 3 / 2);
    html::push_html(&mut html_out, out.into_iter());
    html_out
}

fn level_number(level: HeadingLevel) -> u8 {
    match level {
        HeadingLevel::H1 => 1,
        HeadingLevel::H2 => 2,
        HeadingLevel::H3 => 3,
        HeadingLevel::H4 => 4,
        HeadingLevel::H5 => 5,
        HeadingLevel::H6 => 6,
    }
}

/// A heading's text without its markup.
pub(crate) fn plain(events: &[Event]) -> String {
    events
        .iter()
        .filter_map(|e| match e {
            Event::Text(t) | Event::Code(t) => Some(t.as_ref()),
            _ => None,
        })
        .collect()
}

/// `id`, or `id-N` when it was given N times before on the page (mdBook's numbering).
pub(crate) fn unique(seen: &mut HashMap<String, usize>, id: String) -> String {
    let n = seen.entry(id.clone()).or_insert(0);
    *n += 1;
    match *n {
        1 => id,
        n => format!("{id}-{}", n - 1),
    }
}

/// A link to another page of the book points at its HTML.
fn link<'a>(event: Event<'a>, prefix: &str) -> Event<'a> {
    match event {
        Event::Start(Tag::Link {
            link_type,
            dest_url,
            title,
            id,
        }) if is_relative(&dest_url) => {
            let (file, anchor) = dest_url.split_once('#').unwrap_or((&dest_url, ""));
            let file = match file.strip_suffix(".md") {
                Some(stem) => format!("{prefix}{stem}.html"),
                None if file.is_empty() => String::new(),
                None => format!("{prefix}{file}"),
            };
            let dest = match anchor {
                "" => file,
                a => format!("{file}#{a}"),
            };
            Event::Start(Tag::Link {
                link_type,
                dest_url: CowStr::from(dest),
                title,
                id,
            })
        }
        e => e,
    }
}

/// A link within the book: no scheme, not from the site's root.
pub(crate) fn is_relative(url: &str) -> bool {
    !url.contains("://") && !url.starts_with('/') && !url.starts_with("mailto:")
}

#[cfg(test)]
mod tests;
