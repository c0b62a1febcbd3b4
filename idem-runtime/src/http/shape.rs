//! The shape of what a route stores (its recipe's [`Recipe::result_schema`]): the response every
//! retry is answered with, as the layer keeps it — `{"status": 201, "headers": [["location",
//! "/payments/7"]], "text": "…"}`, or `"base64": "…"` for a body that is not UTF-8. An
//! operator's "completed" verdict on a route's operation is checked against it before it is
//! stored, and `idem show` prints it with an example.
//!
//! [`Recipe::result_schema`]: crate::Recipe::result_schema

use serde_json::{Value, json};

/// The JSON Schema of a stored response, in the subset the verdict check reads
/// ([`ToolFacts::check`](crate::admin::ToolFacts::check)): a status from 100 to 599, headers as
/// `[name, value]` pairs of strings, and the body as exactly one of `text` (any string) and
/// `base64` (standard, padded base64).
pub(super) fn stored_response() -> Value {
    let status = json!({
        "description": "the status every retry is answered with",
        "type": "integer",
        "minimum": 100,
        "maximum": 599,
    });
    let headers = json!({
        "description": "the headers every retry is answered with, as [name, value] pairs",
        "type": "array",
        "items": {
            "type": "array",
            "prefixItems": [{ "type": "string" }, { "type": "string" }],
            "items": false,
            "minItems": 2,
            "maxItems": 2,
        },
    });
    // Exactly one form fits a verdict: a body given as both is refused (the layer would read the
    // base64 and drop the text).
    let form = |body: &str, schema: Value| {
        json!({
            "type": "object",
            "properties": { "status": status, "headers": headers, body: schema },
            "required": ["status", "headers", body],
        })
    };
    json!({
        "title": "the stored HTTP response",
        "oneOf": [
            form("text", json!({ "description": "the body, as text", "type": "string" })),
            form(
                "base64",
                json!({
                    "description": "the body's bytes, in standard base64",
                    "type": "string",
                    "contentEncoding": "base64",
                }),
            ),
        ],
        "examples": [{
            "status": 200,
            "headers": [["content-type", "application/json"]],
            "text": "{\"ok\":true}",
        }],
    })
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;
    use http::{HeaderMap, HeaderName, HeaderValue, StatusCode};
    use serde_json::{Value, json};

    use super::super::answer::StoredResponse;
    use super::stored_response;
    use crate::StalePolicy;
    use crate::admin::ToolFacts;

    fn facts() -> ToolFacts {
        ToolFacts::new(StalePolicy::Hold, Some(stored_response()))
    }

    /// What the layer stores for a response.
    fn stored(status: StatusCode, headers: &[(&str, &str)], body: &[u8]) -> Value {
        let mut map = HeaderMap::new();
        let mut keep = Vec::new();
        for (name, value) in headers {
            let name = HeaderName::from_bytes(name.as_bytes()).unwrap();
            map.append(name.clone(), HeaderValue::from_str(value).unwrap());
            keep.push(name);
        }
        serde_json::to_value(StoredResponse::of(status, &map, &keep, &Bytes::copy_from_slice(body))).unwrap()
    }

    #[test]
    fn what_the_layer_stores_fits_and_its_example_reads_back() {
        let facts = facts();
        for value in [
            stored(StatusCode::CREATED, &[("location", "/payments/7"), ("content-type", "text/plain")], b"paid"),
            stored(StatusCode::OK, &[], &[0xff, 0x00, 0xfe]),
            stored(StatusCode::NO_CONTENT, &[], b""),
        ] {
            facts.check(&value).unwrap_or_else(|why| panic!("{value}: {why}"));
            serde_json::from_value::<StoredResponse>(value).unwrap();
        }
        let example = facts.example().unwrap();
        assert_eq!(
            example,
            json!({"status": 200, "headers": [["content-type", "application/json"]], "text": "{\"ok\":true}"})
        );
        facts.check(&example).unwrap();
        let response = serde_json::from_value::<StoredResponse>(example).unwrap().into_response(true);
        assert_eq!((response.status(), response.body().as_ref()), (StatusCode::OK, &b"{\"ok\":true}"[..]));
    }

    #[test]
    fn a_verdict_a_retry_could_not_be_answered_with_is_refused_in_words() {
        let facts = facts();
        let refused = |value: Value, words: &str| {
            let why = facts.check(&value).expect_err(&value.to_string());
            assert!(why.contains(words), "{value}: {why}");
        };
        refused(json!({"export": "done"}), "lacks the member \"status\"");
        refused(json!({"status": 200, "headers": [], "body": "done"}), "lacks the member \"text\"");
        refused(json!({"status": "200", "headers": [], "text": ""}), "status is string where integer");
        refused(json!({"status": 700, "headers": [], "text": ""}), "status is 700 where at most 599");
        refused(json!({"status": 42, "headers": [], "text": ""}), "status is 42 where at least 100");
        refused(json!({"status": 200.5, "headers": [], "text": ""}), "status is number where integer");
        refused(json!({"status": 200, "headers": [["etag"]], "text": ""}), "has 1 items where at least 2");
        refused(json!({"status": 200, "headers": [["a", "b", "c"]], "text": ""}), "has 3 items where at most 2");
        refused(json!({"status": 200, "headers": {"etag": "x"}, "text": ""}), "headers is object where array");
        refused(json!({"status": 200, "headers": [], "base64": "not base64!"}), "not standard base64");
        refused(json!({"status": 200, "headers": [], "base64": "AAE"}), "not standard base64");
        refused(json!({"status": 200, "headers": [], "text": "a", "base64": "YQ=="}), "fits 2 of its 2 forms");
    }

    /// What the check refuses without its bounds (what makes a stored response correctable) is
    /// what the layer cannot decode: never a response a retry was answered with.
    #[test]
    fn a_stored_response_taken_for_unreadable_is_one_the_layer_cannot_decode() {
        let facts = facts();
        for value in [
            json!({"export": "done"}),
            json!({"status": 200, "headers": []}),
            json!({"status": "200", "headers": [], "text": ""}),
            json!({"status": 200, "headers": [[1, 2]], "text": ""}),
            json!({"status": 200, "headers": [["a", "b", "c"]], "text": ""}),
            json!({"status": 200, "text": ""}),
        ] {
            assert!(facts.readable(&value).is_err(), "{value}");
            assert!(serde_json::from_value::<StoredResponse>(value.clone()).is_err(), "{value} decodes");
        }
        // Outside a bound, or a body given twice, yet replayed: never taken for unreadable.
        for value in [
            json!({"status": 700, "headers": [], "text": ""}),
            json!({"status": 200, "headers": [], "base64": "!"}),
            json!({"status": 200, "headers": [], "text": "a", "base64": "YQ=="}),
        ] {
            assert!(facts.readable(&value).is_ok(), "{value}");
            assert!(facts.check(&value).is_err(), "{value}");
            serde_json::from_value::<StoredResponse>(value).unwrap();
        }
        // A member the layer does not read is ignored by both, as by the layer.
        let extra = json!({"status": 200, "headers": [], "text": "a", "export": "done"});
        facts.check(&extra).unwrap();
        serde_json::from_value::<StoredResponse>(extra).unwrap();
    }

    #[test]
    fn the_shape_reads_on_one_line() {
        let shape = facts().expected_shape().unwrap();
        let pair = "\"headers\": [[string, string]], \"status\": integer from 100 to 599";
        assert_eq!(shape, format!("{{{pair}, \"text\": string}} | {{\"base64\": string (base64), {pair}}}"), "{shape}");
    }
}
