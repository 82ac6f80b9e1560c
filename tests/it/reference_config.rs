//! `config/slogate.reference.yaml` names every field the parser reads, each
//! with its default: users copy from it, so it must not drift from the code.

use std::path::Path;

use serde_norway::Value;
use slogate::config::Config;

fn reference() -> String {
    std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("config/slogate.reference.yaml")).expect("reference config")
}

/// Every mapping key of `a` at `path`, recursively (sequences: element by element).
fn keys(v: &Value, path: &str, out: &mut Vec<String>) {
    match v {
        Value::Mapping(m) => {
            for (k, v) in m {
                let k = k.as_str().unwrap_or("?");
                let p = if path.is_empty() { k.to_string() } else { format!("{path}.{k}") };
                out.push(p.clone());
                keys(v, &p, out);
            }
        }
        Value::Sequence(s) => {
            for (i, v) in s.iter().enumerate() {
                keys(v, &format!("{path}[{i}]"), out);
            }
        }
        _ => {}
    }
}

#[test]
fn the_reference_config_parses_to_the_parsers_defaults() {
    let parsed = Config::parse(&reference()).unwrap_or_else(|e| panic!("reference config is invalid:\n{e}"));
    assert_eq!(format!("{parsed:#?}"), format!("{:#?}", Config::default()), "a value in the reference is not the default");
}

#[test]
fn the_reference_config_names_every_field() {
    let defaults = serde_norway::to_value(Config::default()).expect("serialise defaults");
    let written: Value = serde_norway::from_str(&reference()).expect("yaml");
    let (mut want, mut have) = (Vec::new(), Vec::new());
    keys(&defaults, "", &mut want);
    keys(&written, "", &mut have);
    let missing: Vec<&String> = want.iter().filter(|k| !have.contains(k)).collect();
    assert!(missing.is_empty(), "fields the parser reads that the reference does not name: {missing:?}");
}
