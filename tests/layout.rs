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

/// Every file reads in one sitting: under 500 lines before its tests, every function under 100,
/// or the file says why not (`Over 500 lines` in its module documentation, `Over 100 lines` in
/// the function's).
#[test]
fn every_file_and_function_stays_small_or_says_why() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    sources(&root.join("src"), &mut files);
    let mut big = Vec::new();
    for file in &files {
        let text = std::fs::read_to_string(file).unwrap();
        let body = text.split("\n#[cfg(test)]").next().unwrap_or_default();
        let lines: Vec<&str> = body.lines().collect();
        let name = file.strip_prefix(root).unwrap().display().to_string();
        if lines.len() >= 500 && !body.contains("//! Over 500 lines") {
            big.push(format!("{name}: {} lines before its tests", lines.len()));
        }
        for (i, line) in lines.iter().enumerate() {
            let code = line.trim_start();
            let indent = &line[..line.len() - code.len()];
            let is_fn = [
                "fn ",
                "pub fn ",
                "pub(crate) fn ",
                "async fn ",
                "pub async fn ",
            ]
            .iter()
            .any(|start| code.starts_with(start));
            if !is_fn || code.ends_with(';') {
                continue;
            }
            let close = format!("{indent}}}");
            let Some(end) = (i + 1..lines.len()).find(|&j| lines[j] == close) else {
                continue;
            };
            let said = lines[..i]
                .iter()
                .rev()
                .take_while(|l| {
                    l.trim_start().starts_with("///") || l.trim_start().starts_with("#[")
                })
                .any(|l| l.contains("Over 100 lines"));
            if end - i + 1 >= 100 && !said {
                big.push(format!(
                    "{name}:{}: {} is {} lines",
                    i + 1,
                    code,
                    end - i + 1
                ));
            }
        }
    }
    assert!(big.is_empty(), "split these, or say why not: {big:#?}");
}
