//! The results table, formatted as nccl-tests prints it (column widths,
//! number formats and the footer).

/// The three header lines of the table.
pub fn header() -> [String; 3] {
    let e = "";
    [
        format!(
            "# {e:>10}  {e:>12}  {e:>8}  {e:>6}  {e:>6}           out-of-place                       in-place          "
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
            "size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong", "time",
            "algbw", "busbw", "#wrong"
        ),
        format!(
            "# {:>10}  {:>12}  {:>8}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6}  {:>7}  {:>6}  {:>6}  {:>6} ",
            "(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", "", "(us)", "(GB/s)",
            "(GB/s)", ""
        ),
    ]
}

/// The left part of a row: `%12li  %12li  %8s  %6s  %6i`.
pub fn row_prefix(size: usize, count: usize, type_name: &str, op_name: &str, root: i64) -> String {
    format!("{size:>12}  {count:>12}  {type_name:>8}  {op_name:>6}  {root:>6}")
}

/// One half of a row (out-of-place or in-place): time in microseconds,
/// algorithm and bus bandwidth in GB/s, and the wrong-element count or
/// `N/A` when not checked.
pub fn row_body(time_us: f64, algbw: f64, busbw: f64, wrong: Option<u64>) -> String {
    let t = float_str(time_us, 7);
    let a = float_str(algbw, 6);
    let b = float_str(busbw, 6);
    match wrong {
        Some(w) => format!("  {t:>7}  {a:>6}  {b:>6}  {:>6}", fmt_g(w as f64)),
        None => format!("  {t:>7}  {a:>6}  {b:>6}    N/A"),
    }
}

/// The half of a row for a measurement that did not run (`-P`).
pub fn row_skipped() -> String {
    format!("  {:>7}  {:>6}  {:>6}  {:>6}", "N/A", "N/A", "N/A", "N/A")
}

/// The footer lines: errors, average bus bandwidth, and the closing `#`.
pub fn footer(errors: u64, avg_busbw: f64) -> [String; 3] {
    [
        format!(
            "# {:<20} : {} {}",
            "Out of bounds values",
            errors,
            if errors > 0 { "FAILED" } else { "OK" }
        ),
        format!("# {:<20} : {} ", "Avg bus bandwidth", fmt_g(avg_busbw)),
        "#".to_string(),
    ]
}

/// nccl-tests' `getFloatStr`: two decimals while they fit in `width`,
/// then one, then none, then C's `%.1e`.
pub fn float_str(value: f64, width: usize) -> String {
    // The number of integer digits (0 below 1).
    let mut power = 0usize;
    while power < 40 && value >= 10f64.powi(power as i32) {
        power += 1;
    }
    if power + 2 < width {
        format!("{value:>width$.2}")
    } else if power + 1 < width {
        format!("{value:>width$.1}")
    } else if power < width + 1 {
        format!("{value:>width$.0}")
    } else if width >= 7 {
        format!("{:>width$}", c_exp(value, 1))
    } else {
        format!("{:>width$}", c_exp(value, 0))
    }
}

/// C's `%.{prec}e`: at least two exponent digits and a sign.
pub fn c_exp(value: f64, prec: usize) -> String {
    let s = format!("{value:.prec$e}");
    match s.split_once('e') {
        Some((mant, exp)) => {
            let x: i32 = exp.parse().unwrap_or(0);
            let sign = if x < 0 { '-' } else { '+' };
            format!("{mant}e{sign}{:02}", x.abs())
        }
        None => s, // inf, NaN
    }
}

/// C's `%g`: six significant digits, trailing zeros removed, exponent form
/// below 1e-4 and from 1e6.
pub fn fmt_g(value: f64) -> String {
    if value == 0.0 {
        return "0".into();
    }
    if !value.is_finite() {
        return if value.is_nan() {
            "nan".into()
        } else if value > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        };
    }
    const P: i32 = 6;
    let e = format!("{:.*e}", (P - 1) as usize, value);
    let x: i32 = e
        .split_once('e')
        .and_then(|(_, x)| x.parse().ok())
        .unwrap_or(0);
    if !(-4..P).contains(&x) {
        let s = c_exp(value, (P - 1) as usize);
        let (mant, exp) = s.split_once('e').unwrap_or((&s, ""));
        format!("{}e{exp}", strip_zeros(mant))
    } else {
        strip_zeros(&format!("{:.*}", (P - 1 - x) as usize, value)).to_string()
    }
}

/// Removes trailing zeros after a decimal point, and the point if bare.
fn strip_zeros(s: &str) -> &str {
    if s.contains('.') {
        s.trim_end_matches('0').trim_end_matches('.')
    } else {
        s
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_skipped_half_keeps_the_columns() {
        let run = row_body(123.45, 1.5, 0.75, Some(0));
        let skipped = row_skipped();
        assert_eq!(skipped.len(), run.len());
        assert_eq!(
            skipped.split_whitespace().count(),
            run.split_whitespace().count()
        );
        assert!(skipped.split_whitespace().all(|w| w == "N/A"));
    }

    #[test]
    fn percent_g() {
        assert_eq!(fmt_g(0.0), "0");
        assert_eq!(fmt_g(3.0), "3");
        assert_eq!(fmt_g(12.345678), "12.3457");
        assert_eq!(fmt_g(0.5), "0.5");
        assert_eq!(fmt_g(0.0001234), "0.0001234");
        assert_eq!(fmt_g(0.00001234), "1.234e-05");
        assert_eq!(fmt_g(123456.0), "123456");
        assert_eq!(fmt_g(1234567.0), "1.23457e+06");
        assert_eq!(fmt_g(1e6), "1e+06");
        assert_eq!(fmt_g(999999.5), "1e+06");
        assert_eq!(fmt_g(f64::NAN), "nan");
    }

    #[test]
    fn float_columns() {
        assert_eq!(float_str(13.987, 7), "  13.99");
        assert_eq!(float_str(0.0, 6), "  0.00");
        assert_eq!(float_str(1234.5678, 7), "1234.57");
        assert_eq!(float_str(12345.678, 7), "12345.7");
        assert_eq!(float_str(123456.78, 7), " 123457");
        assert_eq!(float_str(1234567.0, 7), "1234567");
        assert_eq!(float_str(12345678.0, 7), "1.2e+07");
        assert_eq!(float_str(99.999, 6), "100.00");
        assert_eq!(float_str(123.4, 6), "123.40");
        assert_eq!(float_str(1234.5, 6), "1234.5");
        assert_eq!(float_str(123456.0, 6), "123456");
        assert_eq!(float_str(1234567.0, 6), " 1e+06");
        assert_eq!(c_exp(0.000123, 1), "1.2e-04");
    }

    #[test]
    fn rows_line_up_with_the_header() {
        let [l1, l2, l3] = header();
        let row = row_prefix(33554432, 8388608, "float", "sum", -1)
            + &row_body(1234.5678, 27.18, 27.18, Some(0))
            + &row_body(1200.0, 27.96, 27.96, None);
        assert_eq!(
            row,
            "    33554432       8388608     float     sum      -1  1234.57   27.18   27.18       0  1200.00   27.96   27.96    N/A"
        );
        assert_eq!(
            l2,
            "#       size         count      type   redop    root     time   algbw   busbw  #wrong     time   algbw   busbw  #wrong "
        );
        assert_eq!(
            l3,
            "#        (B)    (elements)                               (us)  (GB/s)  (GB/s)             (us)  (GB/s)  (GB/s)         "
        );
        // Every column ends where its header ends (nccl-tests prints "N/A"
        // one column short; we keep that).
        let checked = row_prefix(8, 2, "float", "sum", -1)
            + &row_body(1.0, 0.0, 0.0, Some(0))
            + &row_body(1.0, 0.0, 0.0, Some(12));
        assert_eq!(l2.trim_end().len(), checked.len());
        assert_eq!(row.len() + 1, checked.len());
        assert!(l1.contains("out-of-place") && l1.starts_with("# "));
        let [f1, f2, f3] = footer(0, 12.345678);
        assert_eq!(f1, "# Out of bounds values : 0 OK");
        assert_eq!(f2, "# Avg bus bandwidth    : 12.3457 ");
        assert_eq!(f3, "#");
        assert_eq!(footer(2, 0.0)[0], "# Out of bounds values : 2 FAILED");
    }
}
