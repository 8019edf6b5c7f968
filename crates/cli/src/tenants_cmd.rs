//! `oncegate tenants`: a running gateway's tenant registries — the corps of a WeCom suite, the
//! tenants of a Feishu store app — listed, added, disabled, enabled and removed through its admin
//! API; every gateway on the same store follows within a second.

use anyhow::bail;
use clap::{Args, Subcommand};
use serde_json::Value;

use crate::remote::{Admin, Client, error_of, print_json};

/// `oncegate tenants`.
#[derive(Debug, Args)]
pub(crate) struct TenantsArgs {
    #[command(flatten)]
    admin: Admin,
    #[command(subcommand)]
    what: Tenants,
}

#[derive(Debug, Subcommand)]
enum Tenants {
    /// A source's tenants, in id order.
    List {
        /// The source (platform = "wecom-suite", or a Feishu store app).
        source: String,
        /// Start after this tenant (the `next after` a previous listing printed).
        #[arg(long)]
        after: Option<String>,
        /// How many (1 to 1000).
        #[arg(long, default_value_t = 100)]
        limit: usize,
    },
    /// Adds a tenant (a corp id exactly as WeCom sends it: case-sensitive), or replaces its
    /// settings.
    Add {
        /// The source.
        source: String,
        /// The tenant's id.
        tenant: String,
        /// Its settings, a JSON object.
        #[arg(long)]
        settings: Option<String>,
    },
    /// Disables a tenant: it keeps its settings and credentials, but its callbacks and sends
    /// are refused until it is enabled again.
    Disable {
        /// The source.
        source: String,
        /// The tenant's id.
        tenant: String,
    },
    /// Enables a disabled tenant: it is served again.
    Enable {
        /// The source.
        source: String,
        /// The tenant's id.
        tenant: String,
    },
    /// Removes a tenant: its callbacks are refused from then on; what was admitted is still
    /// delivered.
    Remove {
        /// The source.
        source: String,
        /// The tenant's id.
        tenant: String,
    },
}

/// Runs `oncegate tenants …`: whether it did what was asked.
pub(crate) async fn tenants(args: TenantsArgs) -> anyhow::Result<bool> {
    let client = Client::new(&args.admin)?;
    let json = args.admin.json;
    let (status, answer) = match &args.what {
        Tenants::List {
            source,
            after,
            limit,
        } => {
            let limit = limit.to_string();
            let mut query = vec![("limit", limit.as_str())];
            if let Some(after) = after {
                query.push(("after", after.as_str()));
            }
            let segments = ["admin", "tenants", source.as_str()];
            client
                .at(reqwest::Method::GET, &segments, &query, None)
                .await?
        }
        Tenants::Add {
            source,
            tenant,
            settings,
        } => {
            let body: Value = match settings {
                Some(text) => match serde_json::from_str(text) {
                    Ok(value @ Value::Object(_)) => value,
                    _ => bail!("--settings is a JSON object, e.g. '{{\"name\": \"Acme\"}}'"),
                },
                None => Value::Object(Default::default()),
            };
            let segments = ["admin", "tenants", source.as_str(), tenant.as_str()];
            client
                .at(reqwest::Method::PUT, &segments, &[], Some(&body))
                .await?
        }
        Tenants::Disable { source, tenant } | Tenants::Enable { source, tenant } => {
            let action = if matches!(args.what, Tenants::Disable { .. }) {
                "disable"
            } else {
                "enable"
            };
            let segments = ["admin", "tenants", source.as_str(), tenant.as_str(), action];
            client
                .at(reqwest::Method::POST, &segments, &[], None)
                .await?
        }
        Tenants::Remove { source, tenant } => {
            let segments = ["admin", "tenants", source.as_str(), tenant.as_str()];
            client
                .at(reqwest::Method::DELETE, &segments, &[], None)
                .await?
        }
    };
    if status != 200 {
        bail!("{status}: {}", error_of(&answer));
    }
    if json {
        print_json(&answer)?;
        return Ok(true);
    }
    match &args.what {
        Tenants::List { .. } => {
            let tenants = answer["tenants"].as_array().cloned().unwrap_or_default();
            for tenant in &tenants {
                out!(
                    "{}\t{}",
                    tenant["tenant"].as_str().unwrap_or_default(),
                    tenant["settings"]
                )?;
            }
            out!(
                "{} tenant{}",
                tenants.len(),
                if tenants.len() == 1 { "" } else { "s" }
            )?;
            if let Some(next) = answer["next_after"].as_str() {
                out!("more: --after {next}")?;
            }
        }
        Tenants::Add { source, tenant, .. } => {
            out!(
                "{tenant} is a tenant of {source}: every gateway takes its callbacks within a second"
            )?;
        }
        Tenants::Disable { source, tenant } => {
            out!(
                "{tenant} of {source} is disabled: its callbacks and sends are refused until it is enabled"
            )?;
        }
        Tenants::Enable { source, tenant } => {
            out!("{tenant} of {source} is enabled: every gateway serves it within a second")?;
        }
        Tenants::Remove { source, tenant } => {
            out!("{tenant} is no longer a tenant of {source}: its callbacks are refused")?;
        }
    }
    Ok(true)
}
