//! What THINK has cost and may still cost: each agent's use and the total,
//! each token budget's tokens used and set aside for THINKs still queued or
//! at the provider, and the estimates a THINK is reserved and charged by.

use std::collections::HashMap;

use agentos_proto::payload::LlmStats;
use agentos_proto::{ErrorCode, ErrorReply};

use super::provider::{Chat, Completion};
use crate::identity::FIRST_OPERATOR_ID;
use crate::permissions::Budget;

/// Tokens a chat template adds before any message: role markers, and the
/// default system prompt some models' templates insert (SmolLM2's is
/// about 30 tokens).
const TEMPLATE_TOKENS: u64 = 32;

/// Use of THINK: by one caller, or by all.
#[derive(Clone, Copy, Debug, Default)]
pub struct Use {
    /// THINKs answered.
    pub calls: u64,
    /// Tokens they were charged.
    pub tokens: u64,
    /// Milliseconds they waited in the queue, in all.
    pub queue_ms: u64,
}

/// What a budget has paid for and set aside.
#[derive(Clone, Copy, Debug, Default)]
pub struct Spent {
    /// Tokens charged to it.
    pub used: u64,
    /// Tokens set aside for THINKs still queued or in flight.
    pub reserved: u64,
}

/// THINK's accounts.
#[derive(Debug, Default)]
pub struct Ledger {
    /// Use by agent id; operators' connections are counted in `total` only.
    agents: HashMap<u32, Use>,
    /// Budgets by owner.
    budgets: HashMap<u32, Spent>,
    total: Use,
}

impl Ledger {
    /// An agent's use of THINK, for LIST.
    pub fn stats(&self, agent: u32) -> LlmStats {
        let used = self.agents.get(&agent).copied().unwrap_or_default();
        LlmStats {
            calls: used.calls,
            tokens: used.tokens,
            queue_ms: used.queue_ms,
        }
    }

    /// Every caller's use, together.
    pub fn total(&self) -> Use {
        self.total
    }

    /// What the budget kept under `owner` has spent and set aside.
    pub fn spent(&self, owner: u32) -> Spent {
        self.budgets.get(&owner).copied().unwrap_or_default()
    }

    /// Forgets what was spent of the budget kept under `owner`.
    pub fn forget_budget(&mut self, owner: u32) {
        self.budgets.remove(&owner);
    }

    /// Sets `estimate` tokens aside in the budgets of `owners`, for a
    /// THINK now queued.
    pub fn reserve(&mut self, owners: &[u32], estimate: u64) {
        for owner in owners {
            self.budgets.entry(*owner).or_default().reserved += estimate;
        }
    }

    /// Frees a request's reservations.
    pub fn release(&mut self, owners: &[u32], estimate: u64) {
        for owner in owners {
            if let Some(spent) = self.budgets.get_mut(owner) {
                spent.reserved = spent.reserved.saturating_sub(estimate);
            }
        }
    }

    /// Counts a THINK of `flow` answered, and charges it to the budgets of
    /// `owners`.
    pub fn charge(&mut self, flow: u32, owners: &[u32], tokens: u64, queue_ms: u64) {
        let add = |record: &mut Use| {
            record.calls += 1;
            record.tokens += tokens;
            record.queue_ms += queue_ms;
        };
        add(&mut self.total);
        if flow < FIRST_OPERATOR_ID {
            add(self.agents.entry(flow).or_default());
        }
        // A budget is there since the request reserved from it, unless it
        // was forgotten meanwhile (a run's, its run over): nothing to charge.
        for owner in owners {
            if let Some(spent) = self.budgets.get_mut(owner) {
                spent.used += tokens;
            }
        }
    }

    /// Checks a THINK of `asker` whose prompt is about `prompt_tokens`
    /// against the tightest of its `budgets`: refused when that cannot
    /// cover the prompt, else its `max_tokens` lowered to what is left, so
    /// a budget is overrun only by the error of the prompt's estimate.
    pub fn fit(
        &self,
        asker: u32,
        budgets: &[Budget],
        prompt_tokens: u64,
        max_tokens: &mut u32,
    ) -> Result<(), ErrorReply> {
        let Some((budget, left)) = self.tightest(budgets) else {
            return Ok(());
        };
        if prompt_tokens >= left {
            let spent = self.spent(budget.owner);
            let whose = if budget.owner == asker {
                "its own".to_owned()
            } else {
                format!("the budget of agent {}, which it shares,", budget.owner)
            };
            return Err(ErrorReply::new(
                ErrorCode::LimitExceeded,
                format!(
                    "agent {asker}: {whose} of {} LLM tokens has {left} left ({} used, {} \
                     reserved by THINKs in progress); this prompt alone needs about \
                     {prompt_tokens}",
                    budget.tokens, spent.used, spent.reserved
                ),
            ));
        }
        let room = u32::try_from(left - prompt_tokens).unwrap_or(u32::MAX);
        *max_tokens = (*max_tokens).min(room);
        Ok(())
    }

    /// The budget with the least left, and what it has left.
    pub fn tightest(&self, budgets: &[Budget]) -> Option<(Budget, u64)> {
        budgets
            .iter()
            .map(|budget| {
                let spent = self.spent(budget.owner);
                let left = budget.tokens.saturating_sub(spent.used + spent.reserved);
                (*budget, left)
            })
            .min_by_key(|(_, left)| *left)
    }
}

/// A rough prompt size before the provider counts it: about four
/// characters a token, a few per message for its role markers, and the
/// template's own. Generous rather than short, since budgets rely on it.
pub fn estimate_prompt_tokens(chat: &Chat) -> u64 {
    let characters: usize = chat.system.as_deref().map_or(0, str::len)
        + chat.messages.iter().map(|m| m.content.len()).sum::<usize>();
    (characters as u64).div_ceil(4) + 4 * chat.messages.len() as u64 + TEMPLATE_TOKENS
}

/// What an answered call is charged: the provider's count, or, if it gave
/// none, an estimate from the prompt (`prompt_estimate`) and the answer's
/// length — never more than a generous multiple of what was expected
/// (`estimate`), so a provider reporting absurd usage cannot wreck the
/// counters, buckets and budgets.
pub fn charged_tokens(completion: &Completion, estimate: u64, prompt_estimate: u64) -> u64 {
    let reported = completion.usage.total_tokens;
    let tokens = if reported > 0 {
        reported
    } else {
        prompt_estimate + (completion.content.len() as u64).div_ceil(4)
    };
    tokens.min(estimate.saturating_mul(8).saturating_add(1024))
}

#[cfg(test)]
mod tests {
    use super::*;
    use agentos_proto::payload::Usage;

    fn completion(content: &str, total_tokens: u64) -> Completion {
        Completion {
            content: content.into(),
            usage: Usage {
                total_tokens,
                ..Usage::default()
            },
            model: "m".into(),
            finish_reason: None,
        }
    }

    #[test]
    fn the_providers_count_is_charged() {
        assert_eq!(charged_tokens(&completion("hi", 77), 100, 40), 77);
    }

    #[test]
    fn a_reply_without_usage_is_charged_by_its_length() {
        let answer = "x".repeat(400);
        assert_eq!(charged_tokens(&completion(&answer, 0), 600, 40), 140);
    }

    #[test]
    fn absurd_usage_is_capped() {
        assert_eq!(
            charged_tokens(&completion("hi", u64::MAX), 100, 40),
            100 * 8 + 1024
        );
    }
}
