//! Docs a test keeps true: every config key the README and docs/ name is
//! in the reference config, and every key of the reference is explained
//! there; every file path and section a doc or a code comment names
//! exists; each row of the benchmark index names the commit its result
//! file is stamped with; every series `/metrics` exports is in the
//! operations page's metric table. Each check is a function over text, shown to
//! catch a stale key, path, section or stamp added on purpose.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};

use crate::common::repo;

/// The reference config's keys (`pools[].timeouts.idle`), each with the
/// comments that explain it: its line's, the comment lines that follow it,
/// and (top-level keys) the block above it.
fn reference_keys(text: &str) -> BTreeMap<String, String> {
    let mut keys: BTreeMap<String, String> = BTreeMap::new();
    let mut stack: Vec<(usize, String)> = Vec::new();
    let (mut last, mut above) = (None::<String>, String::new());
    for line in text.lines() {
        let indent = line.len() - line.trim_start().len();
        let body = line.trim_start();
        if body.is_empty() {
            continue;
        }
        if let Some(c) = body.strip_prefix('#') {
            match (&last, indent) {
                (Some(k), i) if i > 0 => keys.entry(k.clone()).or_default().push_str(c),
                _ => above.push_str(c),
            }
            continue;
        }
        let (code, comment) = match body.find(" #") {
            Some(i) => (&body[..i], &body[i + 2..]),
            None => (body, ""),
        };
        let (item, code, at) = match code.strip_prefix("- ") {
            Some(rest) => (true, rest.trim_start(), indent + 2),
            None => (false, code, indent),
        };
        while stack.last().is_some_and(|(i, _)| *i >= indent) {
            stack.pop();
        }
        if item {
            let parent = stack.last().map_or(String::new(), |(_, p)| p.clone());
            stack.push((indent, format!("{parent}[]")));
        }
        let parent = stack.last().map_or(String::new(), |(_, p)| p.clone());
        let join = |k: &str| if parent.is_empty() { k.to_string() } else { format!("{parent}.{k}") };
        let split = code.find(": ").or_else(|| code.ends_with(':').then(|| code.len() - 1));
        let (path, value) = match split.map(|i| (&code[..i], &code[i + 1..])).filter(|(k, _)| is_key(k)) {
            Some((k, v)) => (join(k.trim()), v.trim()),
            None => (parent.clone(), code.trim()),
        };
        let mut explained = std::mem::take(&mut above);
        explained.push_str(comment);
        if path != parent || parent.is_empty() {
            keys.entry(path.clone()).or_default().push_str(&explained);
        }
        if let Some(flow) = value.strip_prefix('{') {
            for k in flow_keys(flow) {
                keys.entry(format!("{path}.{k}")).or_default().push_str(comment);
            }
        }
        stack.push((at, path.clone()));
        last = Some(path);
    }
    keys
}

fn is_key(k: &str) -> bool {
    !k.is_empty() && k.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// The keys of a one-line `{ a: 1, b: { c: 2 } }` (the outer ones).
fn flow_keys(flow: &str) -> Vec<String> {
    let (mut depth, mut part, mut out) = (0, String::new(), Vec::new());
    for c in flow.chars() {
        match c {
            '{' | '[' => depth += 1,
            '}' | ']' if depth == 0 => break,
            '}' | ']' => depth -= 1,
            ',' if depth == 0 => {
                out.extend(part.split_once(':').map(|(k, _)| k.trim().to_string()).filter(|k| is_key(k)));
                part.clear();
                continue;
            }
            _ => {}
        }
        if depth == 0 {
            part.push(c);
        }
    }
    out.extend(part.split_once(':').map(|(k, _)| k.trim().to_string()).filter(|k| is_key(k)));
    out
}

/// Does `word` appear in `text` as a whole word?
fn names(text: &str, word: &str) -> bool {
    text.match_indices(word).any(|(i, _)| {
        let before = text[..i].chars().next_back();
        let after = text[i + word.len()..].chars().next();
        let part = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric() || c == '_');
        !part(before) && !part(after)
    })
}

/// The config keys `doc` names in backticks (`pools[].preempt`,
/// `epp.tls: { cert, key }`) that the reference does not: neither as a
/// key, nor in the comments of the nearest key above it that it has.
fn unknown_keys(doc: &str, keys: &BTreeMap<String, String>) -> Vec<String> {
    let tops: BTreeSet<&str> = keys.keys().filter(|k| !k.contains(['.', '['])).map(String::as_str).collect();
    let mut bad = Vec::new();
    for (i, quoted) in doc.split('`').enumerate() {
        if i % 2 == 0 {
            continue;
        }
        let name = quoted.split([' ', ':', '=', ',']).next().unwrap_or("");
        let top = name.split(['.', '[']).next().unwrap_or("");
        let file = [".rs", ".md", ".yaml", ".py", ".sh", ".json", ".toml"].iter().any(|e| name.ends_with(e));
        if !tops.contains(top) || name.len() == top.len() || file {
            continue;
        }
        let mut path = String::new();
        let mut in_index = false;
        for c in name.chars() {
            match c {
                '[' => (in_index, path) = (true, path + "["),
                ']' => (in_index, path) = (false, path + "]"),
                _ if in_index => {}
                c => path.push(c),
            }
        }
        let path = path.trim_end_matches("[]").trim_end_matches('.').to_string();
        if !known(&path, keys) {
            bad.push(quoted.to_string());
        }
    }
    bad
}

/// `path` is a key of the reference, or its nearest key there explains the rest.
fn known(path: &str, keys: &BTreeMap<String, String>) -> bool {
    if keys.contains_key(path) {
        return true;
    }
    let parts: Vec<&str> = path.split('.').collect();
    (1..parts.len()).rev().any(|n| {
        let (head, rest) = (parts[..n].join("."), &parts[n..]);
        keys.get(head.trim_end_matches("[]")).or_else(|| keys.get(&head)).is_some_and(|c| {
            let c = c.replace("[]", "");
            rest.iter().all(|r| names(&c, r.trim_end_matches("[]")))
        })
    })
}

/// The reference's keys explained neither by a comment of their own nor
/// in the comments of a key above them.
fn unexplained(keys: &BTreeMap<String, String>) -> Vec<String> {
    let parents: BTreeSet<String> =
        keys.keys().filter_map(|k| k.rsplit_once('.').map(|(p, _)| p.trim_end_matches("[]").to_string())).collect();
    keys.iter()
        .filter(|(k, c)| c.trim().is_empty() && !parents.contains(k.as_str()) && !parents.contains(&format!("{k}[]")))
        .filter(|(k, _)| {
            let leaf = k.rsplit('.').next().unwrap_or(k).trim_end_matches("[]");
            let mut up = k.as_str();
            while let Some((p, _)) = up.rsplit_once('.') {
                up = p;
                if keys.get(p).or_else(|| keys.get(p.trim_end_matches("[]"))).is_some_and(|c| names(c, leaf)) {
                    return false;
                }
            }
            true
        })
        .map(|(k, _)| k.clone())
        .collect()
}

/// The files under `roots` (recursively) whose extension is `ext`, sorted.
fn files_under(roots: &[&str], ext: &str) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut dirs: Vec<PathBuf> = roots.iter().map(|r| repo().join(r)).collect();
    while let Some(d) = dirs.pop() {
        for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
            let p = e.path();
            if p.is_dir() {
                dirs.push(p);
            } else if p.extension().is_some_and(|x| x == ext) {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn docs() -> Vec<PathBuf> {
    let mut out = vec![repo().join("README.md"), repo().join("CONTRIBUTING.md")];
    out.extend(files_under(&["docs"], "md"));
    out
}

fn sources() -> Vec<PathBuf> {
    files_under(&["src", "crates"], "rs")
}

fn read(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

fn reference() -> BTreeMap<String, String> {
    reference_keys(&read(&repo().join("config/slogate.reference.yaml")))
}

/// A Markdown heading's anchor, as GitHub makes it.
fn anchor(heading: &str) -> String {
    heading
        .trim()
        .to_lowercase()
        .chars()
        .filter(|c| c.is_alphanumeric() || *c == ' ' || *c == '-' || *c == '_')
        .map(|c| if c == ' ' { '-' } else { c })
        .collect()
}

fn headings(md: &str) -> Vec<String> {
    md.lines().filter_map(|l| l.strip_prefix('#').map(|h| h.trim_start_matches('#').trim().to_string())).collect()
}

/// What `text` (a doc in `dir`, or code comments when `dir` is `None`)
/// names that does not exist under `root`: repository paths
/// (`docs/x.md`, `src/a/b.rs`), relative Markdown links and their
/// anchors, and sections quoted after a doc (`docs/operations.md's "Health checks"`).
fn missing(text: &str, dir: Option<&Path>, root: &Path) -> Vec<String> {
    const ROOTS: [&str; 9] = ["src/", "docs/", "config/", "loadtest/", "tests/", "scripts/", "crates/", "deploy/", "fuzz/"];
    let mut bad = Vec::new();
    let trim = |s: &str| s.trim_end_matches(['.', ',', ')', ':', ';', '\'', '"', '`']).to_string();
    for word in text.split(|c: char| c.is_whitespace() || "`()[]<>\"*|,".contains(c)) {
        let word = trim(word.trim_start_matches(['(', '\'']));
        let word = word.split_once("'s").map_or(word.clone(), |(w, _)| w.to_string());
        let word = word.split('#').next().unwrap_or("").to_string();
        // `loadtest/results/NAME/`: a placeholder, not a path.
        let placeholder = word.split('/').any(|seg| {
            let stem = seg.split('.').next().unwrap_or("");
            stem.len() > 1
                && stem.chars().all(|c| c.is_ascii_uppercase() || c == '_')
                && !["README", "CONTRIBUTING", "LICENSE"].contains(&stem)
        });
        if ROOTS.iter().any(|r| word.starts_with(r)) && !placeholder && !word.contains(['{', '$', '<', '*']) && !root.join(&word).exists() {
            bad.push(word);
        }
    }
    if let Some(dir) = dir {
        for link in text.split("](").skip(1) {
            let target = link.split(')').next().unwrap_or("");
            if target.contains("://") || target.starts_with("mailto:") || target.is_empty() {
                continue;
            }
            let (file, frag) = target.split_once('#').unwrap_or((target, ""));
            let path = if file.is_empty() { None } else { Some(dir.join(file)) };
            match &path {
                Some(p) if !p.exists() => bad.push(target.to_string()),
                Some(p)
                    if !frag.is_empty()
                        && p.extension().is_some_and(|x| x == "md")
                        && !headings(&read(p)).iter().any(|h| anchor(h) == frag) =>
                {
                    bad.push(target.to_string())
                }
                _ => {}
            }
        }
    }
    // `docs/x.md's "Section"` and `[x.md](x.md), "Section"`: the section is a heading there.
    for (i, _) in text.match_indices(".md") {
        let start = text[..i].rfind(|c: char| c.is_whitespace() || "([`".contains(c)).map_or(0, |s| s + 1);
        let file = &text[start..i + 3];
        let after = &text[i + 3..];
        let after = after.strip_prefix("'s ").or_else(|| after.strip_prefix("), "));
        let Some(section) = after.and_then(|a| a.strip_prefix('"')).and_then(|a| a.split_once('"')).map(|(s, _)| s) else { continue };
        let base = dir.unwrap_or(root);
        let p = [base.join(file), root.join(file)].into_iter().find(|p| p.exists());
        let section = section.split_whitespace().collect::<Vec<_>>().join(" ");
        if let Some(p) = p {
            if !headings(&read(&p)).iter().any(|h| h.eq_ignore_ascii_case(&section)) {
                bad.push(format!("{file} \"{section}\""));
            }
        }
    }
    bad
}

/// The comment text of a Rust source.
fn comments(code: &str) -> String {
    code.lines().filter_map(|l| l.trim_start().strip_prefix("//")).map(|c| c.trim_start_matches(['/', '!'])).collect::<Vec<_>>().join("\n")
}

/// Rows of the benchmark index whose commit is not the one the result
/// file they link to is stamped with (`Machine: commit abc1234, …`).
fn stale_stamps(index: &str, dir: &Path) -> Vec<String> {
    let mut bad = Vec::new();
    for row in index.lines().filter(|l| l.starts_with('|')) {
        let cells: Vec<&str> = row.split('|').map(str::trim).collect();
        let Some(link) = cells.iter().find_map(|c| c.split_once("](").map(|(_, l)| l.split(')').next().unwrap_or(""))) else { continue };
        let Some(commit) = cells.iter().find(|c| c.len() >= 7 && c.len() <= 12 && c.chars().all(|x| x.is_ascii_hexdigit())) else {
            continue;
        };
        let stamped = read(&dir.join(link));
        let stamp = stamped.split("Machine: commit ").nth(1).map(|s| s.split([',', ' ', '\n']).next().unwrap_or(""));
        if stamp.is_none_or(|s| !(s.starts_with(commit) || commit.starts_with(s))) {
            bad.push(format!("{link}: index says {commit}, the file {}", stamp.unwrap_or("has no stamp")));
        }
    }
    bad
}

#[test]
fn every_config_key_the_docs_name_is_in_the_reference_config() {
    let keys = reference();
    let mut bad = Vec::new();
    for doc in docs() {
        bad.extend(unknown_keys(&read(&doc), &keys).into_iter().map(|k| format!("{}: `{k}`", doc.display())));
    }
    assert!(bad.is_empty(), "config keys the reference config does not have:\n{}", bad.join("\n"));
    let stale = "Set `pools[].preempt` and `tiers.interactive.reserved_share`, `epp.tls: { cert, key }`; not `pools[].preempt_after`.";
    assert_eq!(unknown_keys(stale, &keys), ["pools[].preempt_after"]);
}

#[test]
fn every_key_of_the_reference_config_is_explained_there() {
    let keys = reference();
    assert!(keys.len() > 120, "the reference's keys were read: {}", keys.len());
    let bad = unexplained(&keys);
    assert!(bad.is_empty(), "keys of config/slogate.reference.yaml without a comment that explains them: {bad:?}");
    let mut with_bare = read(&repo().join("config/slogate.reference.yaml"));
    with_bare.push_str("\nextra:\n  bare_key: 1\n");
    assert_eq!(unexplained(&reference_keys(&with_bare)), ["extra.bare_key"]);
}

#[test]
fn every_path_and_section_a_doc_or_comment_names_exists() {
    let root = repo();
    let mut bad = Vec::new();
    for doc in docs() {
        let dir = doc.parent().unwrap_or(&root);
        bad.extend(missing(&read(&doc), Some(dir), &root).into_iter().map(|m| format!("{}: {m}", doc.display())));
    }
    for src in sources() {
        bad.extend(missing(&comments(&read(&src)), None, &root).into_iter().map(|m| format!("{}: {m}", src.display())));
    }
    assert!(bad.is_empty(), "paths and sections named but not there:\n{}", bad.join("\n"));
    let docs_dir = root.join("docs");
    let stale = "See docs/gone.md, [seats](design/seats.md#no-such-rule), docs/operations.md's \"Tenants\" and \
                 docs/operations.md's \"Health checks\" and src/proxy/mod.rs.";
    assert_eq!(missing(stale, Some(&docs_dir), &root), ["docs/gone.md", "design/seats.md#no-such-rule", "docs/operations.md \"Tenants\""]);
}

#[test]
fn the_benchmark_index_names_the_commit_each_result_is_stamped_with() {
    let docs_dir = repo().join("docs");
    let index = read(&docs_dir.join("benchmarks.md"));
    let bad = stale_stamps(&index, &docs_dir);
    assert!(bad.is_empty(), "docs/benchmarks.md rows whose commit is not their result's (re-run, or copy the stamp):\n{}", bad.join("\n"));
    let row = "| Learned limits (`loadtest/run limits/overload`) | [x](../loadtest/results/limits/overload/README.md) | 2026-01-01 | 0000000 | … |";
    assert_eq!(stale_stamps(row, &docs_dir).len(), 1, "a stale stamp is caught");
}

/// The items a text names beside a source file (`` `src/x.rs` (`item` ``
/// or `` (`src/x.rs`, `item`) ``) that the file does not define: the item's
/// first segment must be a `fn`, type, `const`, `static`, `trait` or `mod`
/// of that file (a file's tests left out).
fn items_not_in_their_file(text: &str, root: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for (i, _) in text.match_indices("`src/") {
        let rest = &text[i + 1..];
        let Some(end) = rest.find('`') else { continue };
        let path = &rest[..end];
        if !path.ends_with(".rs") {
            continue;
        }
        let after = rest[end + 1..].trim_start_matches([',', ' ', '(']);
        let Some(named) = after.strip_prefix('`') else { continue };
        let item: String = named.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        if item.is_empty() || !after.starts_with('`') {
            continue;
        }
        let Ok(code) = std::fs::read_to_string(root.join(path)) else { continue };
        let code = code.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
        let defined = ["fn", "struct", "enum", "const", "static", "type", "trait", "mod"].iter().any(|kind| {
            code.match_indices(&format!("{kind} {item}"))
                .any(|(j, _)| !code[j + kind.len() + 1 + item.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '_'))
        });
        if !defined {
            out.push(format!("{path} ({item})"));
        }
    }
    out
}

#[test]
fn every_item_a_doc_names_beside_a_file_is_defined_there() {
    let root = repo();
    let bad: Vec<String> = docs()
        .iter()
        .flat_map(|d| items_not_in_their_file(&read(d), &root).into_iter().map(move |m| format!("{}: {m}", d.display())))
        .collect();
    assert!(bad.is_empty(), "items named beside a file that does not define them:\n{}", bad.join("\n"));
    let stale = "The stages: `src/proxy/mod.rs` (`forward`), and (`src/proxy/respond.rs`, `observe`); `src/proxy/stages.rs` (`forward`).";
    assert_eq!(items_not_in_their_file(stale, &root), ["src/proxy/mod.rs (forward)"]);
}

/// The series `code` registers (`register("name", ...)` or
/// `register_with_unit("name", ...)`), as Prometheus shows them less
/// `slogate_` (a counter's `_total` left off, as registered).
fn registered_series(code: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for call in ["register(", "register_with_unit("] {
        for (i, _) in code.match_indices(call) {
            let rest = code[i + call.len()..].trim_start();
            let Some(rest) = rest.strip_prefix('"') else { continue };
            if let Some(end) = rest.find('"') {
                out.insert(rest[..end].to_string());
            }
        }
    }
    out
}

/// The series of the operations page's metric table that are not documented
/// there (a counter named with or without its `_total`).
fn undocumented_series(series: &BTreeSet<String>, page: &str) -> Vec<String> {
    let table: String = page.lines().filter(|l| l.starts_with("| `")).map(|l| l.split('|').nth(1).unwrap_or("")).collect();
    series.iter().filter(|s| !table.contains(&format!("`{s}`")) && !table.contains(&format!("`{s}_total`"))).cloned().collect()
}

#[test]
fn every_series_slogate_exports_is_in_the_operations_metric_table() {
    let root = repo();
    let mut code = String::new();
    for src in files_under(&["src/telemetry"], "rs") {
        code.push_str(read(&src).split("#[cfg(test)]\nmod tests").next().unwrap_or(""));
    }
    let series = registered_series(&code);
    assert!(series.len() > 40, "the registry's series were read: {}", series.len());
    let page = read(&root.join("docs/operations.md"));
    let bad = undocumented_series(&series, &page);
    assert!(bad.is_empty(), "series /metrics exports that docs/operations.md's metric table does not list: {bad:?}");
    let with_new = format!("{code}\nr.register(\"replica_new_thing\", \"help\", c.clone());");
    assert_eq!(undocumented_series(&registered_series(&with_new), &page), ["replica_new_thing"]);
}
