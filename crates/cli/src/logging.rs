//! The log: human or JSON lines on stderr, each carrying this gateway's instance name.

use std::io::Write;
use std::sync::Arc;

use oncegate_config::LogFormat;
use tracing_subscriber::fmt::MakeWriter;

/// Writes each formatted line to stderr with the instance name put in front (JSON: as the
/// object's first field). The formatter hands over one whole line per write.
#[derive(Clone)]
struct Tagged {
    tag: Arc<[u8]>,
    json: bool,
}

struct TaggedWriter {
    tag: Arc<[u8]>,
    json: bool,
}

impl Write for TaggedWriter {
    fn write(&mut self, line: &[u8]) -> std::io::Result<usize> {
        let mut out = std::io::stderr().lock();
        match line.strip_prefix(b"{") {
            Some(rest) if self.json => {
                out.write_all(&self.tag)?;
                out.write_all(rest)?;
            }
            _ => {
                out.write_all(&self.tag)?;
                out.write_all(line)?;
            }
        }
        Ok(line.len())
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stderr().flush()
    }
}

impl<'a> MakeWriter<'a> for Tagged {
    type Writer = TaggedWriter;

    fn make_writer(&'a self) -> Self::Writer {
        TaggedWriter {
            tag: self.tag.clone(),
            json: self.json,
        }
    }
}

fn filter() -> tracing_subscriber::EnvFilter {
    tracing_subscriber::EnvFilter::try_from_env("ONCEGATE_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"))
}

/// Colours only on a terminal: files, pipes and journald get plain text.
fn colours() -> bool {
    use std::io::IsTerminal;
    std::io::stderr().is_terminal()
}

/// The log of a command that is not the gateway: plain lines, no instance.
pub(crate) fn init_plain() {
    tracing_subscriber::fmt()
        .with_env_filter(filter())
        .with_ansi(colours())
        .with_writer(std::io::stderr)
        .init();
}

/// The gateway's log, as `[log]` says.
pub(crate) fn init(format: LogFormat, instance: &str) {
    match format {
        LogFormat::Json => {
            let field = serde_json::to_string(instance).unwrap_or_else(|_| "\"?\"".into());
            let tag: Arc<[u8]> = format!("{{\"instance\":{field},").into_bytes().into();
            tracing_subscriber::fmt()
                .json()
                .flatten_event(true)
                .with_current_span(false)
                .with_env_filter(filter())
                .with_writer(Tagged { tag, json: true })
                .init();
        }
        LogFormat::Human => {
            let tag: Arc<[u8]> = format!("[{instance}] ").into_bytes().into();
            tracing_subscriber::fmt()
                .with_env_filter(filter())
                .with_ansi(colours())
                .with_writer(Tagged { tag, json: false })
                .init();
        }
    }
}
