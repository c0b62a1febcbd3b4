//! End to end with a real third-party MCP client: the official Python `mcp` SDK (pinned in
//! `tests/e2e/requirements.txt`) drives `examples/mcp_server.rs` over stdio and over streamable
//! HTTP, running the scenario in `tests/e2e/client.py` (repeats, 20 concurrent identical calls,
//! conflicts, tenants, 401s, a restart on the same `SQLite` ledger) — and a failover: two replicas
//! charging through `examples/processor.rs` (behind idem's HTTP layer), one SIGKILLed mid-charge,
//! the same call through the other: one charge at the processor, its replay marked.
//!
//! Needs the example binary (`cargo test --workspace` builds it; alone: `cargo build --example
//! mcp_server`), `python3` with `venv`, and `PyPI` (once: the venv is kept in `target/e2e-venv`).
//! On a developer machine a missing Python or `PyPI` is a printed `SKIPPED ...`; under `CI=true`
//! every missing piece is a failure.

use std::io::{BufRead, BufReader, Read};
use std::net::{TcpListener, TcpStream, ToSocketAddrs};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

const TEST_NAME: &str = "python_mcp_client_against_the_example_server";
/// One scenario run (one transport); the whole of one run takes ~10 s here.
const RUN_TIMEOUT: Duration = Duration::from_secs(75);
/// Creating the venv and installing the pinned SDK (only when the venv is missing or stale).
const INSTALL_TIMEOUT: Duration = Duration::from_mins(4);

#[test]
fn python_mcp_client_against_the_example_server() {
    let ci = std::env::var("CI").is_ok_and(|value| value == "true" || value == "1");
    let workspace = Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("tests/ lives in the workspace").to_owned();
    let e2e = workspace.join("tests").join("e2e");
    let requirements = e2e.join("requirements.txt");
    let pinned = pinned_mcp_version(&requirements);

    let server = idem_tests::example_binary("mcp_server");

    let skip = |why: String| {
        assert!(!ci, "{TEST_NAME} cannot run under CI=true: {why}");
        println!("SKIPPED {TEST_NAME}: {why}");
    };
    if let Err(why) = python3_version() {
        return skip(why);
    }
    // target/<profile>/examples/mcp_server → target/e2e-venv
    let profile_dir = server.parent().and_then(Path::parent).expect("target/<profile>/examples");
    let venv = profile_dir.parent().expect("target/<profile> has a parent").join("e2e-venv");
    let python = match prepared_venv(&venv, &requirements, &pinned) {
        Ok(python) => python,
        Err(Unavailable::Skip(why)) => return skip(why),
        Err(Unavailable::Broken(why)) => panic!("{why}"),
    };

    let client = e2e.join("client.py");
    let mut failed = Vec::new();
    // Issue 29: a third run, two replicas charging through the processor example, one SIGKILLed.
    let processor = idem_tests::example_binary("processor");
    for transport in ["stdio", "http", "failover"] {
        let mut command = Command::new(&python);
        command.arg(&client).arg("--server").arg(&server).arg("--transport").arg(transport);
        if transport == "failover" {
            command.arg("--processor").arg(&processor);
        }
        command.env("PYTHONDONTWRITEBYTECODE", "1").env("PYTHONUNBUFFERED", "1");
        if transport == "http" {
            command.arg("--port").arg(free_port().to_string());
        }
        println!("---- mcp {pinned} client over {transport}: {command:?}");
        let started = Instant::now();
        match run_streaming(&mut command, transport, RUN_TIMEOUT) {
            Ok(status) if status.success() => {
                println!("---- {transport}: passed in {:.1}s", started.elapsed().as_secs_f64());
            }
            Ok(status) => failed.push(format!("{transport}: client.py exited with {status}")),
            Err(why) => failed.push(format!("{transport}: {why}")),
        }
    }
    assert!(
        failed.is_empty(),
        "the Python MCP client's scenario failed (transcript above):\n  {}",
        failed.join("\n  ")
    );
}

/// The `mcp==X` pin of the requirements file.
fn pinned_mcp_version(requirements: &Path) -> String {
    let text = std::fs::read_to_string(requirements)
        .unwrap_or_else(|error| panic!("cannot read {}: {error}", requirements.display()));
    text.lines()
        .map(str::trim)
        .find_map(|line| line.strip_prefix("mcp=="))
        .map_or_else(|| panic!("{} does not pin `mcp==<version>`", requirements.display()), |v| v.trim().to_owned())
}

fn python3_version() -> Result<String, String> {
    let output = Command::new("python3")
        .arg("--version")
        .output()
        .map_err(|error| format!("python3 is not available ({error})"))?;
    if !output.status.success() {
        return Err(format!("`python3 --version` failed with {}", output.status));
    }
    Ok(String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

enum Unavailable {
    /// A missing piece of the machine (no venv module, no PyPI): skipped on a developer machine.
    Skip(String),
    /// Something that should have worked did not.
    Broken(String),
}

/// The venv's python with `mcp==pinned` installed: reused as is when the pin is already there.
fn prepared_venv(venv: &Path, requirements: &Path, pinned: &str) -> Result<PathBuf, Unavailable> {
    let python = if cfg!(windows) { venv.join("Scripts").join("python.exe") } else { venv.join("bin").join("python") };
    if installed_mcp_version(&python).as_deref() == Some(pinned) {
        println!("---- reusing {} (mcp {pinned})", venv.display());
        return Ok(python);
    }
    if !python.is_file() {
        println!("---- creating {}", venv.display());
        let output = run_quietly(Command::new("python3").arg("-m").arg("venv").arg(venv), INSTALL_TIMEOUT)
            .map_err(|why| Unavailable::Broken(format!("python3 -m venv: {why}")))?;
        if !output.0.success() {
            return Err(Unavailable::Skip(format!(
                "`python3 -m venv` failed (is python3-venv installed?): {}",
                output.1
            )));
        }
    }
    println!("---- installing mcp {pinned} into {}", venv.display());
    let mut pip = Command::new(&python);
    pip.args(["-m", "pip", "install", "--quiet", "--disable-pip-version-check", "--no-input", "-r"]).arg(requirements);
    let (status, output) =
        run_quietly(&mut pip, INSTALL_TIMEOUT).map_err(|why| Unavailable::Broken(format!("pip install: {why}")))?;
    if !status.success() {
        if !pypi_reachable() {
            return Err(Unavailable::Skip(format!("PyPI is not reachable, so mcp {pinned} cannot be installed")));
        }
        return Err(Unavailable::Broken(format!(
            "pip install -r {} failed ({status}):\n{output}",
            requirements.display()
        )));
    }
    match installed_mcp_version(&python) {
        Some(version) if version == pinned => Ok(python),
        other => Err(Unavailable::Broken(format!("after pip install, the venv has mcp {other:?}, not {pinned}"))),
    }
}

fn installed_mcp_version(python: &Path) -> Option<String> {
    if !python.is_file() {
        return None;
    }
    let output = Command::new(python)
        .args(["-c", "import importlib.metadata as m; print(m.version('mcp'))"])
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output.status.success().then(|| String::from_utf8_lossy(&output.stdout).trim().to_owned())
}

fn pypi_reachable() -> bool {
    let Ok(addresses) = ("pypi.org", 443).to_socket_addrs() else { return false };
    addresses.into_iter().any(|address| TcpStream::connect_timeout(&address, Duration::from_secs(5)).is_ok())
}

fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    listener.local_addr().expect("a bound address").port()
}

/// Runs `command` to completion within `timeout`; its status and combined output.
fn run_quietly(command: &mut Command, timeout: Duration) -> Result<(ExitStatus, String), String> {
    let mut child = spawn_piped(command)?;
    let readers = [collect(child.stdout.take()), collect(child.stderr.take())];
    let status = wait_bounded(&mut child, timeout)?;
    let output: String = readers.into_iter().map(|reader| reader.join().unwrap_or_default()).collect();
    Ok((status, output))
}

/// Runs `command` within `timeout`, printing each line of its output as it arrives.
fn run_streaming(command: &mut Command, label: &str, timeout: Duration) -> Result<ExitStatus, String> {
    let mut child = spawn_piped(command)?;
    let out = forward(child.stdout.take(), format!("[{label}] "));
    let err = forward(child.stderr.take(), format!("[{label} stderr] "));
    let status = wait_bounded(&mut child, timeout);
    for reader in [out, err] {
        let _ = reader.join();
    }
    status
}

fn spawn_piped(command: &mut Command) -> Result<Child, String> {
    command.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
    #[cfg(unix)]
    std::os::unix::process::CommandExt::process_group(command, 0);
    command.spawn().map_err(|error| format!("cannot start {command:?}: {error}"))
}

/// Waits for `child` at most `timeout`; past it, kills it (and on Unix the servers it started,
/// which share its process group) and says so.
fn wait_bounded(child: &mut Child, timeout: Duration) -> Result<ExitStatus, String> {
    let deadline = Instant::now() + timeout;
    loop {
        match child.try_wait() {
            Ok(Some(status)) => return Ok(status),
            Ok(None) if Instant::now() < deadline => std::thread::sleep(Duration::from_millis(50)),
            Ok(None) => {
                #[cfg(unix)]
                let _ = Command::new("kill").arg("-KILL").arg(format!("-{}", child.id())).status();
                let _ = child.kill();
                let _ = child.wait();
                return Err(format!("timed out after {}s and was killed", timeout.as_secs()));
            }
            Err(error) => return Err(format!("cannot wait for the child process: {error}")),
        }
    }
}

fn collect(pipe: Option<impl Read + Send + 'static>) -> JoinHandle<String> {
    std::thread::spawn(move || {
        let mut text = String::new();
        if let Some(mut pipe) = pipe {
            let _ = pipe.read_to_string(&mut text);
        }
        text
    })
}

fn forward(pipe: Option<impl Read + Send + 'static>, prefix: String) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let Some(pipe) = pipe else { return };
        for line in BufReader::new(pipe).lines() {
            match line {
                Ok(line) => println!("{prefix}{line}"),
                Err(_) => break,
            }
        }
    })
}
