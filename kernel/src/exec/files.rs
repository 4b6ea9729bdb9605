//! Files brought into a run (`files`, base64) are checked here before any
//! run starts: valid base64, each within `exec.max_file_bytes` once
//! decoded. The run child writes them under `/workspace`, and reads what
//! `collect` names back, never following a symlink out (see
//! `zygote/files.py`).

use std::collections::BTreeMap;

use agentos_proto::payload::bad_request;
use agentos_proto::ErrorReply;

/// Checks every file of a request; the error names the field and path.
pub fn check(files: &BTreeMap<String, String>, max_bytes: u64) -> Result<(), ErrorReply> {
    for (path, content) in files {
        let size = decoded_len(content).ok_or_else(|| {
            bad_request(format!(
                "EXEC field `files`: the content of {path:?} is not valid base64"
            ))
        })?;
        if size as u64 > max_bytes {
            return Err(bad_request(format!(
                "EXEC field `files`: {path:?} is {size} bytes; at most {max_bytes} \
                 (exec.max_file_bytes)"
            )));
        }
    }
    Ok(())
}

/// The length of what standard, padded base64 `text` decodes to, if it is
/// valid.
fn decoded_len(text: &str) -> Option<usize> {
    let bytes = text.as_bytes();
    if bytes.len() % 4 != 0 {
        return None;
    }
    let padding = bytes.iter().rev().take_while(|b| **b == b'=').count();
    if padding > 2 {
        return None;
    }
    let body = &bytes[..bytes.len() - padding];
    body.iter()
        .all(|b| b.is_ascii_alphanumeric() || *b == b'+' || *b == b'/')
        .then(|| bytes.len() / 4 * 3 - padding)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn base64_is_measured_without_decoding() {
        assert_eq!(decoded_len(""), Some(0));
        assert_eq!(decoded_len("aGk="), Some(2));
        assert_eq!(decoded_len("aGkh"), Some(3));
        assert_eq!(decoded_len("aA=="), Some(1));
        assert_eq!(decoded_len("aGk"), None);
        assert_eq!(decoded_len("a=k="), None);
        assert_eq!(decoded_len("a==="), None);
        assert_eq!(decoded_len("aG!="), None);
    }

    #[test]
    fn bad_or_big_files_are_named() {
        let files = BTreeMap::from([("data.bin".to_owned(), "AAAA".repeat(10))]);
        assert!(check(&files, 30).is_ok());
        let err = check(&files, 29).unwrap_err();
        assert!(
            err.error.contains("\"data.bin\" is 30 bytes"),
            "{}",
            err.error
        );
        let files = BTreeMap::from([("x".to_owned(), "%%%%".to_owned())]);
        assert!(check(&files, 100).unwrap_err().error.contains("base64"));
    }
}
