//! `ARCHITECTURE.md` names every source file of the three published crates, and only those: a module
//! added, moved or removed without the map fails here, so the map stays true.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

fn workspace() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).parent().expect("the workspace root").to_owned()
}

/// Every `.rs` file under `root`, as a path relative to it with `/` separators.
fn sources(root: &Path) -> BTreeSet<String> {
    let mut found = BTreeSet::new();
    let mut folders = vec![root.to_owned()];
    while let Some(folder) = folders.pop() {
        for entry in std::fs::read_dir(&folder).expect("read a source folder") {
            let path = entry.expect("a folder entry").path();
            if path.is_dir() {
                folders.push(path);
            } else if path.extension().is_some_and(|extension| extension == "rs") {
                let relative = path.strip_prefix(root).expect("under the root");
                found.insert(
                    relative.components().map(|part| part.as_os_str().to_string_lossy()).collect::<Vec<_>>().join("/"),
                );
            }
        }
    }
    found
}

/// The paths in the first column of the table under `heading`: the rooms the map names.
fn rooms(map: &str, heading: &str) -> BTreeSet<String> {
    let section = map.split(heading).nth(1).unwrap_or_else(|| panic!("ARCHITECTURE.md has no section {heading:?}"));
    let section = section.split("\n## ").next().unwrap_or_default();
    section
        .lines()
        .filter_map(|line| line.strip_prefix("| `"))
        .filter_map(|line| line.split('`').next())
        .filter(|path| path.ends_with(".rs"))
        .map(str::to_owned)
        .collect()
}

fn check(krate: &str) {
    let map = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let named = rooms(&map, &format!("## The rooms of `{krate}`"));
    let present = sources(&workspace().join(krate).join("src"));
    let unnamed: Vec<_> = present.difference(&named).collect();
    let gone: Vec<_> = named.difference(&present).collect();
    assert!(
        unnamed.is_empty() && gone.is_empty(),
        "ARCHITECTURE.md is out of date for {krate}: name these files and their one job {unnamed:?}, \
         and remove these, which no longer exist {gone:?}"
    );
}

#[test]
fn the_map_names_every_runtime_module() {
    check("idem-runtime");
}

#[test]
fn the_map_names_every_runtime_test() {
    let map = std::fs::read_to_string(workspace().join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let named = rooms(&map, "## The tests of `idem-runtime`");
    let present = sources(&workspace().join("idem-runtime").join("tests"));
    assert_eq!(named, present, "ARCHITECTURE.md's table of the runtime's tests is out of date");
}

/// Where a path the map names may be: from the workspace root, or within a crate's sources.
const BASES: [&str; 5] = ["", "idem-runtime/src", "idem-runtime/tests", "idem-cli/src", "idem-macros/src"];

/// The paths the map names in backquotes, anywhere on the page: a file (`.rs`, `.md`, `.toml`) or
/// a folder (ending in `/`); a template such as `ledger/sea/<backend>.rs` names no one file.
fn named_paths(map: &str) -> BTreeSet<String> {
    map.split('`')
        .skip(1)
        .step_by(2)
        .filter(|text| {
            !text.contains(['<', ' ', '*', '"'])
                && (text.ends_with('/') && text.len() > 1
                    || [".rs", ".md", ".toml"].iter().any(|end| text.ends_with(end)))
        })
        .map(str::to_owned)
        .collect()
}

#[test]
fn every_path_the_map_names_exists() {
    let root = workspace();
    let map = std::fs::read_to_string(root.join("ARCHITECTURE.md")).expect("read ARCHITECTURE.md");
    let paths = named_paths(&map);
    assert!(paths.len() > 80, "the map names files: {paths:?}");
    let missing: Vec<_> =
        paths.iter().filter(|path| !BASES.iter().any(|base| root.join(base).join(path.as_str()).exists())).collect();
    assert!(missing.is_empty(), "ARCHITECTURE.md names paths that do not exist: {missing:?}");
}

#[test]
fn the_path_check_sees_a_missing_path() {
    let paths = named_paths("see `idem/gone.rs` and `docs/src/` and `ledger/sea/<backend>.rs` and `not a path`");
    assert_eq!(paths.into_iter().collect::<Vec<_>>(), ["docs/src/", "idem/gone.rs"]);
    assert!(!BASES.iter().any(|base| workspace().join(base).join("idem/gone.rs").exists()));
}

#[test]
fn the_map_names_every_cli_module() {
    check("idem-cli");
}

#[test]
fn the_map_names_every_macro_module() {
    check("idem-macros");
}

/// The module a source file is, as a path (`ledger::sea::statements`; `lib.rs` is the root, ``).
fn module_of(file: &str) -> String {
    let path = file.strip_suffix(".rs").unwrap_or(file);
    let path = path.strip_suffix("/mod").unwrap_or(path);
    if path == "lib" { String::new() } else { path.replace('/', "::") }
}

/// What the crate root re-exports (`lib.rs`'s `pub use`, also inside its inline modules such as
/// `pub mod admin { pub use crate::idem::{…}; }`): each name as reached from the root
/// (`Idem`, `admin::Admin`) and the module it is defined in (`idem`). An import through a root
/// re-export (`crate::Idem`) is an import of that module.
fn root_exports(lib: &str, modules: &BTreeSet<String>) -> std::collections::BTreeMap<String, String> {
    root_export_paths(lib)
        .into_iter()
        .filter_map(|(reached, full)| {
            let parts: Vec<&str> = full.split("::").filter(|part| !part.is_empty()).collect();
            let defined = (1..parts.len())
                .rev()
                .map(|k| parts[..k].join("::"))
                .find(|candidate| modules.contains(candidate))
                .or_else(|| modules.contains(&full).then(|| full.clone()))?;
            Some((reached, defined))
        })
        .collect()
}

/// Each name `lib.rs` re-exports, as reached from the root (`Idem`, `admin::Admin`), with the
/// path it re-exports (`idem::Idem`, from the crate root; an external crate's path as written).
fn root_export_paths(lib: &str) -> Vec<(String, String)> {
    let mut exports = Vec::new();
    let mut inline: Option<String> = None;
    let mut statement: Option<String> = None;
    for line in lib.lines() {
        let code = line.split("//").next().unwrap_or_default();
        if let Some(open) = &mut statement {
            open.push_str(code);
        } else if let Some(name) = code.strip_prefix("pub mod ").and_then(|rest| rest.strip_suffix(" {")) {
            inline = Some(name.trim().to_owned());
            continue;
        } else if code == "}" {
            inline = None;
            continue;
        } else if let Some(rest) =
            code.trim_start().strip_prefix("pub use ").or_else(|| code.trim_start().strip_prefix("pub(crate) use "))
        {
            statement = Some(rest.to_owned());
        } else {
            continue;
        }
        let Some(text) = statement.as_deref().filter(|text| text.contains(';')) else { continue };
        // One space between words, none around the punctuation, so `Foo as Bar` keeps its `as`.
        let text = text.split(';').next().unwrap_or_default().split_whitespace().collect::<Vec<_>>().join(" ");
        let text = ["::", "{", "}", ","]
            .iter()
            .fold(text, |text, mark| text.replace(&format!(" {mark}"), mark).replace(&format!("{mark} "), mark));
        statement = None;
        let text = text.strip_prefix("crate::").or_else(|| text.strip_prefix("self::")).unwrap_or(&text).to_owned();
        let (prefix, items): (String, Vec<String>) = match text.split_once('{') {
            Some((prefix, items)) => {
                (prefix.to_owned(), items.trim_end_matches('}').split(',').map(str::to_owned).collect())
            }
            None => (String::new(), vec![text.clone()]),
        };
        for item in items.iter().filter(|item| !item.is_empty() && !item.ends_with('*') && !item.ends_with(" as _")) {
            let (path, alias) =
                item.split_once(" as ").map_or((item.as_str(), None), |(path, alias)| (path, Some(alias)));
            let full = format!("{prefix}{path}");
            let Some(last) = full.rsplit("::").next() else { continue };
            let name = alias.unwrap_or(last);
            let reached = inline.as_ref().map_or_else(|| name.to_owned(), |module| format!("{module}::{name}"));
            exports.push((reached, full));
        }
    }
    exports
}

/// The public surface stays small and says each thing once (issue 43, item 6): no item is
/// re-exported under two paths (`Admin` and `admin::Admin`), and the root's own names stay few.
#[test]
fn no_item_is_exported_twice_and_the_root_stays_small() {
    let lib = std::fs::read_to_string(workspace().join("idem-runtime/src/lib.rs")).expect("read lib.rs");
    // The items under `__private` are the macros' and not public API.
    let exports: Vec<(String, String)> =
        root_export_paths(&lib).into_iter().filter(|(reached, _)| !reached.starts_with("__private::")).collect();
    let mut seen = std::collections::BTreeMap::<&str, Vec<&str>>::new();
    for (reached, full) in &exports {
        seen.entry(full.as_str()).or_default().push(reached.as_str());
    }
    let twice: Vec<_> = seen.iter().filter(|(_, reached)| reached.len() > 1).collect();
    assert!(twice.is_empty(), "re-exported under more than one path: {twice:?}");
    let root: Vec<&str> =
        exports.iter().map(|(reached, _)| reached.as_str()).filter(|name| !name.contains("::")).collect();
    // What a handler author writes (issue 43: at most 25); the rest lives in its module.
    assert!(root.len() <= 25, "{} names at the crate root: {root:?}", root.len());
}

/// `mcp`'s own names stay few (issue 43, item 6: at most 15) — what a server author writes; what
/// idem puts on the wire is in `mcp::wire`, the tasks' forwarding in `mcp::tasks` — and a helper
/// the macros reach through `__private` from one of `mcp`'s rooms is not public in `mcp` as well.
#[test]
fn the_mcp_module_stays_small_and_keeps_the_macros_helpers_out() {
    let module = std::fs::read_to_string(workspace().join("idem-runtime/src/mcp/mod.rs")).expect("read mcp/mod.rs");
    let exports = root_export_paths(&module);
    let mut names: BTreeSet<String> =
        exports.iter().filter_map(|(reached, _)| reached.split("::").next()).map(str::to_owned).collect();
    names.extend(module.lines().filter_map(|line| line.strip_prefix("pub mod ")?.strip_suffix(';')).map(str::to_owned));
    // `client` (feature `mcp-client`, issue 46) is the other side's door: a client author's names live in it.
    names.remove("client");
    assert!(names.len() <= 15, "{} names in `mcp`: {names:?}", names.len());

    let lib = std::fs::read_to_string(workspace().join("idem-runtime/src/lib.rs")).expect("read lib.rs");
    let public: BTreeSet<String> = exports.iter().map(|(_, full)| full.replace("super::", "")).collect();
    let helpers: Vec<String> = root_export_paths(&lib)
        .into_iter()
        .filter(|(reached, full)| reached.starts_with("__private::") && full.matches("::").count() >= 2)
        .filter_map(|(_, full)| full.strip_prefix("mcp::").map(str::to_owned))
        .filter(|helper| public.contains(helper))
        .collect();
    assert!(helpers.is_empty(), "the macros' helpers also public in `mcp`: {helpers:?}");
}

/// The modules the code of `module` names through `crate::`, `super::` or `self::` paths,
/// outside comments and its test module, each resolved to the longest module it starts with —
/// or, for a name the crate root re-exports (`crate::Idem`, `crate::admin::Admin`), to the
/// module that defines it ([`root_exports`]). A module naming an ancestor of its own (what
/// declares it) does not count.
fn imports(
    module: &str,
    source: &str,
    modules: &BTreeSet<String>,
    exports: &std::collections::BTreeMap<String, String>,
) -> BTreeSet<String> {
    let code = source.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
    let code: Vec<&str> = code.lines().map(|line| line.split("//").next().unwrap_or_default()).collect();
    let code = code.join("\n");
    let is_ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut found = BTreeSet::new();
    let mut rest = code.as_str();
    while let Some(at) = ["crate::", "super::", "self::"].iter().filter_map(|head| rest.find(head)).min() {
        let before = rest[..at].chars().next_back();
        let path: String = rest[at..].chars().take_while(|&c| is_ident(c) || c == ':').collect();
        rest = &rest[at + path.len().max(1)..];
        if before.is_some_and(is_ident) {
            continue;
        }
        let parts: Vec<&str> = path.split("::").filter(|part| !part.is_empty()).collect();
        let mut base: Vec<&str> = module.split("::").filter(|part| !part.is_empty()).collect();
        let names: Vec<&str> = match parts.first() {
            Some(&"crate") => {
                base.clear();
                parts[1..].to_vec()
            }
            Some(&"self") => parts[1..].to_vec(),
            _ => {
                let ups = parts.iter().take_while(|part| **part == "super").count();
                base.truncate(base.len().saturating_sub(ups));
                parts[ups..].to_vec()
            }
        };
        let target = (0..=names.len())
            .rev()
            .map(|k| base.iter().chain(&names[..k]).copied().collect::<Vec<_>>().join("::"))
            .find(|candidate| modules.contains(candidate));
        // Through the root: a name it re-exports is its defining module.
        let target = match target {
            Some(root) if root.is_empty() => {
                let rooted: Vec<&str> = base.iter().chain(&names).copied().collect();
                (1..=rooted.len()).rev().find_map(|k| exports.get(&rooted[..k].join("::")).cloned()).or(Some(root))
            }
            other => other,
        };
        if let Some(target) = target
            && !target.is_empty()
            && target != module
            && !module.starts_with(&format!("{target}::"))
        {
            found.insert(target);
        }
    }
    found
}

/// The runtime's modules import one another one way: no module reaches, through the modules
/// it imports, back to itself (the ledger imports nothing of the orchestration, the secrets
/// nothing of the ledger, no backend another).
#[test]
fn the_runtime_modules_have_no_import_cycles() {
    let root = workspace().join("idem-runtime").join("src");
    // Modules declared `#[cfg(test)] mod name;` are tests, not the runtime.
    let tests: BTreeSet<String> = sources(&root)
        .iter()
        .flat_map(|file| {
            let source = std::fs::read_to_string(root.join(file)).expect("read a source file");
            let parent = module_of(file);
            let declared: Vec<String> = source
                .split("#[cfg(test)]\nmod ")
                .skip(1)
                .filter_map(|rest| rest.split_once(';').map(|(name, _)| name.trim().to_owned()))
                .filter(|name| !name.contains(char::is_whitespace))
                .map(|name| if parent.is_empty() { name } else { format!("{parent}::{name}") })
                .collect();
            declared
        })
        .collect();
    let files: Vec<String> = sources(&root).into_iter().filter(|file| !tests.contains(&module_of(file))).collect();
    let modules: BTreeSet<String> = files.iter().map(|file| module_of(file)).collect();
    let exports = root_exports(&std::fs::read_to_string(root.join("lib.rs")).expect("read lib.rs"), &modules);
    assert!(exports.get("Idem").is_some_and(|module| module == "idem"), "the root's re-exports: {exports:?}");
    let graph: std::collections::BTreeMap<String, BTreeSet<String>> = files
        .iter()
        .map(|file| {
            let source = std::fs::read_to_string(root.join(file)).expect("read a source file");
            let module = module_of(file);
            let imported = imports(&module, &source, &modules, &exports);
            (module, imported)
        })
        .collect();
    // Each import is an edge between two siblings: the children of the deepest module both
    // sit under (`ledger::sea::migrate -> idem` is `ledger -> idem` at the root). A parent's
    // use of its own child is no edge.
    let mut levels: std::collections::BTreeMap<String, std::collections::BTreeMap<String, BTreeSet<String>>> =
        std::collections::BTreeMap::new();
    for (from, targets) in &graph {
        for to in targets {
            let (a, b): (Vec<&str>, Vec<&str>) = (from.split("::").collect(), to.split("::").collect());
            let common = a.iter().zip(&b).take_while(|(x, y)| x == y).count();
            if let (Some(x), Some(y)) = (a.get(common), b.get(common)) {
                let parent = a[..common].join("::");
                levels.entry(parent).or_default().entry((*x).to_owned()).or_default().insert((*y).to_owned());
            }
        }
    }
    // A path from a sibling's imports back to it is a cycle.
    let mut cycles = Vec::new();
    for (parent, siblings) in &levels {
        for start in siblings.keys() {
            let mut seen = BTreeSet::new();
            let mut stack: Vec<Vec<String>> =
                siblings[start].iter().map(|next| vec![start.clone(), next.clone()]).collect();
            while let Some(path) = stack.pop() {
                let last = path.last().cloned().unwrap_or_default();
                if last == *start {
                    cycles.push(format!("in `{parent}`: {}", path.join(" -> ")));
                    break;
                }
                if seen.insert(last.clone()) {
                    for next in siblings.get(&last).into_iter().flatten() {
                        let mut longer = path.clone();
                        longer.push(next.clone());
                        stack.push(longer);
                    }
                }
            }
        }
    }
    assert!(cycles.is_empty(), "import cycles between the runtime's modules: {cycles:#?}");
}

/// The check sees a cycle: two modules that import each other.
#[test]
fn the_cycle_check_sees_a_cycle() {
    let modules: BTreeSet<String> = ["", "ledger", "idem", "ledger::sea"].map(str::to_owned).into();
    let exports = root_exports(
        "pub use idem::{Idem, Builder as Settings};\npub mod admin {\n    pub use crate::idem::Admin;\n}\npub use idem_macros::idempotent;\n",
        &modules,
    );
    let none = std::collections::BTreeMap::new();
    assert_eq!(imports("ledger::sea", "use crate::idem::DEFAULT;\n", &modules, &none), ["idem".to_owned()].into());
    assert_eq!(
        imports("idem", "use crate::ledger::Ledger; // crate::nothing\n", &modules, &none),
        ["ledger".to_owned()].into()
    );
    assert_eq!(imports("ledger::sea", "use super::Ledger;\n", &modules, &none), BTreeSet::new(), "its own parent");
    // Through the root's re-exports, also an aliased one and one of an inline module.
    for through in ["use crate::Idem;\n", "use crate::Settings;\n", "fn f(_: crate::admin::Admin) {}\n"] {
        assert_eq!(imports("ledger::sea", through, &modules, &exports), ["idem".to_owned()].into(), "{through}");
    }
    assert_eq!(exports.len(), 3, "{exports:?}");
}

/// No source file of the published crates passes 600 lines: a file that grows past it holds more
/// than one job, and is split along its seams (issue 43).
#[test]
fn no_source_file_passes_600_lines() {
    let mut long = Vec::new();
    for krate in ["idem-runtime", "idem-macros", "idem-cli"] {
        let root = workspace().join(krate).join("src");
        for file in sources(&root) {
            let lines = std::fs::read_to_string(root.join(&file)).expect("read a source file").lines().count();
            if lines > 600 {
                long.push(format!("{krate}/src/{file}: {lines} lines"));
            }
        }
    }
    assert!(long.is_empty(), "split these along their seams (at most 600 lines a file): {long:#?}");
}

/// Issue 43, item 3: who serves which operation is kept by the ledger's catalogue, which the
/// handles over the ledger share — never by a process static (the three registries it replaced
/// were two statics and a handle's map). A static with a lock is allowed only for what is one
/// per process by nature, each named here with why.
#[test]
fn no_process_static_keeps_who_serves_what() {
    let allowed = [
        // Route names and namespaces interned: text kept once per process, not who serves it.
        "http/mod.rs: KEPT",
        // `Idem::install`: the handle `#[idempotent]` free functions run under, one per process.
        "idem/handle.rs: INSTALLED",
        // A server type checked once for its status tool, to log an error once per type.
        "mcp/macro_support.rs: CHECKED",
    ];
    let root = workspace().join("idem-runtime").join("src");
    let mut found = Vec::new();
    for file in sources(&root) {
        let text = std::fs::read_to_string(root.join(&file)).expect("read a source file");
        for line in text.lines().map(str::trim_start) {
            let Some(rest) = line.strip_prefix("static ").or_else(|| line.strip_prefix("pub(crate) static ")) else {
                continue;
            };
            let Some((name, ty)) = rest.split_once(':') else { continue };
            if ty.contains("Mutex") || ty.contains("RwLock") {
                found.push(format!("{file}: {name}"));
            }
        }
    }
    assert_eq!(found, allowed, "a process-wide static with a lock: keep per-ledger state in its Catalogue");
}

/// The public methods of `Impl` blocks of `ty` in each runtime file (`pub fn` or `pub async fn`
/// at the block's first level), by file.
fn public_methods(ty: &str) -> std::collections::BTreeMap<String, Vec<String>> {
    let root = workspace().join("idem-runtime").join("src");
    let mut found = std::collections::BTreeMap::new();
    for file in sources(&root) {
        let text = std::fs::read_to_string(root.join(&file)).expect("read a source file");
        let mut inside = false;
        for line in text.lines() {
            let opens = (line.starts_with("impl ") || line.starts_with("impl<")) && line.ends_with('{');
            if opens {
                let named = line.trim_end_matches('{').trim();
                let target = named.rsplit(" for ").next().unwrap_or(named);
                let target = target.split_whitespace().last().unwrap_or_default();
                inside = target == ty || target.starts_with(&format!("{ty}<"));
                if inside && !named.contains(" for ") {
                    found.entry(file.clone()).or_insert_with(Vec::new);
                }
                continue;
            }
            if line == "}" {
                inside = false;
            }
            let method = line.strip_prefix("    pub fn ").or_else(|| line.strip_prefix("    pub async fn "));
            if inside && let Some(method) = method {
                let name: String = method.chars().take_while(|c| c.is_alphanumeric() || *c == '_').collect();
                found.entry(file.clone()).or_insert_with(Vec::new).push(name);
            }
        }
    }
    found
}

/// Issue 43, item 2: a small front. `Idem`'s public methods — what a door or a handler needs —
/// are in one file and few; `Admin`, the operator's verbs, is one room.
#[test]
fn the_handle_has_a_small_front_and_admin_one_room() {
    let idem = public_methods("Idem");
    let public: Vec<(&String, &Vec<String>)> = idem.iter().filter(|(_, methods)| !methods.is_empty()).collect();
    assert_eq!(public.len(), 1, "Idem's public methods live in idem/handle.rs alone: {public:?}");
    assert_eq!(public[0].0, "idem/handle.rs");
    assert!(public[0].1.len() <= 9, "Idem keeps what a door or a handler needs: {:?}", public[0].1);
    let admin: Vec<String> = public_methods("Admin").into_keys().collect();
    assert_eq!(admin, ["idem/admin.rs"], "every method of Admin is in idem/admin.rs");
}

/// Issue 43, item 1: one engine. Every door hands its `Call` to `Idem::execute`, and only the
/// doors do: `Idem::call` (which the HTTP layer calls too), the macro's plain handlers and its
/// rmcp tools. A new door goes through one of them or is named here.
#[test]
fn every_door_hands_its_call_to_one_engine() {
    let root = workspace().join("idem-runtime").join("src");
    let mut callers = Vec::new();
    for file in sources(&root) {
        let text = std::fs::read_to_string(root.join(&file)).expect("read a source file");
        let code = text.split("#[cfg(test)]\nmod tests").next().unwrap_or_default();
        if code.lines().any(|line| !line.trim_start().starts_with("//") && line.contains(".execute(Call {")) {
            callers.push(file);
        }
    }
    assert_eq!(callers, ["idem/handle.rs", "macro_support.rs", "mcp/macro_support.rs"]);
    let service = std::fs::read_to_string(root.join("http/service.rs")).expect("read the HTTP service");
    assert!(service.contains("config.idem.call(&recipe"), "the HTTP layer calls Idem::call");
}
