//! vLLM's KV-event wire format, decoded.
//!
//! A replica started with `--kv-events-config` publishes on a ZMQ PUB
//! socket messages of three frames: the topic, an 8-byte big-endian
//! sequence number, and a msgpack `KVEventBatch`. The batch and its events
//! are msgspec structs; current vLLM encodes them as maps (an event's kind
//! in its `type` member), earlier releases as arrays (the kind first, then
//! the fields in order, trailing defaults left out). Both are read here.
//! Fields this gateway does not use are skipped, and an event of a kind it
//! does not know is counted and skipped, so a newer engine's additions do
//! not stop the stream.

use rmpv::Value;
use xxhash_rust::xxh3::xxh3_64;

/// An engine's name for a block, as this gateway keeps it: an integer
/// hash as it is, a byte-string hash (vLLM's sha256 digests) folded to 64
/// bits.
pub(crate) type EngineHash = u64;

/// One event of a batch.
#[derive(Debug, Clone, PartialEq)]
pub(crate) enum KvEvent {
    /// Blocks the replica computed and keeps: `hashes[i]` holds
    /// `tokens[i * block_size..(i + 1) * block_size]`, chained to `parent`
    /// (`None`: the first block is the prompt's first).
    Stored {
        hashes: Vec<EngineHash>,
        parent: Option<EngineHash>,
        tokens: Vec<u32>,
        block_size: usize,
        /// Keyed by more than tokens (a LoRA adapter, multimodal inputs, a
        /// cache salt): a prompt's tokens alone cannot name these blocks.
        keyed_beyond_tokens: bool,
        /// Where the blocks are (`GPU`, or an offload tier), and which KV
        /// cache group (hybrid models keep one per attention kind).
        place: Place,
    },
    /// Blocks the replica evicted from `place`.
    Removed { hashes: Vec<EngineHash>, place: Place },
    /// The replica dropped its whole cache (a reset, a restart).
    Cleared,
}

/// Where a block is held: the medium (`None`: the GPU, as vLLM leaves it
/// unset or writes `"GPU"`) and the cache group.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub(crate) struct Place {
    /// A hash of the medium's name; 0 for the GPU.
    pub(crate) medium: u64,
    pub(crate) group: i64,
}

/// A decoded `KVEventBatch`.
#[derive(Debug, Clone, PartialEq, Default)]
pub(crate) struct Batch {
    /// The engine's wall-clock time of the batch, in seconds.
    pub(crate) ts: f64,
    pub(crate) events: Vec<KvEvent>,
    /// Events of a kind this gateway does not know (skipped).
    pub(crate) unknown: usize,
    /// The data-parallel rank that published it, where the engine says.
    pub(crate) rank: Option<i64>,
}

/// Why a payload could not be read.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct WireError(pub(crate) String);

impl std::fmt::Display for WireError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "KV event batch: {}", self.0)
    }
}

fn bad<T>(what: impl Into<String>) -> Result<T, WireError> {
    Err(WireError(what.into()))
}

/// Decode one message's payload (its third frame).
pub(crate) fn decode(payload: &[u8]) -> Result<Batch, WireError> {
    let mut rd = payload;
    let v = rmpv::decode::read_value(&mut rd).map_err(|e| WireError(format!("not msgpack: {e}")))?;
    let fields = Fields::of(&v, &["ts", "events", "data_parallel_rank"], false)?;
    let ts = match fields.get(0) {
        Some(Value::F64(x)) => *x,
        Some(Value::F32(x)) => f64::from(*x),
        Some(Value::Integer(i)) => i.as_f64().unwrap_or(0.0),
        _ => return bad("no ts"),
    };
    let Some(Value::Array(raw)) = fields.get(1) else { return bad("no events") };
    let rank = fields.get(2).and_then(Value::as_i64);
    let mut batch = Batch { ts, events: Vec::with_capacity(raw.len()), unknown: 0, rank };
    for e in raw {
        match event(e)? {
            Some(e) => batch.events.push(e),
            None => batch.unknown += 1,
        }
    }
    Ok(batch)
}

const STORED: &[&str] =
    &["block_hashes", "parent_block_hash", "token_ids", "block_size", "lora_id", "medium", "lora_name", "extra_keys", "group_idx"];
const REMOVED: &[&str] = &["block_hashes", "medium", "group_idx"];

/// One event; `None` for a kind not known here.
fn event(v: &Value) -> Result<Option<KvEvent>, WireError> {
    let kind = match v {
        Value::Map(m) => m.iter().find(|(k, _)| k.as_str() == Some("type")).and_then(|(_, v)| v.as_str()),
        Value::Array(a) => a.first().and_then(Value::as_str),
        _ => return bad("an event is neither a map nor an array"),
    };
    Ok(Some(match kind {
        Some("BlockStored") => {
            let f = Fields::of(v, STORED, true)?;
            let hashes = hashes(f.get(0), "BlockStored.block_hashes")?;
            let parent = match f.get(1) {
                None | Some(Value::Nil) => None,
                Some(h) => Some(hash(h).ok_or_else(|| WireError("BlockStored.parent_block_hash".into()))?),
            };
            let Some(Value::Array(ids)) = f.get(2) else { return bad("BlockStored.token_ids") };
            let tokens = ids.iter().map(|t| t.as_u64().and_then(|t| u32::try_from(t).ok())).collect::<Option<Vec<u32>>>();
            let tokens = tokens.ok_or_else(|| WireError("BlockStored.token_ids: not token ids".into()))?;
            let block_size =
                f.get(3).and_then(Value::as_u64).filter(|&b| b > 0).ok_or_else(|| WireError("BlockStored.block_size".into()))?;
            let set = |v: Option<&Value>| v.is_some_and(|v| !v.is_nil());
            let extra = match f.get(7) {
                Some(Value::Array(per_block)) => per_block.iter().any(|k| !k.is_nil()),
                other => set(other),
            };
            let keyed_beyond_tokens = set(f.get(4)) || set(f.get(6)) || extra;
            KvEvent::Stored {
                hashes,
                parent,
                tokens,
                block_size: block_size as usize,
                keyed_beyond_tokens,
                place: place(f.get(5), f.get(8)),
            }
        }
        Some("BlockRemoved") => {
            let f = Fields::of(v, REMOVED, true)?;
            KvEvent::Removed { hashes: hashes(f.get(0), "BlockRemoved.block_hashes")?, place: place(f.get(1), f.get(2)) }
        }
        Some("AllBlocksCleared") => KvEvent::Cleared,
        Some(_) => return Ok(None),
        None => return bad("an event without its kind"),
    }))
}

fn place(medium: Option<&Value>, group: Option<&Value>) -> Place {
    let medium = match medium.and_then(Value::as_str) {
        None | Some("GPU") | Some("gpu") => 0,
        Some(m) => xxh3_64(m.as_bytes()) | 1,
    };
    Place { medium, group: group.and_then(Value::as_i64).unwrap_or(0) }
}

fn hashes(v: Option<&Value>, what: &str) -> Result<Vec<EngineHash>, WireError> {
    let Some(Value::Array(a)) = v else { return bad(what) };
    a.iter().map(hash).collect::<Option<Vec<_>>>().ok_or_else(|| WireError(format!("{what}: not block hashes")))
}

/// A block hash: an integer (older vLLM; Python's hash, so possibly
/// negative) or bytes (a digest).
fn hash(v: &Value) -> Option<EngineHash> {
    match v {
        Value::Integer(i) => i.as_u64().or_else(|| i.as_i64().map(|x| x as u64)),
        Value::Binary(b) => Some(xxh3_64(b)),
        _ => None,
    }
}

/// A struct's fields by position, from either encoding: an array (after
/// the kind, if `tagged`) in the declared order, or a map by name.
struct Fields<'a>(Vec<Option<&'a Value>>);

impl<'a> Fields<'a> {
    fn of(v: &'a Value, names: &[&str], tagged: bool) -> Result<Fields<'a>, WireError> {
        match v {
            Value::Array(a) => {
                let a = if tagged { a.get(1..).unwrap_or(&[]) } else { &a[..] };
                Ok(Fields((0..names.len()).map(|i| a.get(i)).collect()))
            }
            Value::Map(m) => Ok(Fields(names.iter().map(|n| m.iter().find(|(k, _)| k.as_str() == Some(*n)).map(|(_, v)| v)).collect())),
            _ => bad("a struct is neither a map nor an array"),
        }
    }

    fn get(&self, i: usize) -> Option<&'a Value> {
        self.0.get(i).copied().flatten()
    }
}

#[cfg(test)]
mod tests;
