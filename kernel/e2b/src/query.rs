//! A URL's query, as the face's routes read it.

use percent_encoding::percent_decode_str;

/// A query's pairs, each name and value percent-decoded (`+` a space).
pub fn query_pairs(query: &str) -> Vec<(String, String)> {
    let decode = |text: &str| {
        let spaced = text.replace('+', " ");
        percent_decode_str(&spaced).decode_utf8_lossy().into_owned()
    };
    query
        .split('&')
        .filter(|pair| !pair.is_empty())
        .map(|pair| match pair.split_once('=') {
            Some((name, value)) => (decode(name), decode(value)),
            None => (decode(pair), String::new()),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pairs_are_decoded_and_a_bare_name_has_an_empty_value() {
        assert_eq!(
            query_pairs("path=%2Fhome%2Fa+b&username=&flag"),
            [
                ("path".to_owned(), "/home/a b".to_owned()),
                ("username".to_owned(), String::new()),
                ("flag".to_owned(), String::new()),
            ]
        );
    }
}
