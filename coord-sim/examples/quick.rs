//! scratch
fn main() {
    use coord_sim::chaos::*;
    if std::env::var("TRACE").is_ok() {
        struct T;
        impl tracing_subscriber::fmt::time::FormatTime for T {
            fn format_time(
                &self,
                w: &mut tracing_subscriber::fmt::format::Writer<'_>,
            ) -> std::fmt::Result {
                write!(w, "{:?}", tokio::time::Instant::now())
            }
        }
        tracing_subscriber::fmt()
            .with_timer(T)
            .with_env_filter(std::env::var("TRACE").unwrap())
            .init();
    }
    let scenario = Scenario::default();
    if let Ok(b) = std::env::var("BUG") {
        coord_api::planted::enable(&[coord_api::planted::Bug::from_name(&b).unwrap()]);
    }
    let n = std::env::args()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(3u64);
    let first = std::env::var("SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(0u64);
    for seed in first..first + n {
        let t = std::time::Instant::now();
        let faults = schedule(&scenario, &mut Rng::new(seed));
        #[cfg(feature = "turmoil")]
        let h = if std::env::var("TURMOIL").is_ok() {
            simulate_turmoil(&scenario, seed, &faults)
        } else {
            simulate(&scenario, seed, &faults)
        };
        #[cfg(not(feature = "turmoil"))]
        let h = simulate(&scenario, seed, &faults);
        let v = check(&scenario, &h);
        if let Ok(d) = std::env::var("DUMP") {
            let parts: Vec<f64> = d.split(',').map(|x| x.parse().unwrap()).collect();
            if parts[0] as u64 == seed {
                for r in &h.records {
                    let t = r.at.as_secs_f64();
                    if t >= parts[1] && t <= parts[2] {
                        let line = format!("{:?}", r.what);
                        if std::env::var("NOSTORE").is_ok() && line.starts_with("Store(Renew") {
                            continue;
                        }
                        println!("{t:9.3} {}", &line[..line.len().min(300)]);
                    }
                }
            }
        }
        println!(
            "seed {seed}: {} faults, {} records, {} violations, {:?}",
            faults.len(),
            h.records.len(),
            v.len(),
            t.elapsed()
        );
        for x in v.iter().take(8) {
            println!("  {x}");
        }
    }
}
#[allow(dead_code)]
fn dump() {}
