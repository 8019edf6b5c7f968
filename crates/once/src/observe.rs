//! What the protocol tells whoever counts: renewals, lost leases, refused completions,
//! guards dropped unsettled.

use oncegate_core::Lease;

/// How one renewal of a running lease went.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Renewal {
    /// The store extended the lease.
    Renewed,
    /// The store refused: another holder took the key over (the lease had run out).
    Lost,
    /// The store did not answer; the lease may still run out.
    Failed,
}

/// Hears what the protocol does, for metrics and logs. Every method has an empty default, so
/// an observer implements only what it counts.
pub trait Observer: Send + Sync + 'static {
    /// A renewal of `lease` while its work ran.
    fn renewal(&self, lease: &Lease, renewal: Renewal) {
        let _ = (lease, renewal);
    }

    /// A completion of `lease` was refused: its key was taken over meanwhile, so the other
    /// holder's work may run too.
    fn fenced(&self, lease: &Lease) {
        let _ = lease;
    }

    /// A guard was dropped without being settled (an error path, a panic, a cancelled task):
    /// its key is released in the background.
    fn abandoned(&self, lease: &Lease) {
        let _ = lease;
    }
}

/// The observer that hears nothing, but logs a lost lease.
#[derive(Debug, Default, Clone, Copy)]
pub struct Quiet;

impl Observer for Quiet {
    fn renewal(&self, lease: &Lease, renewal: Renewal) {
        if renewal == Renewal::Lost {
            tracing::warn!(key = %lease.key, "lease lost while its work runs");
        }
    }
}
