//! `docs/benchmarks.svg`: throughput and p99 of each scenario on each
//! backend, two bar charts side by side (requests/s on a log scale, since
//! new charges and replays differ tenfold; p99 linear), drawn straight from
//! the load [`Report`]s the markdown's tables come from (no second renderer).

use std::fmt::Write as _;

use payments_loadtest::load::Report;

use crate::results::BackendResults;

/// A scenario as charted: its label and the report stream that times it.
struct Series {
    label: &'static str,
    stream: &'static str,
    report: fn(&BackendResults) -> Option<&Report>,
}

const SERIES: [Series; 6] = [
    Series {
        label: "new",
        stream: "charge",
        report: |b| b.new.as_ref(),
    },
    Series {
        label: "replay",
        stream: "replay",
        report: |b| b.replay.as_ref(),
    },
    Series {
        label: "/healthz",
        stream: "health",
        report: |b| b.health.as_ref(),
    },
    Series {
        label: "refund",
        stream: "refund",
        report: |b| b.refund.as_ref(),
    },
    Series {
        label: "capture",
        stream: "capture",
        report: |b| b.capture.as_ref(),
    },
    Series {
        label: "list",
        stream: "list",
        report: |b| Some(&b.list.as_ref()?.0),
    },
];

/// One colour per backend, in the markdown's column order.
const COLOURS: [&str; 4] = ["#4e79a7", "#f28e2b", "#59a14f", "#b07aa1"];

const WIDTH: f64 = 960.0;
const HEIGHT: f64 = 380.0;
const PANEL: f64 = 440.0;
const TOP: f64 = 60.0;
const PLOT: f64 = 250.0;

/// The chart, or `None` when no scenario was measured.
pub fn render(backends: &[BackendResults]) -> Option<String> {
    let measured: Vec<&Series> = SERIES
        .iter()
        .filter(|s| backends.iter().any(|b| figures(s, b).is_some()))
        .collect();
    if measured.is_empty() {
        return None;
    }
    let mut svg = format!(
        "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"{WIDTH}\" height=\"{HEIGHT}\" \
         viewBox=\"0 0 {WIDTH} {HEIGHT}\" font-family=\"sans-serif\" font-size=\"12\">\n\
         <rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
    );
    let rps = |s: &Series, b: &BackendResults| figures(s, b).map(|f| f.0);
    let p99 = |s: &Series, b: &BackendResults| figures(s, b).map(|f| f.1);
    panel(
        &mut svg,
        40.0,
        "requests/s (log scale)",
        &measured,
        backends,
        &rps,
        Scale::Log,
        &|v| format!("{v:.0}"),
    );
    panel(
        &mut svg,
        520.0,
        "p99, ms",
        &measured,
        backends,
        &p99,
        Scale::Linear,
        &|v| format!("{v:.1}"),
    );
    for (i, b) in backends.iter().enumerate() {
        let x = 40.0 + i as f64 * 130.0;
        let colour = COLOURS[i % COLOURS.len()];
        let _ = writeln!(
            svg,
            "<rect x=\"{x}\" y=\"14\" width=\"12\" height=\"12\" fill=\"{colour}\"/>\
             <text x=\"{}\" y=\"24\">{}</text>",
            x + 18.0,
            b.backend
        );
    }
    svg.push_str("</svg>\n");
    Some(svg)
}

/// A scenario's throughput (req/s) and p99 (ms) on one backend.
fn figures(series: &Series, b: &BackendResults) -> Option<(f64, f64)> {
    let stream = (series.report)(b)?.stream(series.stream)?;
    let p99_ms = stream.latency_us?.p99 as f64 / 1000.0;
    Some((stream.throughput_rps, p99_ms))
}

/// How a panel maps values to bar heights.
#[derive(Clone, Copy)]
enum Scale {
    Linear,
    /// From 10 to the next power of ten above the largest value, with a
    /// grid line at each power.
    Log,
}

/// One bar chart: a group of bars per scenario, one bar per backend, each
/// labelled with its value.
#[allow(clippy::too_many_arguments)]
fn panel(
    svg: &mut String,
    left: f64,
    title: &str,
    series: &[&Series],
    backends: &[BackendResults],
    value: &dyn Fn(&Series, &BackendResults) -> Option<f64>,
    scale: Scale,
    label: &dyn Fn(f64) -> String,
) {
    let values = series
        .iter()
        .flat_map(|s| backends.iter().filter_map(|b| value(s, b)));
    let max = values.fold(0.0_f64, f64::max).max(f64::EPSILON);
    let bottom = TOP + PLOT;
    let decades = max.log10().ceil().max(2.0);
    let height = |v: f64| match scale {
        Scale::Linear => PLOT * v / max,
        Scale::Log => PLOT * ((v.max(10.0).log10() - 1.0) / (decades - 1.0)),
    };
    if let Scale::Log = scale {
        for power in 1..=decades as u32 {
            let y = bottom - height(10f64.powi(power as i32));
            let _ = writeln!(
                svg,
                "<line x1=\"{left}\" y1=\"{y:.1}\" x2=\"{}\" y2=\"{y:.1}\" stroke=\"#ddd\"/>\
                 <text x=\"{}\" y=\"{:.1}\" font-size=\"9\" text-anchor=\"end\">{}</text>",
                left + PANEL,
                left - 2.0,
                y + 3.0,
                10u64.pow(power)
            );
        }
    }
    let _ = writeln!(
        svg,
        "<text x=\"{left}\" y=\"{}\" font-weight=\"bold\">{title}</text>\n\
         <line x1=\"{left}\" y1=\"{bottom}\" x2=\"{}\" y2=\"{bottom}\" stroke=\"#333\"/>",
        TOP - 10.0,
        left + PANEL
    );
    let group = PANEL / series.len() as f64;
    let bar = (group - 16.0) / backends.len().max(1) as f64;
    for (g, s) in series.iter().enumerate() {
        let x0 = left + g as f64 * group + 8.0;
        for (i, b) in backends.iter().enumerate() {
            let Some(v) = value(s, b) else { continue };
            let h = height(v);
            let (x, y) = (x0 + i as f64 * bar, bottom - h);
            let colour = COLOURS[i % COLOURS.len()];
            let _ = writeln!(
                svg,
                "<rect x=\"{x:.1}\" y=\"{y:.1}\" width=\"{:.1}\" height=\"{h:.1}\" fill=\"{colour}\">\
                 <title>{} {}: {}</title></rect>\n\
                 <text x=\"{:.1}\" y=\"{:.1}\" font-size=\"9\" text-anchor=\"middle\">{}</text>",
                bar - 2.0,
                b.backend,
                s.label,
                label(v),
                x + bar / 2.0 - 1.0,
                y - 3.0,
                label(v)
            );
        }
        let _ = writeln!(
            svg,
            "<text x=\"{:.1}\" y=\"{:.1}\" text-anchor=\"middle\">{}</text>",
            x0 + (group - 16.0) / 2.0,
            bottom + 18.0,
            s.label
        );
    }
}
