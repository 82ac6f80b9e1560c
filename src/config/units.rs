//! The units a config is written in: durations (`300ms`, `30s`, `28d`) and
//! sizes (`4MiB`).

use std::time::Duration;

use serde::{Deserialize, Deserializer, Serialize};

/// A duration written as a string: `300ms`, `30s`, `28d`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Dur(pub Duration);

impl Dur {
    pub const fn secs(s: u64) -> Self {
        Dur(Duration::from_secs(s))
    }
    pub const fn millis(ms: u64) -> Self {
        Dur(Duration::from_millis(ms))
    }
    pub fn get(self) -> Duration {
        self.0
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        humantime::parse_duration(s.trim())
            .map(Dur)
            .map_err(|e| serde::de::Error::custom(format!("invalid duration `{s}`: {e} (write e.g. 300ms, 30s, 28d)")))
    }
}

/// Written as it is read: `250ms`, `30s`, `28d`.
impl Serialize for Dur {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

/// Written as a whole number of bytes.
impl Serialize for Size {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.serialize_u64(self.0)
    }
}

impl std::fmt::Display for Dur {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}", humantime::format_duration(self.0))
    }
}

/// A size written as a string: `4MiB`, `512KiB`, or a plain byte count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Size(pub u64);

impl<'de> Deserialize<'de> for Size {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            N(u64),
            S(String),
        }
        match Raw::deserialize(d)? {
            Raw::N(n) => Ok(Size(n)),
            Raw::S(s) => s
                .trim()
                .parse::<bytesize::ByteSize>()
                .map(|b| Size(b.as_u64()))
                .map_err(|e| serde::de::Error::custom(format!("invalid size `{s}`: {e} (write e.g. 4MiB)"))),
        }
    }
}
