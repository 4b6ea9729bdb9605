//! Whether a loop's answer is checked: it came after a run that worked and
//! printed something, and every number it states was printed by a run or
//! given in the task; if not, why, and what it is sent back with. A small
//! model that cannot read its output, or did not run anything, still
//! answers; the result then says it is unchecked and why, rather than
//! passing a guess off as computed.

/// A number as written: its value, and how many decimals it was given
/// with (an answer may round what a run printed).
#[derive(Clone, Copy, Debug, PartialEq)]
struct Number {
    value: f64,
    decimals: i32,
}

impl Number {
    fn parse(text: &str) -> Option<Number> {
        let decimals = text.split_once('.').map_or(0, |(_, after)| after.len());
        Some(Number {
            value: text.parse().ok()?,
            decimals: i32::try_from(decimals).ok()?,
        })
    }

    /// Whether `self`, as an answer states it, is what `printed` shows:
    /// the same value, or that value rounded to the decimals given.
    fn states(&self, printed: &Number) -> bool {
        if self.value == printed.value {
            return true;
        }
        if self.decimals == 0 || printed.decimals <= self.decimals {
            return false;
        }
        let scale = 10f64.powi(self.decimals);
        ((printed.value * scale).round() - self.value * scale).abs() < 0.5
    }
}

/// A number in text, as each way it may be read: "42,925" is 42925, or the
/// two numbers 42 and 925 of a list.
#[derive(Debug)]
struct Written {
    joined: Option<Number>,
    parts: Vec<Number>,
}

/// The numbers written in `text`: runs of digits with at most one
/// decimal point, commas between digits kept as both readings. Signs are
/// left off ("2024-03-01" is a date, not three numbers of which two are
/// negative).
fn numbers_in(text: &str) -> Vec<Written> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut at = 0;
    while at < bytes.len() {
        if !bytes[at].is_ascii_digit() {
            at += 1;
            continue;
        }
        let start = at;
        let mut seen_point = false;
        while at < bytes.len() {
            let next_is_digit = bytes.get(at + 1).is_some_and(u8::is_ascii_digit);
            match bytes[at] {
                b'0'..=b'9' => at += 1,
                b',' if next_is_digit && !seen_point => at += 1,
                b'.' if next_is_digit && !seen_point => {
                    seen_point = true;
                    at += 1;
                }
                _ => break,
            }
        }
        let token = &text[start..at];
        let parts: Vec<Number> = token.split(',').filter_map(Number::parse).collect();
        let joined = token
            .contains(',')
            .then(|| Number::parse(&token.replace(',', "")))
            .flatten();
        found.push(Written { joined, parts });
    }
    found
}

/// Every number `text` may be read as stating.
fn every_reading(text: &str) -> Vec<Number> {
    numbers_in(text)
        .into_iter()
        .flat_map(|written| written.joined.into_iter().chain(written.parts))
        .collect()
}

/// The first number `answer` states that neither a run printed (`printed`)
/// nor the task gave (`task`), as written; `None` if there is none.
pub fn unprinted_number(answer: &str, printed: &[&str], task: &str) -> Option<String> {
    let known: Vec<Number> = printed
        .iter()
        .chain([&task])
        .flat_map(|text| every_reading(text))
        .collect();
    let is_known = |number: &Number| known.iter().any(|seen| number.states(seen));
    numbers_in(answer).into_iter().find_map(|written| {
        let joined_known = written.joined.as_ref().is_some_and(is_known);
        let parts_known = written.parts.iter().all(is_known);
        let stated = written.joined.or(written.parts.first().copied());
        (!joined_known && !parts_known).then(|| stated.map(format_number).unwrap_or_default())
    })
}

fn format_number(number: Number) -> String {
    format!("{:.*}", number.decimals.max(0) as usize, number.value)
}

/// Why an answer is not checked.
#[derive(Debug)]
pub enum Unchecked {
    /// No code has run.
    NothingRan,
    /// The last run failed, with this error.
    Failed(String),
    /// The last run printed nothing.
    Silent,
    /// The answer states this number, which no run printed.
    Unprinted(String),
}

impl std::fmt::Display for Unchecked {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Unchecked::NothingRan => write!(f, "no code ran: the answer is the model's own"),
            Unchecked::Failed(error) => write!(
                f,
                "the last run failed ({error}) and the model answered without a run that worked"
            ),
            Unchecked::Silent => write!(
                f,
                "the last run printed nothing for the answer to come from"
            ),
            Unchecked::Unprinted(number) => {
                write!(f, "the answer states {number}, which no run printed")
            }
        }
    }
}

/// What an unchecked answer is sent back with: a request for code that
/// prints it.
pub fn ask_for_code(why: &Unchecked) -> String {
    match why {
        Unchecked::NothingRan => "No code has run yet, so that answer is unchecked. Reply with \
                                  one ```python block that computes it (calling the tools if \
                                  the task names them) and prints the result; you will see \
                                  what it prints."
            .to_owned(),
        Unchecked::Failed(error) => format!(
            "Your last code failed with: {error}\nSo that answer is unchecked. Reply with one \
             ```python block of fixed code that prints the result."
        ),
        Unchecked::Silent => "Your last code printed nothing, so that answer is unchecked. Reply \
                              with one ```python block that prints the result."
            .to_owned(),
        Unchecked::Unprinted(number) => format!(
            "Your answer states {number}, which your code did not print, so it is unchecked. \
             Reply with one ```python block that computes the answer and prints it."
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_a_run_printed_or_the_task_gave_are_known() {
        assert_eq!(
            unprinted_number("The sum is 42,925.", &["42925\n"], ""),
            None
        );
        assert_eq!(
            unprinted_number("It is 37.8 °C", &["37.77777777777778\n"], ""),
            None
        );
        assert_eq!(unprinted_number("The mean is 6", &["6.0\n"], ""), None);
        assert_eq!(
            unprinted_number(
                "299 days from 2024-03-01 to 2024-12-25",
                &["299\n"],
                "2024-03-01 and 2024-12-25"
            ),
            None
        );
        assert_eq!(
            unprinted_number(
                "In Tokyo it is 14:32.",
                &["{'datetime': '2026-11-29T14:32:05+09:00'}"],
                ""
            ),
            None
        );
        assert_eq!(unprinted_number("The code word is PELICAN.", &[], ""), None);
        assert_eq!(unprinted_number("1, 22, 333", &["[1, 22, 333]"], ""), None);
    }

    #[test]
    fn a_number_no_run_printed_is_named() {
        assert_eq!(
            unprinted_number("There are 38 lines.", &["3\n11\n19\n"], "count the lines"),
            Some("38".into())
        );
        assert_eq!(
            unprinted_number("The mean is 5", &["5.45\n"], ""),
            Some("5".into())
        );
        assert_eq!(
            unprinted_number("It is 37.9", &["37.77\n"], ""),
            Some("37.9".into())
        );
        assert_eq!(
            unprinted_number("42,925", &["42924"], ""),
            Some("42925".into())
        );
    }
}
