//! The figures as text tables, one column per backend.

use crate::{BackendReport, FanoutPoint, OBELISK_FANOUT, PeerPoint};

fn fanout_cell(p: &FanoutPoint) -> String {
    format!(
        "{:.3}; {:.3}, {:.0}",
        p.submit_seconds, p.seconds, p.per_stage_us
    )
}

/// The report as a table, one column per backend.
pub fn table(reports: &[(&str, &BackendReport)]) -> String {
    let mut rows: Vec<(String, Vec<String>)> = vec![
        ("(1) raw limit, txn/s".into(), vec![]),
        ("(2) stage completions/s (Wasm chain)".into(), vec![]),
        ("    chain runs; their Wasm burn-down, s".into(), vec![]),
        ("    ratio (2)/(1)".into(), vec![]),
        ("    completions per commit".into(), vec![]),
        ("(3) fan-out small: submit s; s, µs/stage".into(), vec![]),
        ("    fan-out large: submit s; s, µs/stage".into(), vec![]),
        ("    growth large/small per stage".into(), vec![]),
        ("    RSS start/peak, small; large, MB".into(), vec![]),
        ("    audit s, peak MB, small; large".into(), vec![]),
        ("    map over as many: submit s; s, µs/stage".into(), vec![]),
        ("    map per stage / large fan-out's".into(), vec![]),
        ("    the same, submissions counted".into(), vec![]),
        ("(4) release latency p50 / p99, ms".into(), vec![]),
        ("(5) native chain, completions/s".into(), vec![]),
        ("    Wasm vs native (time ratio)".into(), vec![]),
        ("    instantiate + call, µs".into(), vec![]),
    ];
    for (_, r) in reports {
        let cells = [
            format!("{:.0}", r.raw_txn_per_s),
            format!("{:.0}", r.stage_completions_per_s),
            format!("{}; {:.1}", r.chain_runs, r.chain_seconds),
            format!("{:.2}", r.ratio),
            format!("{:.1}", r.completions_per_commit),
            fanout_cell(&r.fanout[0]),
            fanout_cell(&r.fanout[1]),
            format!("{:.2}", r.fanout_growth),
            format!(
                "{:.0}/{:.0}; {:.0}/{:.0}",
                r.fanout[0].rss_at_start_mb,
                r.fanout[0].peak_rss_mb,
                r.fanout[1].rss_at_start_mb,
                r.fanout[1].peak_rss_mb
            ),
            format!(
                "{:.3}, {:.0}; {:.3}, {:.0}",
                r.fanout[0].audit_seconds,
                r.fanout[0].audit_peak_rss_mb,
                r.fanout[1].audit_seconds,
                r.fanout[1].audit_peak_rss_mb
            ),
            fanout_cell(&r.map),
            format!("{:.2}", r.map_vs_fanout),
            format!("{:.2}", r.map_vs_fanout_submitted),
            format!(
                "{:.2} / {:.2}",
                r.release_latency_p50_ms, r.release_latency_p99_ms
            ),
            format!("{:.0}", r.native_stage_completions_per_s),
            format!("{:.2}", r.wasm_vs_native),
            format!("{:.1}", r.instantiate_call_us),
        ];
        for (row, cell) in rows.iter_mut().zip(cells) {
            row.1.push(cell);
        }
    }
    let peers: Vec<_> = reports
        .iter()
        .map(|(n, r)| (*n, r.peer.as_slice()))
        .collect();
    rows.extend(peer_rows(&peers));
    let registered = reports.first().map_or(0, |(_, r)| r.submit.registered);
    rows.push((
        format!("(7) submit µs: alone; +{registered} other plugins; +{registered} own versions"),
        reports
            .iter()
            .map(|(_, r)| {
                let s = &r.submit;
                format!(
                    "{:.0}; {:.0}; {:.0}",
                    s.alone_us, s.other_plugins_us, s.own_versions_us
                )
            })
            .collect(),
    ));
    let relay = |cell: fn(&crate::RelayPoint) -> String| {
        reports
            .iter()
            .map(|(_, r)| r.relay.as_ref().map_or("-".into(), cell))
            .collect()
    };
    rows.push((
        "(8) relay to JetStream, events/s; raw publishes/s".into(),
        relay(|p| format!("{:.0}; {:.0}", p.relay_events_per_s, p.raw_publishes_per_s)),
    ));
    rows.push((
        "    ratio relay/raw".into(),
        relay(|p| format!("{:.2}", p.ratio)),
    ));
    rows.push((
        "    CPU of this process per event, µs: relay; raw".into(),
        relay(|p| cpu_pair(p.relay_cpu_us_per_event, p.raw_cpu_us_per_publish)),
    ));
    rows.push((
        "    CPU of the machine per event, µs: relay; raw".into(),
        relay(|p| {
            cpu_pair(
                p.relay_machine_cpu_us_per_event,
                p.raw_machine_cpu_us_per_publish,
            )
        }),
    ));
    rows.push((
        "    commit to ack p50 / p99, ms".into(),
        relay(|p| {
            format!(
                "{:.1} / {:.1}",
                p.commit_to_ack_p50_ms, p.commit_to_ack_p99_ms
            )
        }),
    ));
    render(reports.iter().map(|(name, _)| *name), &rows)
}

/// The relay's and the raw limit's CPU figures, or `-` where there are none.
fn cpu_pair(relay: Option<f64>, raw: Option<f64>) -> String {
    match relay.zip(raw) {
        Some((relay, raw)) => format!("{relay:.1}; {raw:.1}"),
        None => "-".into(),
    }
}

/// Scenario 6 alone, one column per backend.
pub fn peer_table(reports: &[(&str, &[PeerPoint])]) -> String {
    render(reports.iter().map(|(name, _)| *name), &peer_rows(reports))
}

fn peer_rows(reports: &[(&str, &[PeerPoint])]) -> Vec<(String, Vec<String>)> {
    OBELISK_FANOUT
        .iter()
        .enumerate()
        .map(|(i, (stages, obelisk))| {
            let first = if i == 0 { "(6)" } else { "   " };
            let label =
                format!("{first} {stages} stages, median s (runs); x Obelisk's {obelisk} s");
            let cells = reports
                .iter()
                .map(|(_, peer)| match peer.get(i) {
                    Some(p) => format!(
                        "{:.3} ({}); {:.1}",
                        p.median_seconds,
                        p.totals_seconds.len(),
                        p.times_faster
                    ),
                    None => "-".into(),
                })
                .collect();
            (label, cells)
        })
        .collect()
}

/// Rows of cells under one column per name.
fn render<'a>(names: impl Iterator<Item = &'a str>, rows: &[(String, Vec<String>)]) -> String {
    let names: Vec<&str> = names.collect();
    // Each column as wide as its widest cell, two spaces apart: a cell never
    // runs into its neighbour, whatever the figures.
    let label = rows
        .iter()
        .map(|(l, _)| l.chars().count())
        .max()
        .unwrap_or(0);
    let widths: Vec<usize> = names
        .iter()
        .enumerate()
        .map(|(i, name)| {
            rows.iter()
                .map(|(_, cells)| cells.get(i).map_or(0, |c| c.chars().count()))
                .chain([name.chars().count()])
                .max()
                .unwrap_or(0)
                + 2
        })
        .collect();
    let mut out = format!("{:<label$}", "");
    for (name, width) in names.iter().zip(&widths) {
        out.push_str(&format!("{name:>width$}"));
    }
    out.push('\n');
    for (text, cells) in rows {
        out.push_str(&format!("{text:<label$}"));
        for (cell, width) in cells.iter().zip(&widths) {
            out.push_str(&format!("{cell:>width$}"));
        }
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::{SubmitCost, median};

    fn report(scale: f64) -> BackendReport {
        let point = |stages| FanoutPoint {
            stages,
            submit_seconds: 0.001 * scale,
            seconds: 0.1 * scale,
            per_stage_us: 123.0 * scale,
            rss_at_start_mb: 30.0,
            peak_rss_mb: 31.0,
            audit_seconds: 0.01 * scale,
            audit_peak_rss_mb: 32.0,
        };
        BackendReport {
            raw_txn_per_s: 1_000.0 * scale,
            stage_completions_per_s: 900.0 * scale,
            ratio: 0.9,
            chain_runs: 20,
            chain_seconds: 0.1 * scale,
            completions_per_commit: 2.0,
            release_latency_p50_ms: 0.01,
            release_latency_p99_ms: 0.02,
            fanout: vec![point(20), point(200)],
            fanout_growth: 1.0,
            map: point(200),
            map_vs_fanout: 1.0,
            map_vs_fanout_submitted: 1.0,
            native_stage_completions_per_s: 950.0 * scale,
            wasm_vs_native: 1.05,
            instantiate_call_us: 11.0,
            peer: OBELISK_FANOUT
                .iter()
                .map(|&(stages, obelisk_seconds)| PeerPoint {
                    stages,
                    obelisk_seconds,
                    totals_seconds: vec![0.05 * scale],
                    median_seconds: 0.05 * scale,
                    times_faster: obelisk_seconds / (0.05 * scale),
                })
                .collect(),
            submit: SubmitCost {
                registered: 1_000,
                alone_us: 500.0 * scale,
                other_plugins_us: 510.0 * scale,
                own_versions_us: 900.0 * scale,
            },
            relay: None,
        }
    }

    #[test]
    fn the_median_of_an_even_count_is_the_mean_of_the_middle_two() {
        assert_eq!(median(&[1.0, 2.0, 4.0, 8.0]), 3.0);
        assert_eq!(median(&[1.0, 2.0, 4.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
    }

    /// With fixed 18-character columns, a fan-out cell of a slow backend
    /// ("0.100; 10.000, 12300") ran into the next column's.
    #[test]
    fn every_cell_of_the_table_stands_apart_from_its_neighbours() {
        let (slow, fast) = (report(100.0), report(1.0));
        let text = table(&[("postgres", &slow), ("sqlite", &fast)]);
        let fanout = text
            .lines()
            .find(|l| l.starts_with("(3) fan-out small"))
            .expect("fan-out row");
        let cells = [fanout_cell(&slow.fanout[0]), fanout_cell(&fast.fanout[0])];
        // Each cell right-aligned in its column, two spaces at least before
        // it (a wider cell of another row may widen the column).
        let before_last = fanout
            .strip_suffix(cells[1].as_str())
            .unwrap_or_else(|| panic!("the last cell ends the row: {fanout:?}"));
        assert!(before_last.ends_with("  "), "{fanout:?}");
        let before_first = before_last
            .trim_end_matches(' ')
            .strip_suffix(cells[0].as_str())
            .unwrap_or_else(|| panic!("the first cell precedes it: {fanout:?}"));
        assert!(before_first.ends_with("  "), "{fanout:?}");
        for line in text.lines() {
            assert_eq!(line.chars().count(), fanout.chars().count(), "{line:?}");
        }
    }
}
