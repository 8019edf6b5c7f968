//! What `check-config` checks on this machine beyond the file itself: the listeners' ports can
//! be bound, and the embedded store's and file sinks' folders can be written. A configuration that is valid
//! but fails at `serve` on the first try is what a new user meets first.

use std::io::ErrorKind;
use std::path::Path;

use oncegate_config::{Config, Problem, Severity, SinkKind, StoreConfig};

/// Problems `serve` would meet here with `config`.
pub(crate) fn problems(config: &Config) -> Vec<Problem> {
    let mut found = Vec::new();
    let mut listeners = vec![
        ("server.listen", config.server.listen.as_str()),
        ("server.admin_listen", config.server.admin_listen.as_str()),
    ];
    if !config.api.callers.is_empty() {
        listeners.push(("api.listen", config.api.listen.as_str()));
    }
    for (setting, address) in listeners {
        if let Some(problem) = bind(setting, address) {
            found.push(problem);
        }
    }
    if let StoreConfig::Embedded(settings) = &config.store
        && let Some(problem) = writable("store.path", &settings.path)
    {
        found.push(problem);
    }
    // A file sink's folder, as the store's: the sink opens its file there at start.
    for (i, route) in config.routes.iter().enumerate() {
        if let (SinkKind::File, Some(path)) = (route.sink, &route.path) {
            let setting = format!("route[{i}].path");
            let problem = if path.is_dir() {
                Some(Problem {
                    severity: Severity::Error,
                    setting,
                    message: format!("{} is a folder: name the file to write", path.display()),
                })
            } else {
                let folder = path.parent().filter(|p| !p.as_os_str().is_empty());
                writable(&setting, folder.unwrap_or(Path::new(".")))
            };
            found.extend(problem);
        }
    }
    found
}

/// Binds `address` for a moment: in use is a warning (a gateway running with this file right
/// now holds it too), refused is an error.
fn bind(setting: &str, address: &str) -> Option<Problem> {
    let error = std::net::TcpListener::bind(address).err()?;
    Some(match error.kind() {
        ErrorKind::AddrInUse => Problem {
            severity: Severity::Warning,
            setting: setting.into(),
            message: format!(
                "{address} is in use by another process now: serve will fail to start until it stops (or choose another port)"
            ),
        },
        ErrorKind::PermissionDenied => Problem {
            severity: Severity::Error,
            setting: setting.into(),
            message: format!(
                "{address} may not be bound by this user ({error}): ports below 1024 need root or CAP_NET_BIND_SERVICE; choose a port of 1024 or above"
            ),
        },
        _ => Problem {
            severity: Severity::Error,
            setting: setting.into(),
            message: format!("{address} cannot be bound here: {error}"),
        },
    })
}

/// Whether the store's folder (or, before it exists, the folder it would be made in) takes a
/// new file. Farther up nothing is tried: a path of another machine (a container's volume,
/// checked on the build host) is not this machine's problem.
///
/// A file where a folder of the path must be is an error anywhere: no folder can be made in it.
fn writable(setting: &str, path: &Path) -> Option<Problem> {
    let nearest = path
        .ancestors()
        .filter(|p| !p.as_os_str().is_empty())
        .find(|p| p.exists());
    if let Some(file) = nearest.filter(|p| !p.is_dir()) {
        return Some(Problem {
            severity: Severity::Error,
            setting: setting.into(),
            message: if file == path {
                format!(
                    "{} is a file, not a folder: choose another path",
                    path.display()
                )
            } else {
                format!(
                    "{} is a file, not a folder: {} cannot be made in it; choose another path",
                    file.display(),
                    path.display()
                )
            },
        });
    }
    let folder = if path.is_dir() {
        path
    } else {
        let parent = path.parent().filter(|p| !p.as_os_str().is_empty());
        let parent = parent.unwrap_or(Path::new("."));
        if !parent.is_dir() {
            return None;
        }
        parent
    };
    let probe = folder.join(format!(".oncegate-check-{}", std::process::id()));
    let made = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .open(&probe);
    let error = match made {
        Ok(_) => {
            let _ = std::fs::remove_file(&probe);
            return None;
        }
        Err(error) => error,
    };
    Some(Problem {
        severity: Severity::Error,
        setting: setting.into(),
        message: format!(
            "{} cannot be written by this user ({error}): the store lives there; give the user running oncegate that folder, or choose another",
            folder.display()
        ),
    })
}
