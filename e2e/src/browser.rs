//! Headless Chromium for tests: load a page and read its DOM, or take a
//! screenshot of it, or keep it open and ask it questions as it runs
//! ([`live`]). Each run gets a throwaway profile and is bounded by a
//! timeout, so a hung browser fails the test instead of stalling it.

pub mod live;

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
    process::{ExitStatus, Stdio},
    time::Duration,
};

use tokio::process::Command;

/// The names Chromium goes by, tried in this order.
const CANDIDATES: [&str; 3] = ["chromium", "chromium-browser", "google-chrome"];

/// How long `--version` may take when looking for the browser.
const PROBE_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of the browser's stderr an error keeps (its tail).
const STDERR_TAIL: usize = 2000;

/// Running the browser went wrong.
#[derive(Debug, thiserror::Error)]
pub enum BrowserError {
    /// None of the candidate programs answered `--version`.
    #[error("no Chromium found (tried {}): install Debian's chromium", CANDIDATES.join(", "))]
    NotFound,
    /// A file URL was asked for a relative path.
    #[error("{} is not an absolute path", .0.display())]
    NotAbsolute(PathBuf),
    /// The throwaway profile directory could not be made.
    #[error("creating a profile directory: {0}")]
    Profile(#[source] std::io::Error),
    /// The browser could not be started or waited for.
    #[error("running {program}: {source}")]
    Run {
        /// The program.
        program: String,
        /// Why.
        source: std::io::Error,
    },
    /// The browser did not finish in time (it is killed).
    #[error("{program} did not finish within {timeout:?}")]
    Timeout {
        /// The program.
        program: String,
        /// The bound it exceeded.
        timeout: Duration,
    },
    /// The browser exited with an error.
    #[error("{program} failed ({status}): {stderr}")]
    Failed {
        /// The program.
        program: String,
        /// How it exited.
        status: ExitStatus,
        /// The tail of what it wrote to stderr.
        stderr: String,
    },
    /// The browser's DevTools endpoint did not answer as the protocol says.
    #[error("{program}'s DevTools: {detail}")]
    Devtools {
        /// The program.
        program: String,
        /// What went wrong.
        detail: String,
    },
    /// The browser exited cleanly but wrote no screenshot.
    #[error("{program} wrote no screenshot to {}", .path.display())]
    NoScreenshot {
        /// The program.
        program: String,
        /// Where the PNG was expected.
        path: PathBuf,
    },
}

/// A Chromium binary, run headless.
#[derive(Debug, Clone)]
pub struct Chromium {
    program: String,
    timeout: Duration,
}

impl Chromium {
    /// The default bound on one run of the browser.
    pub const DEFAULT_TIMEOUT: Duration = Duration::from_secs(60);

    /// Finds the first of `chromium`, `chromium-browser` and `google-chrome`
    /// that answers `--version`.
    pub async fn find() -> Result<Self, BrowserError> {
        for program in CANDIDATES {
            let probe = Command::new(program)
                .arg("--version")
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .kill_on_drop(true)
                .status();
            if let Ok(Ok(status)) = tokio::time::timeout(PROBE_TIMEOUT, probe).await
                && status.success()
            {
                return Ok(Self {
                    program: program.to_owned(),
                    timeout: Self::DEFAULT_TIMEOUT,
                });
            }
        }
        Err(BrowserError::NotFound)
    }

    /// The same browser with another bound on each run.
    #[must_use]
    pub fn with_timeout(self, timeout: Duration) -> Self {
        Self { timeout, ..self }
    }

    /// The program that is run.
    pub fn program(&self) -> &str {
        &self.program
    }

    /// Loads `url` and returns its DOM after load, serialised as HTML.
    pub async fn dump_dom(&self, url: &str) -> Result<String, BrowserError> {
        let stdout = self.run(["--dump-dom".into(), url.into()]).await?;
        Ok(String::from_utf8_lossy(&stdout).into_owned())
    }

    /// Loads `url` in a `width`×`height` window and writes a PNG of that
    /// window to `png`.
    pub async fn screenshot(
        &self,
        url: &str,
        png: &Path,
        width: u32,
        height: u32,
    ) -> Result<(), BrowserError> {
        // A PNG left from an earlier run must not pass for this one.
        match std::fs::remove_file(png) {
            Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
                return Err(self.run_error(err));
            }
            _ => {}
        }
        let mut target = OsString::from("--screenshot=");
        target.push(png);
        self.run([
            target,
            format!("--window-size={width},{height}").into(),
            url.into(),
        ])
        .await?;
        if png.is_file() {
            Ok(())
        } else {
            Err(BrowserError::NoScreenshot {
                program: self.program.clone(),
                path: png.to_owned(),
            })
        }
    }

    /// The browser, headless, on the fresh profile `profile`, with `args`
    /// after the common ones.
    fn command(&self, profile: &Path, args: impl IntoIterator<Item = OsString>) -> Command {
        let mut user_data_dir = OsString::from("--user-data-dir=");
        user_data_dir.push(profile);
        let mut command = Command::new(&self.program);
        command
            .args([
                "--headless",
                "--no-sandbox",
                "--disable-gpu",
                "--disable-dev-shm-usage",
                "--hide-scrollbars",
                "--no-first-run",
                "--no-default-browser-check",
            ])
            .arg(user_data_dir)
            .args(args)
            .stdin(Stdio::null())
            .kill_on_drop(true);
        command
    }

    /// Runs the browser headless with a fresh profile and `args`, and
    /// returns its stdout.
    async fn run(&self, args: impl IntoIterator<Item = OsString>) -> Result<Vec<u8>, BrowserError> {
        let profile = tempfile::tempdir().map_err(BrowserError::Profile)?;
        let output = self.command(profile.path(), args).output();
        let output = tokio::time::timeout(self.timeout, output)
            .await
            .map_err(|_| BrowserError::Timeout {
                program: self.program.clone(),
                timeout: self.timeout,
            })?
            .map_err(|err| self.run_error(err))?;
        if !output.status.success() {
            let stderr = String::from_utf8_lossy(&output.stderr);
            let start = stderr.floor_char_boundary(stderr.len().saturating_sub(STDERR_TAIL));
            return Err(BrowserError::Failed {
                program: self.program.clone(),
                status: output.status,
                stderr: stderr[start..].trim().to_owned(),
            });
        }
        Ok(output.stdout)
    }

    fn run_error(&self, source: std::io::Error) -> BrowserError {
        BrowserError::Run {
            program: self.program.clone(),
            source,
        }
    }
}

/// The `file://` URL of an absolute path, percent-encoding every byte a URL
/// path cannot hold as is.
pub fn file_url(path: &Path) -> Result<String, BrowserError> {
    if !path.is_absolute() {
        return Err(BrowserError::NotAbsolute(path.to_owned()));
    }
    let mut url = String::from("file://");
    for &byte in path.as_os_str().as_encoded_bytes() {
        if byte.is_ascii_alphanumeric() || b"/-._~".contains(&byte) {
            url.push(char::from(byte));
        } else {
            url.push_str(&format!("%{byte:02X}"));
        }
    }
    Ok(url)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_urls_encode_what_a_url_cannot_hold() {
        assert_eq!(
            file_url(Path::new("/tmp/run 1/report#2.html"))
                .ok()
                .as_deref(),
            Some("file:///tmp/run%201/report%232.html")
        );
    }

    #[test]
    fn file_urls_need_an_absolute_path() {
        assert!(matches!(
            file_url(Path::new("report.html")),
            Err(BrowserError::NotAbsolute(_))
        ));
    }
}
