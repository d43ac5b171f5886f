//! What the floor tools' tests share.

/// A floor tool's run that must have succeeded: its standard output, and
/// its table's rows (lines not starting with `#`) as numbers.
pub(crate) fn table(out: &std::process::Output) -> (String, Vec<Vec<f64>>) {
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let rows = text
        .lines()
        .filter(|l| !l.starts_with('#'))
        .map(|l| l.split_whitespace().map(|w| w.parse().unwrap()).collect())
        .collect();
    (text, rows)
}
