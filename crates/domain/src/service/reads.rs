//! Reads: a charge or refund within the caller's reach, and the lists.

use super::*;

impl ChargeService {
    /// The charge `charge_id`, whoever's it is.
    pub(super) async fn charge(&self, charge_id: &str) -> Result<Option<Charge>, StoreError> {
        // An id no charge can have is not looked up.
        if !crate::charge::is_charge_id(charge_id) {
            return Ok(None);
        }
        self.store.charge(charge_id).await
    }

    /// The charge, if `actor` may read it: its own, or any with
    /// `charges:read_all`; `None` also for a charge out of reach.
    pub async fn charge_for(
        &self,
        actor: &Actor,
        charge_id: &str,
    ) -> Result<Option<Charge>, ChargeError> {
        actor.may_read()?;
        Ok(self
            .charge(charge_id)
            .await?
            .filter(|c| actor.reads(&c.customer_id)))
    }

    /// `GET /api/charges`: a page of the caller's charges; with
    /// `charges:read_all`, of the customer `customer=` names, or without
    /// it of every customer. A cursor must name a charge of that list.
    pub async fn list_charges(
        &self,
        actor: &Actor,
        query: &[(String, String)],
    ) -> Result<List<Charge>, ChargeError> {
        actor.may_read()?;
        // Authorisation first: a token that may not name a customer is
        // told so before anything about its query.
        if !actor.reads_all() && query.iter().any(|(name, _)| name == "customer") {
            return Err(Denied(Scope::ChargesReadAll).into());
        }
        let query = ChargeQuery::parse(query)?;
        let owner = match (&query.customer, actor.reads_all()) {
            (Some(customer), true) => Some(customer),
            (Some(_), false) => return Err(Denied(Scope::ChargesReadAll).into()),
            (None, true) => None,
            (None, false) => Some(actor.subject()),
        };
        if let Some(cursor) = &query.page.cursor
            && self
                .charge(cursor.id())
                .await?
                .is_none_or(|c| owner.is_some_and(|o| c.customer_id != o.as_str()))
        {
            return Err(no_such(cursor, "charge").into());
        }
        let rows = self.store.list_charges(owner, &query).await?;
        Ok(List::from_rows(
            rows,
            &query.page,
            "/api/charges".to_owned(),
        ))
    }

    /// `GET /api/charges/{id}/refunds`: a page of a readable charge's
    /// refunds; a charge out of reach is not found.
    pub async fn list_refunds(
        &self,
        actor: &Actor,
        charge_id: &str,
        query: &[(String, String)],
    ) -> Result<List<Refund>, ChargeError> {
        let page = list::parse_page(query)?;
        let charge = self
            .charge_for(actor, charge_id)
            .await?
            .ok_or(ChargeError::ChargeNotFound)?;
        if let Some(cursor) = &page.cursor {
            let refund = self.store.refund(cursor.id()).await?;
            if refund.is_none_or(|r| r.charge_id != charge.id) {
                return Err(no_such(cursor, "refund of this charge").into());
            }
        }
        let rows = self.store.list_refunds(&charge.id, &page).await?;
        let url = format!("{}/refunds", charge.location());
        Ok(List::from_rows(rows, &page, url))
    }

    /// The refund, if `actor` may read it (as its charge); `None` also
    /// for a refund out of reach.
    pub async fn refund_for(
        &self,
        actor: &Actor,
        refund_id: &str,
    ) -> Result<Option<Refund>, ChargeError> {
        actor.may_read()?;
        if !crate::charge::is_refund_id(refund_id) {
            return Ok(None);
        }
        Ok(self
            .store
            .refund(refund_id)
            .await?
            .filter(|r| actor.reads(&r.customer_id)))
    }
}

impl ChargeService {
    /// `GET /api/events`: a page of events, newest first. A cursor must
    /// name an event.
    pub async fn list_events(
        &self,
        actor: &Actor,
        query: &[(String, String)],
    ) -> Result<List<Event>, ChargeError> {
        actor.may_read_events()?;
        let query = EventQuery::parse(query)?;
        if let Some(cursor) = &query.page.cursor
            && self.event_for(actor, cursor.id()).await?.is_none()
        {
            return Err(no_such(cursor, "event").into());
        }
        let rows = self.store.list_events(&query).await?;
        Ok(List::from_rows(rows, &query.page, "/api/events".to_owned()))
    }

    /// `GET /api/events/{id}`: the event, if there is one.
    pub async fn event_for(
        &self,
        actor: &Actor,
        event_id: &str,
    ) -> Result<Option<Event>, ChargeError> {
        actor.may_read_events()?;
        // An id no event can have is not looked up.
        if !crate::events::is_event_id(event_id) {
            return Ok(None);
        }
        Ok(self.store.event(event_id).await?)
    }
}

/// A cursor that names no object the caller may page from.
pub(super) fn no_such(cursor: &Cursor, what: &str) -> InvalidRequest {
    InvalidRequest {
        param: Some(cursor.param().to_owned()),
        message: format!("no such {what}: {:?}", cursor.id()),
    }
}
