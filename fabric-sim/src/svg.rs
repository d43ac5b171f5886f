//! Line plots as SVG, written by hand (no plotting dependency): one panel
//! per plot, log2 x axis, linear y axis, one polyline per series.

use std::fmt::Write;

/// One line of a plot.
#[derive(Clone, Debug, PartialEq)]
pub struct Series {
    /// Legend text.
    pub label: String,
    /// (x, y) points, x > 0.
    pub points: Vec<(f64, f64)>,
}

/// One panel.
#[derive(Clone, Debug, PartialEq)]
pub struct Panel {
    /// Title above the panel.
    pub title: String,
    /// X axis label.
    pub x_label: String,
    /// Y axis label.
    pub y_label: String,
    /// How x ticks are written.
    pub x_unit: XUnit,
    /// The lines.
    pub series: Vec<Series>,
}

/// How x values are printed on ticks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum XUnit {
    /// Bytes (1K, 1M, 1G).
    Bytes,
    /// Plain counts (4k for 4096).
    Count,
}

const COLORS: [&str; 8] = [
    "#1f77b4", "#d62728", "#2ca02c", "#ff7f0e", "#9467bd", "#8c564b", "#e377c2", "#17becf",
];
const DASHES: [&str; 3] = ["", "6,3", "2,3"];

/// A tick label: bytes in K/M/G of 1024, counts in k of 1024 (the axes
/// are powers of two).
pub fn tick(x: f64, unit: XUnit) -> String {
    let (k, m, g) = (1024.0, 1024.0 * 1024.0, 1024.0 * 1024.0 * 1024.0);
    let (v, s) = if x >= g {
        (x / g, "G")
    } else if x >= m {
        (x / m, "M")
    } else if x >= k {
        (x / k, if unit == XUnit::Bytes { "K" } else { "k" })
    } else {
        (x, "")
    };
    if (v - v.round()).abs() < 1e-9 {
        format!("{}{s}", v.round())
    } else {
        format!("{v:.1}{s}")
    }
}

fn esc(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
}

/// The panels side by side, as an SVG document.
pub fn render(panels: &[Panel]) -> String {
    let (pw, ph) = (460.0, 340.0);
    let (ml, mr, mt, mb) = (60.0, 16.0, 30.0, 120.0);
    let w = pw * panels.len() as f64;
    let mut out = String::new();
    let _ = writeln!(
        out,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{w}" height="{}" font-family="sans-serif" font-size="11">"#,
        ph + mb - 40.0
    );
    let _ = writeln!(out, r#"<rect width="100%" height="100%" fill="white"/>"#);
    for (i, p) in panels.iter().enumerate() {
        let x0 = i as f64 * pw + ml;
        let (iw, ih) = (pw - ml - mr, ph - mt - 60.0);
        let y0 = mt;
        let pts = p.series.iter().flat_map(|s| s.points.iter());
        let (mut xmin, mut xmax, mut ymax) = (f64::INFINITY, 0.0f64, 0.0f64);
        for &(x, y) in pts {
            xmin = xmin.min(x);
            xmax = xmax.max(x);
            ymax = ymax.max(y);
        }
        if !xmin.is_finite() {
            continue;
        }
        let (lx0, lx1) = (
            xmin.log2().floor(),
            xmax.log2().ceil().max(xmin.log2().floor() + 1.0),
        );
        let ymax = nice(ymax);
        let px = |x: f64| x0 + (x.log2() - lx0) / (lx1 - lx0) * iw;
        let py = |y: f64| y0 + ih - y / ymax * ih;
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle" font-size="13">{}</text>"#,
            x0 + iw / 2.0,
            y0 - 10.0,
            esc(&p.title)
        );
        let _ = writeln!(
            out,
            r##"<rect x="{x0}" y="{y0}" width="{iw}" height="{ih}" fill="none" stroke="#444"/>"##
        );
        for k in 0..=4 {
            let y = ymax * k as f64 / 4.0;
            let _ = writeln!(
                out,
                r##"<line x1="{x0}" x2="{}" y1="{yy}" y2="{yy}" stroke="#ddd"/><text x="{}" y="{}" text-anchor="end">{}</text>"##,
                x0 + iw,
                x0 - 4.0,
                py(y) + 4.0,
                fmt_num(y),
                yy = py(y)
            );
        }
        let step = ((lx1 - lx0) / 8.0).ceil().max(1.0);
        let mut e = lx0;
        while e <= lx1 + 1e-9 {
            let x = 2f64.powf(e);
            let _ = writeln!(
                out,
                r##"<line x1="{xx}" x2="{xx}" y1="{y0}" y2="{}" stroke="#eee"/><text x="{xx}" y="{}" text-anchor="middle">{}</text>"##,
                y0 + ih,
                y0 + ih + 14.0,
                tick(x, p.x_unit),
                xx = px(x)
            );
            e += step;
        }
        let _ = writeln!(
            out,
            r#"<text x="{}" y="{}" text-anchor="middle">{}</text>"#,
            x0 + iw / 2.0,
            y0 + ih + 30.0,
            esc(&p.x_label)
        );
        let _ = writeln!(
            out,
            r#"<text transform="translate({},{}) rotate(-90)" text-anchor="middle">{}</text>"#,
            x0 - 44.0,
            y0 + ih / 2.0,
            esc(&p.y_label)
        );
        for (j, s) in p.series.iter().enumerate() {
            let color = COLORS[j % COLORS.len()];
            let dash = DASHES[(j / COLORS.len()) % DASHES.len()];
            let pts: Vec<String> = s
                .points
                .iter()
                .map(|&(x, y)| format!("{:.1},{:.1}", px(x), py(y)))
                .collect();
            let _ = writeln!(
                out,
                r#"<polyline points="{}" fill="none" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/>"#,
                pts.join(" ")
            );
            for &(x, y) in &s.points {
                let _ = writeln!(
                    out,
                    r#"<circle cx="{:.1}" cy="{:.1}" r="2.5" fill="{color}"/>"#,
                    px(x),
                    py(y)
                );
            }
            let (lx, ly) = (
                x0 + (j % 2) as f64 * iw / 2.0,
                y0 + ih + 48.0 + (j / 2) as f64 * 14.0,
            );
            let _ = writeln!(
                out,
                r#"<line x1="{lx}" x2="{}" y1="{}" y2="{}" stroke="{color}" stroke-width="2" stroke-dasharray="{dash}"/><text x="{}" y="{}">{}</text>"#,
                lx + 18.0,
                ly - 4.0,
                ly - 4.0,
                lx + 22.0,
                ly,
                esc(&s.label)
            );
        }
    }
    out.push_str("</svg>\n");
    out
}

/// A round axis maximum at or above `y`.
fn nice(y: f64) -> f64 {
    if y <= 0.0 || !y.is_finite() {
        return 1.0;
    }
    let p = 10f64.powf(y.log10().floor());
    for m in [1.0, 2.0, 2.5, 5.0, 10.0] {
        if m * p >= y {
            return m * p;
        }
    }
    10.0 * p
}

fn fmt_num(y: f64) -> String {
    if y == y.round() {
        format!("{}", y as i64)
    } else {
        format!("{y:.1}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_and_axis_maxima() {
        assert_eq!(tick(1048576.0, XUnit::Bytes), "1M");
        assert_eq!(tick(4096.0, XUnit::Count), "4k");
        assert_eq!(tick(1536.0, XUnit::Bytes), "1.5K");
        assert_eq!(tick(512.0, XUnit::Count), "512");
        assert_eq!(tick(16384.0, XUnit::Bytes), "16K");
        assert_eq!(nice(42.0), 50.0);
        assert_eq!(nice(0.0), 1.0);
    }

    #[test]
    fn a_plot_holds_its_series() {
        let svg = render(&[Panel {
            title: "t".into(),
            x_label: "x".into(),
            y_label: "y".into(),
            x_unit: XUnit::Bytes,
            series: vec![Series {
                label: "a<b".into(),
                points: vec![(1024.0, 1.0), (2048.0, 2.0)],
            }],
        }]);
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("a&lt;b"));
        assert_eq!(svg.matches("<polyline").count(), 1);
        assert!(svg.trim_end().ends_with("</svg>"));
    }
}
