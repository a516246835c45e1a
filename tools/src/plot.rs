//! Log-log line plots as SVG text, for `shmfab compare --plot`: panels side
//! by side, each a set of named series (a value per message size, absent
//! where a system has no figure), sharing one legend. The x axis is the
//! message size (ticks at powers of two, labelled `8 B`, `4 KiB`, `2 MiB`),
//! the y axis a decimal log scale (ticks at each power of ten, with 2 and 5
//! between them when the panel spans less than two decades).
//!
//! ```
//! use shmfab_tools::plot::{svg, Panel, Series};
//! let s = Series { name: "shmfab", color: "#d62728", dashed: false, points: vec![(8.0, Some(0.1)), (64.0, Some(0.2))] };
//! let p = Panel { title: "half round trip", y_label: "us", series: vec![s] };
//! let out = svg("title", "subtitle", &[p]);
//! assert!(out.starts_with("<svg") && out.contains("shmfab"));
//! ```

use std::fmt::Write;

/// One line: a system's values by message size.
#[derive(Clone, Debug)]
pub struct Series<'a> {
    /// Name in the legend.
    pub name: &'a str,
    /// SVG colour of the line and its points.
    pub color: &'a str,
    /// Drawn dashed (a floor rather than a system).
    pub dashed: bool,
    /// (message size in bytes, value); None (or a value that is not
    /// positive) leaves a gap in the line.
    pub points: Vec<(f64, Option<f64>)>,
}

/// One plot: its series against message size.
#[derive(Clone, Debug)]
pub struct Panel<'a> {
    /// Heading above the plot.
    pub title: &'a str,
    /// Label of the y axis.
    pub y_label: &'a str,
    /// The lines.
    pub series: Vec<Series<'a>>,
}

/// A log scale mapping `lo..=hi` (both positive) onto pixels `p0..=p1`
/// (p1 may be below p0, as on a y axis).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct LogScale {
    /// Smallest value shown.
    pub lo: f64,
    /// Largest value shown.
    pub hi: f64,
    /// Pixel of `lo`.
    pub p0: f64,
    /// Pixel of `hi`.
    pub p1: f64,
}

impl LogScale {
    /// The pixel of `v` (positive).
    pub fn at(&self, v: f64) -> f64 {
        let t = (v.ln() - self.lo.ln()) / (self.hi.ln() - self.lo.ln());
        self.p0 + t * (self.p1 - self.p0)
    }
}

/// Smallest and largest of the positive values present, or None.
fn extent(values: impl Iterator<Item = f64>) -> Option<(f64, f64)> {
    values
        .filter(|v| v.is_finite() && *v > 0.0)
        .fold(None, |acc, v| Some(acc.map_or((v, v), |(lo, hi): (f64, f64)| (lo.min(v), hi.max(v)))))
}

/// The decimal range shown for values from `lo` to `hi`: out to whole
/// powers of ten, at least one decade.
pub fn decade_range(lo: f64, hi: f64) -> (f64, f64) {
    // A hair of slack, so that 1000 computed as 999.9999999 stays in its decade.
    let a = (lo.log10() + 1e-9).floor();
    let mut b = (hi.log10() - 1e-9).ceil();
    if b <= a {
        b = a + 1.0;
    }
    (10f64.powf(a), 10f64.powf(b))
}

/// Ticks of a decimal log axis over `lo..=hi` (whole powers of ten, as
/// [`decade_range`] gives): each power of ten, labelled, and 2 and 5
/// times each also labelled when the range spans less than two decades.
/// Returns (value, labelled) pairs in increasing order; the minor ticks
/// (2 to 9 times each power) that are not labelled come too.
pub fn decade_ticks(lo: f64, hi: f64) -> Vec<(f64, bool)> {
    let a = lo.log10().round() as i32;
    let b = hi.log10().round() as i32;
    let few = b - a < 2;
    let mut out = Vec::new();
    for e in a..=b {
        let p = 10f64.powi(e);
        out.push((p, true));
        if e == b {
            break;
        }
        for m in 2..=9 {
            out.push((p * m as f64, few && (m == 2 || m == 5)));
        }
    }
    out
}

/// Ticks of the size axis over `lo..=hi`: every power of two inside it,
/// labelled at exponents that are multiples of the smallest step (1, 2, 3,
/// ...) that keeps the labels to at most `max_labels`. Returns (value,
/// labelled) pairs in increasing order.
pub fn size_ticks(lo: f64, hi: f64, max_labels: usize) -> Vec<(f64, bool)> {
    let a = (lo.log2() - 1e-9).ceil() as i32;
    let b = (hi.log2() + 1e-9).floor() as i32;
    if b < a {
        return Vec::new();
    }
    let step =
        (1..).find(|s: &i32| (a..=b).filter(|e| e.rem_euclid(*s) == 0).count() <= max_labels.max(1)).unwrap_or(1);
    (a..=b).map(|e| (2f64.powi(e), e.rem_euclid(step) == 0)).collect()
}

/// A power-of-two byte count for an axis: `8 B`, `4 KiB`, `2 MiB`.
pub fn size_label(v: f64) -> String {
    let n = v.round() as u64;
    match n {
        n if n >= 1 << 30 && n.is_multiple_of(1 << 30) => format!("{} GiB", n >> 30),
        n if n >= 1 << 20 && n.is_multiple_of(1 << 20) => format!("{} MiB", n >> 20),
        n if n >= 1 << 10 && n.is_multiple_of(1 << 10) => format!("{} KiB", n >> 10),
        n => format!("{n} B"),
    }
}

/// A value of a decimal axis: `0.01`, `0.5`, `20`, `10000`.
pub fn value_label(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.0}")
    } else {
        let places = (-v.log10()).ceil().max(0.0) as usize;
        format!("{v:.places$}")
    }
}

/// `s` with the characters XML gives a meaning to escaped.
pub fn escape(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&apos;"),
            c => o.push(c),
        }
    }
    o
}

/// Width of one panel, in pixels (plot area and its margins).
const PANEL_W: f64 = 500.0;
/// Plot area of a panel, relative to the panel's left edge and the top.
const PLOT_X: f64 = 75.0;
const PLOT_W: f64 = 400.0;
const PLOT_Y: f64 = 80.0;
const PLOT_H: f64 = 300.0;
/// Height of the whole picture.
const HEIGHT: f64 = 490.0;

/// The SVG of `panels` side by side under a `title` and a `subtitle`, with
/// one legend below them naming every series (in first-seen order).
pub fn svg(title: &str, subtitle: &str, panels: &[Panel]) -> String {
    let width = PANEL_W * panels.len().max(1) as f64 + 20.0;
    let mut o = String::new();
    let _ = writeln!(
        o,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{width:.0}" height="{HEIGHT:.0}" viewBox="0 0 {width:.0} {HEIGHT:.0}" font-family="sans-serif" font-size="12">"#
    );
    let _ = writeln!(o, r#"<rect x="0" y="0" width="{width:.0}" height="{HEIGHT:.0}" fill="white"/>"#);
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="24" text-anchor="middle" font-size="16">{}</text>"#,
        width / 2.0,
        escape(title)
    );
    let _ = writeln!(
        o,
        r##"<text x="{:.1}" y="44" text-anchor="middle" fill="#444">{}</text>"##,
        width / 2.0,
        escape(subtitle)
    );
    for (i, p) in panels.iter().enumerate() {
        panel(&mut o, 10.0 + i as f64 * PANEL_W, p);
    }
    legend(&mut o, panels, width);
    o.push_str("</svg>\n");
    o
}

/// Draws one panel with its left edge at `left`.
fn panel(o: &mut String, left: f64, p: &Panel) {
    let (x0, y0) = (left + PLOT_X, PLOT_Y);
    let (x1, y1) = (x0 + PLOT_W, y0 + PLOT_H);
    let _ = writeln!(o, r#"<g class="panel">"#);
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle" font-size="14">{}</text>"#,
        (x0 + x1) / 2.0,
        y0 - 12.0,
        escape(p.title)
    );
    let _ = writeln!(
        o,
        r##"<rect x="{x0:.1}" y="{y0:.1}" width="{PLOT_W:.1}" height="{PLOT_H:.1}" fill="none" stroke="#333"/>"##
    );
    let xs = extent(p.series.iter().flat_map(|s| s.points.iter().map(|pt| pt.0)));
    let ys = extent(p.series.iter().flat_map(|s| s.points.iter().filter_map(|pt| pt.1)));
    let (Some((xlo, xhi)), Some((ylo, yhi))) = (xs, ys) else {
        let _ = writeln!(
            o,
            r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">no figures</text>"#,
            (x0 + x1) / 2.0,
            (y0 + y1) / 2.0
        );
        let _ = writeln!(o, "</g>");
        return;
    };
    // Half a doubling of room on each side of the sizes.
    let xs = LogScale { lo: xlo / 2f64.sqrt(), hi: xhi * 2f64.sqrt(), p0: x0, p1: x1 };
    let (ylo, yhi) = decade_range(ylo, yhi);
    let ys = LogScale { lo: ylo, hi: yhi, p0: y1, p1: y0 };
    for (v, labelled) in size_ticks(xs.lo, xs.hi, 8) {
        let x = xs.at(v);
        let len = if labelled { 6.0 } else { 3.0 };
        if labelled {
            let _ = writeln!(o, r##"<line x1="{x:.1}" y1="{y0:.1}" x2="{x:.1}" y2="{y1:.1}" stroke="#e4e4e4"/>"##);
            let _ =
                writeln!(o, r#"<text x="{x:.1}" y="{:.1}" text-anchor="middle">{}</text>"#, y1 + 18.0, size_label(v));
        }
        let _ = writeln!(o, r##"<line x1="{x:.1}" y1="{y1:.1}" x2="{x:.1}" y2="{:.1}" stroke="#333"/>"##, y1 - len);
    }
    for (v, labelled) in decade_ticks(ys.lo, ys.hi) {
        let y = ys.at(v);
        let decade = (v.log10() - v.log10().round()).abs() < 1e-9;
        let len = if labelled { 6.0 } else { 3.0 };
        if decade {
            let _ = writeln!(o, r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{x1:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##);
        }
        if labelled {
            let _ = writeln!(
                o,
                r#"<text x="{:.1}" y="{:.1}" text-anchor="end">{}</text>"#,
                x0 - 8.0,
                y + 4.0,
                value_label(v)
            );
        }
        let _ = writeln!(o, r##"<line x1="{x0:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="#333"/>"##, x0 + len);
    }
    let _ = writeln!(
        o,
        r#"<text x="{:.1}" y="{:.1}" text-anchor="middle">message size</text>"#,
        (x0 + x1) / 2.0,
        y1 + 40.0
    );
    let (lx, ly) = (left + 18.0, (y0 + y1) / 2.0);
    let _ = writeln!(
        o,
        r#"<text x="{lx:.1}" y="{ly:.1}" text-anchor="middle" transform="rotate(-90 {lx:.1} {ly:.1})">{}</text>"#,
        escape(p.y_label)
    );
    for s in &p.series {
        series(o, s, &xs, &ys);
    }
    let _ = writeln!(o, "</g>");
}

/// Draws one series: a polyline per unbroken run of values, a dot per value.
fn series(o: &mut String, s: &Series, xs: &LogScale, ys: &LogScale) {
    let name = escape(s.name);
    let dash = if s.dashed { r#" stroke-dasharray="6 4""# } else { "" };
    let mut runs: Vec<Vec<(f64, f64)>> = vec![Vec::new()];
    for &(x, y) in &s.points {
        match y.filter(|y| y.is_finite() && *y > 0.0 && x > 0.0) {
            Some(y) => match runs.last_mut() {
                Some(r) => r.push((xs.at(x), ys.at(y))),
                None => runs.push(vec![(xs.at(x), ys.at(y))]),
            },
            None if runs.last().is_some_and(|r| !r.is_empty()) => runs.push(Vec::new()),
            None => {}
        }
    }
    for run in runs.iter().filter(|r| !r.is_empty()) {
        let pts: Vec<String> = run.iter().map(|(x, y)| format!("{x:.1},{y:.1}")).collect();
        let _ = writeln!(
            o,
            r#"<polyline data-series="{name}" points="{}" fill="none" stroke="{}" stroke-width="2"{dash}/>"#,
            pts.join(" "),
            s.color
        );
        for (x, y) in run {
            let _ = writeln!(o, r#"<circle cx="{x:.1}" cy="{y:.1}" r="3" fill="{}"/>"#, s.color);
        }
    }
}

/// The legend: every series of every panel once, in a row under the panels.
fn legend(o: &mut String, panels: &[Panel], width: f64) {
    let mut seen: Vec<&Series> = Vec::new();
    for s in panels.iter().flat_map(|p| &p.series) {
        if !seen.iter().any(|t| t.name == s.name) {
            seen.push(s);
        }
    }
    // Room for each entry: its line, its name (about 7 px a character at
    // 12 px), a gap.
    let room = |s: &Series| 34.0 + 7.0 * s.name.chars().count() as f64 + 24.0;
    let mut x = (width - seen.iter().map(|s| room(s)).sum::<f64>()).max(0.0) / 2.0;
    let y = HEIGHT - 22.0;
    let _ = writeln!(o, r#"<g class="legend">"#);
    for s in seen {
        let dash = if s.dashed { r#" stroke-dasharray="6 4""# } else { "" };
        let _ = writeln!(
            o,
            r#"<line x1="{x:.1}" y1="{y:.1}" x2="{:.1}" y2="{y:.1}" stroke="{}" stroke-width="2"{dash}/>"#,
            x + 28.0,
            s.color
        );
        let _ = writeln!(o, r#"<text x="{:.1}" y="{:.1}">{}</text>"#, x + 34.0, y + 4.0, escape(s.name));
        x += room(s);
    }
    let _ = writeln!(o, "</g>");
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A small XML reader, enough for what [`svg`] writes: checks that tags
    /// nest and close, attributes are quoted, text holds no bare `<` or `&`
    /// outside an entity. Returns the element names in document order.
    fn elements(xml: &str) -> Result<Vec<String>, String> {
        let mut names = Vec::new();
        let mut open: Vec<String> = Vec::new();
        let mut rest = xml;
        while !rest.is_empty() {
            let Some(lt) = rest.find('<') else {
                check_text(rest)?;
                break;
            };
            check_text(&rest[..lt])?;
            rest = &rest[lt + 1..];
            let gt = rest.find('>').ok_or("a tag that never closes")?;
            let tag = &rest[..gt];
            rest = &rest[gt + 1..];
            if let Some(name) = tag.strip_prefix('/') {
                match open.pop() {
                    Some(o) if o == name.trim() => {}
                    o => return Err(format!("</{name}> closes {o:?}")),
                }
                continue;
            }
            let empty = tag.ends_with('/');
            let tag = tag.trim_end_matches('/');
            let name_end = tag.find(char::is_whitespace).unwrap_or(tag.len());
            let name = &tag[..name_end];
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':') {
                return Err(format!("bad element name {name:?}"));
            }
            check_attributes(&tag[name_end..])?;
            if open.is_empty() && !names.is_empty() {
                return Err(format!("<{name}> after the root element"));
            }
            names.push(name.to_string());
            if !empty {
                open.push(name.to_string());
            }
        }
        if !open.is_empty() {
            return Err(format!("unclosed: {open:?}"));
        }
        Ok(names)
    }

    fn check_text(t: &str) -> Result<(), String> {
        let mut s = t;
        while let Some(i) = s.find('&') {
            s = &s[i..];
            let ok = ["&amp;", "&lt;", "&gt;", "&quot;", "&apos;"].iter().any(|e| s.starts_with(e));
            if !ok {
                return Err(format!("bare & in {t:?}"));
            }
            s = &s[1..];
        }
        Ok(())
    }

    fn check_attributes(mut a: &str) -> Result<(), String> {
        loop {
            a = a.trim_start();
            if a.is_empty() {
                return Ok(());
            }
            let eq = a.find('=').ok_or_else(|| format!("attribute without a value: {a:?}"))?;
            let key = &a[..eq];
            if key.is_empty() || !key.chars().all(|c| c.is_ascii_alphanumeric() || c == '-' || c == ':') {
                return Err(format!("bad attribute name {key:?}"));
            }
            a = a[eq + 1..].strip_prefix('"').ok_or_else(|| format!("unquoted value of {key}"))?;
            let end = a.find('"').ok_or_else(|| format!("value of {key} never ends"))?;
            if a[..end].contains('<') {
                return Err(format!("< in the value of {key}"));
            }
            check_text(&a[..end])?;
            a = &a[end + 1..];
        }
    }

    fn sample() -> Vec<Panel<'static>> {
        let sizes = [8.0, 64.0, 1024.0, 16384.0, 262144.0, 4194304.0];
        let line = |name, color, dashed, f: fn(f64) -> Option<f64>| Series {
            name,
            color,
            dashed,
            points: sizes.iter().map(|&s| (s, f(s))).collect(),
        };
        let lat = Panel {
            title: "half round trip",
            y_label: "us",
            series: vec![
                line("shmfab", "#d62728", false, |s| Some(0.1 + s / 20000.0)),
                line("raw floor", "#7f7f7f", true, |s| (s <= 3968.0).then_some(0.04 + s / 50000.0)),
                line("Open <MPI> & co", "#1f77b4", false, |s| (s != 1024.0).then_some(0.15 + s / 10000.0)),
            ],
        };
        let bw = Panel {
            title: "bandwidth",
            y_label: "MB/s",
            series: vec![line("shmfab", "#d62728", false, |s| Some(s / 10.0)), line("UCX", "#2ca02c", false, |_| None)],
        };
        vec![lat, bw]
    }

    #[test]
    fn the_svg_is_well_formed_and_names_every_series() {
        let out = svg("shmfab compare", "raw floor 0.04 us & more", &sample());
        let names = elements(&out).unwrap_or_else(|e| panic!("{e}\n{out}"));
        assert_eq!(names[0], "svg");
        assert_eq!(names.iter().filter(|n| *n == "g").count(), 3, "two panels and a legend");
        // Series with a gap are split: Open MPI has none at 1 KiB, so two
        // lines; UCX has no value at all, so none (but a legend entry).
        let lines = |n: &str| out.matches(&format!(r#"data-series="{}""#, escape(n))).count();
        assert_eq!((lines("shmfab"), lines("raw floor"), lines("Open <MPI> & co"), lines("UCX")), (2, 1, 2, 0));
        assert_eq!(names.iter().filter(|n| *n == "circle").count(), 6 + 3 + 5 + 6);
        for n in ["shmfab", "raw floor", "Open <MPI> & co", "UCX"] {
            assert_eq!(out.matches(&format!(">{}</text>", escape(n))).count(), 1, "{n} in the legend once");
        }
        assert!(!out.contains("NaN") && !out.contains("inf"), "{out}");
        // The checker itself catches what it is there for.
        assert!(elements("<svg><g></svg>").is_err());
        assert!(elements("<svg><text>a & b</text></svg>").is_err());
        assert!(elements("<svg><rect x=1/></svg>").is_err());
        assert!(elements("<svg/><svg/>").is_err());
    }

    #[test]
    fn a_panel_without_figures_says_so() {
        let p = Panel {
            title: "t",
            y_label: "y",
            series: vec![Series { name: "s", color: "red", dashed: false, points: vec![(8.0, None)] }],
        };
        let out = svg("a", "b", &[p]);
        elements(&out).unwrap();
        assert!(out.contains("no figures") && !out.contains("polyline") && !out.contains("NaN"));
    }

    #[test]
    fn log_ticks_sit_at_equal_steps_per_decade() {
        assert_eq!(decade_range(0.043, 642.0), (0.01, 1000.0));
        assert_eq!(decade_range(1.0, 1000.0), (1.0, 1000.0));
        assert_eq!(decade_range(3.0, 3.0), (1.0, 10.0));
        let s = LogScale { lo: 0.01, hi: 1000.0, p0: 400.0, p1: 100.0 };
        let labelled: Vec<f64> = decade_ticks(0.01, 1000.0).into_iter().filter(|t| t.1).map(|t| t.0).collect();
        assert_eq!(labelled.len(), 6);
        for (k, v) in labelled.iter().enumerate() {
            assert!((v / 10f64.powi(k as i32 - 2) - 1.0).abs() < 1e-12, "{v}");
            assert!((s.at(*v) - (400.0 - 60.0 * k as f64)).abs() < 1e-9, "{v} at {}", s.at(*v));
        }
        // 2 sits log10(2) of the way through its decade.
        assert!((s.at(2.0) - (s.at(1.0) - 60.0 * 2f64.log10())).abs() < 1e-9);
        // Five decades: 8 minor ticks each, none labelled.
        assert_eq!(decade_ticks(0.01, 1000.0).len(), 6 + 5 * 8);
        // One decade: 1, 2, 5, 10 labelled.
        let few: Vec<f64> = decade_ticks(1.0, 10.0).into_iter().filter(|t| t.1).map(|t| t.0).collect();
        assert_eq!(few, vec![1.0, 2.0, 5.0, 10.0]);
        assert_eq!(value_label(0.01), "0.01");
        assert_eq!(value_label(0.5), "0.5");
        assert_eq!(value_label(10000.0), "10000");
    }

    #[test]
    fn size_ticks_are_powers_of_two_labelled_every_few() {
        let t = size_ticks(8.0 / 2f64.sqrt(), 4194304.0 * 2f64.sqrt(), 8);
        assert_eq!(t.len(), 20, "2^3 to 2^22");
        let labelled: Vec<String> = t.iter().filter(|x| x.1).map(|x| size_label(x.0)).collect();
        assert_eq!(labelled, ["8 B", "64 B", "512 B", "4 KiB", "32 KiB", "256 KiB", "2 MiB"]);
        let t = size_ticks(8.0, 64.0, 8);
        assert!(t.iter().all(|x| x.1) && t.len() == 4);
        assert!(size_ticks(5.0, 7.0, 8).is_empty());
        let s = LogScale { lo: 8.0, hi: 8192.0, p0: 0.0, p1: 100.0 };
        assert!((s.at(256.0) - 50.0).abs() < 1e-9, "2^8 halfway between 2^3 and 2^13");
    }
}
