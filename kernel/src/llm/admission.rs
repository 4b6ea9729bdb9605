//! Admission by requests per minute and tokens per minute: two token
//! buckets, each holding at most a minute's allowance and refilled
//! continuously. A request goes to the provider only when both can pay for
//! it; otherwise [`Admission::admit`] says when they will be able to.
//!
//! Tokens are paid with the request's estimate when it is sent and
//! corrected with the provider's count when it returns, so the bucket may
//! go below zero after an underestimate — the debt is paid back by waiting.

use std::time::{Duration, Instant};

/// One bucket: `capacity` per minute.
#[derive(Debug)]
struct Bucket {
    capacity: f64,
    level: f64,
    updated: Instant,
}

impl Bucket {
    fn new(per_minute: u64, now: Instant) -> Bucket {
        Bucket {
            capacity: per_minute as f64,
            level: per_minute as f64,
            updated: now,
        }
    }

    fn refill(&mut self, now: Instant) {
        let elapsed = now.saturating_duration_since(self.updated).as_secs_f64();
        self.level = (self.level + elapsed * self.capacity / 60.0).min(self.capacity);
        self.updated = now;
    }

    /// When `amount` can be paid (a request larger than the whole bucket
    /// waits for a full one).
    fn ready_at(&self, amount: f64, now: Instant) -> Instant {
        let needed = amount.min(self.capacity) - self.level;
        if needed <= 0.0 {
            return now;
        }
        // The level never falls below -capacity, so this is at most two
        // minutes away.
        let wait = Duration::try_from_secs_f64(needed * 60.0 / self.capacity)
            .unwrap_or(Duration::from_secs(120));
        now.checked_add(wait).unwrap_or(now)
    }

    /// Takes `amount`, keeping any debt to one minute's allowance: a
    /// provider reporting absurd usage cannot lock the bucket for longer.
    fn pay(&mut self, amount: f64) {
        self.level = (self.level - amount).clamp(-self.capacity, self.capacity);
    }
}

/// The provider's rate limits, as configured (0 is no limit).
#[derive(Debug)]
pub struct Admission {
    requests: Option<Bucket>,
    tokens: Option<Bucket>,
}

impl Admission {
    /// Limits of `rpm` requests and `tpm` tokens per minute.
    pub fn new(rpm: u32, tpm: u64, now: Instant) -> Admission {
        Admission {
            requests: (rpm > 0).then(|| Bucket::new(u64::from(rpm), now)),
            tokens: (tpm > 0).then(|| Bucket::new(tpm, now)),
        }
    }

    /// Pays for a request of `estimate` tokens now, or says when to ask
    /// again.
    pub fn admit(&mut self, estimate: u64, now: Instant) -> Result<(), Instant> {
        let amount = estimate as f64;
        let mut ready = now;
        if let Some(bucket) = &mut self.requests {
            bucket.refill(now);
            ready = ready.max(bucket.ready_at(1.0, now));
        }
        if let Some(bucket) = &mut self.tokens {
            bucket.refill(now);
            ready = ready.max(bucket.ready_at(amount, now));
        }
        if ready > now {
            return Err(ready);
        }
        if let Some(bucket) = &mut self.requests {
            bucket.pay(1.0);
        }
        if let Some(bucket) = &mut self.tokens {
            bucket.pay(amount.min(bucket.capacity));
        }
        Ok(())
    }

    /// Corrects the token bucket once a request's real cost is known.
    pub fn settle(&mut self, estimate: u64, actual: u64, now: Instant) {
        if let Some(bucket) = &mut self.tokens {
            bucket.refill(now);
            let charged = (estimate as f64).min(bucket.capacity);
            bucket.pay(actual as f64 - charged);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn no_limits_admit_everything() {
        let now = Instant::now();
        let mut admission = Admission::new(0, 0, now);
        for _ in 0..10_000 {
            assert_eq!(admission.admit(1_000_000, now), Ok(()));
        }
    }

    #[test]
    fn requests_per_minute_spread_out_once_the_burst_is_spent() {
        let now = Instant::now();
        let mut admission = Admission::new(60, 0, now);
        for _ in 0..60 {
            assert_eq!(admission.admit(1, now), Ok(()));
        }
        let next = admission.admit(1, now).unwrap_err();
        let wait = next - now;
        assert!(
            wait > Duration::from_millis(990) && wait <= Duration::from_millis(1010),
            "{wait:?}"
        );
        assert_eq!(admission.admit(1, next), Ok(()));
    }

    #[test]
    fn tokens_per_minute_wait_for_enough_and_settle_corrects() {
        let now = Instant::now();
        let mut admission = Admission::new(0, 6_000, now);
        assert_eq!(admission.admit(6_000, now), Ok(()));
        // The request used only 3000: half the bucket comes back.
        admission.settle(6_000, 3_000, now);
        assert_eq!(admission.admit(3_000, now), Ok(()));
        let next = admission.admit(600, now).unwrap_err();
        assert_eq!((next - now).as_secs(), 6);
    }

    #[test]
    fn absurd_usage_costs_at_most_a_minute() {
        let now = Instant::now();
        let mut admission = Admission::new(0, 100, now);
        assert_eq!(admission.admit(10, now), Ok(()));
        admission.settle(10, u64::MAX, now);
        let next = admission.admit(10, now).unwrap_err();
        assert!(next - now <= Duration::from_secs(120), "{:?}", next - now);
    }

    #[test]
    fn a_request_larger_than_the_bucket_waits_for_a_full_one() {
        let now = Instant::now();
        let mut admission = Admission::new(0, 1_000, now);
        assert_eq!(admission.admit(5_000, now), Ok(()));
        let next = admission.admit(5_000, now).unwrap_err();
        assert_eq!((next - now).as_secs(), 60);
    }
}
