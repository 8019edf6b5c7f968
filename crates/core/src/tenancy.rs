//! Sources that serve many tenants: what a platform's lifecycle pushes change (a ticket, a
//! tenant that joins or leaves) and the set of tenants a source takes callbacks from.

/// A change to a multi-tenant source's state that one of its platform's pushes makes.
#[derive(Clone, PartialEq, Eq)]
pub enum TenancyChange {
    /// The platform's latest ticket for the app (WeCom's `suite_ticket`, pushed every 10
    /// minutes, valid 30): kept in the store and shared by every gateway, the newest winning.
    Ticket {
        /// The ticket.
        ticket: String,
        /// When the platform issued it, unix seconds.
        issued_secs: u64,
        /// How long it is kept: WeCom's `suite_ticket` is valid 30 minutes; Feishu's
        /// `app_ticket` (pushed hourly, its life undocumented) is kept 12 hours, as its
        /// official SDKs keep it.
        life: std::time::Duration,
    },
    /// A tenant installed or enabled the app (Feishu's `app_open`, `app_status_change` to
    /// `start_by_tenant`): it joins the registry.
    Joined {
        /// The tenant.
        tenant: String,
    },
    /// A tenant left (WeCom's `cancel_auth`; Feishu's `app_uninstalled`, `app_status_change` to
    /// a stop): its callbacks are refused from then on; what
    /// was admitted is still delivered.
    Left {
        /// The tenant.
        tenant: String,
    },
    /// A tenant authorised the app, or asked for a new secret (WeCom's `create_auth`,
    /// `reset_permanent_code`): its one-use code is exchanged for the tenant's permanent
    /// credential, which adds (or renews) the tenant. Done from the queue, never inside the
    /// platform's answer deadline (1000 ms).
    Authorised {
        /// The temporary authorisation code (10 minutes, one use). A secret: never logged.
        auth_code: String,
    },
    /// A tenant changed what it authorised (WeCom's `change_auth`: the app's visibility, its
    /// permissions, a 代开发 app enabled or disabled): what the gateway keeps of it (its
    /// agent, its name) is read again from the platform, from the queue.
    Rescoped {
        /// The tenant.
        tenant: String,
    },
}

/// Tickets and codes are secrets: shown as their kind only.
impl std::fmt::Debug for TenancyChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            TenancyChange::Ticket { issued_secs, .. } => f
                .debug_struct("Ticket")
                .field("issued_secs", issued_secs)
                .finish_non_exhaustive(),
            TenancyChange::Left { tenant } => {
                f.debug_struct("Left").field("tenant", tenant).finish()
            }
            TenancyChange::Joined { tenant } => {
                f.debug_struct("Joined").field("tenant", tenant).finish()
            }
            TenancyChange::Rescoped { tenant } => {
                f.debug_struct("Rescoped").field("tenant", tenant).finish()
            }
            TenancyChange::Authorised { .. } => {
                f.debug_struct("Authorised").finish_non_exhaustive()
            }
        }
    }
}

/// The set of tenants a source takes callbacks from, replaced whole by whoever keeps the
/// registry. Tenant ids are opaque and case-sensitive: never normalised.
pub trait TenantSet: Send + Sync {
    /// Replaces the set.
    fn replace(&self, tenants: Vec<String>);

    /// Replaces the set with `tenants` and each one's settings (the JSON object the registry
    /// keeps), answering the tenants it left out, each with why: settings it cannot serve a
    /// tenant with. A set of ids only (the default) takes every one.
    fn replace_with_settings(&self, tenants: Vec<(String, bytes::Bytes)>) -> Vec<(String, String)> {
        self.replace(tenants.into_iter().map(|(tenant, _)| tenant).collect());
        Vec::new()
    }

    /// Whether a tenant with `settings` can be served: the refusal is said to whoever adds
    /// it. Any settings do for a set of ids only (the default).
    fn check_settings(&self, settings: &[u8]) -> Result<(), String> {
        let _ = settings;
        Ok(())
    }

    /// Whether `tenant` is in the set.
    fn contains(&self, tenant: &str) -> bool;

    /// How many tenants the set holds.
    fn len(&self) -> usize;

    /// Whether the set is empty.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

/// A [`TenantSet`] in memory: read on every callback, replaced whole by whoever keeps the
/// registry (the gateway, from the store) — the new set is built before the lock is taken.
#[derive(Debug, Default)]
pub struct Tenants {
    ids: std::sync::RwLock<std::collections::HashSet<String>>,
}

impl Tenants {
    fn ids(&self) -> std::sync::RwLockReadGuard<'_, std::collections::HashSet<String>> {
        self.ids
            .read()
            .unwrap_or_else(|poisoned| poisoned.into_inner())
    }
}

impl TenantSet for Tenants {
    fn replace(&self, tenants: Vec<String>) {
        let ids = tenants.into_iter().collect();
        let old = std::mem::replace(
            &mut *self
                .ids
                .write()
                .unwrap_or_else(|poisoned| poisoned.into_inner()),
            ids,
        );
        // Dropped after the lock is let go.
        drop(old);
    }

    fn contains(&self, tenant: &str) -> bool {
        self.ids().contains(tenant)
    }

    fn len(&self) -> usize {
        self.ids().len()
    }
}

/// Whose an event is: its tenant (a Feishu `tenant_key`, a WeCom corp) and, where the platform
/// has them, its agent (a WeCom app's AgentID). Routes match both; deliveries carry both (the
/// envelope's `owner`, with what it has).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct Owner<'a> {
    /// The tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tenant: Option<&'a str>,
    /// The agent within the tenant.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub agent: Option<&'a str>,
}

impl Owner<'_> {
    /// Whether it names neither.
    pub fn is_empty(&self) -> bool {
        self.tenant.is_none() && self.agent.is_none()
    }
}
