//! The rooms of `src/` form a ladder: a room imports only rooms below it,
//! never back up, so no two rooms import each other (directly or round a
//! loop). This test reads every `crate::` path in `src/` and fails on an
//! import that goes up or sideways, naming the file and the two rooms.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

/// Each room's rung, lowest first. A room may import rooms on lower rungs only.
const LADDER: &[(&str, u32)] = &[
    ("config", 0),
    ("telemetry", 1),
    ("reduce", 1),
    ("error", 2),
    ("rules", 2),
    ("upstream", 3),
    ("server", 3),
    ("admission", 4),
    ("classify", 5),
    ("fleet", 5),
    ("state", 6),
    ("proxy", 7),
    ("status", 7),
    ("capacity", 7),
    ("admin", 8),
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
            wrong.push(format!("{}: room `{room}` is not on the ladder (add it to LADDER in tests/rooms.rs)", rel.display()));
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
