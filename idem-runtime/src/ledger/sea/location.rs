//! Where a SQL ledger is, in words an operator can act on: what was given (a URL, or a plain
//! path that means a SQLite file), the default file when nothing was, and the one description
//! that the startup log line, [`SeaOrmLedger::describe`](super::SeaOrmLedger::describe) and
//! every connection error share.
//!
//! Guarantees: no password is ever part of a description or an error (a URL's `user:pass@`
//! becomes `user:***@`, password-like query values `***`); a plain path is never mistaken for a
//! URL, nor a URL for a path.

use std::ffi::OsString;
use std::fmt;
use std::path::{Path, PathBuf};

use sea_orm::DbBackend;

use crate::ledger::LedgerError;

pub use crate::ledger::DATABASE_URL_ENV;

/// Who chose where the ledger is — what a message names, so the reader knows what to change.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(super) enum Origin {
    /// [`DATABASE_URL_ENV`].
    Env,
    /// [`DATABASE_URL_ENV`] unset: [`default_path`].
    Default,
    /// The application's code (`connect`, `connect_with`).
    Code,
    /// A connection the application opened and wrapped (`from_connection`).
    Connection,
    /// A location given to a tool that opens an existing ledger (`connect_existing`: the
    /// operator's `idem`, whose own words say where it came from).
    Given,
}

impl Origin {
    /// Who chose, in parentheses after the place.
    const fn said(self) -> &'static str {
        match self {
            Self::Env => "from IDEM_DATABASE_URL",
            Self::Default => "IDEM_DATABASE_URL unset: the default",
            Self::Code => "given in code",
            Self::Connection => "opened by the application",
            Self::Given => "as given",
        }
    }

    /// The other way out, after what to check.
    const fn remedy(self) -> &'static str {
        match self {
            Self::Env => "or set IDEM_DATABASE_URL to another location",
            Self::Default | Self::Connection => {
                "or set IDEM_DATABASE_URL to a location this user may write (a plain file path will do)"
            }
            Self::Code => "or connect to another location",
            Self::Given => "or give another location",
        }
    }
}

/// Where the default ledger of `program` is, and whether a ledger is there already:
/// [`SeaOrmLedger::default_path`](super::SeaOrmLedger::default_path), which says why there.
///
/// # Errors
/// The data directory's variable is unset (or not an absolute path), or `program` is not a name;
/// the message says to set [`DATABASE_URL_ENV`].
pub(super) fn default_path(program: &str) -> Result<(PathBuf, Found), LedgerError> {
    let exe = std::env::current_exe().ok();
    let var = |name: &str| std::env::var_os(name);
    choose_default(std::env::consts::OS, &var, program, exe.as_deref(), &|path| path.is_file()).map_err(|why| {
        LedgerError::unavailable(format!(
            "cannot choose the default ledger file: {why}. Set IDEM_DATABASE_URL to a file path (say \
             /var/lib/<app>/ledger.sqlite3) or a database URL"
        ))
    })
}

/// What is at the default location chosen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Found {
    /// A ledger, at the program's place.
    Ledger,
    /// A ledger where an earlier version kept the default — under the executable's name, not
    /// the program's — and none at the program's place: still this program's, so it is used.
    Earlier {
        /// Where the program's own would be.
        instead_of: PathBuf,
    },
    /// Nothing: a new ledger (and a new secret beside it) is made here.
    Nothing,
}

/// The default ledger of `program` on `os`, reading variables through `var`: `idem/<program>/
/// ledger.sqlite3` in the data directory — or, if nothing is there but a ledger is where an
/// earlier version kept the default (under the name of `exe`, the running executable), that one.
/// `exists` says whether a file is there.
fn choose_default(
    os: &str,
    var: &dyn Fn(&str) -> Option<OsString>,
    program: &str,
    exe: Option<&Path>,
    exists: &dyn Fn(&Path) -> bool,
) -> Result<(PathBuf, Found), String> {
    let named = |name: &str| {
        !name.is_empty() && name != "." && name != ".." && !name.contains(['/', '\\']) && !name.contains('\0')
    };
    if !named(program) {
        return Err(format!(
            "`{program}` cannot name a directory (give the program's name, e.g. env!(\"CARGO_PKG_NAME\"))"
        ));
    }
    let data = data_dir(os, var)?;
    let place = |name: &str| data.join("idem").join(name).join("ledger.sqlite3");
    let own = place(program);
    if exists(&own) {
        return Ok((own, Found::Ledger));
    }
    if let Some(earlier) = exe.and_then(|exe| executable_name(os, exe)).filter(|name| named(name) && name != program)
        && exists(&place(&earlier))
    {
        return Ok((place(&earlier), Found::Earlier { instead_of: own }));
    }
    Ok((own, Found::Nothing))
}

/// This user's data directory on `os`.
fn data_dir(os: &str, var: &dyn Fn(&str) -> Option<OsString>) -> Result<PathBuf, String> {
    let dir = |name: &str| var(name).map(PathBuf::from).filter(|dir| dir.has_root());
    Ok(match os {
        "windows" => dir("LOCALAPPDATA").ok_or("LOCALAPPDATA is not set")?,
        "macos" => dir("HOME").map(|home| home.join("Library").join("Application Support")).ok_or("HOME is not set")?,
        _ => dir("XDG_DATA_HOME")
            .or_else(|| dir("HOME").map(|home| home.join(".local").join("share")))
            .ok_or("neither XDG_DATA_HOME nor HOME is set to an absolute path")?,
    })
}

/// The executable's file name without `.exe` on Windows: what named the default ledger before
/// it was named by the program.
fn executable_name(os: &str, exe: &Path) -> Option<String> {
    let name = exe.file_name()?.to_string_lossy().into_owned();
    let suffix = if os == "windows" { ".exe" } else { "" };
    let program = match name.len().checked_sub(suffix.len()) {
        Some(cut) if !suffix.is_empty() && name.is_char_boundary(cut) && name[cut..].eq_ignore_ascii_case(suffix) => {
            &name[..cut]
        }
        _ => name.as_str(),
    };
    (!program.is_empty()).then(|| program.to_owned())
}

/// What the user gave: a database URL, or a plain path to a SQLite file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Given {
    /// `scheme://…`, or `sqlite:…` (`sqlite::memory:`).
    Url(String),
    /// Anything else: a SQLite file, relative to the working directory unless absolute.
    Path(PathBuf),
}

impl Given {
    /// Tells a URL from a plain path: a URL starts with a scheme and `://` (or is `sqlite:…`);
    /// `C:\ledger.db`, `./ledger.db` and `/var/lib/app/ledger.sqlite3` are paths.
    pub(super) fn parse(text: &str) -> Self {
        let scheme = text.split_once("://").map(|(scheme, _)| scheme);
        let is_scheme = |s: &str| {
            s.starts_with(|c: char| c.is_ascii_alphabetic())
                && s.chars().all(|c| c.is_ascii_alphanumeric() || "+-.".contains(c))
        };
        if scheme.is_some_and(is_scheme) || text.get(..7).is_some_and(|s| s.eq_ignore_ascii_case("sqlite:")) {
            Self::Url(text.to_owned())
        } else {
            Self::Path(PathBuf::from(text))
        }
    }

    /// The URL sea-orm connects to. A path becomes `sqlite:<absolute path>?mode=rwc` (created if
    /// missing): absolute, so the pool's later connections open the same file whatever the
    /// working directory is by then; `%`, `?` and `#` are escaped, as SQLite URLs decode them.
    pub(super) fn url(&self) -> String {
        match self {
            Self::Url(url) => url.clone(),
            Self::Path(path) => {
                let path = absolute(path).to_string_lossy().replace('%', "%25").replace('?', "%3F").replace('#', "%23");
                format!("sqlite:{path}?mode=rwc")
            }
        }
    }
}

/// `path` made absolute against the working directory (without touching the file system).
fn absolute(path: &Path) -> PathBuf {
    std::path::absolute(path).unwrap_or_else(|_| path.to_owned())
}

/// Where a ledger is, and who chose it.
#[derive(Clone, Debug)]
pub(super) struct Location {
    place: Place,
    origin: Origin,
    /// The URL as given, password redacted, for errors about a server; `None` for a file.
    shown: Option<String>,
}

/// What a location names.
#[derive(Clone, Debug)]
enum Place {
    /// A SQLite file (absolute).
    SqliteFile(PathBuf),
    /// An in-memory SQLite database.
    SqliteMemory,
    /// A database server.
    Server {
        /// `postgres` or `mysql`, as the URL said.
        scheme: String,
        /// Host and port as given; empty when the URL names none (the driver's default).
        address: String,
        /// The database's name; empty when the URL names none.
        database: String,
    },
    /// A URL of a kind idem does not know (sea-orm will refuse it): only its redacted self.
    Other,
    /// A connection the application opened: only its backend is known.
    Opened(DbBackend),
}

impl Location {
    /// The location `url` (as sea-orm gets it) names, chosen by `origin`.
    pub(super) fn of_url(url: &str, origin: Origin) -> Self {
        let (scheme, rest) = url.split_once(':').unwrap_or_default();
        let scheme = scheme.to_ascii_lowercase();
        let shown = Some(redact(url));
        let place = match scheme.as_str() {
            "sqlite" if super::sqlite::in_memory(url) => Place::SqliteMemory,
            "sqlite" => {
                let path = rest.trim_start_matches("//");
                let path = path.split('?').next().unwrap_or_default();
                if path.is_empty() {
                    Place::Other
                } else {
                    return Self { place: Place::SqliteFile(absolute(Path::new(&decode(path)))), origin, shown: None };
                }
            }
            "postgres" | "postgresql" | "mysql" => {
                let after = rest.strip_prefix("//").unwrap_or(rest);
                let end = after.find(['/', '?', '#']).unwrap_or(after.len());
                let (authority, path) = after.split_at(end);
                let address = authority.rsplit_once('@').map_or(authority, |(_, host)| host).to_owned();
                let database = path.strip_prefix('/').unwrap_or_default();
                let database = database.split(['?', '#']).next().unwrap_or_default().to_owned();
                let scheme = if scheme == "postgresql" { "postgres".to_owned() } else { scheme };
                Place::Server { scheme, address, database }
            }
            _ => Place::Other,
        };
        Self { place, origin, shown }
    }

    /// A connection the application opened on `backend`.
    pub(super) const fn opened(backend: DbBackend) -> Self {
        Self { place: Place::Opened(backend), origin: Origin::Connection, shown: None }
    }

    /// The location of a plain path about to be opened (before any URL exists).
    pub(super) fn of_path(path: &Path, origin: Origin) -> Self {
        Self { place: Place::SqliteFile(absolute(path)), origin, shown: None }
    }

    /// `error`, met while opening this ledger from `raw` (the URL as given, if any), with the
    /// place, who chose it and what to do; an error that is not about reaching the ledger is left
    /// as it is.
    pub(super) fn refused(&self, error: LedgerError, raw: Option<&str>) -> LedgerError {
        // The driver's error is dropped, not kept as the source: its text may quote the URL with
        // its password, and this message already carries its words, redacted.
        match error {
            LedgerError::Unavailable { detail, .. } => LedgerError::unavailable(self.cannot(&detail, raw)),
            LedgerError::Ambiguous { detail, .. } => LedgerError::ambiguous(self.cannot(&detail, raw)),
            other => other,
        }
    }

    /// The kind of database this location names (`"sqlite"`, `"postgres"`, `"mysql"`: the
    /// feature that compiles its driver in), if it names one; and who chose it.
    pub(super) fn kind(&self) -> (Option<&'static str>, Origin) {
        let kind = match &self.place {
            Place::SqliteFile(_) | Place::SqliteMemory => Some("sqlite"),
            Place::Server { scheme, .. } if scheme == "postgres" => Some("postgres"),
            Place::Server { scheme, .. } if scheme == "mysql" => Some("mysql"),
            Place::Server { .. } | Place::Other | Place::Opened(_) => None,
        };
        (kind, self.origin)
    }

    /// "cannot open <place> (<who chose it>): <cause>. <what to do>", no password in it.
    pub(super) fn cannot(&self, cause: &str, raw: Option<&str>) -> String {
        let cause = scrub(cause, raw);
        let cause = without_source_line(cause.trim_end_matches('.'));
        let origin = self.origin;
        let (said, remedy) = (origin.said(), origin.remedy());
        match &self.place {
            Place::SqliteFile(path) => format!(
                "cannot open the SQLite file {} ({said}): {cause}. Check that its directory exists (or can be \
                 created) and that this user may write there, {remedy}",
                path.display()
            ),
            Place::Server { .. } => {
                let url = self.shown.as_deref().unwrap_or_default();
                format!(
                    "cannot connect to the {} ({said}: {url}): {cause}. Check that the server is running and \
                     reachable there and that the user, password and database are right, {remedy}",
                    self.place
                )
            }
            Place::SqliteMemory | Place::Other | Place::Opened(_) => {
                let place = match &self.shown {
                    Some(url) => format!("`{url}`"),
                    None => self.place.to_string(),
                };
                format!(
                    "cannot open the ledger at {place} ({said}): {cause}. Use a `sqlite://path?mode=rwc`, \
                     `postgres://…` or `mysql://…` URL or a plain file path, {remedy}"
                )
            }
        }
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match &self.place {
            Place::Other => write!(f, "`{}`", self.shown.as_deref().unwrap_or_default())?,
            place => write!(f, "{place}")?,
        }
        write!(f, " ({})", self.origin.said())
    }
}

impl fmt::Display for Place {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::SqliteFile(path) => write!(f, "sqlite file {}", path.display()),
            Self::SqliteMemory => f.write_str("sqlite in memory (forgotten when the process exits)"),
            Self::Server { scheme, address, database } => {
                let database = if database.is_empty() { "its default" } else { database };
                let address = if address.is_empty() { "the driver's default host" } else { address };
                write!(f, "{scheme} database {database} at {address}")
            }
            Self::Other => f.write_str("an unrecognised location"),
            Self::Opened(backend) => {
                let name = match backend {
                    DbBackend::Postgres => "postgres",
                    DbBackend::MySql => "mysql",
                    _ => "sqlite",
                };
                write!(f, "{name} through a connection pool")
            }
        }
    }
}

/// `url` with its password replaced: `user:pass@` becomes `user:***@`, and the value of a query
/// parameter whose name mentions a password, secret or key becomes `***`.
pub(super) fn redact(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return redact_query(url) };
    let end = rest.find(['/', '?', '#']).unwrap_or(rest.len());
    let (authority, tail) = rest.split_at(end);
    let authority = match authority.rsplit_once('@') {
        Some((userinfo, host)) => match userinfo.split_once(':') {
            Some((user, _password)) => format!("{user}:***@{host}"),
            None => authority.to_owned(),
        },
        None => authority.to_owned(),
    };
    format!("{scheme}://{authority}{}", redact_query(tail))
}

/// The part after `?` with password-like values replaced.
fn redact_query(text: &str) -> String {
    let Some((before, query)) = text.split_once('?') else { return text.to_owned() };
    let pairs: Vec<String> = query
        .split('&')
        .map(|pair| match pair.split_once('=') {
            Some((name, _))
                if ["pass", "secret", "key", "token"].iter().any(|w| name.to_ascii_lowercase().contains(w)) =>
            {
                format!("{name}=***")
            }
            _ => pair.to_owned(),
        })
        .collect();
    format!("{before}?{}", pairs.join("&"))
}

/// `cause` (a driver's words) with `raw`, the URL as given, replaced by its redacted form
/// wherever it is quoted (sea-orm quotes a URL it cannot parse), and any other
/// `scheme://user:password@` in it redacted too.
fn scrub(cause: &str, raw: Option<&str>) -> String {
    let cause = match raw {
        Some(raw) if !raw.is_empty() => cause.replace(raw, &redact(raw)),
        _ => cause.to_owned(),
    };
    let mut out = String::with_capacity(cause.len());
    let mut rest = cause.as_str();
    while let Some(at) = rest.find("://") {
        let (head, after) = rest.split_at(at + 3);
        out.push_str(head);
        let end = after.find(['/', '?', '#', ' ', '\'', '"', '`']).unwrap_or(after.len());
        let (authority, tail) = after.split_at(end);
        match authority.rsplit_once('@').and_then(|(userinfo, host)| Some((userinfo.split_once(':')?.0, host))) {
            Some((user, host)) => out.push_str(&format!("{user}:***@{host}")),
            None => out.push_str(authority),
        }
        rest = tail;
    }
    out.push_str(rest);
    out
}

/// Decodes `%XX` escapes (as SQLite URLs do), leaving anything malformed as it is.
fn decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| (b as char).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) =
                (bytes.get(i + 1).and_then(|b| hex(*b)), bytes.get(i + 2).and_then(|b| hex(*b)))
        {
            out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'?'));
            i += 3;
        } else {
            out.push(bytes[i]);
            i += 1;
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `cause` without the PostgreSQL server's source line the driver appends to its errors
/// (`database "x" does not exist at line 948`): a place in PostgreSQL's C code, not the user's.
fn without_source_line(cause: &str) -> &str {
    match cause.rsplit_once(" at line ") {
        Some((words, line)) if !line.is_empty() && line.bytes().all(|byte| byte.is_ascii_digit()) => words,
        _ => cause,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_plain_path_is_a_sqlite_file_and_a_url_stays_a_url() {
        for path in ["/var/lib/app/ledger.sqlite3", "./ledger.db", "ledger.db", r"C:\data\ledger.db", "C:/data/l.db"] {
            assert_eq!(Given::parse(path), Given::Path(PathBuf::from(path)), "{path}");
        }
        for url in ["sqlite://a.db?mode=rwc", "sqlite::memory:", "SQLITE:a.db", "postgres://h/db", "mysql://h/db"] {
            assert_eq!(Given::parse(url), Given::Url(url.to_owned()), "{url}");
        }
        let url = Given::Path(PathBuf::from("/srv/a?b%c#d.db")).url();
        assert_eq!(url, "sqlite:/srv/a%3Fb%25c%23d.db?mode=rwc", "escaped as SQLite URLs decode them");
        let relative = Given::Path(PathBuf::from("ledger.db")).url();
        let absolute = std::env::current_dir().unwrap().join("ledger.db");
        assert_eq!(relative, format!("sqlite:{}?mode=rwc", absolute.display()), "made absolute");
    }

    #[test]
    fn a_description_names_the_place_and_who_chose_it() {
        let file = Location::of_url("sqlite:///home/u/.local/share/idem/app/ledger.sqlite3?mode=rwc", Origin::Default);
        assert_eq!(
            file.to_string(),
            "sqlite file /home/u/.local/share/idem/app/ledger.sqlite3 (IDEM_DATABASE_URL unset: the default)"
        );
        let relative = Location::of_url("sqlite://.idem/ledger.sqlite3?mode=rwc", Origin::Env);
        let absolute = std::env::current_dir().unwrap().join(".idem/ledger.sqlite3");
        assert_eq!(relative.to_string(), format!("sqlite file {} (from IDEM_DATABASE_URL)", absolute.display()));
        let memory = Location::of_url("sqlite::memory:", Origin::Code);
        assert_eq!(memory.to_string(), "sqlite in memory (forgotten when the process exits) (given in code)");
        let pg = Location::of_url("postgres://idem:hunter2@db.internal:5432/app?sslmode=require", Origin::Env);
        assert_eq!(pg.to_string(), "postgres database app at db.internal:5432 (from IDEM_DATABASE_URL)");
        let my = Location::of_url("mysql://root@127.0.0.1:3306/test", Origin::Code);
        assert_eq!(my.to_string(), "mysql database test at 127.0.0.1:3306 (given in code)");
        let bare = Location::of_url("postgresql:///", Origin::Code);
        assert_eq!(bare.to_string(), "postgres database its default at the driver's default host (given in code)");
        let odd = Location::of_url("redis://u:hunter2@h/0", Origin::Env);
        assert_eq!(odd.to_string(), "`redis://u:***@h/0` (from IDEM_DATABASE_URL)");
        let opened = Location::opened(DbBackend::Postgres);
        assert_eq!(opened.to_string(), "postgres through a connection pool (opened by the application)");
    }

    #[test]
    fn passwords_never_show() {
        assert_eq!(redact("postgres://idem:hunter2@db:5432/app"), "postgres://idem:***@db:5432/app");
        assert_eq!(redact("postgres://idem@db/app"), "postgres://idem@db/app");
        assert_eq!(redact("mysql://u:p@ss@h/db"), "mysql://u:***@h/db", "the last `@` ends the user info");
        assert_eq!(
            redact("postgres://h/db?user=u&password=hunter2&sslmode=require&sslkey=/k"),
            "postgres://h/db?user=u&password=***&sslmode=require&sslkey=***"
        );
        let raw = "postgres://idem:hunter2@db:5432/app";
        let cause = format!("The connection string '{raw}' cannot be parsed; also mysql://x:hunter3@y");
        let location = Location::of_url(raw, Origin::Env);
        let said = location.cannot(&cause, Some(raw));
        assert!(!said.contains("hunter"), "{said}");
        assert!(said.contains("'postgres://idem:***@db:5432/app'"), "{said}");
        assert!(said.contains("mysql://x:***@y"), "{said}");
    }

    fn env(pairs: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |name: &str| pairs.iter().find(|(n, _)| *n == name).map(|(_, v)| OsString::from(v))
    }

    #[test]
    fn the_default_file_is_per_user_and_per_program() {
        let nothing = |_: &Path| false;
        let exe = Some(Path::new("/opt/tickets/bin/tickets-server"));
        let linux = env(&[("HOME", "/home/u")]);
        let (path, found) = choose_default("linux", &linux, "tickets", exe, &nothing).unwrap();
        assert_eq!(
            (path.as_path(), found),
            (Path::new("/home/u/.local/share/idem/tickets/ledger.sqlite3"), Found::Nothing)
        );
        let xdg = env(&[("HOME", "/home/u"), ("XDG_DATA_HOME", "/data/u")]);
        let (path, _) = choose_default("freebsd", &xdg, "tickets", exe, &nothing).unwrap();
        assert_eq!(path, Path::new("/data/u/idem/tickets/ledger.sqlite3"));
        let relative_xdg = env(&[("HOME", "/home/u"), ("XDG_DATA_HOME", "data")]);
        let (path, _) = choose_default("linux", &relative_xdg, "tickets", exe, &nothing).unwrap();
        assert_eq!(path, Path::new("/home/u/.local/share/idem/tickets/ledger.sqlite3"), "a relative one is ignored");
        let (mac, _) = choose_default("macos", &linux, "my.server", None, &nothing).unwrap();
        assert_eq!(mac, Path::new("/home/u/Library/Application Support/idem/my.server/ledger.sqlite3"));
        let windows = env(&[("LOCALAPPDATA", "/Users/u/AppData/Local")]);
        let (path, _) = choose_default("windows", &windows, "Tickets", exe, &nothing).unwrap();
        assert_eq!(path, Path::new("/Users/u/AppData/Local/idem/Tickets/ledger.sqlite3"));
        let error = choose_default("linux", &env(&[]), "tickets", exe, &nothing).unwrap_err();
        assert_eq!(error, "neither XDG_DATA_HOME nor HOME is set to an absolute path");
        for odd in ["", ".", "..", "a/b", r"a\b"] {
            assert!(choose_default("linux", &linux, odd, exe, &nothing).is_err(), "{odd:?}");
        }
    }

    /// Issue 41, item 2: the default ledger is the program's, not the executable file's: a
    /// renamed binary (a deploy under another name, a versioned file, `.exe` or not) keeps its
    /// ledger and its secret, so its repeats are still answered.
    #[test]
    fn a_renamed_executable_keeps_its_default_ledger() {
        let linux = env(&[("HOME", "/home/u")]);
        let nothing = |_: &Path| false;
        let paths: Vec<PathBuf> = ["/opt/tickets/bin/tickets-server", "/usr/local/bin/tickets-v2", "/tmp/a.out"]
            .into_iter()
            .map(|exe| choose_default("linux", &linux, "tickets", Some(Path::new(exe)), &nothing).unwrap().0)
            .collect();
        assert!(
            paths.iter().all(|path| path == Path::new("/home/u/.local/share/idem/tickets/ledger.sqlite3")),
            "{paths:?}"
        );
        let windows = env(&[("LOCALAPPDATA", "/Users/u/AppData/Local")]);
        let a =
            choose_default("windows", &windows, "tickets", Some(Path::new("C:/bin/Tickets.EXE")), &nothing).unwrap();
        let b =
            choose_default("windows", &windows, "tickets", Some(Path::new("C:/bin/tickets-2.exe")), &nothing).unwrap();
        assert_eq!(a, b);
    }

    /// A ledger an earlier version kept under the executable's name is still found (its
    /// operations and secret are there): not stranded by the move to the program's name — and
    /// the program's own, once it exists, wins.
    #[test]
    fn a_ledger_at_the_earlier_default_is_still_used() {
        let linux = env(&[("HOME", "/home/u")]);
        let exe = Some(Path::new("/opt/tickets/bin/tickets-server"));
        let earlier = Path::new("/home/u/.local/share/idem/tickets-server/ledger.sqlite3");
        let own = Path::new("/home/u/.local/share/idem/tickets/ledger.sqlite3");
        let only_earlier = |path: &Path| path == earlier;
        let (path, found) = choose_default("linux", &linux, "tickets", exe, &only_earlier).unwrap();
        assert_eq!((path.as_path(), found), (earlier, Found::Earlier { instead_of: own.to_owned() }));
        let both = |path: &Path| path == earlier || path == own;
        let (path, found) = choose_default("linux", &linux, "tickets", exe, &both).unwrap();
        assert_eq!((path.as_path(), found), (own, Found::Ledger));
        let (path, found) = choose_default("linux", &linux, "tickets-server", exe, &only_earlier).unwrap();
        assert_eq!((path.as_path(), found), (earlier, Found::Ledger), "the same name: the same place");
    }
}
