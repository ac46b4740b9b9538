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

/// The test tokens the network declines, and how.
const DECLINED: [(&str, Decline); 4] = [
    (
        "tok_chargeDeclined",
        Decline {
            code: "card_declined",
            decline_code: "generic_decline",
            message: "Your card was declined.",
        },
    ),
    (
        "tok_chargeDeclinedInsufficientFunds",
        Decline {
            code: "card_declined",
            decline_code: "insufficient_funds",
            message: "Your card has insufficient funds.",
        },
    ),
    (
        "tok_chargeDeclinedExpiredCard",
        Decline {
            code: "expired_card",
            decline_code: "expired_card",
            message: "Your card has expired.",
        },
    ),
    (
        "tok_chargeDeclinedFraudulent",
        Decline {
            code: "card_declined",
            decline_code: "fraudulent",
            message: "Your card was declined.",
        },
    ),
];

/// Authorises a charge on a test token; `None` for a token that does not
/// exist (Stripe answers 400 `resource_missing`, and charges nothing).
pub(crate) fn authorize(token: &str) -> Option<Authorization> {
    if matches!(token, "tok_visa" | "tok_mastercard" | "tok_amex") {
        return Some(Authorization::Approved);
    }
    DECLINED
        .iter()
        .find(|(declined, _)| *declined == token)
        .map(|(_, decline)| Authorization::Declined(*decline))
}

/// Every failure code a declined charge can carry (`Decline::code`).
pub(crate) fn failure_codes() -> impl Iterator<Item = &'static str> {
    DECLINED.iter().map(|(_, decline)| decline.code)
}

/// Every failure message a declined charge can carry (`Decline::message`).
pub(crate) fn failure_messages() -> impl Iterator<Item = &'static str> {
    DECLINED.iter().map(|(_, decline)| decline.message)
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
