//! Every relative link in README.md and docs/*.md leads somewhere: the file
//! exists, and a `#fragment` names a heading of the target (by GitHub's
//! rule for heading anchors). A renamed or removed doc otherwise leaves
//! dead links that nothing notices until a reader follows one.

use std::collections::HashSet;
use std::fs;
use std::path::{Path, PathBuf};

fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("runtime-tokio sits in the repository root")
        .to_path_buf()
}

/// README.md and every docs/*.md, in a stable order.
fn documents(root: &Path) -> Vec<PathBuf> {
    let mut docs: Vec<PathBuf> = fs::read_dir(root.join("docs"))
        .expect("docs/")
        .map(|entry| entry.expect("docs/ entry").path())
        .filter(|path| path.extension().is_some_and(|ext| ext == "md"))
        .collect();
    docs.sort();
    docs.insert(0, root.join("README.md"));
    docs
}

/// The lines outside fenced code blocks, numbered from 1, with inline code
/// spans blanked: a link written inside backticks is an example, not a
/// link.
fn prose_lines(text: &str) -> Vec<(usize, String)> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
            continue;
        }
        if in_fence {
            continue;
        }
        let mut prose = String::with_capacity(line.len());
        let mut in_code = false;
        for c in line.chars() {
            if c == '`' {
                in_code = !in_code;
            } else if !in_code {
                prose.push(c);
            }
        }
        lines.push((index + 1, prose));
    }
    lines
}

/// Targets of the inline links `[text](target)` on one line.
fn link_targets(line: &str) -> Vec<&str> {
    let mut targets = Vec::new();
    let mut rest = line;
    while let Some(start) = rest.find("](") {
        let after = &rest[start + 2..];
        let Some(end) = after.find(')') else { break };
        targets.push(after[..end].trim());
        rest = &after[end + 1..];
    }
    targets
}

/// GitHub's anchors for the headings of a markdown text: lower case, every
/// character but letters, digits, `-`, `_` and spaces dropped, spaces
/// turned into `-`, and `-1`, `-2`, … appended to repeats.
fn heading_anchors(text: &str) -> HashSet<String> {
    let mut anchors = HashSet::new();
    for (_, line) in prose_lines_keeping_code(text) {
        let Some(title) = line.strip_prefix('#') else {
            continue;
        };
        let title = title.trim_start_matches('#').trim();
        let slug: String = title
            .to_lowercase()
            .chars()
            .filter(|c| c.is_alphanumeric() || matches!(c, '-' | '_' | ' '))
            .map(|c| if c == ' ' { '-' } else { c })
            .collect();
        let mut anchor = slug.clone();
        let mut repeat = 0;
        while !anchors.insert(anchor.clone()) {
            repeat += 1;
            anchor = format!("{slug}-{repeat}");
        }
    }
    anchors
}

/// Like [`prose_lines`], but a heading's code spans keep their text, as
/// they do in its anchor.
fn prose_lines_keeping_code(text: &str) -> Vec<(usize, String)> {
    let mut in_fence = false;
    let mut lines = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim_start().starts_with("```") {
            in_fence = !in_fence;
        } else if !in_fence {
            lines.push((index + 1, line.to_owned()));
        }
    }
    lines
}

#[test]
fn relative_links_in_readme_and_docs_resolve() {
    let root = repo_root();
    let mut broken = Vec::new();
    let mut checked = 0;
    for doc in documents(&root) {
        let text = fs::read_to_string(&doc).expect("readable markdown");
        let shown = doc
            .strip_prefix(&root)
            .unwrap_or(&doc)
            .display()
            .to_string();
        for (number, line) in prose_lines(&text) {
            for target in link_targets(&line) {
                if target.contains("://") || target.starts_with("mailto:") {
                    continue;
                }
                checked += 1;
                let (path, fragment) = match target.split_once('#') {
                    Some((path, fragment)) => (path, Some(fragment)),
                    None => (target, None),
                };
                let file = if path.is_empty() {
                    doc.clone()
                } else {
                    doc.parent().expect("a file has a folder").join(path)
                };
                if !file.exists() {
                    broken.push(format!("{shown}:{number}: {target}: no such file"));
                    continue;
                }
                let Some(fragment) = fragment else { continue };
                if file.extension().is_some_and(|ext| ext == "md") {
                    let target_text = fs::read_to_string(&file).expect("readable markdown");
                    if !heading_anchors(&target_text).contains(fragment) {
                        broken.push(format!("{shown}:{number}: {target}: no such heading"));
                    }
                }
            }
        }
    }
    assert!(checked > 0, "no relative links found: is the scan broken?");
    assert!(broken.is_empty(), "broken links:\n{}", broken.join("\n"));
}

#[test]
fn anchors_follow_github() {
    let anchors = heading_anchors(
        "# Top\n## 5. Replies (server → client)\n```\n# not a heading\n```\n## Top\n### `ticketing lock`\n",
    );
    for expected in ["top", "5-replies-server--client", "top-1", "ticketing-lock"] {
        assert!(
            anchors.contains(expected),
            "{expected} missing from {anchors:?}"
        );
    }
    assert!(!anchors.contains("not-a-heading"));
}

/// The snippets of every doc are compiled as doctests of runtime-smol
/// (its `doc_snippets` module); a new doc must be listed there too, or its
/// Rust blocks would go unchecked.
#[test]
fn every_doc_is_compiled_as_doctests() {
    let root = repo_root();
    let lib = fs::read_to_string(root.join("runtime-smol/src/lib.rs")).expect("runtime-smol lib");
    let missing: Vec<String> = documents(&root)
        .iter()
        .map(|doc| {
            doc.strip_prefix(&root)
                .expect("under the root")
                .display()
                .to_string()
        })
        .filter(|path| !lib.contains(&format!("include_str!(\"../../{path}\")")))
        .collect();
    assert!(
        missing.is_empty(),
        "not in runtime-smol/src/lib.rs's doc_snippets: {missing:?}"
    );
}
