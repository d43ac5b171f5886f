//! The few JSON encoders the reports share (RAS, `fabric_check`,
//! `fabric_sim`): the reports are written by hand, without a serializer.

use std::fmt::Write;

/// `s` as a JSON string literal, quotes included.
pub fn string(s: &str) -> String {
    let mut o = String::with_capacity(s.len() + 2);
    o.push('"');
    for c in s.chars() {
        match c {
            '"' => o.push_str("\\\""),
            '\\' => o.push_str("\\\\"),
            '\n' => o.push_str("\\n"),
            '\r' => o.push_str("\\r"),
            '\t' => o.push_str("\\t"),
            c if (c as u32) < 0x20 => {
                let _ = write!(o, "\\u{:04x}", c as u32);
            }
            c => o.push(c),
        }
    }
    o.push('"');
    o
}

/// A finite number as JSON; JSON has no infinities or NaN, so `null`.
pub fn number(x: f64) -> String {
    if x.is_finite() {
        format!("{x}")
    } else {
        "null".into()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_and_numbers() {
        let cases = [
            ("plain", r#""plain""#),
            ("q\"b\\", r#""q\"b\\""#),
            ("a\nb\tc\r", r#""a\nb\tc\r""#),
            ("\u{1}", r#""\u0001""#),
            ("é", "\"é\""),
        ];
        for (s, want) in cases {
            assert_eq!(string(s), want, "{s:?}");
        }
        assert_eq!(number(1.5), "1.5");
        assert_eq!(number(3.0), "3");
        assert_eq!(number(f64::NAN), "null");
        assert_eq!(number(f64::INFINITY), "null");
    }
}
