//! SVG line charts of a sweep, one metric against chunk size with a line per method,
//! drawn with plotters' SVG backend (text stays `<text>`, so no font files are needed).

use super::results::{Metric, Series};
use crate::error::{Error, Result};
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::prelude::*;
use plotters::style::text_anchor::{HPos, Pos, VPos};
use std::ops::Range;

/// The plot's own size; the legend gets a column of its own to the right,
/// so it can never hide a point.
const PLOT_SIZE: (u32, u32) = (760, 500);
/// Legend text size, and the width of one character of it as a font-less
/// layout has to guess it (generous: sans-serif averages about 0.55 em).
const LEGEND_FONT: u32 = 13;
const LEGEND_CHAR_WIDTH: u32 = 8;
/// Left of the text: a sample of the line.
const LEGEND_SAMPLE: u32 = 36;
const LEGEND_ROW: i32 = 22;

/// Line colours that stay distinct on white and for most colour-blind
/// readers (Okabe and Ito's palette, yellow left out); repeated past seven methods.
const COLORS: [RGBColor; 7] = [
    RGBColor(0, 114, 178),
    RGBColor(213, 94, 0),
    RGBColor(0, 158, 115),
    RGBColor(204, 121, 167),
    RGBColor(86, 180, 233),
    RGBColor(230, 159, 0),
    RGBColor(0, 0, 0),
];

/// The chart of `metric` over `series`, as an SVG document. The x axis is
/// logarithmic in chunk size, with a tick at every size measured; a single
/// chunk size still gives one point per method.
pub fn svg(metric: Metric, series: &[Series]) -> Result<String> {
    let mut text = String::new();
    draw(metric, series, &mut text)
        .map_err(|err| Error::invalid(format!("chart {}", metric.chart_file()), err.to_string()))?;
    Ok(text)
}

fn draw(
    metric: Metric,
    series: &[Series],
    text: &mut String,
) -> std::result::Result<(), Box<dyn std::error::Error>> {
    let axis = ChunkAxis::new(&chunk_sizes(series));
    let top = y_top(metric, series);

    let lines: Vec<(&Series, RGBColor)> = series
        .iter()
        .filter(|line| !line.points.is_empty())
        .enumerate()
        .map(|(index, line)| (line, COLORS[index % COLORS.len()]))
        .collect();
    let longest_name = lines
        .iter()
        .map(|(line, _)| line.method.chars().count() as u32)
        .max()
        .unwrap_or(0);
    let legend_width = LEGEND_SAMPLE + LEGEND_CHAR_WIDTH * longest_name + 16;

    let size = (PLOT_SIZE.0 + legend_width, PLOT_SIZE.1);
    let root = SVGBackend::with_string(text, size).into_drawing_area();
    root.fill(&WHITE)?;
    let root = root.titled(
        &format!("{} by chunk size", metric.title()),
        ("sans-serif", 22),
    )?;
    let (plot_area, legend_area) = root.split_horizontally(PLOT_SIZE.0);
    let mut chart = ChartBuilder::on(&plot_area)
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(axis, 0.0..top)?;
    let y_label = |value: &f64| match metric {
        Metric::CostIndex => format!("{value:.4}"),
        Metric::CacheHit | Metric::Accuracy => format!("{value:.0}"),
        Metric::NetTokens | Metric::OutputTokens => format!("{value:.0}"),
    };
    chart
        .configure_mesh()
        .max_light_lines(2)
        .x_desc("chunk tokens")
        .y_desc(metric.title())
        .y_label_formatter(&y_label)
        .draw()?;

    for (row, (line, color)) in lines.iter().enumerate() {
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|&(size, value)| (ChunkAxis::position(size), value))
            .collect();
        chart.draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?;
        chart.draw_series(
            points
                .into_iter()
                .map(|point| Circle::new(point, 4, color.filled())),
        )?;
        draw_legend_entry(&legend_area, row, &line.method, *color)?;
    }
    root.present()?;
    Ok(())
}

/// Every chunk size measured, ascending, each once.
fn chunk_sizes(series: &[Series]) -> Vec<usize> {
    let mut sizes: Vec<usize> = series
        .iter()
        .flat_map(|line| line.points.iter().map(|&(size, _)| size.max(1)))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    sizes
}

/// The top of the y axis: 100 for a percentage, else a tenth above the
/// largest value (1 when every value is zero).
fn y_top(metric: Metric, series: &[Series]) -> f64 {
    if matches!(metric, Metric::CacheHit | Metric::Accuracy) {
        return 100.0;
    }
    let max = series
        .iter()
        .flat_map(|line| line.points.iter().map(|&(_, value)| value))
        .fold(0.0, f64::max);
    if max > 0.0 {
        max * 1.1
    } else {
        1.0
    }
}

/// Row `row` of the legend: a sample of the line, then the method's name.
fn draw_legend_entry<DB: DrawingBackend>(
    area: &DrawingArea<DB, plotters::coord::Shift>,
    row: usize,
    method: &str,
    color: RGBColor,
) -> std::result::Result<(), DrawingAreaErrorKind<DB::ErrorType>> {
    let y = 16 + LEGEND_ROW * row as i32;
    let sample = LEGEND_SAMPLE as i32 - 12;
    area.draw(&PathElement::new(
        vec![(0, y), (sample, y)],
        color.stroke_width(2),
    ))?;
    let font = TextStyle::from(("sans-serif", LEGEND_FONT).into_font())
        .pos(Pos::new(HPos::Left, VPos::Center));
    area.draw(&Text::new(
        method.to_string(),
        (LEGEND_SAMPLE as i32, y),
        font,
    ))
}

/// The x axis: chunk sizes on a log₂ scale (sizes usually double, so they
/// come out evenly spaced), labelled at exactly the sizes measured.
struct ChunkAxis {
    range: Range<f64>,
    ticks: Vec<f64>,
}

impl ChunkAxis {
    fn new(sizes: &[usize]) -> Self {
        let ticks: Vec<f64> = sizes.iter().map(|&size| Self::position(size)).collect();
        // Half a step of margin keeps the outermost points off the frame.
        let range = match (ticks.first(), ticks.last()) {
            (Some(first), Some(last)) => first - 0.5..last + 0.5,
            _ => 9.0..11.0,
        };
        ChunkAxis { range, ticks }
    }

    fn position(size: usize) -> f64 {
        (size.max(1) as f64).log2()
    }
}

impl Ranged for ChunkAxis {
    type FormatOption = NoDefaultFormatting;
    type ValueType = f64;

    fn map(&self, value: &f64, limit: (i32, i32)) -> i32 {
        let share = (value - self.range.start) / (self.range.end - self.range.start);
        limit.0 + (share * f64::from(limit.1 - limit.0)).round() as i32
    }

    fn key_points<Hint: KeyPointHint>(&self, _hint: Hint) -> Vec<f64> {
        self.ticks.clone()
    }

    fn range(&self) -> Range<f64> {
        self.range.clone()
    }
}

impl ValueFormatter<f64> for ChunkAxis {
    fn format(position: &f64) -> String {
        format!("{}", position.exp2().round())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The contents of every `<text>` element.
    fn texts(svg: &str) -> Vec<&str> {
        svg.split("<text")
            .skip(1)
            .filter_map(|element| {
                let (_, rest) = element.split_once('>')?;
                Some(rest.split_once("</text>")?.0.trim())
            })
            .collect()
    }

    fn line(method: &str, points: &[(usize, f64)]) -> Series {
        Series {
            method: method.into(),
            points: points.to_vec(),
        }
    }

    #[test]
    fn a_chart_is_svg_naming_every_method_and_chunk_size() {
        let series = [
            line(
                "prism-amendments",
                &[(500, 70.0), (1000, 60.0), (2000, 50.0)],
            ),
            line("prism-in-place <&>", &[(500, 40.0), (2000, 30.0)]),
        ];
        let svg = svg(Metric::CacheHit, &series).unwrap();
        assert!(svg.starts_with("<svg") && svg.trim_end().ends_with("</svg>"));
        let texts = texts(&svg);
        assert!(texts.contains(&"prism-amendments"), "{texts:?}");
        // Text is escaped, so the file stays well-formed XML.
        assert!(texts.contains(&"prism-in-place &lt;&amp;&gt;"), "{texts:?}");
        for tick in ["500", "1000", "2000"] {
            assert!(texts.contains(&tick), "no tick {tick}: {texts:?}");
        }
        assert!(texts.contains(&"Cache hit (%) by chunk size"));
        assert!(texts.contains(&"chunk tokens"));
    }

    #[test]
    fn one_chunk_size_still_draws_points() {
        let series = [line("a", &[(1000, 0.003)]), line("b", &[])];
        let svg = svg(Metric::CostIndex, &series).unwrap();
        assert!(svg.contains("<circle"));
        let texts = texts(&svg);
        assert!(texts.contains(&"a") && texts.contains(&"1000"), "{texts:?}");
        assert!(
            !texts.contains(&"b"),
            "a method without values gets no legend entry"
        );
    }

    /// The `x` attribute of the `<text>` element that reads `content`.
    fn text_x(svg: &str, content: &str) -> Option<f64> {
        svg.split("<text").skip(1).find_map(|element| {
            let (attributes, rest) = element.split_once('>')?;
            if rest.split_once("</text>")?.0.trim() != content {
                return None;
            }
            let (_, after) = attributes.split_once("x=\"")?;
            after.split_once('"')?.0.parse().ok()
        })
    }

    #[test]
    fn the_legend_stands_right_of_every_point() {
        // A point in the top right corner, where a legend inside the plot would sit.
        let series = [
            line(
                "prism-amendments-no-updates-unconstrained",
                &[(500, 0.01), (4000, 0.09)],
            ),
            line("incremental", &[(4000, 0.0867)]),
        ];
        let svg = svg(Metric::CostIndex, &series).unwrap();
        let rightmost_point = svg
            .split("<circle")
            .skip(1)
            .filter_map(|element| {
                element
                    .split_once("cx=\"")?
                    .1
                    .split_once('"')?
                    .0
                    .parse::<f64>()
                    .ok()
            })
            .fold(0.0, f64::max);
        assert!(rightmost_point > 0.0, "{svg}");
        for name in ["prism-amendments-no-updates-unconstrained", "incremental"] {
            let x = text_x(&svg, name).unwrap_or_else(|| panic!("no legend entry {name}"));
            assert!(
                x > f64::from(PLOT_SIZE.0) && x > rightmost_point,
                "{name} at {x}"
            );
        }
    }

    #[test]
    fn no_data_draws_an_empty_chart() {
        let svg = svg(Metric::NetTokens, &[]).unwrap();
        assert!(svg.starts_with("<svg") && !svg.contains("<circle"));
    }
}
