//! `bench report NAME KIND DIR ARGS...`: which report a driver asked for,
//! its arguments read.

use std::path::Path;

use super::records::{capacity, load};
use super::{
    admission, admission_events, calibration, cost, epp, fleet, health, independent, limits, litellm, messages, migration, overhead, paths,
    prefix, resume, retry, scale, short, soak, tenants, tenants_tokens, uploads,
};

/// The reports, as `NAME KIND ARGS`, for the usage message.
const USAGE: &str = "capacity RESULT.json | admission overload|shedlate DIR C | admission breaker|reduction DIR | \
limits overload DIR C | limits change DIR C HALF C2 shift|slow | limits batch DIR C QUIET | limits fleet DIR C KILL_AT | \
limits coldstart DIR | short DIR C | health DIR | soak DIR | resume DIR FAULT_AT | messages DIR CLIENT | hol DIR HZ | pair DIR HZ A B A2 | tenants fair|flood|weights DIR C | \
tenants tpm DIR LIMIT | \
uploads DIR HZ JSON_RATE FORM_RATE | epp DIR HZ | independent DIR GENERATOR | retry DIR OLD_REV | migration DIR CHECK_OK LITELLM SDK | \
calibration DIR SECS RATES CSECS CONCURRENCIES | scale DIR HZ | heap N PROTO=DHAT_JSON... | litellm DIR HZ VERSION | cost DIR HZ STREAMS | \
overhead DIR IDLE_KB OPEN_KB OPEN_STREAMS HZ PLACEMENT | prefix DIR SECS PART...";

/// The driver's arguments, read in order.
struct Args<'a>(std::slice::Iter<'a, String>);

impl<'a> Args<'a> {
    fn text(&mut self, what: &str) -> Result<&'a str, String> {
        self.0.next().map(String::as_str).ok_or_else(|| format!("missing {what}; the reports: {USAGE}"))
    }
    fn num(&mut self, what: &str) -> Result<f64, String> {
        let a = self.text(what)?;
        a.parse().map_err(|_| format!("{what}: {a:?} is not a number"))
    }
    fn dir(&mut self) -> Result<&'a Path, String> {
        self.text("DIR").map(Path::new)
    }
}

/// Runs the report `args` name, with the rest of them.
pub fn main(args: &[String]) -> Result<(), String> {
    let mut a = Args(args.iter());
    match a.text("the report's name")? {
        // Prints C (req/s) for the driver to read.
        "capacity" => {
            println!("{:.2}", capacity(&load(Path::new(a.text("RESULT.json")?))?));
            Ok(())
        }
        "short" => short::short(a.dir()?, a.num("C")?),
        "health" => health::health(a.dir()?),
        "soak" => soak::soak(a.dir()?),
        "resume" => {
            let dir = a.dir()?;
            resume::resume(dir, a.text("FAULT_AT")?)
        }
        "messages" => {
            let dir = a.dir()?;
            messages::messages(dir, a.text("CLIENT")?)
        }
        "hol" => paths::hol(a.dir()?, a.num("HZ")?),
        "pair" => {
            let (dir, hz) = (a.dir()?, a.num("HZ")?);
            paths::pair(dir, hz, [a.text("A")?, a.text("B")?, a.text("A2")?])
        }
        "uploads" => {
            let (dir, hz) = (a.dir()?, a.num("HZ")?);
            uploads::uploads(dir, hz, a.text("JSON_RATE")?, a.text("FORM_RATE")?)
        }
        "epp" => epp::epp(a.dir()?, a.num("HZ")?),
        "independent" => {
            let dir = a.dir()?;
            independent::independent(dir, a.text("GENERATOR")?)
        }
        "retry" => {
            let dir = a.dir()?;
            retry::retry(dir, a.text("OLD_REV")?)
        }
        "migration" => {
            let (dir, ok) = (a.dir()?, a.text("CHECK_OK")? == "true");
            migration::migration(dir, ok, a.text("LITELLM_VERSION")?, a.text("SDK_VERSION")?)
        }
        "calibration" => {
            let (dir, secs) = (a.dir()?, a.num("SECS")?);
            calibration::calibration(dir, secs, a.text("RATES")?, a.text("CSECS")?, a.text("CONCURRENCIES")?)
        }
        "scale" => scale::scale(a.dir()?, a.num("HZ")?),
        "heap" => {
            let n = a.num("N")?;
            scale::heap(n, a.0.as_slice())
        }
        "litellm" => {
            let (dir, hz) = (a.dir()?, a.num("HZ")?);
            litellm::litellm(dir, hz, a.text("LITELLM_VERSION")?)
        }
        "cost" => {
            let (dir, hz) = (a.dir()?, a.num("HZ")?);
            cost::cost(dir, hz, a.text("STREAMS")?)
        }
        "overhead" => {
            let (dir, idle, open) = (a.dir()?, a.num("IDLE_KB")?, a.num("OPEN_KB")?);
            let (streams, hz) = (a.text("OPEN_STREAMS")?, a.num("HZ")?);
            overhead::overhead(dir, idle, open, streams, hz, a.text("PLACEMENT")?)
        }
        "prefix" => {
            let (dir, secs) = (a.dir()?, a.num("SECS")?);
            prefix::prefix(dir, secs, a.0.as_slice())
        }
        name => of_kind(name, a),
    }
}

/// The reports of a driver that has several: `NAME KIND DIR ARGS`.
fn of_kind(name: &str, mut a: Args) -> Result<(), String> {
    let kind = a.text("the report's kind")?;
    let dir = a.dir()?;
    match (name, kind) {
        ("admission", "overload") => admission::overload(dir, a.num("C")?),
        ("admission", "shedlate") => admission::shedlate(dir, a.num("C")?),
        ("admission", "breaker") => admission_events::breaker(dir),
        ("admission", "reduction") => admission_events::reduction(dir),
        ("limits", "overload") => limits::overload(dir, a.num("C")?),
        ("limits", "change") => limits::change(dir, a.num("C")?, a.num("HALF")?, a.num("C2")?, a.text("shift|slow")?),
        ("limits", "batch") => limits::batch(dir, a.num("C")?, a.num("QUIET")?),
        ("limits", "fleet") => fleet::fleet(dir, a.num("C")?, a.num("KILL_AT")?),
        ("limits", "coldstart") => fleet::coldstart(dir),
        ("tenants", "fair") => tenants::fair(dir, a.num("C")?),
        ("tenants", "flood") => tenants::flood(dir, a.num("C")?),
        ("tenants", "weights") => tenants_tokens::weights(dir, a.num("C")?),
        ("tenants", "tpm") => tenants_tokens::tpm(dir, a.num("LIMIT")?),
        _ => Err(format!("no report {name} {kind}; the reports: {USAGE}")),
    }
}
