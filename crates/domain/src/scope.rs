//! What a token may do: the OAuth scopes this server knows, read from an
//! access token's `scope` (RFC 8693 / RFC 9068: space-separated) or `scp`
//! claim. Scopes this server does not know (`openid profile`, which every
//! identity provider's access tokens carry) are ignored, never an error.
//!
//! Only the names and their parsing live here so far: issue 26 makes the
//! routes require them (a customer's own charges and reads by default,
//! refunds and cross-customer reads from the back office).

use std::fmt;

/// One scope this server knows.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Scope {
    /// Create charges for oneself.
    ChargesWrite,
    /// Read one's own charges and refunds.
    ChargesRead,
    /// Read any customer's charges and refunds (the back office).
    ChargesReadAll,
    /// Refund any customer's charge (the back office).
    RefundsWrite,
    /// Capture or release a hold (the back office).
    ChargesCapture,
    /// Read the event log (the back office).
    EventsRead,
}

impl Scope {
    /// Every scope, in the order [`Scopes`]'s text lists them.
    pub const ALL: [Scope; 6] = [
        Self::ChargesWrite,
        Self::ChargesRead,
        Self::ChargesReadAll,
        Self::RefundsWrite,
        Self::ChargesCapture,
        Self::EventsRead,
    ];

    /// The scope's name in a token.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::ChargesWrite => "charges:write",
            Self::ChargesRead => "charges:read",
            Self::ChargesReadAll => "charges:read_all",
            Self::RefundsWrite => "refunds:write",
            Self::ChargesCapture => "charges:capture",
            Self::EventsRead => "events:read",
        }
    }

    /// The scope named `name` exactly (scopes are case-sensitive, RFC 6749
    /// section 3.3), if this server knows it.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|s| s.as_str() == name)
    }

    const fn bit(self) -> u8 {
        1 << self as u8
    }
}

impl fmt::Display for Scope {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A set of [`Scope`]s.
#[derive(Clone, Copy, Default, PartialEq, Eq, Hash)]
pub struct Scopes(u8);

impl Scopes {
    /// The known scopes among `names`; the others are ignored.
    pub fn from_names<'a>(names: impl IntoIterator<Item = &'a str>) -> Self {
        names
            .into_iter()
            .filter_map(Scope::parse)
            .fold(Self::default(), |set, scope| set.with(scope))
    }

    /// The known scopes of a space-separated list (a `scope` claim).
    pub fn from_claim(words: &str) -> Self {
        Self::from_names(words.split(' ').filter(|w| !w.is_empty()))
    }

    /// This set and `scope`.
    #[must_use]
    pub const fn with(self, scope: Scope) -> Self {
        Self(self.0 | scope.bit())
    }

    pub const fn contains(self, scope: Scope) -> bool {
        self.0 & scope.bit() != 0
    }

    /// Whether it names none of this server's scopes.
    pub const fn is_empty(self) -> bool {
        self.0 == 0
    }

    pub fn iter(self) -> impl Iterator<Item = Scope> {
        Scope::ALL.into_iter().filter(move |s| self.contains(*s))
    }
}

/// Space-separated, as a `scope` claim.
impl fmt::Display for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, scope) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(" ")?;
            }
            f.write_str(scope.as_str())?;
        }
        Ok(())
    }
}

impl fmt::Debug for Scopes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Scopes({self})")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_name_reads_back() {
        for scope in Scope::ALL {
            assert_eq!(Scope::parse(scope.as_str()), Some(scope));
        }
        assert_eq!(Scope::parse("Refunds:Write"), None, "case-sensitive");
    }

    #[test]
    fn unknown_scopes_are_ignored_and_spaces_may_repeat() {
        let scopes =
            Scopes::from_claim("openid  profile refunds:write charges:read offline_access");
        assert_eq!(scopes.to_string(), "charges:read refunds:write");
        assert!(scopes.contains(Scope::RefundsWrite) && !scopes.contains(Scope::ChargesWrite));
        assert!(Scopes::from_claim("openid profile").is_empty());
        assert!(Scopes::from_claim("").is_empty());
        let listed = Scopes::from_names(["events:read", "email", "events:read"]);
        assert_eq!(listed.iter().collect::<Vec<_>>(), [Scope::EventsRead]);
    }
}
