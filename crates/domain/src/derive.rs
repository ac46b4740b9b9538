//! Ids and provider keys derived from the operation, not from a row.
//!
//! A keyed operation's id and its idempotency key at the provider are
//! functions of what the client sent (its customer, the route, its
//! `Idempotency-Key`, and for a refund the charge) and of a **generation**,
//! never of a row the database wrote. A database that loses its last
//! writes (a promoted asynchronous replica, a Galera node that crashed
//! ahead of the cluster, a point-in-time restore) loses the claim, but the
//! client's retry derives the same id and the same provider key again, and
//! the provider answers from its own idempotency record instead of charging
//! a second time.
//!
//! The generation tells a key reused after its record expired (a new
//! payment) from a retry of the same operation: it is the number of
//! operations already made under the same parts. Charges and refunds are
//! never deleted, and each carries its derived id, so generation `g` is
//! taken exactly when the id derived for `g` exists. A claim starts at 0;
//! the store refuses a generation whose id exists
//! ([`crate::store::ClaimOutcome::GenerationTaken`]) and the service moves
//! on to the first free one. A retry after a lost write finds its own
//! generation free again (the write is gone), and every earlier generation
//! taken (they were written before it), so it derives what it derived
//! before. `docs/design-decisions.md` walks through every case.
//!
//! HMAC-SHA256 under `PROVIDER_KEY_SECRET`, over a length-prefixed encoding
//! of a label and the parts (so customer `a|b` with key `c` never meets
//! customer `a` with key `b|c`): the provider never sees a client's key,
//! nobody without the secret can predict another operation's key, and the
//! id a client sees (another label) reveals nothing of the provider key.

use hmac::{Hmac, Mac};
use sha2::Sha256;

/// The shortest secret accepted: 32 bytes, as many as the MAC's output.
pub const MIN_SECRET_LEN: usize = 32;

/// What one derivation yields: the operation's id and its provider key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Derived {
    pub id: String,
    pub provider_key: String,
}

/// The secret every replica and jobs runner derives under. Its `Debug`
/// shows only the fingerprint.
#[derive(Clone)]
pub struct Derivation {
    mac: Hmac<Sha256>,
}

impl std::fmt::Debug for Derivation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Derivation")
            .field("fingerprint", &self.fingerprint())
            .finish()
    }
}

/// Why a secret was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("PROVIDER_KEY_SECRET must be at least {MIN_SECRET_LEN} bytes (it is {0})")]
pub struct ShortSecret(pub usize);

impl Derivation {
    pub fn new(secret: &[u8]) -> Result<Self, ShortSecret> {
        if secret.len() < MIN_SECRET_LEN {
            return Err(ShortSecret(secret.len()));
        }
        let mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes a key of any length");
        Ok(Self { mac })
    }

    /// A fingerprint of the secret, safe to store and to log: every
    /// replica and jobs runner of one database must show the same.
    pub fn fingerprint(&self) -> String {
        hex::encode(&self.mac("payments/secret-fingerprint", &[], 0)[..16])
    }

    /// A charge made under `key` on `route` by `customer`.
    pub fn charge(&self, customer: &str, route: &str, key: &str, generation: u32) -> Derived {
        let parts = [customer, route, key];
        self.derived("ch_", "payments-charge-", "charge", &parts, generation)
    }

    /// A refund of `charge_id` made under `key` on `route` by `subject`
    /// (the owner of the key's record).
    pub fn refund(
        &self,
        charge_id: &str,
        subject: &str,
        route: &str,
        key: &str,
        generation: u32,
    ) -> Derived {
        let parts = [charge_id, subject, route, key];
        self.on_charge(("refund", "re_"), parts, generation)
    }

    /// An operation on a charge: a refund, or a capture or cancel of a
    /// hold (`what`: `refund`, `capture`, `cancel`; its ids prefixed
    /// `id_prefix`), over the charge, the subject that made it, the route
    /// and the key (`parts`, in that order); its provider key is
    /// `payments-{what}-` and the MAC.
    pub fn on_charge(
        &self,
        (what, id_prefix): (&str, &str),
        parts: [&str; 4],
        generation: u32,
    ) -> Derived {
        let key_prefix = format!("payments-{what}-");
        self.derived(id_prefix, &key_prefix, what, &parts, generation)
    }

    fn derived(
        &self,
        id_prefix: &str,
        key_prefix: &str,
        what: &str,
        parts: &[&str],
        generation: u32,
    ) -> Derived {
        let id = self.mac(&format!("payments/{what}/id"), parts, generation);
        let key = self.mac(&format!("payments/{what}/provider-key"), parts, generation);
        Derived {
            // 128 bits, as many as the random ids before it.
            id: format!("{id_prefix}{}", hex::encode(&id[..16])),
            // 16 + 64 characters, far under Stripe's 255.
            provider_key: format!("{key_prefix}{}", hex::encode(key)),
        }
    }

    /// HMAC over the label and each part, each preceded by its length in
    /// eight bytes, then the generation.
    fn mac(&self, label: &str, parts: &[&str], generation: u32) -> [u8; 32] {
        let mut mac = self.mac.clone();
        for part in std::iter::once(label).chain(parts.iter().copied()) {
            mac.update(&(part.len() as u64).to_be_bytes());
            mac.update(part.as_bytes());
        }
        mac.update(&generation.to_be_bytes());
        mac.finalize().into_bytes().into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn derivation() -> Derivation {
        Derivation::new(&[7; 32]).expect("long enough")
    }

    #[test]
    fn the_same_operation_derives_the_same_ids() {
        let d = derivation();
        let a = d.charge("cus_a", "/api/charges", "k1", 0);
        assert_eq!(a, d.charge("cus_a", "/api/charges", "k1", 0));
        assert!(a.id.starts_with("ch_") && a.id.len() == 35, "{}", a.id);
        assert!(a.provider_key.starts_with("payments-charge-"));
        assert!(a.provider_key.len() <= 255);
        assert!(!a.provider_key.contains("k1") && !a.provider_key.contains(&a.id[3..]));
    }

    #[test]
    fn every_part_and_the_generation_change_the_ids() {
        let d = derivation();
        let a = d.charge("cus_a", "/api/charges", "k1", 0);
        for other in [
            d.charge("cus_b", "/api/charges", "k1", 0),
            d.charge("cus_a", "/api/other", "k1", 0),
            d.charge("cus_a", "/api/charges", "k2", 0),
            d.charge("cus_a", "/api/charges", "k1", 1),
            Derivation::new(&[8; 32]).expect("long enough").charge(
                "cus_a",
                "/api/charges",
                "k1",
                0,
            ),
        ] {
            assert_ne!(a.id, other.id);
            assert_ne!(a.provider_key, other.provider_key);
        }
        let r = d.refund("ch_1", "cus_a", "/api/charges/{id}/refunds", "k1", 0);
        assert!(r.id.starts_with("re_") && r.provider_key.starts_with("payments-refund-"));
        assert_ne!(
            r,
            d.refund("ch_2", "cus_a", "/api/charges/{id}/refunds", "k1", 0)
        );
    }

    #[test]
    fn parts_are_length_prefixed() {
        let d = derivation();
        assert_ne!(
            d.charge("a|b", "/api/charges", "c", 0),
            d.charge("a", "/api/charges", "b|c", 0)
        );
        assert_ne!(d.charge("ab", "/r", "c", 0), d.charge("a", "b/r", "c", 0));
    }

    #[test]
    fn short_secrets_are_refused_and_debug_shows_no_secret() {
        assert_eq!(
            Derivation::new(b"short").expect_err("too short"),
            ShortSecret(5)
        );
        let d = derivation();
        assert!(format!("{d:?}").contains(&d.fingerprint()));
        assert_eq!(d.fingerprint().len(), 32);
    }
}
