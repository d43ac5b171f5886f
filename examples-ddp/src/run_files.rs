//! What a finished training run leaves behind, read back by the examples'
//! tests: parameters dumped per rank (`--dump-params DIR/params.{rank}`)
//! and the JSON log of its epochs (`--log-json DIR/log.json`).

use std::path::PathBuf;

/// A finished run: its folder, its rank count and its standard output.
pub struct Run {
    /// Where the run wrote `params.{rank}` and `log.json`.
    pub dir: PathBuf,
    /// Ranks the run had.
    pub ranks: usize,
    /// What the launcher printed.
    pub stdout: String,
}

impl Run {
    /// The parameters `rank` dumped, as bytes.
    pub fn params(&self, rank: usize) -> Vec<u8> {
        std::fs::read(self.dir.join(format!("params.{rank}"))).expect("dumped parameters")
    }

    /// The epochs' JSON lines.
    pub fn epochs(&self) -> Vec<String> {
        std::fs::read_to_string(self.dir.join("log.json"))
            .expect("json log")
            .lines()
            .map(String::from)
            .collect()
    }
}

/// The number after `"key":` in a JSON line (panics naming the key when
/// absent: a test helper).
pub fn field(line: &str, key: &str) -> f64 {
    let at = line
        .find(&format!("\"{key}\":"))
        .unwrap_or_else(|| panic!("no {key} in {line}"))
        + key.len()
        + 3;
    let end = line[at..].find([',', '}']).map_or(line.len(), |e| at + e);
    line[at..end]
        .parse()
        .unwrap_or_else(|_| panic!("bad {key} in {line}"))
}

#[cfg(test)]
mod tests {
    #[test]
    fn fields() {
        let l = r#"{"epoch":3,"loss":0.25,"acc":1}"#;
        assert_eq!(super::field(l, "epoch"), 3.0);
        assert_eq!(super::field(l, "loss"), 0.25);
        assert_eq!(super::field(l, "acc"), 1.0);
    }
}
