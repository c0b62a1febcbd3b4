//! Route templates as axum 0.8's router (matchit 0.8) reads and matches them, so the layer
//! protects a route exactly where the router sends its requests — and refuses, when it is built,
//! a template it could not match that way.
//!
//! - Text matches itself, byte for byte (`{{` and `}}` are a literal `{` and `}`); a trailing
//!   slash is part of the route (`/payments/` is not `/payments`), and the root is `/`.
//! - `{name}` matches the rest of its segment, up to the next `/` or the end of the path (the
//!   segment may have text before it, `/v{version}`, never after it). At the end of the template
//!   it matches at least one character; before a `/` it may match none (`/a/{id}/b` matches
//!   `/a//b`, as the router does).
//! - `{*name}`, only at the end, matches everything that remains — one or more segments, slashes
//!   included — but never nothing (`/files/{*rest}` does not match `/files/` nor `/files`).
//! - Where two of the layer's templates match one path, the router's priority decides: at the
//!   first character they take differently, text wins over `{name}`, which wins over `{*name}`.

/// One piece of a template.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Piece {
    /// Literal text, escapes undone.
    Text(String),
    /// `{name}`: the rest of a segment.
    Param,
    /// `{*name}`: the rest of the path, at least one character.
    CatchAll,
}

/// How one path was matched, per character: by text (0), a `{name}` (1, with a mark where it
/// starts, so an empty one counts) or a `{*name}` (2). The smallest wins, as in the router.
pub(super) type Rank = Vec<u8>;

/// `template` as pieces, or why the layer cannot match it as axum's router would, with what to
/// write instead.
pub(super) fn parse(template: &str) -> Result<Vec<Piece>, String> {
    if template.is_empty() {
        return Err("a route template starts with `/`; the root route is written `/`".to_owned());
    }
    if !template.starts_with('/') {
        return Err(format!("a route template starts with `/`, as axum's Router::route takes it: write `/{template}`"));
    }
    // axum 0.8 refuses the 0.7 capture syntax (`:id`, `*rest`) in a route: a template written so
    // would never match the route the router has.
    if template.split('/').any(|segment| segment.starts_with(':') || segment.starts_with('*')) {
        let rewritten: Vec<String> = template
            .split('/')
            .map(|segment| {
                if let Some(name) = segment.strip_prefix(':') {
                    format!("{{{name}}}")
                } else if let Some(name) = segment.strip_prefix('*') {
                    format!("{{*{name}}}")
                } else {
                    segment.to_owned()
                }
            })
            .collect();
        let rewritten = rewritten.join("/");
        return Err(format!(
            "axum 0.8 writes a capture `{{id}}` and a catch-all `{{*rest}}` (not `:id`, `*rest`): write `{rewritten}`"
        ));
    }
    let bytes = template.as_bytes();
    let mut pieces = Vec::new();
    let mut text = String::new();
    let mut chars = template.char_indices().peekable();
    while let Some((at, c)) = chars.next() {
        match c {
            '{' if chars.peek().is_some_and(|&(_, next)| next == '{') => {
                chars.next();
                text.push('{');
            }
            '}' if chars.peek().is_some_and(|&(_, next)| next == '}') => {
                chars.next();
                text.push('}');
            }
            '}' => {
                return Err(format!(
                    "a `}}` without its `{{` at byte {at}; a literal brace is written twice (`}}}}`, `{{{{`)"
                ));
            }
            '{' => {
                let Some(close) = template[at..].find('}').map(|offset| at + offset) else {
                    return Err(format!(
                        "a `{{` without its closing `}}` at byte {at}; write `{{name}}` for a parameter, `{{{{` for a literal `{{`"
                    ));
                };
                let inner = &template[at + 1..close];
                let (catch_all, name) = inner.strip_prefix('*').map_or((false, inner), |name| (true, name));
                if name.is_empty() || name.contains(['{', '*', '/']) {
                    return Err(format!(
                        "`{{{inner}}}` is not a parameter: a parameter has a name (`{{id}}`, `{{*rest}}`) without `{{`, `*` or `/` in it"
                    ));
                }
                let after = bytes.get(close + 1).copied();
                if catch_all && after.is_some() {
                    return Err(format!(
                        "a catch-all `{{*{name}}}` is only allowed at the end of a route: write `{}`",
                        &template[..=close]
                    ));
                }
                if after.is_some_and(|after| after != b'/') {
                    let end = template[close..].find('/').map_or(template.len(), |offset| close + offset);
                    let rewritten = format!("{}{}", &template[..=close], &template[end..]);
                    return Err(format!(
                        "a parameter ends its segment (axum's router refuses text after `{{{name}}}` in one \
                         segment): write `{rewritten}` and read the rest of the segment in the handler"
                    ));
                }
                if !text.is_empty() {
                    pieces.push(Piece::Text(std::mem::take(&mut text)));
                }
                pieces.push(if catch_all { Piece::CatchAll } else { Piece::Param });
                while chars.peek().is_some_and(|&(next, _)| next <= close) {
                    chars.next();
                }
            }
            c => text.push(c),
        }
    }
    if !text.is_empty() {
        pieces.push(Piece::Text(text));
    }
    Ok(pieces)
}

/// Whether `pieces` match `path` as the router would, and how (for priority).
pub(super) fn matches(pieces: &[Piece], path: &str) -> Option<Rank> {
    let mut rest = path;
    let mut rank = Rank::with_capacity(path.len() + 2);
    for (i, piece) in pieces.iter().enumerate() {
        match piece {
            Piece::Text(text) => {
                rest = rest.strip_prefix(text.as_str())?;
                rank.extend(std::iter::repeat_n(0, text.len()));
            }
            Piece::Param => {
                let end = rest.find('/').unwrap_or(rest.len());
                let last = i + 1 == pieces.len();
                // At the end, at least one character and nothing after; before a `/`, possibly
                // none (the router reaches a parameter only with something left to match).
                if (last && (end == 0 || end != rest.len())) || rest.is_empty() {
                    return None;
                }
                rank.push(1);
                rank.extend(std::iter::repeat_n(1, end));
                rest = &rest[end..];
            }
            Piece::CatchAll => {
                if rest.is_empty() {
                    return None;
                }
                rank.push(2);
                rank.extend(std::iter::repeat_n(2, rest.len()));
                rest = "";
            }
        }
    }
    rest.is_empty().then_some(rank)
}

#[cfg(test)]
mod tests {
    use super::{Piece, matches, parse};

    fn at(template: &str, path: &str) -> bool {
        matches(&parse(template).unwrap(), path).is_some()
    }

    #[test]
    fn templates_match_where_axum_routes() {
        assert!(at("/", "/"));
        assert!(!at("/", "/x") && !at("/", ""));
        assert!(at("/payments", "/payments"));
        assert!(!at("/payments", "/payments/") && !at("/payments/", "/payments"));
        assert!(at("/payments/", "/payments/"));
        assert!(at("/payments/{id}", "/payments/1"));
        assert!(!at("/payments/{id}", "/payments/") && !at("/payments/{id}", "/payments/1/"));
        assert!(!at("/payments/{id}", "/payments/1/2") && !at("/payments/{id}", "/payments"));
        assert!(at("/a/{id}/b", "/a/1/b") && at("/a/{id}/b", "/a//b"));
        assert!(at("/v{version}/pay", "/v2/pay") && !at("/v{version}/pay", "/2/pay"));
        assert!(at("/files/{*rest}", "/files/a") && at("/files/{*rest}", "/files/a/b"));
        assert!(at("/files/{*rest}", "/files/a/") && at("/files/{*rest}", "/files//"));
        assert!(!at("/files/{*rest}", "/files/") && !at("/files/{*rest}", "/files"));
        assert!(at("/{*rest}", "/x") && !at("/{*rest}", "/"));
        assert!(at("/{{literal}}", "/{literal}") && !at("/{{literal}}", "/literal"));
        assert_eq!(parse("/{{a}}/{b}").unwrap(), vec![Piece::Text("/{a}/".to_owned()), Piece::Param]);
    }

    #[test]
    fn text_wins_over_a_parameter_which_wins_over_a_catch_all() {
        let rank = |template: &str, path: &str| matches(&parse(template).unwrap(), path).unwrap();
        assert!(rank("/files/special", "/files/special") < rank("/files/{name}", "/files/special"));
        assert!(rank("/files/{name}", "/files/special") < rank("/files/{*rest}", "/files/special"));
        assert!(rank("/a//b", "/a//b") < rank("/a/{id}/b", "/a//b"));
        assert!(rank("/a/{id}/b", "/a/x/b") < rank("/a/{*rest}", "/a/x/b"));
    }

    #[test]
    fn templates_the_router_refuses_are_refused_with_advice() {
        let advice = |template: &str| parse(template).unwrap_err();
        assert!(advice("payments").contains("`/payments`"));
        assert!(advice("").contains("`/`"));
        assert!(advice("/payments/:id/*rest").contains("`/payments/{id}/{*rest}`"));
        assert!(advice("/files/{*rest}/meta").contains("`/files/{*rest}`"));
        assert!(advice("/payments/{id}.json/x").contains("`/payments/{id}/x`"));
        assert!(advice("/payments/{}").contains("a name"));
        assert!(advice("/payments/{*}").contains("a name"));
        assert!(advice("/payments/{id").contains("`}`"));
        assert!(advice("/payments/id}").contains("`}}`"));
        assert!(advice("/payments/{a}{b}").contains("`/payments/{a}`"));
    }
}
