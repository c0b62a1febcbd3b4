//! Runnable programs for idem; see the `[[example]]` targets. What they share lives here.

/// Why a program stopped, in words: its error's message and each cause — not Rust's debug
/// syntax, which is what `main` returning an error would print.
pub struct Stopped(pub Box<dyn std::error::Error>);

impl<E: Into<Box<dyn std::error::Error>>> From<E> for Stopped {
    fn from(error: E) -> Self {
        Self(error.into())
    }
}

impl std::fmt::Debug for Stopped {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let message = self.0.to_string();
        write!(f, "{message}")?;
        let mut cause = self.0.source();
        while let Some(error) = cause {
            // A cause the message already says is not said twice.
            let words = error.to_string();
            if !message.contains(&words) {
                write!(f, "\n  caused by: {words}")?;
            }
            cause = error.source();
        }
        Ok(())
    }
}

/// Waits for SIGTERM (what systemd and Kubernetes send) or SIGINT (ctrl-c): when a program
/// starts draining.
pub async fn stop_requested() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{SignalKind, signal};
        match signal(SignalKind::terminate()) {
            Ok(mut terminate) => tokio::select! {
                _ = terminate.recv() => {}
                _ = tokio::signal::ctrl_c() => {}
            },
            Err(_) => drop(tokio::signal::ctrl_c().await),
        }
    }
    #[cfg(not(unix))]
    drop(tokio::signal::ctrl_c().await);
}

/// Logs to standard error (colours on a terminal), at `RUST_LOG`'s levels, `info` by default.
pub fn log_to_stderr() {
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_env_filter(tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| "info".into()))
        .init();
}
