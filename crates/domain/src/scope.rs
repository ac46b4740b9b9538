//! What a token may do: the OAuth scopes this server knows, read from an
//! access token's `scope` (RFC 8693 / RFC 9068: space-separated) or `scp`
//! claim. Scopes this server does not know (`openid profile`, which every
//! identity provider's access tokens carry) are ignored, never an error.
//!
//! An [`Actor`] is who a request speaks for: a subject, its [`Role`] (a
//! customer, or the merchant's back office, which the API decides from the
//! token's audience or issuer) and the scopes it holds. Its rights:
//!
//! | route | needs | reaches |
//! |---|---|---|
//! | `POST /api/charges` | `charges:write` | charges for the subject itself |
//! | `GET` a charge, a refund, a list | `charges:read` or `charges:read_all` | the subject's own; any customer's with `charges:read_all` |
//! | `GET /api/charges?customer=` | `charges:read_all` | that customer's |
//! | `POST /api/charges/{id}/refunds` | `refunds:write` | any charge from the back office; the subject's own with `REFUNDS_BY_CUSTOMER` |
//!
//! Back-office scopes ([`BACK_OFFICE`]) count only in a back-office token:
//! a public client can ask an identity provider for any scope its API
//! defines. A token naming none of this server's scopes holds
//! [`DEFAULT`]: charge and read its own, as every token could before
//! scopes, minus refunds.

use std::fmt;

use crate::charge::CustomerId;

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
    /// `GET /api/disputes`: the back office's list of open disputes.
    DisputesRead,
}

impl Scope {
    /// Every scope, in the order [`Scopes`]'s text lists them.
    pub const ALL: [Scope; 7] = [
        Self::ChargesWrite,
        Self::ChargesRead,
        Self::ChargesReadAll,
        Self::RefundsWrite,
        Self::ChargesCapture,
        Self::EventsRead,
        Self::DisputesRead,
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
            Self::DisputesRead => "disputes:read",
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

    /// The empty set.
    pub const NONE: Scopes = Scopes(0);

    /// This set and `other`'s.
    #[must_use]
    pub const fn union(self, other: Scopes) -> Self {
        Self(self.0 | other.0)
    }

    /// This set without those of `other`.
    #[must_use]
    pub const fn without(self, other: Scopes) -> Self {
        Self(self.0 & !other.0)
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

/// What a token naming none of this server's scopes may do: charge, and
/// read its own charges and refunds.
pub const DEFAULT: Scopes = Scopes::NONE
    .with(Scope::ChargesWrite)
    .with(Scope::ChargesRead);

/// The scopes honoured only in a back-office token.
pub const BACK_OFFICE: Scopes = Scopes::NONE
    .with(Scope::ChargesReadAll)
    .with(Scope::RefundsWrite)
    .with(Scope::ChargesCapture)
    .with(Scope::EventsRead)
    .with(Scope::DisputesRead);

/// Whose token it is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Role {
    /// A customer (a mobile app): acts on its own charges.
    Customer,
    /// The merchant's back office, support tools or ops: a token of the
    /// configured back-office audience or issuer.
    BackOffice,
    /// The payment provider itself: a refund made in its dashboard, which
    /// this server learns of by its webhook. Never a token's role.
    Provider,
}

impl Role {
    /// Its name in answers (`requested_by.role`), logs and the database.
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::Customer => "customer",
            Self::BackOffice => "back_office",
            Self::Provider => "provider",
        }
    }

    pub fn parse(name: &str) -> Option<Self> {
        match name {
            "customer" => Some(Self::Customer),
            "back_office" => Some(Self::BackOffice),
            "provider" => Some(Self::Provider),
            _ => None,
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A request refused for want of `0`: 403 `insufficient_scope`, before
/// anything is read or stored.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("this token lacks the scope {0}")]
pub struct Denied(pub Scope);

/// Who a request speaks for, and what it may do.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Actor {
    subject: CustomerId,
    role: Role,
    scopes: Scopes,
}

impl Actor {
    /// The rights of a token of `role` for `subject` that names `claimed`:
    /// back-office scopes only for the back office; [`DEFAULT`] when it
    /// names none of this server's; with `refunds_by_customer`
    /// (`REFUNDS_BY_CUSTOMER`) a customer also refunds its own charges.
    pub fn new(
        subject: CustomerId,
        role: Role,
        claimed: Scopes,
        refunds_by_customer: bool,
    ) -> Self {
        let mut scopes = match role {
            Role::BackOffice => claimed,
            // Never a token's role; no rights if it were.
            Role::Customer | Role::Provider => claimed.without(BACK_OFFICE),
        };
        if scopes.is_empty() {
            scopes = DEFAULT;
        }
        if refunds_by_customer && role == Role::Customer {
            scopes = scopes.with(Scope::RefundsWrite);
        }
        Self {
            subject,
            role,
            scopes,
        }
    }

    /// A customer with [`DEFAULT`] rights.
    pub fn customer(subject: CustomerId) -> Self {
        Self::new(subject, Role::Customer, Scopes::NONE, false)
    }

    /// The token's `sub`: a charge's customer, an idempotency record's
    /// owner, a refund's `requested_by`.
    pub fn subject(&self) -> &CustomerId {
        &self.subject
    }

    pub fn role(&self) -> Role {
        self.role
    }

    /// The scopes it holds, after the rules of [`Actor::new`].
    pub fn scopes(&self) -> Scopes {
        self.scopes
    }

    /// `scope`, or [`Denied`].
    pub fn require(&self, scope: Scope) -> Result<(), Denied> {
        if self.scopes.contains(scope) {
            Ok(())
        } else {
            Err(Denied(scope))
        }
    }

    /// Create charges: `charges:write`.
    pub fn may_charge(&self) -> Result<(), Denied> {
        self.require(Scope::ChargesWrite)
    }

    /// Read charges and refunds: `charges:read` (its own) or
    /// `charges:read_all` (anyone's).
    pub fn may_read(&self) -> Result<(), Denied> {
        if self.reads_all() {
            return Ok(());
        }
        self.require(Scope::ChargesRead)
    }

    /// Refund: `refunds:write`.
    pub fn may_refund(&self) -> Result<(), Denied> {
        self.require(Scope::RefundsWrite)
    }

    /// Capture or cancel a hold: `charges:capture` (back-office tokens
    /// only hold it), on any customer's charge.
    pub fn may_capture(&self) -> Result<(), Denied> {
        self.require(Scope::ChargesCapture)
    }

    /// Read events (`GET /api/events`): `events:read`, which back-office
    /// tokens only hold (an event may be about any customer's charge).
    pub fn may_read_disputes(&self) -> Result<(), Denied> {
        self.require(Scope::DisputesRead)
    }

    pub fn may_read_events(&self) -> Result<(), Denied> {
        self.require(Scope::EventsRead)
    }

    /// Whether it reads any customer's charges and refunds.
    pub fn reads_all(&self) -> bool {
        self.scopes.contains(Scope::ChargesReadAll)
    }

    /// Whether `customer_id`'s charges are within its reach for an action
    /// that reaches everyone's when `everyone`: its own always are.
    fn reaches(&self, customer_id: &str, everyone: bool) -> bool {
        everyone || customer_id == self.subject.as_str()
    }

    /// Whether it may read what belongs to `customer_id`.
    pub fn reads(&self, customer_id: &str) -> bool {
        self.may_read().is_ok() && self.reaches(customer_id, self.reads_all())
    }

    /// Whether it may refund a charge of `customer_id`: the back office
    /// any, a customer (with `REFUNDS_BY_CUSTOMER`) its own.
    pub fn refunds(&self, customer_id: &str) -> bool {
        self.may_refund().is_ok() && self.reaches(customer_id, self.role == Role::BackOffice)
    }
}

impl fmt::Display for Actor {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.subject, self.role)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn actor(role: Role, claim: &str, refunds_by_customer: bool) -> Actor {
        let subject = CustomerId::parse("sub_1").expect("valid");
        Actor::new(
            subject,
            role,
            Scopes::from_claim(claim),
            refunds_by_customer,
        )
    }

    #[test]
    fn a_token_without_our_scopes_charges_and_reads_its_own_and_never_refunds() {
        for claim in ["", "openid profile email"] {
            let a = actor(Role::Customer, claim, false);
            assert_eq!(a.scopes(), DEFAULT);
            assert!(a.may_charge().is_ok() && a.reads("sub_1") && !a.reads("cus_other"));
            assert_eq!(a.may_refund(), Err(Denied(Scope::RefundsWrite)));
            assert!(!a.refunds("sub_1"));
        }
    }

    #[test]
    fn back_office_scopes_count_only_in_a_back_office_token() {
        let claim = "refunds:write charges:read_all";
        let customer = actor(Role::Customer, claim, false);
        assert_eq!(customer.scopes(), DEFAULT, "dropped, then nothing left");
        assert!(!customer.reads_all() && !customer.refunds("sub_1"));
        let mixed = actor(Role::Customer, "charges:read refunds:write", false);
        assert_eq!(mixed.scopes().to_string(), "charges:read");
        assert_eq!(mixed.may_charge(), Err(Denied(Scope::ChargesWrite)));

        let office = actor(Role::BackOffice, claim, false);
        assert!(office.refunds("cus_any") && office.reads("cus_any") && office.reads_all());
        assert_eq!(office.may_charge(), Err(Denied(Scope::ChargesWrite)));
        let refunds_only = actor(Role::BackOffice, "refunds:write", false);
        assert!(refunds_only.refunds("cus_any"));
        assert_eq!(refunds_only.may_read(), Err(Denied(Scope::ChargesRead)));
        assert!(!refunds_only.reads("cus_any"));
    }

    #[test]
    fn refunds_by_customer_lets_a_customer_refund_its_own_only() {
        let a = actor(Role::Customer, "", true);
        assert!(a.may_refund().is_ok() && a.refunds("sub_1") && !a.refunds("cus_other"));
        assert!(a.may_charge().is_ok());
        let office = actor(Role::BackOffice, "charges:read_all", true);
        assert!(!office.refunds("cus_any"), "the setting is for customers");
    }

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
