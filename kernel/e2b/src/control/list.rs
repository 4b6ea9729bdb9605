//! `GET /v2/sandboxes`: the key's sandboxes, filtered by metadata, state,
//! template and start, ordered by start, a page at a time (the next
//! page's token in `X-Next-Token`, none after the last).

use std::collections::BTreeMap;

use chrono::{DateTime, FixedOffset};
use percent_encoding::percent_decode_str;

use super::context::Control;
use super::shapes::ListedSandbox;
use crate::answer::ApiError;
use crate::query::query_pairs;

/// A page's size when the request names none, and the most it may name.
const MAX_PAGE: usize = 100;

/// What a list asks for.
#[derive(Debug, Default, PartialEq)]
pub struct ListQuery {
    metadata: BTreeMap<String, String>,
    states: Vec<String>,
    ascending: bool,
    started_after: Option<DateTime<FixedOffset>>,
    template: Option<String>,
    limit: usize,
    next_token: Option<String>,
}

/// The SDKs' metadata filter, `k=v&k2=v2` with each key and value
/// percent-encoded, sent percent-encoded once more as one value.
fn metadata_filter(text: &str) -> Result<BTreeMap<String, String>, ApiError> {
    let whole = percent_decode_str(text).decode_utf8_lossy().into_owned();
    let mut filter = BTreeMap::new();
    for pair in whole.split('&').filter(|pair| !pair.is_empty()) {
        let (name, value) = pair.split_once('=').ok_or_else(|| {
            ApiError::bad_request(format!("metadata filter {pair:?}: give key=value"))
        })?;
        let decode = |text: &str| percent_decode_str(text).decode_utf8_lossy().into_owned();
        filter.insert(decode(name), decode(value));
    }
    Ok(filter)
}

impl ListQuery {
    pub fn parse(query: &str) -> Result<ListQuery, ApiError> {
        let mut asked = ListQuery {
            limit: MAX_PAGE,
            ..ListQuery::default()
        };
        for (name, value) in query_pairs(query) {
            match name.as_str() {
                "metadata" => asked.metadata.extend(metadata_filter(&value)?),
                "state" => asked.states.extend(
                    value
                        .split(',')
                        .filter(|state| !state.is_empty())
                        .map(str::to_owned),
                ),
                "order" => {
                    asked.ascending = match value.as_str() {
                        "asc" => true,
                        "desc" => false,
                        other => {
                            return Err(ApiError::bad_request(format!(
                                "order {other:?}: give asc or desc"
                            )))
                        }
                    }
                }
                "startedAfter" => {
                    let at = DateTime::parse_from_rfc3339(&value).map_err(|err| {
                        ApiError::bad_request(format!("startedAfter {value:?}: {err}"))
                    })?;
                    asked.started_after = Some(at);
                }
                "template" => asked.template = Some(value),
                "limit" => {
                    asked.limit = value
                        .parse()
                        .ok()
                        .filter(|limit| (1..=MAX_PAGE).contains(limit))
                        .ok_or_else(|| {
                            ApiError::bad_request(format!("limit {value:?}: give 1 to {MAX_PAGE}"))
                        })?;
                }
                "nextToken" => asked.next_token = Some(value),
                other => {
                    return Err(ApiError::bad_request(format!(
                        "unknown query parameter {other:?}"
                    )))
                }
            }
        }
        if let Some(state) = asked
            .states
            .iter()
            .find(|state| !matches!(state.as_str(), "running" | "paused"))
        {
            return Err(ApiError::bad_request(format!(
                "state {state:?}: give running, paused or both"
            )));
        }
        Ok(asked)
    }
}

/// One page of the key's sandboxes, and the token of the next if
/// there are more.
pub async fn list(
    cx: &Control<'_>,
    asked: &ListQuery,
) -> Result<(Vec<ListedSandbox>, Option<String>), ApiError> {
    let sizes = cx.face.sizing.sizes();
    let mut listed: Vec<ListedSandbox> = cx
        .tenant
        .sandboxes()
        .await?
        .iter()
        .filter(|session| {
            asked.metadata.iter().all(|(name, value)| {
                !name.starts_with(crate::tenant::OWN_LABEL_PREFIX)
                    && session.labels.get(name) == Some(value)
            })
        })
        .map(|session| ListedSandbox::of(session, sizes))
        .filter(|sandbox| {
            asked.states.is_empty() || asked.states.iter().any(|state| state == sandbox.state)
        })
        .filter(|sandbox| {
            asked
                .template
                .as_ref()
                .is_none_or(|template| *template == sandbox.template_id)
        })
        .filter(|sandbox| {
            asked.started_after.is_none_or(|after| {
                DateTime::parse_from_rfc3339(&sandbox.started_at)
                    .is_ok_and(|started| started >= after)
            })
        })
        .collect();
    // Started times are RFC 3339 in UTC from one clock, so their text
    // sorts as they do; the id breaks ties.
    listed.sort_by(|a, b| (&a.started_at, &a.sandbox_id).cmp(&(&b.started_at, &b.sandbox_id)));
    if !asked.ascending {
        listed.reverse();
    }
    if let Some(after) = &asked.next_token {
        let at = listed
            .iter()
            .position(|sandbox| sandbox.sandbox_id == *after)
            .ok_or_else(|| {
                ApiError::bad_request(format!(
                    "nextToken {after:?}: no such sandbox (it may have ended); list again \
                     from the start"
                ))
            })?;
        listed.drain(..=at);
    }
    let next = (listed.len() > asked.limit).then(|| listed[asked.limit - 1].sandbox_id.clone());
    listed.truncate(asked.limit);
    Ok((listed, next))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_sdks_triple_encoded_metadata_is_read_back() {
        // {"user id": "a b&c=d"} as the Python SDK sends it.
        let asked = ListQuery::parse("metadata=user%252520id%3Da%252520b%252526c%25253Dd").unwrap();
        assert_eq!(
            asked.metadata,
            BTreeMap::from([("user id".to_owned(), "a b&c=d".to_owned())])
        );
        let asked = ListQuery::parse("state=running%2Cpaused&limit=5&order=asc").unwrap();
        assert_eq!(asked.states, ["running", "paused"]);
        assert_eq!((asked.limit, asked.ascending), (5, true));
        let asked = ListQuery::parse("startedAfter=2026-01-01T00%3A00%3A00%2B00%3A00").unwrap();
        assert!(asked.started_after.is_some());
    }

    #[test]
    fn a_bad_parameter_is_named() {
        for bad in [
            "limit=0",
            "limit=101",
            "limit=x",
            "state=killed",
            "order=up",
            "startedAfter=yesterday",
            "metadata=novalue",
            "colour=red",
        ] {
            let err = ListQuery::parse(bad).unwrap_err();
            assert_eq!(err.status, http::StatusCode::BAD_REQUEST, "{bad}");
        }
    }
}
