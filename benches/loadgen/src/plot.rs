//! One kind of SVG chart (plotters): lines with points, one series per
//! system, either axis optionally logarithmic. Log axes plot log10 of the
//! values on a linear axis and label the ticks with the values, which keeps
//! one coordinate type for every chart.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

pub struct Chart<'a> {
    pub title: String,
    pub x_label: &'a str,
    pub y_label: &'a str,
    pub log_x: bool,
    pub log_y: bool,
}

pub type Series = (String, Vec<(f64, f64)>);

pub fn draw(path: &Path, chart: &Chart, series: &[Series]) -> anyhow::Result<()> {
    let scale = |v: f64, log: bool| if log { v.max(1e-3).log10() } else { v };
    let points: Vec<(String, Vec<(f64, f64)>)> = series
        .iter()
        .map(|(name, values)| {
            let mapped = values
                .iter()
                .filter(|(x, y)| x.is_finite() && y.is_finite())
                .map(|&(x, y)| (scale(x, chart.log_x), scale(y, chart.log_y)))
                .collect();
            (name.clone(), mapped)
        })
        .collect();
    let all = points.iter().flat_map(|(_, p)| p.iter().copied());
    let (mut x0, mut x1, mut y0, mut y1) = (f64::MAX, f64::MIN, f64::MAX, f64::MIN);
    for (x, y) in all {
        (x0, x1, y0, y1) = (x0.min(x), x1.max(x), y0.min(y), y1.max(y));
    }
    if x0 > x1 {
        (x0, x1, y0, y1) = (0.0, 1.0, 0.0, 1.0);
    }
    let pad_x = ((x1 - x0) * 0.05).max(0.05);
    let pad_y = ((y1 - y0) * 0.08).max(0.05);
    let y_start = if chart.log_y {
        y0 - pad_y
    } else {
        0.0f64.min(y0)
    };
    let root = SVGBackend::new(path, (720, 440)).into_drawing_area();
    root.fill(&WHITE).map_err(|e| anyhow!("{e}"))?;
    let mut ctx = ChartBuilder::on(&root)
        .caption(chart.title.as_str(), ("sans-serif", 20))
        .margin(12)
        .x_label_area_size(40)
        .y_label_area_size(64)
        .build_cartesian_2d((x0 - pad_x)..(x1 + pad_x), y_start..(y1 + pad_y))
        .map_err(|e| anyhow!("{e}"))?;
    let label = |v: f64, log: bool| {
        let v = if log { 10f64.powf(v) } else { v };
        if v.abs() >= 100.0 {
            format!("{v:.0}")
        } else if v.abs() >= 1.0 {
            format!("{v:.1}")
        } else {
            format!("{v:.2}")
        }
    };
    ctx.configure_mesh()
        .x_desc(chart.x_label)
        .y_desc(chart.y_label)
        .x_label_formatter(&|v| label(*v, chart.log_x))
        .y_label_formatter(&|v| label(*v, chart.log_y))
        .light_line_style(WHITE.mix(0.0))
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    for (i, (name, values)) in points.iter().enumerate() {
        let color = Palette99::pick(i).to_rgba();
        ctx.draw_series(LineSeries::new(
            values.iter().copied(),
            color.stroke_width(2),
        ))
        .map_err(|e| anyhow!("{e}"))?
        .label(name.as_str())
        .legend(move |(x, y)| PathElement::new(vec![(x, y), (x + 18, y)], color.stroke_width(2)));
        ctx.draw_series(values.iter().map(|&p| Circle::new(p, 3, color.filled())))
            .map_err(|e| anyhow!("{e}"))?;
    }
    ctx.configure_series_labels()
        .background_style(WHITE.mix(0.85))
        .border_style(BLACK)
        .position(SeriesLabelPosition::UpperLeft)
        .draw()
        .map_err(|e| anyhow!("{e}"))?;
    root.present().map_err(|e| anyhow!("{e}"))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_chart_names_its_series_and_survives_empty_and_log_input() {
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("c.svg");
        let chart = Chart {
            title: "t".into(),
            x_label: "x",
            y_label: "y",
            log_x: true,
            log_y: true,
        };
        let series = vec![
            ("alpha".to_owned(), vec![(1.0, 10.0), (2.0, 1000.0)]),
            ("beta".to_owned(), vec![]),
        ];
        draw(&path, &chart, &series).expect("draws");
        let svg = std::fs::read_to_string(&path).expect("written");
        assert!(svg.starts_with("<svg") && svg.contains("alpha") && svg.contains("beta"));
        draw(&path, &chart, &[]).expect("draws an empty chart");
    }
}
