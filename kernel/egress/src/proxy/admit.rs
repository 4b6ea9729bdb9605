//! Which requests inside an intercepted tunnel go on, beyond a
//! well-formed head: each must be for the tunnel's host, keep the
//! headers the proxy frames and keys it by, and carry no body a server
//! may ignore. A request that fails is refused before any of it is sent.

use super::refusal::Refusal;
use crate::request::{self, Framing};

/// Refuses a target that could name another host than the tunnel's
/// (`authority`: its host, and its port unless 443): a server takes the
/// host from an absolute-form URL whatever `Host` says (RFC 9112 3.2.2),
/// reading its scheme in any case and often any scheme at all. Only a
/// path, `*` for OPTIONS, or an http or https URL of the tunnel's own
/// authority goes on.
pub fn target(authority: &str, method: &str, target: &str) -> Result<(), Refusal> {
    if target.starts_with('/') || (target == "*" && method == "OPTIONS") {
        return Ok(());
    }
    let web =
        |scheme: &str| scheme.eq_ignore_ascii_case("https") || scheme.eq_ignore_ascii_case("http");
    let Some((_, rest)) = request::absolute_form(target).filter(|(scheme, _)| web(scheme)) else {
        return Err(Refusal::Target(target.to_owned()));
    };
    // To the path or query: anything else in it (userinfo, a fragment, a
    // backslash) makes it differ from the tunnel's.
    let asked = rest.split(['/', '?']).next().unwrap_or_default();
    // The tunnel's authority names its port unless that is 443, which a
    // URL may name all the same.
    let has_port = authority
        .rsplit(']')
        .next()
        .is_some_and(|after| after.contains(':'));
    let same = asked.eq_ignore_ascii_case(authority)
        || (!has_port && asked.eq_ignore_ascii_case(&format!("{authority}:443")));
    if !same {
        return Err(Refusal::OtherHost {
            asked: asked.to_owned(),
            tunnel: authority.to_owned(),
        });
    }
    Ok(())
}

/// Refuses a body on GET, HEAD or OPTIONS (TRACE is refused whole): RFC
/// 9110 gives it no meaning there and servers commonly ignore it, reading
/// it as the next request, and the proxy's next head, with the key, as
/// that one's body.
pub fn body(method: &str, framing: Framing) -> Result<(), Refusal> {
    if !framing.fits(method) {
        return Err(Refusal::BodyOnMethod(method.to_owned()));
    }
    Ok(())
}

/// The options the `Connection` headers of a head (`text`, without its
/// final CRLF CRLF) list, lowercased: the headers they name belong to the
/// hop, and no intermediary may forward them (RFC 9110 7.6.1). One naming
/// a header the proxy frames the body by, or sets (named in `set`), refuses the
/// request: a hop that honoured it would remove what the proxy read the
/// body's end from, or the key, after the proxy had decided on it.
pub fn connection_options(text: &str, set: &[&str]) -> Result<Vec<String>, Refusal> {
    let mut options = Vec::new();
    for line in text.split("\r\n").skip(1) {
        let Some((name, value)) = line.split_once(':') else {
            continue;
        };
        if !name.eq_ignore_ascii_case("connection") {
            continue;
        }
        // Empty elements are allowed in a list (RFC 9110 5.6.1).
        for option in value.split(',').map(|o| o.trim_matches([' ', '\t'])) {
            if option.is_empty() {
                continue;
            }
            if !option.bytes().all(request::is_tchar) {
                let value = value.trim_matches([' ', '\t']);
                return Err(Refusal::ConnectionList(value.to_owned()));
            }
            let kept = ["content-length", "transfer-encoding", "host"]
                .iter()
                .any(|name| option.eq_ignore_ascii_case(name))
                || set.iter().any(|name| name.eq_ignore_ascii_case(option));
            if kept {
                return Err(Refusal::HopByHop(option.to_owned()));
            }
            options.push(option.to_ascii_lowercase());
        }
    }
    Ok(options)
}
