//! Sandbox ids: E2B's are 20 lower-case letters and digits; in a fleet,
//! the face adds its node's tag, so any node's face knows where a
//! sandbox is from its id alone.

use http::StatusCode;

use crate::answer::ApiError;

/// The random part of a sandbox id.
pub const SANDBOX_ID_LEN: usize = 20;

/// A new sandbox id: 20 lower-case letters and digits, each drawn
/// uniformly (bytes past the last whole multiple of 36 are drawn again),
/// then, in a fleet, the node's `tag`.
pub fn new_sandbox_id(tag: Option<&str>) -> Result<String, ApiError> {
    const ALPHABET: &[u8] = b"abcdefghijklmnopqrstuvwxyz0123456789";
    let fair = 256 - 256 % ALPHABET.len();
    let mut id = String::with_capacity(SANDBOX_ID_LEN);
    while id.len() < SANDBOX_ID_LEN {
        let random = agentos_http::random::bytes::<32>().map_err(random_failed)?;
        for byte in random.iter().map(|byte| usize::from(*byte)) {
            if byte < fair && id.len() < SANDBOX_ID_LEN {
                id.push(char::from(ALPHABET[byte % ALPHABET.len()]));
            }
        }
    }
    id.push_str(tag.unwrap_or(""));
    Ok(id)
}

fn random_failed(err: std::io::Error) -> ApiError {
    ApiError::new(
        StatusCode::INTERNAL_SERVER_ERROR,
        format!("reading random bytes: {err}"),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_twenty_lower_case_letters_and_digits() {
        let id = new_sandbox_id(None).unwrap();
        assert_eq!(id.len(), SANDBOX_ID_LEN);
        assert!(id
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit()));
        assert_ne!(id, new_sandbox_id(None).unwrap());
    }
}
