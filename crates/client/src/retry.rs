//! When to try again: capped exponential backoff with full jitter, at least
//! as long as the server's `Retry-After`, within an attempt budget and an
//! overall deadline.

use std::time::Duration;

/// How long one operation may keep retrying.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Attempts in all, the first included (at least 1).
    pub max_attempts: u32,
    /// The whole operation, every attempt and wait included.
    pub deadline: Duration,
    /// The backoff ceiling after the first failed attempt; doubles per attempt.
    pub backoff_base: Duration,
    /// The backoff ceiling never exceeds this (a server's `Retry-After` may).
    pub backoff_cap: Duration,
}

impl Default for RetryPolicy {
    /// Eight attempts within two minutes, backing off from 250 ms to 10 s:
    /// long enough to outlast a slow provider (the server's own provider
    /// timeout defaults to 10 s and its lease to 30 s).
    fn default() -> Self {
        Self {
            max_attempts: 8,
            deadline: Duration::from_secs(120),
            backoff_base: Duration::from_millis(250),
            backoff_cap: Duration::from_secs(10),
        }
    }
}

impl RetryPolicy {
    /// The longest backoff after `failed` attempts (1-based):
    /// `min(cap, base * 2^(failed - 1))`.
    pub fn ceiling(&self, failed: u32) -> Duration {
        let doublings = failed.saturating_sub(1).min(31);
        self.backoff_base
            .saturating_mul(1u32 << doublings)
            .min(self.backoff_cap)
    }

    /// The wait after `failed` attempts: uniform in `[0, ceiling]` ("full
    /// jitter", so clients that failed together do not retry together), but
    /// never shorter than the server's `Retry-After`.
    pub fn delay(&self, failed: u32, retry_after: Option<Duration>) -> Duration {
        let ceiling = self.ceiling(failed);
        let millis = u64::try_from(ceiling.as_millis()).unwrap_or(u64::MAX);
        let jittered = Duration::from_millis(uniform(millis));
        jittered.max(retry_after.unwrap_or_default())
    }
}

/// A draw uniform in `[0, max]` from the operating system's generator (the
/// one `uuid` uses for the keys). Should the generator fail, `max`: the
/// longest wait is the safe one.
fn uniform(max: u64) -> u64 {
    let Ok(random) = getrandom::u64() else {
        return max;
    };
    // `random / 2^64 * (max + 1)` in integers: no modulo bias, and the result
    // is at most `max`, so the cast keeps every bit.
    ((u128::from(random) * (u128::from(max) + 1)) >> 64) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn policy() -> RetryPolicy {
        RetryPolicy {
            max_attempts: 10,
            deadline: Duration::from_secs(60),
            backoff_base: Duration::from_millis(100),
            backoff_cap: Duration::from_secs(1),
        }
    }

    #[test]
    fn ceiling_doubles_then_caps() {
        let p = policy();
        let ms = |n| p.ceiling(n).as_millis();
        assert_eq!(
            [ms(1), ms(2), ms(3), ms(4), ms(5)],
            [100, 200, 400, 800, 1000]
        );
        assert_eq!(p.ceiling(1000), Duration::from_secs(1));
    }

    #[test]
    fn uniform_stays_within_its_bound_and_spreads() {
        assert_eq!(uniform(0), 0);
        let draws: Vec<u64> = (0..200).map(|_| uniform(9)).collect();
        assert!(draws.iter().all(|d| *d <= 9));
        assert!(draws.iter().any(|d| *d < 5) && draws.iter().any(|d| *d >= 5));
        // The widest range neither overflows nor panics.
        let _ = uniform(u64::MAX);
    }

    #[test]
    fn delay_is_jittered_within_the_ceiling_and_honours_retry_after() {
        let p = policy();
        for failed in 1..8 {
            for _ in 0..50 {
                assert!(p.delay(failed, None) <= p.ceiling(failed));
                let two = Duration::from_secs(2);
                assert!(p.delay(failed, Some(two)) >= two);
            }
        }
    }
}
