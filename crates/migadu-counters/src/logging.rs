//! Log destinations shared by the application log and the counting transaction log: stderr,
//! stdout or a file that is reopened on SIGHUP; writes are unbuffered so `tail -f` sees them.

use std::fs::{File, OpenOptions};
use std::io::Write;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};

/// One destination. A file is held behind a mutex so concurrent writers never interleave a line.
pub enum LogWriter {
    Stderr,
    Stdout,
    File { path: PathBuf, file: Mutex<File> },
    Off,
}

fn open_append(path: &PathBuf) -> std::io::Result<File> {
    OpenOptions::new().create(true).append(true).open(path)
}

impl LogWriter {
    /// `stderr`, `stdout`, `off` or a path (created, appended to).
    pub fn open(spec: &str) -> std::io::Result<LogWriter> {
        Ok(match spec {
            "stderr" => LogWriter::Stderr,
            "stdout" => LogWriter::Stdout,
            "off" => LogWriter::Off,
            path => {
                let path = PathBuf::from(path);
                let file = open_append(&path).map_err(|e| {
                    std::io::Error::new(
                        e.kind(),
                        format!("cannot open log {}: {e}", path.display()),
                    )
                })?;
                LogWriter::File {
                    path,
                    file: Mutex::new(file),
                }
            }
        })
    }

    pub fn is_off(&self) -> bool {
        matches!(self, LogWriter::Off)
    }

    /// Writes the whole buffer at once; a failing log must not take the service down.
    pub fn write_all(&self, buf: &[u8]) {
        let _ = match self {
            LogWriter::Stderr => std::io::stderr().lock().write_all(buf),
            LogWriter::Stdout => std::io::stdout().lock().write_all(buf),
            LogWriter::File { file, .. } => file.lock().expect("log lock").write_all(buf),
            LogWriter::Off => Ok(()),
        };
    }

    /// Opens the path again so a file moved away by log rotation is replaced by a new one.
    pub fn reopen(&self) -> std::io::Result<()> {
        if let LogWriter::File { path, file } = self {
            let new = open_append(path)?;
            *file.lock().expect("log lock") = new;
        }
        Ok(())
    }
}

/// Adapter for tracing-subscriber.
#[derive(Clone)]
pub struct AppWriter(pub Arc<LogWriter>);

pub struct AppLine(Arc<LogWriter>);

impl Write for AppLine {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.write_all(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl<'a> tracing_subscriber::fmt::MakeWriter<'a> for AppWriter {
    type Writer = AppLine;
    fn make_writer(&'a self) -> AppLine {
        AppLine(self.0.clone())
    }
}

/// Both destinations; when they name the same file they share one writer.
pub struct Logs {
    pub app: Arc<LogWriter>,
    pub counting: Arc<LogWriter>,
}

impl Logs {
    pub fn open(output: &str, counting_output: Option<&str>) -> std::io::Result<Logs> {
        let app = Arc::new(LogWriter::open(output)?);
        let counting = match counting_output {
            None => app.clone(),
            Some(c) if c == output => app.clone(),
            Some(c) => Arc::new(LogWriter::open(c)?),
        };
        Ok(Logs { app, counting })
    }

    pub fn reopen(&self) -> std::io::Result<()> {
        self.app.reopen()?;
        if !Arc::ptr_eq(&self.app, &self.counting) {
            self.counting.reopen()?;
        }
        Ok(())
    }
}

/// Installs the application logger (`console` or `json`, at `level`).
pub fn init_app_log(writer: Arc<LogWriter>, format: &str, level: &str) {
    let filter = tracing_subscriber::EnvFilter::new(format!("{level},hyper=warn,reqwest=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(AppWriter(writer))
        .with_ansi(false)
        .with_target(false);
    let _ = if format == "json" {
        builder.json().try_init()
    } else {
        builder.try_init()
    };
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reopen_after_move_writes_to_the_new_file() {
        let dir = std::env::temp_dir().join(format!("mc-logw-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("a.log");
        let w = LogWriter::open(path.to_str().unwrap()).unwrap();
        w.write_all(b"one\n");
        std::fs::rename(&path, dir.join("a.log.0")).unwrap();
        w.write_all(b"two\n");
        w.reopen().unwrap();
        w.write_all(b"three\n");
        assert_eq!(
            std::fs::read_to_string(dir.join("a.log.0")).unwrap(),
            "one\ntwo\n"
        );
        assert_eq!(std::fs::read_to_string(&path).unwrap(), "three\n");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
