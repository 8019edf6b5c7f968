//! JSON lines: on standard output, or in a file synced before an event counts as delivered.

use std::path::Path;

use tokio::io::AsyncWriteExt;
use tokio::sync::Mutex;

use crate::sink::error::{SinkError, SinkSetupError};
use crate::sink::outgoing::{Delivered, Outgoing, Sink, envelope};

/// Writes one JSON line per event to standard output, or to a file where each line is synced
/// to disk before its event counts as delivered.
#[derive(Debug)]
pub struct LinesSink {
    out: Output,
}

#[derive(Debug)]
enum Output {
    Stdout(Mutex<tokio::io::Stdout>),
    File(crate::sink::file::FileLines),
}

impl LinesSink {
    /// Lines on standard output.
    pub fn stdout() -> Self {
        Self {
            out: Output::Stdout(Mutex::new(tokio::io::stdout())),
        }
    }

    /// Lines appended to `path`.
    pub async fn file(path: &Path) -> Result<Self, SinkSetupError> {
        let cut =
            crate::sink::file::cut_torn_tail(path).map_err(|source| SinkSetupError::File {
                path: path.display().to_string(),
                source,
            })?;
        if cut > 0 {
            tracing::warn!(
                path = %path.display(),
                bytes = cut,
                "the file sink's last line was cut off half-written (a crash before its sync); \
                 its events were not acknowledged and are delivered again"
            );
        }
        // 0600 in a 0700 folder when created: the lines hold decrypted messages.
        let file = oncegate_files::open_append(path).map_err(|source| SinkSetupError::File {
            path: path.display().to_string(),
            source,
        })?;
        let name = path.display().to_string();
        let lines = crate::sink::file::FileLines::start(file, name.clone())
            .map_err(|source| SinkSetupError::File { path: name, source })?;
        Ok(Self {
            out: Output::File(lines),
        })
    }
}

impl Sink for LinesSink {
    fn deliver<'a>(&'a self, outgoing: Outgoing<'a>) -> Delivered<'a> {
        Box::pin(async move {
            let mut line = envelope(&outgoing);
            line.push(b'\n');
            match &self.out {
                Output::Stdout(stdout) => {
                    let mut stdout = stdout.lock().await;
                    let written = match stdout.write_all(&line).await {
                        Ok(()) => stdout.flush().await,
                        Err(error) => Err(error),
                    };
                    written
                        .map_err(|error| SinkError::Transient(format!("cannot write: {error}")))?;
                }
                Output::File(file) => file.append(line).await.map_err(SinkError::Transient)?,
            }
            Ok(None)
        })
    }
}
