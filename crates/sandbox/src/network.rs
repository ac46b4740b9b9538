//! The simulated card network: Stripe's test tokens and what each one does.

/// Why the network refused a card, in Stripe's vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Decline {
    /// The error `code` (`card_declined`, `expired_card`).
    pub(crate) code: &'static str,
    /// The finer `decline_code`.
    pub(crate) decline_code: &'static str,
    /// The human message Stripe sends.
    pub(crate) message: &'static str,
}

/// The network's answer for a known token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Authorization {
    Approved,
    Declined(Decline),
}

/// Authorises a charge on a test token; `None` for a token that does not
/// exist (Stripe answers 400 `resource_missing`, and charges nothing).
pub(crate) fn authorize(token: &str) -> Option<Authorization> {
    let declined = |code, decline_code, message| {
        Some(Authorization::Declined(Decline {
            code,
            decline_code,
            message,
        }))
    };
    match token {
        "tok_visa" | "tok_mastercard" | "tok_amex" => Some(Authorization::Approved),
        "tok_chargeDeclined" => declined(
            "card_declined",
            "generic_decline",
            "Your card was declined.",
        ),
        "tok_chargeDeclinedInsufficientFunds" => declined(
            "card_declined",
            "insufficient_funds",
            "Your card has insufficient funds.",
        ),
        "tok_chargeDeclinedExpiredCard" => {
            declined("expired_card", "expired_card", "Your card has expired.")
        }
        "tok_chargeDeclinedFraudulent" => {
            declined("card_declined", "fraudulent", "Your card was declined.")
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn test_tokens() {
        assert_eq!(authorize("tok_visa"), Some(Authorization::Approved));
        assert!(matches!(
            authorize("tok_chargeDeclinedExpiredCard"),
            Some(Authorization::Declined(Decline {
                code: "expired_card",
                ..
            }))
        ));
        assert_eq!(authorize("tok_nope"), None);
    }
}
