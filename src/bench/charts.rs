//! SVG line charts of a sweep: one metric against chunk size, one line per
//! method, drawn with plotters' SVG backend (text stays `<text>` elements, so
//! no font files are needed to draw or to view them).

use super::sweep::{Metric, Series};
use crate::error::{Error, Result};
use plotters::coord::ranged1d::{KeyPointHint, NoDefaultFormatting, Ranged, ValueFormatter};
use plotters::prelude::*;
use std::ops::Range;

const SIZE: (u32, u32) = (800, 500);

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
    let mut sizes: Vec<usize> = series
        .iter()
        .flat_map(|line| line.points.iter().map(|&(size, _)| size.max(1)))
        .collect();
    sizes.sort_unstable();
    sizes.dedup();
    let axis = ChunkAxis::new(&sizes);
    let top = match metric {
        Metric::CacheHit => 100.0,
        _ => {
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
    };

    let root = SVGBackend::with_string(text, SIZE).into_drawing_area();
    root.fill(&WHITE)?;
    let mut chart = ChartBuilder::on(&root)
        .caption(
            format!("{} by chunk size", metric.title()),
            ("sans-serif", 22),
        )
        .margin(16)
        .x_label_area_size(44)
        .y_label_area_size(72)
        .build_cartesian_2d(axis, 0.0..top)?;
    let y_label = |value: &f64| match metric {
        Metric::CostIndex => format!("{value:.4}"),
        Metric::CacheHit => format!("{value:.0}"),
        Metric::NetTokens | Metric::OutputTokens => format!("{value:.0}"),
    };
    chart
        .configure_mesh()
        .max_light_lines(2)
        .x_desc("chunk tokens")
        .y_desc(metric.title())
        .y_label_formatter(&y_label)
        .draw()?;

    for (index, line) in series
        .iter()
        .filter(|line| !line.points.is_empty())
        .enumerate()
    {
        let color = COLORS[index % COLORS.len()];
        let points: Vec<(f64, f64)> = line
            .points
            .iter()
            .map(|&(size, value)| (ChunkAxis::position(size), value))
            .collect();
        chart
            .draw_series(LineSeries::new(points.clone(), color.stroke_width(2)))?
            // plotters sizes the legend box by a font-less width estimate
            // that comes out short; two trailing spaces, which SVG viewers
            // drop, widen the box to fit.
            .label(format!("{}  ", line.method))
            .legend(move |(x, y)| {
                PathElement::new(vec![(x, y), (x + 20, y)], color.stroke_width(2))
            });
        chart.draw_series(
            points
                .into_iter()
                .map(|point| Circle::new(point, 4, color.filled())),
        )?;
    }
    chart
        .configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperRight)
        .draw()?;
    root.present()?;
    Ok(())
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

    #[test]
    fn no_data_draws_an_empty_chart() {
        let svg = svg(Metric::NetTokens, &[]).unwrap();
        assert!(svg.starts_with("<svg") && !svg.contains("<circle"));
    }
}
