//! The rooms of `src/` form a ladder: a room imports only rooms below it,
//! never back up, so no two rooms import each other (directly or round a
//! loop). This test reads every `crate::` path in `src/` and fails on an
//! import that goes up or sideways, naming the file and the two rooms.
//!
//! Inside a room the files form a ladder too: no two files of a room import
//! each other, directly or round a loop (`super::file` and
//! `crate::room::file` paths, comments and tests left out). A room's
//! `mod.rs` is its top, which wires its files: it is a node of that graph
//! too, so a top that defines what its files import and uses them is
//! found (a room's top declares and re-exports; its own code uses files
//! only where no file imports from it).
//!
//! And size is a rule, or a split regrows: no file of `src/` over 600
//! lines of code (its tests left out: unit tests of a large file go to a
//! sibling `tests.rs`), no function over 80 lines except the few named in
//! `LONG_FUNCTIONS` with their reasons. Clippy's `too_many_lines` holds
//! the same line (`clippy.toml`).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each room's rung, lowest first. A room may import rooms on lower rungs only.
const LADDER: &[(&str, u32)] = &[
    ("config", 0),
    ("sync", 0),
    ("flat", 0),
    ("telemetry", 1),
    ("reduce", 1),
    ("error", 2),
    ("rules", 2),
    ("upstream", 3),
    ("server", 3),
    ("limits", 4),
    ("admission", 5),
    ("classify", 6),
    ("fleet", 6),
    ("state", 7),
    ("proxy", 8),
    ("status", 8),
    ("capacity", 8),
    ("discovery", 8),
    ("admin", 9),
    ("epp", 9),
    ("import", 1),
];

fn rung(room: &str) -> Option<u32> {
    LADDER.iter().find(|(r, _)| *r == room).map(|(_, n)| *n)
}

fn rust_files(dir: &Path, out: &mut Vec<PathBuf>) {
    for entry in std::fs::read_dir(dir).expect("read src") {
        let path = entry.expect("entry").path();
        if path.is_dir() {
            rust_files(&path, out);
        } else if path.extension().is_some_and(|e| e == "rs") {
            out.push(path);
        }
    }
}

/// The rooms named by `crate::room` and `crate::{room, ...}` in `text`.
fn imported_rooms(text: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for (i, _) in text.match_indices("crate::") {
        let rest = &text[i + "crate::".len()..];
        let names: Vec<&str> = match rest.strip_prefix('{') {
            Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
            None => vec![rest],
        };
        for n in names {
            let name: String = n.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
            if !name.is_empty() && name.chars().next().is_some_and(|c| c.is_ascii_lowercase()) {
                out.insert(name);
            }
        }
    }
    out
}

#[test]
fn rooms_import_only_rooms_below_them() {
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let mut files = Vec::new();
    rust_files(&src, &mut files);
    let mut wrong = Vec::new();
    let mut edges = 0;
    for f in &files {
        let rel = f.strip_prefix(&src).expect("under src");
        let first = rel.components().next().expect("a component").as_os_str().to_string_lossy().to_string();
        let room = first.trim_end_matches(".rs").to_string();
        if room == "lib" || room == "main" {
            continue; // the top: wires every room
        }
        let Some(own) = rung(&room) else {
            wrong.push(format!("{}: room `{room}` is not on the ladder (add it to LADDER in tests/it/rooms.rs)", rel.display()));
            continue;
        };
        let text = std::fs::read_to_string(f).expect("read");
        for other in imported_rooms(&text) {
            if other == room {
                continue;
            }
            edges += 1;
            match rung(&other) {
                Some(n) if n < own => {}
                Some(n) => wrong.push(format!("{}: `{room}` (rung {own}) imports `{other}` (rung {n}): not below it", rel.display())),
                None => wrong.push(format!("{}: imports `{other}`, which is not on the ladder", rel.display())),
            }
        }
    }
    assert!(edges > 20, "found only {edges} imports between rooms: the scan is broken");
    assert!(wrong.is_empty(), "imports that go up or sideways the ladder:\n{}", wrong.join("\n"));
}

#[test]
fn the_scan_sees_grouped_and_nested_imports() {
    let found = imported_rooms("use crate::{admission::Lease, config::Tier};\nlet x = crate::upstream::conn::get(r);\n");
    assert_eq!(found.into_iter().collect::<Vec<_>>(), ["admission", "config", "upstream"]);
}

/// Code as the scans read it: comments and `#[cfg(test)]` modules left out.
fn code_of(text: &str) -> String {
    let text = text.split("#[cfg(test)]\nmod tests").next().unwrap_or("");
    text.lines().map(|l| l.split("//").next().unwrap_or("")).collect::<Vec<_>>().join("\n")
}

/// The names `code` imports from its room, by `super::NAME` or
/// `crate::ROOM::NAME`, grouped or not.
fn imported_names(code: &str, room: &str) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for prefix in ["super::".to_string(), format!("crate::{room}::")] {
        for (i, _) in code.match_indices(prefix.as_str()) {
            let rest = &code[i + prefix.len()..];
            let names: Vec<&str> = match rest.strip_prefix('{') {
                Some(group) => group.split('}').next().unwrap_or("").split(',').collect(),
                None => vec![rest],
            };
            for n in names {
                let name: String = n.trim().chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
                if !name.is_empty() {
                    out.insert(name);
                }
            }
        }
    }
    out
}

/// The files of `files` (names within one room) that `code` imports, by
/// `super::NAME` or `crate::ROOM::NAME`, grouped or not.
fn imported_files(code: &str, room: &str, files: &[String]) -> BTreeSet<String> {
    imported_names(code, room).into_iter().filter(|n| files.contains(n)).collect()
}

/// A room's top (`mod.rs`) as a node of its room's graph: the names it
/// defines itself (a file that imports one from `super` depends on the
/// top), and the files its own code uses (its `mod` and `pub use` lines
/// are wiring, not use; a private `use FILE::` is use).
fn top_of(code: &str, files: &[String]) -> (BTreeSet<String>, BTreeSet<String>) {
    let (mut defined, mut uses) = (BTreeSet::new(), BTreeSet::new());
    let ident = |s: &str| s.chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect::<String>();
    for line in code.lines() {
        let unindented = !line.starts_with(char::is_whitespace);
        let mut t = line.trim_start();
        let public = t.starts_with("pub");
        if public {
            t = t.split_once(' ').map_or("", |(_, r)| r);
        }
        if unindented && t.starts_with("mod ") {
            continue;
        }
        if unindented && t.starts_with("use ") {
            let used = ident(t.trim_start_matches("use ").trim_start_matches("self::"));
            if !public && files.contains(&used) {
                uses.insert(used);
            }
            continue;
        }
        if unindented {
            let t = t.trim_start_matches("async ").trim_start_matches("unsafe ");
            for kind in ["fn ", "struct ", "enum ", "const ", "static ", "type ", "trait ", "macro_rules! "] {
                if let Some(rest) = t.strip_prefix(kind) {
                    defined.insert(ident(rest));
                }
            }
        }
        for f in files {
            let used = line
                .match_indices(&format!("{f}::"))
                .any(|(i, _)| !line[..i].ends_with(|c: char| c.is_ascii_alphanumeric() || c == '_' || c == ':'));
            if used {
                uses.insert(f.clone());
            }
        }
    }
    (defined, uses)
}

/// A loop in `edges` (file -> the files it imports), if there is one, as the path round it.
fn find_circle(edges: &std::collections::BTreeMap<String, BTreeSet<String>>) -> Option<Vec<String>> {
    fn visit(
        f: &str,
        edges: &std::collections::BTreeMap<String, BTreeSet<String>>,
        path: &mut Vec<String>,
        done: &mut BTreeSet<String>,
    ) -> Option<Vec<String>> {
        if let Some(i) = path.iter().position(|p| p == f) {
            let mut circle = path[i..].to_vec();
            circle.push(f.to_string());
            return Some(circle);
        }
        if done.contains(f) {
            return None;
        }
        path.push(f.to_string());
        for next in edges.get(f).into_iter().flatten() {
            if let Some(c) = visit(next, edges, path, done) {
                return Some(c);
            }
        }
        path.pop();
        done.insert(f.to_string());
        None
    }
    let mut done = BTreeSet::new();
    edges.keys().find_map(|f| visit(f, edges, &mut Vec::new(), &mut done))
}

/// A room's top in the graph of its files.
const TOP: &str = "mod.rs";

#[test]
fn no_two_files_of_a_room_import_each_other() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut circles = Vec::new();
    let mut edges_seen = 0;
    let rooms = ["src", "loadtest/src"].into_iter().flat_map(|d| std::fs::read_dir(root.join(d)).expect("read the sources"));
    for entry in rooms {
        let dir = entry.expect("entry").path();
        if !dir.is_dir() {
            continue;
        }
        let room = dir.file_name().expect("name").to_string_lossy().to_string();
        let mut paths = Vec::new();
        rust_files(&dir, &mut paths);
        paths.retain(|p| p.file_name().is_some_and(|n| n != "tests.rs"));
        let files: Vec<String> =
            paths.iter().filter_map(|p| p.file_stem().map(|s| s.to_string_lossy().to_string())).filter(|n| n != "mod").collect();
        let mut edges = std::collections::BTreeMap::new();
        // The room's top is a node too: a file that imports what the top
        // defines, while the top uses that file, is a circle.
        let top = dir.join("mod.rs");
        let (defined, top_uses) = match std::fs::read_to_string(&top) {
            Ok(text) => top_of(&code_of(&text), &files),
            Err(_) => Default::default(),
        };
        edges_seen += top_uses.len();
        edges.insert(TOP.to_string(), top_uses);
        for p in &paths {
            let name = p.file_stem().expect("stem").to_string_lossy().to_string();
            if name == "mod" {
                continue;
            }
            let code = code_of(&std::fs::read_to_string(p).expect("read"));
            let mut to = imported_files(&code, &room, &files);
            // `super::` of a file in the room's own folder is the top.
            let names = imported_names(&code, &room);
            if p.parent() == Some(dir.as_path()) && names.iter().any(|n| defined.contains(n) && !files.contains(n)) {
                to.insert(TOP.to_string());
            }
            to.remove(&name);
            edges_seen += to.len();
            edges.insert(name, to);
        }
        if let Some(c) = find_circle(&edges) {
            let at = dir.strip_prefix(root).unwrap_or(&dir).display().to_string();
            circles.push(format!("{at}/: {}", c.join(" -> ")));
        }
    }
    assert!(edges_seen > 5, "found only {edges_seen} imports between files of a room: the scan is broken");
    assert!(circles.is_empty(), "files of a room that import each other (split out the value types they share):\n{}", circles.join("\n"));
}

/// A top that defines what a file imports from it, and uses that file,
/// is a circle; the top that only declares and re-exports is not.
#[test]
fn a_circle_through_a_rooms_top_is_found() {
    let files = vec!["pick".to_string(), "pool".to_string()];
    let top = code_of("mod pick;\npub(crate) use pick::Picked;\npub(crate) struct Pool;\nimpl Pool {\n    fn next(&self) { pick::least_loaded(self) }\n}\n");
    let (defined, uses) = top_of(&top, &files);
    assert_eq!(defined.into_iter().collect::<Vec<_>>(), ["Pool"]);
    assert_eq!(uses.iter().cloned().collect::<Vec<_>>(), ["pick"], "the call is use; the re-export is not");
    let pick = code_of("use super::{Picked, Pool};\n");
    assert_eq!(imported_names(&pick, "upstream").into_iter().collect::<Vec<_>>(), ["Picked", "Pool"]);
    let mut edges = std::collections::BTreeMap::new();
    edges.insert(TOP.to_string(), uses);
    edges.insert("pick".to_string(), [TOP.to_string()].into());
    assert_eq!(find_circle(&edges), Some(vec![TOP.to_string(), "pick".to_string(), TOP.to_string()]));
    // Pool in a file of its own, the top only declaring and re-exporting.
    let top = code_of("mod pick;\nmod pool;\npub(crate) use pick::Picked;\npub(crate) use pool::Pool;\n");
    let (defined, uses) = top_of(&top, &files);
    assert!(defined.is_empty() && uses.is_empty(), "{defined:?} {uses:?}");
}

#[test]
fn a_circle_between_two_files_of_a_room_is_found() {
    let files = vec!["store".to_string(), "tenants".to_string(), "quota".to_string()];
    let store = code_of("use super::tenants::{Limit, Limits};\n// super::quota in a comment does not count\n");
    let tenants = code_of("use crate::admission::{quota::Calendar, store::Store};\n#[cfg(test)]\nmod tests { use super::super::store; }\n");
    assert_eq!(imported_files(&store, "admission", &files).into_iter().collect::<Vec<_>>(), ["tenants"]);
    assert_eq!(imported_files(&tenants, "admission", &files).into_iter().collect::<Vec<_>>(), ["quota", "store"]);
    let mut edges = std::collections::BTreeMap::new();
    edges.insert("store".to_string(), imported_files(&store, "admission", &files));
    edges.insert("tenants".to_string(), imported_files(&tenants, "admission", &files));
    edges.insert("quota".to_string(), BTreeSet::new());
    assert_eq!(find_circle(&edges), Some(vec!["store".to_string(), "tenants".to_string(), "store".to_string()]));
    edges.get_mut("store").expect("store").clear();
    assert_eq!(find_circle(&edges), None, "the value types moved out: no circle");
}

/// The most lines of code (tests left out) a file of `src/` may have.
const MAX_FILE_LINES: usize = 600;
/// The most lines a function may have.
const MAX_FN_LINES: usize = 80;
/// Functions allowed to be longer: (file from the repository's root, function, why).
/// None today; a function that must stay whole (a table, a template) is
/// named here with its reason rather than cut at an arbitrary line.
const LONG_FUNCTIONS: &[(&str, &str, &str)] = &[];

/// `text` without its `#[cfg(test)] mod tests { ... }` module (the rest of
/// a file after that line is its tests, by this project's layout).
fn without_tests(text: &str) -> &str {
    text.split("#[cfg(test)]\nmod tests").next().unwrap_or("")
}

/// `code` with string, raw string and char literals and comments blanked
/// (their braces do not count), lines kept.
fn blank_literals(code: &str) -> String {
    let b = code.as_bytes();
    let mut out = String::with_capacity(code.len());
    let mut i = 0;
    while i < b.len() {
        let c = b[i];
        let rest = &code[i..];
        if rest.starts_with("//") {
            let end = rest.find('\n').unwrap_or(rest.len());
            out.push_str(&" ".repeat(end));
            i += end;
        } else if c == b'r'
            && (rest.starts_with("r\"") || rest.starts_with("r#"))
            && (i == 0 || !(b[i - 1].is_ascii_alphanumeric() || b[i - 1] == b'_'))
        {
            let hashes = rest[1..].chars().take_while(|h| *h == '#').count();
            if rest.as_bytes().get(1 + hashes) != Some(&b'"') {
                out.push(c as char);
                i += 1;
                continue;
            }
            let close = format!("\"{}", "#".repeat(hashes));
            let body = 2 + hashes;
            let end = rest[body..].find(&close).map_or(rest.len(), |e| body + e + close.len());
            out.extend(rest[..end].chars().map(|ch| if ch == '\n' { '\n' } else { ' ' }));
            i += end;
        } else if c == b'"' {
            let mut j = i + 1;
            while j < b.len() && b[j] != b'"' {
                j += if b[j] == b'\\' { 2 } else { 1 };
            }
            let end = (j + 1).min(b.len());
            out.extend(code[i..end].chars().map(|ch| if ch == '\n' { '\n' } else { ' ' }));
            i = end;
        } else if c == b'\''
            && (rest.get(2..3) == Some("'") || (rest.get(1..2) == Some("\\") && rest[2..].find('\'').is_some_and(|e| e < 10)))
        {
            // A char literal ('{', '\n', '\u{7b}'); a lifetime has no closing quote.
            let end = if rest.get(2..3) == Some("'") { 3 } else { 3 + rest[2..].find('\'').unwrap_or(0) };
            out.push_str(&" ".repeat(end));
            i += end;
        } else {
            let ch = rest.chars().next().unwrap_or(' ');
            out.push(ch);
            i += ch.len_utf8();
        }
    }
    out
}

/// Each function in `code` (literals blanked): its name and its length in
/// lines, from its `fn` line to its closing brace.
fn function_lengths(code: &str) -> Vec<(String, usize)> {
    let lines: Vec<&str> = code.lines().collect();
    let mut out = Vec::new();
    for (start, line) in lines.iter().enumerate() {
        let Some(at) = line.find("fn ") else { continue };
        let before = line[..at].trim();
        let words_ok =
            before.split_whitespace().all(|w| w.starts_with("pub") || ["async", "const", "unsafe", "extern", "default"].contains(&w));
        if !words_ok || (at > 0 && !line.as_bytes()[at - 1].is_ascii_whitespace()) {
            continue;
        }
        let name: String = line[at + 3..].chars().take_while(|c| c.is_ascii_alphanumeric() || *c == '_').collect();
        let mut depth = 0i64;
        let mut opened = false;
        for (k, l) in lines[start..].iter().enumerate() {
            if !opened && l.trim_end().ends_with(';') && !l.contains('{') {
                break; // a declaration without a body
            }
            for ch in l.chars() {
                match ch {
                    '{' => {
                        depth += 1;
                        opened = true;
                    }
                    '}' => depth -= 1,
                    _ => {}
                }
            }
            if opened && depth <= 0 {
                out.push((name.clone(), k + 1));
                break;
            }
        }
    }
    out
}

/// The files the size rules judge, named from the repository's root: the
/// product's (`src/`) and the benchmarks' (`loadtest/src/`), all but the
/// split-out tests.
fn judged_files() -> Vec<(String, String)> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let mut files = Vec::new();
    for dir in ["src", "loadtest/src"] {
        rust_files(&root.join(dir), &mut files);
    }
    files.sort();
    files
        .into_iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs"))
        .map(|f| {
            let rel = f.strip_prefix(root).expect("in the repository").display().to_string();
            (rel, std::fs::read_to_string(&f).expect("read"))
        })
        .collect()
}

#[test]
fn no_file_is_over_600_lines_of_code() {
    let over: Vec<String> = judged_files()
        .iter()
        .map(|(rel, text)| (rel, without_tests(text).lines().count()))
        .filter(|(_, n)| *n > MAX_FILE_LINES)
        .map(|(rel, n)| format!("{rel}: {n} lines (split it along a seam; unit tests may move to a sibling tests.rs)"))
        .collect();
    assert!(over.is_empty(), "files over {MAX_FILE_LINES} lines of code:\n{}", over.join("\n"));
}

#[test]
fn no_function_is_over_80_lines_except_the_named_ones() {
    let mut over = Vec::new();
    let mut seen = 0;
    for (rel, text) in judged_files() {
        for (name, n) in function_lengths(&blank_literals(without_tests(&text))) {
            seen += 1;
            let excepted = LONG_FUNCTIONS.iter().any(|(f, func, _)| *f == rel && *func == name);
            if n > MAX_FN_LINES && !excepted {
                over.push(format!("{rel}: fn {name}: {n} lines"));
            }
        }
    }
    assert!(seen > 500, "found only {seen} functions: the scan is broken");
    assert!(
        over.is_empty(),
        "functions over {MAX_FN_LINES} lines (split them, or name one in LONG_FUNCTIONS with its reason):\n{}",
        over.join("\n")
    );
}

/// Stage lists held below the general bound, or they regrow one inline
/// step at a time: (file under `src/`, function, most lines).
const STAGE_LISTS: &[(&str, &str, usize)] = &[("proxy/stages.rs", "forward", 50)];

#[test]
fn the_request_paths_stage_list_stays_a_list() {
    for (file, func, most) in STAGE_LISTS {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(file)).expect("read");
        let lengths = function_lengths(&blank_literals(without_tests(&text)));
        let n = lengths.iter().find(|(name, _)| name == func).map(|(_, n)| *n).unwrap_or_else(|| panic!("src/{file}: no fn {func}"));
        assert!(n <= *most, "src/{file}: fn {func} is {n} lines, over its {most}: a new stage is a function of its own");
    }
}

/// Structs composed of named parts, held to a count of direct fields, or
/// they flatten again one field at a time: (file under `src/`, struct, most fields).
const COMPOSED: &[(&str, &str, usize)] = &[("upstream/replica.rs", "Replica", 12)];

/// The direct fields of `name` in `code`: the lines one indent deep in
/// its braces that name a field.
fn field_count(code: &str, name: &str) -> Option<usize> {
    let start = code.find(&format!("struct {name} {{"))?;
    let body = &code[start..];
    let body = &body[..body.find("\n}")?];
    Some(
        body.lines()
            .skip(1)
            .filter(|l| l.starts_with("    ") && !l.starts_with("     "))
            .map(str::trim)
            .filter(|l| !l.starts_with("//") && !l.starts_with('#'))
            .filter(|l| {
                l.split(':').next().is_some_and(|f| {
                    f.split_whitespace().last().is_some_and(|w| w.chars().all(|c| c.is_ascii_lowercase() || c == '_' || c.is_ascii_digit()))
                })
            })
            .count(),
    )
}

#[test]
fn composed_structs_stay_composed() {
    for (file, name, most) in COMPOSED {
        let text = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("src").join(file)).expect("read");
        let n = field_count(&code_of(&text), name).unwrap_or_else(|| panic!("src/{file}: no struct {name}"));
        assert!(n <= *most, "src/{file}: {name} has {n} direct fields, over its {most}: a new field goes into one of its parts");
    }
    let flat = "pub(crate) struct R {\n    /// doc\n    pub(crate) a: u8,\n    b: [u8; 2],\n    pub(super) seats: Seats,\n}\n";
    assert_eq!(field_count(flat, "R"), Some(3));
}

/// The request's record takes each stage's output at one point: each of
/// its setters (`set_*`, `hold_*`) is called from one file of the product
/// at most, the stage that owns what it records.
#[test]
fn the_trackers_setters_each_have_one_stage() {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    let tracker = code_of(&std::fs::read_to_string(root.join("proxy/tracker.rs")).expect("read"));
    let setters: Vec<&str> = tracker
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix("pub(crate) fn ").or_else(|| l.trim_start().strip_prefix("pub(super) fn ")))
        .filter_map(|l| l.split('(').next())
        .filter(|n| n.starts_with("set_") || n.starts_with("hold_"))
        .collect();
    assert!(setters.len() >= 5, "found only {setters:?}: the scan is broken");
    let mut files = Vec::new();
    rust_files(&root, &mut files);
    let texts: Vec<(String, String)> = files
        .iter()
        .filter(|f| f.file_name().is_some_and(|n| n != "tests.rs"))
        .map(|f| (f.strip_prefix(&root).expect("in src").display().to_string(), code_of(&std::fs::read_to_string(f).expect("read"))))
        .collect();
    for setter in setters {
        let callers: Vec<&str> =
            texts.iter().filter(|(_, code)| code.contains(&format!(".{setter}("))).map(|(rel, _)| rel.as_str()).collect();
        assert!(callers.len() <= 1, "Tracker::{setter} is called from {callers:?}: a stage's output goes to the tracker at one point");
    }
}

#[test]
fn the_size_scans_count_what_they_should() {
    let code = "pub(crate) async fn a(x: u8) -> u8 {\n    let s = \"}}}\";\n    let c = '{';\n    let r = r#\"{ \"# ;\n    // }\n    x\n}\n\nfn b<'a>(v: &'a str) -> &'a str { v }\n\ntrait T {\n    fn decl(&self);\n}\n";
    let found = function_lengths(&blank_literals(code));
    assert_eq!(found, vec![("a".to_string(), 7), ("b".to_string(), 1)]);
    assert_eq!(without_tests("fn a() {}\n#[cfg(test)]\nmod tests {\n    fn t() {}\n}\n").lines().count(), 1);
}
