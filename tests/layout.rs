//! docs/layout.md is the map a newcomer reads first: it names every file under `src/`, and
//! names none that is gone.

use std::path::{Path, PathBuf};

fn sources(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.is_dir() {
            sources(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

#[test]
fn the_layout_names_every_source_file_and_no_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let layout = std::fs::read_to_string(root.join("docs/layout.md")).unwrap();
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    assert!(files.len() > 50, "the tree is read: {files:?}");
    let named = |file: &str| {
        layout
            .lines()
            .any(|l| l.split_whitespace().next() == Some(file))
    };
    let missing: Vec<_> = (files.iter())
        .map(|f| f.strip_prefix(root).unwrap().display().to_string())
        .filter(|f| !named(f))
        .collect();
    assert!(
        missing.is_empty(),
        "docs/layout.md does not name {missing:?}: give each a line"
    );
    let gone: Vec<_> = (layout.lines())
        .filter_map(|l| l.split_whitespace().next())
        .filter(|w| w.starts_with("src/") && w.ends_with(".rs"))
        .filter(|w| !root.join(w).is_file())
        .collect();
    assert!(
        gone.is_empty(),
        "docs/layout.md names files that are gone: {gone:?}"
    );
}
