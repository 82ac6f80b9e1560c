//! Where a stream's prompts come from when its lengths are not drawn: the
//! datasets of `vllm bench serve`, and prompts with shared prefixes, for
//! benchmarks of prefix-cache-aware routing. Text is made at four characters a token (the simulator's and
//! slogate's count); what is shared is shared byte for byte, and what is a
//! request's own starts with a tag no other request has, so two prompts
//! share exactly the prefix the shape says.

use std::path::PathBuf;

use rand::rngs::StdRng;
use rand::seq::SliceRandom;
use rand::SeedableRng;

use serde::{Deserialize, Serialize};

use super::prompt::{estimate_tokens, Prompt};

/// The datasets of `vllm bench serve` that fit a load generator without a
/// tokenizer (token counts are estimated at four characters a token, as
/// the simulator and slogate count them).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "name", rename_all = "snake_case", deny_unknown_fields)]
pub enum Dataset {
    /// `--dataset-name sharegpt`: a JSON array of `{"conversations": [{"from",
    /// "value"}, ...]}`; each conversation's first turn is the prompt, its
    /// second turn's length the output length (or `output_len` for all).
    /// Conversations of fewer than two turns are skipped, as vllm bench does;
    /// the rest are taken in an order shuffled by the scenario's seed.
    Sharegpt {
        path: PathBuf,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        output_len: Option<u32>,
    },
    /// `--dataset-name random`: lengths drawn uniformly from
    /// `len * [1 - range_ratio, 1 + range_ratio]`.
    Random {
        input_len: u32,
        output_len: u32,
        #[serde(default)]
        range_ratio: f64,
    },
    /// inference-perf's `shared_prefix`: `groups` system prompts of
    /// `system_prompt_len` tokens, each followed by `prompts_per_group`
    /// questions of `question_len`; the requests take them in an order
    /// shuffled by the scenario's seed (see [`super::datasets`]).
    SharedPrefix { groups: u32, prompts_per_group: u32, system_prompt_len: u32, question_len: u32, output_len: u32 },
    /// Conversations growing turn by turn: each of `conversations` resends
    /// its history (a system prompt of `system_prompt_len`, shared by all
    /// when `shared_system`, then `turn_len` tokens per turn) with every
    /// new turn; the requests take every conversation's first turn, then
    /// every second turn, and so on, up to `turns`.
    Conversations {
        conversations: u32,
        turns: u32,
        system_prompt_len: u32,
        turn_len: u32,
        output_len: u32,
        #[serde(default)]
        shared_system: bool,
    },
}

/// `n` tokens of text starting with `tag` (at least the tag).
fn text(tag: &str, n: u32) -> String {
    let mut s = format!("{tag} ");
    let want = n as usize * 4;
    while s.len() + 4 <= want {
        s.push_str("abc ");
    }
    s
}

fn prompt(text: String, output_len: u32) -> Prompt {
    Prompt { prompt_tokens: estimate_tokens(&text), output_tokens: output_len, text: Some(text.into()) }
}

/// inference-perf's `shared_prefix` shape.
pub struct SharedPrefix<'a> {
    /// Makes this stream's system prompts its own (another stream's group 0 differs).
    pub tag: &'a str,
    pub groups: u32,
    pub prompts_per_group: u32,
    pub system_len: u32,
    pub question_len: u32,
    pub output_len: u32,
}

impl SharedPrefix<'_> {
    /// Every group's questions, in an order shuffled by `seed`.
    pub fn prompts(&self, seed: u64) -> Result<Vec<Prompt>, String> {
        if self.groups == 0 || self.prompts_per_group == 0 {
            return Err("shared_prefix: groups and prompts_per_group must be at least 1".into());
        }
        let mut out = Vec::with_capacity((self.groups * self.prompts_per_group) as usize);
        for g in 0..self.groups {
            let system = text(&format!("[{} system prompt {g}]", self.tag), self.system_len);
            for q in 0..self.prompts_per_group {
                let question = text(&format!("[question {g}.{q}]"), self.question_len);
                out.push(prompt(format!("{system}{question}"), self.output_len));
            }
        }
        out.shuffle(&mut StdRng::seed_from_u64(seed));
        Ok(out)
    }
}

/// Conversations that resend their history with every turn.
pub struct Conversations<'a> {
    pub tag: &'a str,
    pub conversations: u32,
    pub turns: u32,
    pub system_len: u32,
    pub turn_len: u32,
    pub output_len: u32,
    /// One system prompt for all (an application's), or one each.
    pub shared_system: bool,
}

impl Conversations<'_> {
    /// Turn 1 of every conversation, then turn 2 of every one, ...: a
    /// conversation's next turn comes `conversations` requests later.
    pub fn prompts(&self) -> Result<Vec<Prompt>, String> {
        if self.conversations == 0 || self.turns == 0 {
            return Err("conversations: conversations and turns must be at least 1".into());
        }
        let mut history: Vec<String> = (0..self.conversations)
            .map(|c| {
                let who = if self.shared_system { String::new() } else { format!(" {c}") };
                text(&format!("[{} system prompt{who}]", self.tag), self.system_len)
            })
            .collect();
        let mut out = Vec::with_capacity((self.conversations * self.turns) as usize);
        for t in 0..self.turns {
            for (c, h) in history.iter_mut().enumerate() {
                h.push_str(&text(&format!("[conversation {c} turn {t}]"), self.turn_len));
                out.push(prompt(h.clone(), self.output_len));
            }
        }
        Ok(out)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shared(a: &str, b: &str) -> usize {
        a.bytes().zip(b.bytes()).take_while(|(x, y)| x == y).count()
    }

    #[test]
    fn groups_share_their_system_prompt_and_nothing_else() {
        use super::text;
        let shape = SharedPrefix { tag: "s", groups: 3, prompts_per_group: 4, system_len: 100, question_len: 20, output_len: 5 };
        let p = shape.prompts(1).expect("prompts");
        assert_eq!(p.len(), 12);
        assert!(p.iter().all(|x| x.prompt_tokens == 120 && x.output_tokens == 5));
        let of = |x: &Prompt| x.text.as_deref().unwrap_or("").to_string();
        let group = |t: &str| t.split(']').next().unwrap_or("").to_string();
        for a in &p {
            for b in &p {
                let (ta, tb) = (of(a), of(b));
                if ta == tb {
                    continue;
                }
                let n = shared(&ta, &tb);
                if group(&ta) == group(&tb) {
                    // The system prompt, then "[question g." and their own numbers.
                    let system = text(&format!("{}]", group(&ta)), 100).len();
                    assert_eq!(n, system + "[question 0.".len(), "same group: the system prompt, then their own questions");
                } else {
                    assert!(n < 20, "other groups share only the tag's start");
                }
            }
        }
    }

    #[test]
    fn each_turn_resends_the_conversation_so_far() {
        let shape =
            Conversations { tag: "c", conversations: 2, turns: 3, system_len: 50, turn_len: 10, output_len: 5, shared_system: true };
        let p = shape.prompts().expect("prompts");
        let t: Vec<String> = p.iter().map(|x| x.text.as_deref().unwrap_or("").to_string()).collect();
        assert_eq!(t.len(), 6);
        // Conversation 0's turns are requests 0, 2, 4: each extends the last.
        assert!(t[2].starts_with(&t[0]) && t[4].starts_with(&t[2]));
        assert_eq!(p[4].prompt_tokens, 80);
        // The two conversations share the system prompt only.
        assert_eq!(shared(&t[0], &t[1]), text("[c system prompt]", 50).len() + "[conversation ".len());
    }
}
