//! What differs between two requests sent with one idempotency key: the
//! names (never the values) of the members of their normalised forms that
//! differ, so a client told `idempotency_key_reused` can see which field
//! its retry changed. The first request is not stored as sent: its
//! normalised form is rebuilt from the row it created (`Charge::request`,
//! `Refund::request`), and checked against the row's fingerprint.

use serde_json::Value;

use super::Fingerprint;

/// The members of `new` and `first` (both normalised requests: objects with
/// every member present) whose values differ, in name order. A member that
/// is itself an object of strings (`metadata`) is compared entry by entry:
/// each entry added, removed or changed is named `metadata.<key>`.
pub fn differing_fields(first: &Value, new: &Value) -> Vec<String> {
    let (Value::Object(first), Value::Object(new)) = (first, new) else {
        return if first == new {
            Vec::new()
        } else {
            vec![String::new()]
        };
    };
    let mut names: Vec<&String> = first.keys().chain(new.keys()).collect();
    names.sort();
    names.dedup();
    let mut differing = Vec::new();
    for name in names {
        match (first.get(name), new.get(name)) {
            (Some(Value::Object(was)), Some(Value::Object(now))) => {
                let mut keys: Vec<&String> = was.keys().chain(now.keys()).collect();
                keys.sort();
                keys.dedup();
                differing.extend(
                    keys.into_iter()
                        .filter(|key| was.get(*key) != now.get(*key))
                        .map(|key| format!("{name}.{key}")),
                );
            }
            (was, now) if was != now => differing.push(name.clone()),
            _ => {}
        }
    }
    differing
}

/// Of the normalised forms a stored row may have been created from, the
/// one whose fingerprint is the row's: a row keeps what was asked only as
/// it was carried out (a refund of "the rest" stores the amount it came
/// to), so each kind offers its candidates. `None` if none matches (a key
/// stored under an older fingerprint scheme).
pub fn first_request(stored: &Fingerprint, candidates: Vec<Value>) -> Option<Value> {
    candidates
        .into_iter()
        .find(|candidate| Fingerprint::of(candidate) == *stored)
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    #[test]
    fn names_each_member_and_each_metadata_entry_that_differs() {
        let first = json!({
            "amount": 100, "currency": "USD", "customer": null, "description": "a",
            "metadata": {"order": "1", "gone": "x", "same": "s"}
        });
        let new = json!({
            "amount": 200, "currency": "USD", "customer": "c", "description": "a",
            "metadata": {"order": "2", "added": "y", "same": "s"}
        });
        assert_eq!(
            differing_fields(&first, &new),
            [
                "amount",
                "customer",
                "metadata.added",
                "metadata.gone",
                "metadata.order"
            ]
        );
        assert!(differing_fields(&first, &first).is_empty());
    }

    #[test]
    fn the_first_request_is_the_candidate_with_the_rows_fingerprint() {
        let rest = json!({"amount": null, "reason": null, "metadata": {}});
        let explicit = json!({"amount": 500, "reason": null, "metadata": {}});
        let stored = Fingerprint::of(&rest);
        assert_eq!(
            first_request(&stored, vec![explicit.clone(), rest.clone()]),
            Some(rest)
        );
        assert_eq!(
            first_request(&Fingerprint::ZERO, vec![explicit]),
            None,
            "an older fingerprint matches no candidate"
        );
    }
}
