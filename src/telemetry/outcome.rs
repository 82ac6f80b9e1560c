//! How one request ended, and what that means for every consumer.
//!
//! The decision of what an outcome counts as is made here and only here:
//! metrics, error budgets, breaker probes, goodput, trace status, the status
//! page and the PromQL that `slogate rules` generates all ask these methods.
//! Adding an outcome means answering each question below once.

use prometheus_client::encoding::EncodeLabelValue;

use super::metrics::BreachKind;

/// How one request ended. Exactly one per request, recorded once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, EncodeLabelValue)]
#[allow(non_camel_case_types)]
pub enum Outcome {
    /// Finished normally (`finish_reason: stop` or a non-streaming 2xx).
    ok,
    /// Finished because it hit `max_tokens`.
    length,
    /// The client hung up first.
    cancelled,
    /// A 4xx caused by the request.
    client_error,
    /// 429: breaker open, queue full or shed.
    rejected,
    /// 503: no healthy replica.
    unavailable,
    /// A first-token, idle or total timeout.
    timeout,
    /// 5xx from the replica, or connect failure.
    upstream_error,
    /// Error event, `finish_reason: error`, or the stream cut before `[DONE]`.
    stream_error,
    /// Ended by the gateway when its key's token limits ran out while it
    /// streamed (a `length` finish and `[DONE]` to the client): the key's
    /// doing, like a refusal of its own limits.
    quota_exhausted,
    /// A follow-up (`previous_response_id`) whose stored state was on a
    /// replica that is gone: the service lost the conversation.
    state_lost,
}

/// What an outcome counts as for the availability SLI.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SliClass {
    /// Counted, and good.
    Good,
    /// Counted, and bad: the gateway or the fleet failed the caller.
    Bad,
    /// Not counted: the caller ended it or caused it.
    Excluded,
}

impl Outcome {
    /// Every outcome, in label order.
    pub const ALL: [Outcome; 11] = [
        Outcome::ok,
        Outcome::length,
        Outcome::cancelled,
        Outcome::client_error,
        Outcome::rejected,
        Outcome::unavailable,
        Outcome::timeout,
        Outcome::upstream_error,
        Outcome::stream_error,
        Outcome::quota_exhausted,
        Outcome::state_lost,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::ok => "ok",
            Outcome::length => "length",
            Outcome::cancelled => "cancelled",
            Outcome::client_error => "client_error",
            Outcome::rejected => "rejected",
            Outcome::unavailable => "unavailable",
            Outcome::timeout => "timeout",
            Outcome::upstream_error => "upstream_error",
            Outcome::stream_error => "stream_error",
            Outcome::quota_exhausted => "quota_exhausted",
            Outcome::state_lost => "state_lost",
        }
    }

    /// How it counts for availability (and so for budgets, trace status and
    /// the availability recording rule).
    pub fn sli(self) -> SliClass {
        match self {
            Outcome::ok | Outcome::length => SliClass::Good,
            Outcome::rejected
            | Outcome::unavailable
            | Outcome::timeout
            | Outcome::upstream_error
            | Outcome::stream_error
            | Outcome::state_lost => SliClass::Bad,
            Outcome::client_error | Outcome::cancelled | Outcome::quota_exhausted => SliClass::Excluded,
        }
    }

    /// The replica produced a whole answer: it counts for e2e latency,
    /// TPOT, the latency SLI and goodput.
    pub fn completed(self) -> bool {
        self.sli() == SliClass::Good
    }

    /// Does ending this way say something about the class's latency? A
    /// half-open breaker's probe that ended so is judged slow; one that
    /// ended otherwise (the caller left, was refused, or sent a bad request)
    /// gives its place back unjudged.
    pub fn judges_latency(self) -> bool {
        !matches!(self, Outcome::cancelled | Outcome::rejected | Outcome::client_error | Outcome::quota_exhausted | Outcome::state_lost)
    }

    /// Which SLO breach this outcome is, if any (`cut`: the stream ended
    /// before `[DONE]`, an incomplete answer rather than an error event).
    pub fn breach(self, cut: bool) -> Option<BreachKind> {
        match self {
            Outcome::stream_error if cut => Some(BreachKind::incomplete),
            Outcome::timeout => Some(BreachKind::timeout),
            Outcome::stream_error | Outcome::upstream_error | Outcome::unavailable | Outcome::state_lost => Some(BreachKind::error),
            // A `length` finish is the answer the client asked for (its own
            // max_tokens): no breach.
            Outcome::ok | Outcome::length | Outcome::cancelled | Outcome::client_error | Outcome::rejected | Outcome::quota_exhausted => {
                None
            }
        }
    }

    /// A PromQL regex alternation of the outcomes in `class`, for
    /// `outcome=~"..."` (generated rules use this, never a written list).
    pub fn regex(class: SliClass) -> String {
        Outcome::ALL.iter().filter(|o| o.sli() == class).map(|o| o.as_str()).collect::<Vec<_>>().join("|")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The whole table, written out: a new outcome or a changed answer has
    /// to be decided here on purpose.
    #[test]
    fn outcome_classification_table() {
        use SliClass::*;
        type Row = (Outcome, SliClass, bool, bool, Option<BreachKind>, Option<BreachKind>);
        #[rustfmt::skip]
        let table: [Row; 11] = [
            // outcome                  sli       completed judges  breach(cut=false)             breach(cut=true)
            (Outcome::ok,             Good,     true,  true,  None,                         None),
            (Outcome::length,         Good,     true,  true,  None,                         None),
            (Outcome::cancelled,      Excluded, false, false, None,                         None),
            (Outcome::client_error,   Excluded, false, false, None,                         None),
            (Outcome::rejected,       Bad,      false, false, None,                         None),
            (Outcome::unavailable,    Bad,      false, true,  Some(BreachKind::error),      Some(BreachKind::error)),
            (Outcome::timeout,        Bad,      false, true,  Some(BreachKind::timeout),    Some(BreachKind::timeout)),
            (Outcome::upstream_error, Bad,      false, true,  Some(BreachKind::error),      Some(BreachKind::error)),
            (Outcome::stream_error,   Bad,      false, true,  Some(BreachKind::error),      Some(BreachKind::incomplete)),
            (Outcome::quota_exhausted, Excluded, false, false, None,                        None),
            (Outcome::state_lost,     Bad,      false, false, Some(BreachKind::error),      Some(BreachKind::error)),
        ];
        assert_eq!(table.map(|r| r.0), Outcome::ALL, "every outcome, once, in order");
        for (o, sli, completed, judges, breach, breach_cut) in table {
            assert_eq!(o.sli(), sli, "{o:?}");
            assert_eq!(o.completed(), completed, "{o:?}");
            assert_eq!(o.judges_latency(), judges, "{o:?}");
            assert_eq!(o.breach(false), breach, "{o:?}");
            assert_eq!(o.breach(true), breach_cut, "{o:?}");
        }
        assert_eq!(Outcome::regex(Good), "ok|length");
        assert_eq!(Outcome::regex(Excluded), "cancelled|client_error|quota_exhausted");
        assert_eq!(Outcome::regex(Bad), "rejected|unavailable|timeout|upstream_error|stream_error|state_lost");
    }
}
