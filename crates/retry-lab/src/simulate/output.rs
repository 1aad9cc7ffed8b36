//! The simulation's files: CSV tables and SVG line charts, one line per policy.
//!
//! Numbers are printed with fixed decimals, so the same report gives the same bytes.

use std::fmt::Write as _;
use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use plotters::prelude::*;

use super::Report;

/// The files [`write()`] creates, in order.
pub const FILES: [&str; 8] = [
    "steady.csv",
    "episode.csv",
    "recovery.csv",
    "goodput.svg",
    "amplification.svg",
    "p99.svg",
    "episode-goodput.svg",
    "episode-attempts.svg",
];

/// `steady.csv`: one row per policy and load.
pub fn steady_csv(report: &Report) -> String {
    let mut out = String::from(
        "policy,load,offered_ops_per_s,goodput_ops_per_s,amplification,failure_rate,p50_ms,p99_ms,p999_ms,shed_per_s\n",
    );
    for r in &report.steady {
        let _ = writeln!(
            out,
            "{},{:.2},{:.1},{:.1},{:.3},{:.4},{:.3},{:.3},{:.3},{:.1}",
            r.policy.name(),
            r.load,
            r.offered,
            r.goodput,
            r.amplification,
            r.failure_rate,
            r.latency_ms[0],
            r.latency_ms[1],
            r.latency_ms[2],
            r.shed_per_s
        );
    }
    out
}

/// `episode.csv`: one row per policy and time bucket.
pub fn episode_csv(report: &Report) -> String {
    let mut out = String::from(
        "policy,t_s,offered_ops_per_s,goodput_ops_per_s,attempts_per_s,failure_rate\n",
    );
    for e in &report.episode {
        for (t, offered, goodput, attempts, failure) in &e.series {
            let _ = writeln!(
                out,
                "{},{t:.2},{offered:.1},{goodput:.1},{attempts:.1},{failure:.4}",
                e.policy.name()
            );
        }
    }
    out
}

/// `recovery.csv`: one row per policy; an empty time means it did not recover.
pub fn recovery_csv(report: &Report) -> String {
    let mut out = String::from("policy,time_to_recover_s\n");
    for e in &report.episode {
        let t = e
            .time_to_recover
            .map(|t| format!("{t:.2}"))
            .unwrap_or_default();
        let _ = writeln!(out, "{},{t}", e.policy.name());
    }
    out
}

/// The name of the offered-load line of the episode chart (drawn in grey).
const OFFERED: &str = "offered load";

const COLORS: [RGBColor; 9] = [
    RGBColor(0, 0, 0),
    RGBColor(214, 39, 40),
    RGBColor(31, 119, 180),
    RGBColor(23, 190, 207),
    RGBColor(148, 103, 189),
    RGBColor(44, 160, 44),
    RGBColor(188, 189, 34),
    RGBColor(255, 127, 14),
    RGBColor(140, 86, 75),
];

/// One line of a chart.
struct Line {
    name: String,
    points: Vec<(f64, f64)>,
}

/// Where a chart's legend goes, and how much room above the highest point it leaves for it.
struct Legend {
    position: SeriesLabelPosition,
    headroom: f64,
}

/// A line chart as SVG text. `log_y` plots the y axis on a log scale.
fn chart(
    title: &str,
    x_label: &str,
    y_label: &str,
    lines: &[Line],
    log_y: bool,
    legend: Legend,
) -> io::Result<String> {
    let mut svg = String::new();
    let xs = lines.iter().flat_map(|l| l.points.iter().map(|p| p.0));
    let ys = lines.iter().flat_map(|l| l.points.iter().map(|p| p.1));
    let (x0, x1) = xs.fold((f64::MAX, f64::MIN), |(a, b), x| (a.min(x), b.max(x)));
    let y1 = ys.clone().fold(0.0f64, f64::max).max(1e-9) * legend.headroom;
    let y0 = ys
        .filter(|y| *y > 0.0)
        .fold(f64::MAX, f64::min)
        .min(y1 / 2.0);
    let draw = |svg: &mut String| -> Result<(), Box<dyn std::error::Error>> {
        let root = SVGBackend::with_string(svg, (900, 560)).into_drawing_area();
        root.fill(&WHITE)?;
        let mut builder = ChartBuilder::on(&root);
        builder
            .caption(title, ("sans-serif", 22))
            .margin(12)
            .x_label_area_size(44)
            .y_label_area_size(70);
        let style = |name: &str, i: usize| {
            let color = if name == OFFERED {
                RGBColor(150, 150, 150)
            } else {
                COLORS[i % COLORS.len()]
            };
            let width = if name.starts_with("current") { 3 } else { 2 };
            ShapeStyle::from(&color).stroke_width(width)
        };
        if log_y {
            let mut c = builder.build_cartesian_2d(x0..x1, (y0..y1).log_scale())?;
            c.configure_mesh()
                .x_desc(x_label)
                .y_desc(y_label)
                .max_light_lines(0)
                .draw()?;
            for (i, line) in lines.iter().enumerate() {
                let s = style(&line.name, i);
                c.draw_series(LineSeries::new(
                    line.points.iter().map(|p| (p.0, p.1.max(y0))),
                    s,
                ))?
                .label(line.name.clone())
                .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], s));
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(legend.position)
                .draw()?;
        } else {
            let mut c = builder.build_cartesian_2d(x0..x1, 0.0..y1)?;
            c.configure_mesh()
                .y_label_formatter(&|v| {
                    if y1 < 20.0 {
                        format!("{v:.1}")
                    } else {
                        format!("{v:.0}")
                    }
                })
                .x_desc(x_label)
                .y_desc(y_label)
                .max_light_lines(0)
                .draw()?;
            for (i, line) in lines.iter().enumerate() {
                let s = style(&line.name, i);
                c.draw_series(LineSeries::new(line.points.iter().copied(), s))?
                    .label(line.name.clone())
                    .legend(move |(x, y)| PathElement::new([(x, y), (x + 18, y)], s));
            }
            c.configure_series_labels()
                .background_style(WHITE.mix(0.85))
                .border_style(BLACK)
                .position(legend.position)
                .draw()?;
        }
        root.present()?;
        Ok(())
    };
    draw(&mut svg).map_err(|e| io::Error::other(format!("drawing {title}: {e}")))?;
    Ok(svg)
}

fn steady_lines(report: &Report, value: impl Fn(&super::SteadyRow) -> f64) -> Vec<Line> {
    let mut lines: Vec<Line> = Vec::new();
    for row in &report.steady {
        let name = row.policy.name();
        let point = (row.load, value(row));
        match lines.iter_mut().find(|l| l.name == name) {
            Some(l) => l.points.push(point),
            None => lines.push(Line {
                name,
                points: vec![point],
            }),
        }
    }
    lines
}

fn episode_lines(report: &Report, value: impl Fn(&(f64, f64, f64, f64, f64)) -> f64) -> Vec<Line> {
    report
        .episode
        .iter()
        .map(|e| Line {
            name: e.policy.name(),
            points: e.series.iter().map(|p| (p.0, value(p))).collect(),
        })
        .collect()
}

/// Every file's name and contents, in [`FILES`] order.
pub fn render(report: &Report) -> io::Result<Vec<(&'static str, String)>> {
    let capacity = report.cluster.capacity();
    let mut offered = Line {
        name: OFFERED.into(),
        points: Vec::new(),
    };
    if let Some(first) = report.episode.first() {
        offered.points = first.series.iter().map(|p| (p.0, p.1)).collect();
    }
    let mut goodput_episode = episode_lines(report, |p| p.2);
    goodput_episode.push(Line {
        name: OFFERED.into(),
        points: offered.points.clone(),
    });
    let x = "offered load (x capacity)";
    Ok(vec![
        ("steady.csv", steady_csv(report)),
        ("episode.csv", episode_csv(report)),
        ("recovery.csv", recovery_csv(report)),
        (
            "goodput.svg",
            chart(
                &format!("Goodput vs offered load (capacity {capacity:.0} ops/s)"),
                x,
                "successful operations per second",
                &steady_lines(report, |r| r.goodput),
                false,
                Legend {
                    position: SeriesLabelPosition::LowerRight,
                    headroom: 1.05,
                },
            )?,
        ),
        (
            "amplification.svg",
            chart(
                "Retry amplification vs offered load",
                x,
                "attempts per operation",
                &steady_lines(report, |r| r.amplification),
                false,
                Legend {
                    position: SeriesLabelPosition::UpperLeft,
                    headroom: 1.4,
                },
            )?,
        ),
        (
            "p99.svg",
            chart(
                "p99 latency vs offered load (failures included)",
                x,
                "p99 latency (ms, log scale)",
                &steady_lines(report, |r| r.latency_ms[1]),
                true,
                Legend {
                    position: SeriesLabelPosition::UpperRight,
                    headroom: 12.0,
                },
            )?,
        ),
        (
            "episode-goodput.svg",
            chart(
                "Overload episode: goodput over time",
                "time (s)",
                "successful operations per second",
                &goodput_episode,
                false,
                Legend {
                    position: SeriesLabelPosition::UpperRight,
                    headroom: 1.05,
                },
            )?,
        ),
        (
            "episode-attempts.svg",
            chart(
                "Overload episode: attempts sent over time",
                "time (s)",
                "attempts per second",
                &episode_lines(report, |p| p.3),
                false,
                Legend {
                    position: SeriesLabelPosition::UpperRight,
                    headroom: 1.05,
                },
            )?,
        ),
    ])
}

/// Writes every file into `dir` (created if missing); returns their paths.
pub fn write(report: &Report, dir: &Path) -> io::Result<Vec<PathBuf>> {
    fs::create_dir_all(dir)?;
    render(report)?
        .into_iter()
        .map(|(name, contents)| {
            let path = dir.join(name);
            fs::write(&path, contents)?;
            Ok(path)
        })
        .collect()
}
