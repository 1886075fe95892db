//! Embeds the book's sources (`docs/src`) for `latch serve` to serve at `/docs/`: writes
//! the list of its files, each as `include_bytes!`, so a changed page rebuilds the binary
//! and a new one is picked up (the folder is watched).

use std::path::{Path, PathBuf};

fn main() {
    let root = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let src = root.join("docs/src");
    println!("cargo::rerun-if-changed={}", src.display());
    let mut files = Vec::new();
    walk(&src, &mut files);
    files.sort();
    let mut out = String::from("&[\n");
    for file in &files {
        let rel = file
            .strip_prefix(&src)
            .unwrap()
            .to_string_lossy()
            .replace('\\', "/");
        out.push_str(&format!(
            "    ({rel:?}, include_bytes!({:?})),\n",
            file.display().to_string()
        ));
    }
    out.push(']');
    let dest = PathBuf::from(std::env::var("OUT_DIR").unwrap()).join("book_files.rs");
    std::fs::write(dest, out).unwrap();
}

fn walk(dir: &Path, out: &mut Vec<PathBuf>) {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return;
    };
    for entry in entries.flatten() {
        let path = entry.path();
        if path.is_dir() {
            walk(&path, out);
        } else {
            out.push(path);
        }
    }
}
