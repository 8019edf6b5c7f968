//! Whose an event is among the tenants its platform serves, read from the event alone.

/// Whose `event` is among the tenants its platform serves (routes match it, deliveries carry
/// it): a WeCom event's corp and agent, an Official Account, a Feishu event's `tenant_key`. A
/// function of the event alone, so that no configuration changes where an event goes.
pub(crate) fn of(event: &oncegate_core::Event) -> oncegate_core::Owner<'_> {
    match &*event.platform {
        #[cfg(feature = "wecom")]
        "wecom" | "wechat" => oncegate_wecom::owner(event),
        _ => oncegate_core::Owner {
            tenant: event.tenant.as_deref(),
            agent: None,
        },
    }
}
