//! The per-customer rate limit behind the domain's [`RateLimit`] port:
//! `governor`'s keyed GCRA, in memory, per process. With N replicas a
//! customer can start N times the rate; the limit is a brake on card
//! testing, not an accounting rule.

use std::num::NonZeroU32;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use governor::clock::{Clock, DefaultClock};
use governor::{DefaultKeyedRateLimiter, Quota, RateLimiter};
use payments_domain::charge::CustomerId;
use payments_domain::limits::RateLimit;

/// Forget customers idle long enough to be back at a full burst, every
/// this many admissions, so the map holds only recent customers.
const FORGET_EVERY: u32 = 10_000;

/// `per_minute` new operations a minute per customer, `burst` at once.
pub struct GovernorLimit {
    limiter: DefaultKeyedRateLimiter<CustomerId>,
    clock: DefaultClock,
    admitted: AtomicU32,
}

impl std::fmt::Debug for GovernorLimit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("GovernorLimit")
            .field("customers", &self.limiter.len())
            .finish()
    }
}

impl GovernorLimit {
    pub fn new(per_minute: NonZeroU32, burst: NonZeroU32) -> Self {
        let quota = Quota::per_minute(per_minute).allow_burst(burst);
        Self {
            limiter: RateLimiter::keyed(quota),
            clock: DefaultClock::default(),
            admitted: AtomicU32::new(0),
        }
    }
}

impl RateLimit for GovernorLimit {
    fn admit(&self, customer: &CustomerId) -> Result<(), Duration> {
        if self.admitted.fetch_add(1, Ordering::Relaxed) % FORGET_EVERY == FORGET_EVERY - 1 {
            self.limiter.retain_recent();
        }
        self.limiter
            .check_key(customer)
            .map_err(|not_until| not_until.wait_time_from(self.clock.now()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn customer(id: &str) -> CustomerId {
        CustomerId::parse(id).expect("valid")
    }

    #[test]
    fn a_burst_then_the_rate_per_customer() {
        let nz = |n| NonZeroU32::new(n).expect("non-zero");
        let limit = GovernorLimit::new(nz(60), nz(3));
        let alice = customer("cus_alice");
        for _ in 0..3 {
            assert!(limit.admit(&alice).is_ok());
        }
        let wait = limit.admit(&alice).expect_err("over the burst");
        assert!(
            wait > Duration::ZERO && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        assert!(limit.admit(&customer("cus_bob")).is_ok(), "per customer");
    }
}
