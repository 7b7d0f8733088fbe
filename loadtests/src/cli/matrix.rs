//! `sluice-load matrix`: every row of the deployment's matrix against every target, scenario
//! by scenario, written to `docs/capacity.md` (plus its SVG chart and JSON with every sample).

use std::path::{Component, Path, PathBuf};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use anyhow::{bail, Context, Result};
use clap::Args;
use serde_json::Value;
use sluice_loadtests::measure::measure;
use sluice_loadtests::report::{self, capacity_doc, chart, entry_json, DocInfo, Entry};
use sluice_loadtests::scenario::matrix;

use super::common::{self, parse_duration, ClientArgs, PromptArgs};

/// The deployment watched its mixed traffic this long; `--soak` defaults to it × scale.
const DEPLOYMENT_SOAK: Duration = Duration::from_secs(83 * 60);

#[derive(Args, Debug)]
pub struct MatrixArgs {
    /// The Sluice gateway (e.g. https://localhost:8443 with --ca certs/sluice-dev-ca.pem).
    #[arg(long)]
    pub gateway: Option<String>,
    /// The bundled engine reached directly (e.g. http://127.0.0.1:8000).
    #[arg(long)]
    pub engine: Option<String>,
    /// llama.cpp's llama-server (e.g. http://127.0.0.1:8081).
    #[arg(long)]
    pub llama_server: Option<String>,
    /// Any other target, NAME=URL (vLLM, SGLang, ...); repeatable.
    #[arg(long = "target", value_parser = parse_target)]
    pub targets: Vec<(String, String)>,
    /// Request counts (and the soak) are the deployment's × this; every row sends at least one.
    #[arg(long, default_value_t = 1.0)]
    pub scale: f64,
    /// The soak's duration [default: 83 minutes × scale].
    #[arg(long, value_parser = parse_duration)]
    pub soak: Option<Duration>,
    /// Only these rows (ids as in the document: short-c4, rate-0.20, needle-8k, soak, ...).
    #[arg(long, value_delimiter = ',')]
    pub rows: Vec<String>,
    /// All rows but these.
    #[arg(long, value_delimiter = ',')]
    pub skip: Vec<String>,
    /// Needle depths, 0 (start) to 1 (end).
    #[arg(long, value_delimiter = ',', default_value = "0.1,0.5,0.9")]
    pub depths: Vec<f64>,
    /// The Markdown report; what a person wrote in it (the notes above the matrix, every
    /// section after it) survives a rerun.
    #[arg(long, default_value = "docs/capacity.md")]
    pub out: PathBuf,
    /// The chart [default: --out with .svg].
    #[arg(long)]
    pub svg: Option<PathBuf>,
    /// Every sample as JSON [default: --out with .json].
    #[arg(long)]
    pub json_out: Option<PathBuf>,
    #[command(flatten)]
    pub client: ClientArgs,
    #[command(flatten)]
    pub prompts: PromptArgs,
}

fn parse_target(s: &str) -> Result<(String, String)> {
    match s.split_once('=') {
        Some((name, url)) if !name.is_empty() && !url.is_empty() => {
            Ok((name.to_owned(), url.to_owned()))
        }
        _ => bail!("{s:?}: expected NAME=URL"),
    }
}

/// `to` as seen from the directory `from_dir` (both relative to the same place).
fn relative(from_dir: &Path, to: &Path) -> String {
    let parts = |p: &Path| -> Vec<String> {
        p.components()
            .filter(|c| !matches!(c, Component::CurDir))
            .map(|c| c.as_os_str().to_string_lossy().into_owned())
            .collect()
    };
    let (from, to) = (parts(from_dir), parts(to));
    let common = from.iter().zip(&to).take_while(|(a, b)| a == b).count();
    let mut out: Vec<String> = vec!["..".into(); from.len() - common];
    out.extend(to[common..].iter().cloned());
    out.join("/")
}

/// `YYYY-MM-DD HH:MM` UTC (days-from-civil inverted, after Howard Hinnant).
fn utc(t: SystemTime) -> String {
    let secs = t.duration_since(UNIX_EPOCH).map_or(0, |d| d.as_secs()) as i64;
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!(
        "{year:04}-{month:02}-{day:02} {:02}:{:02}",
        rem / 3600,
        rem % 3600 / 60
    )
}

fn load_average() -> String {
    std::fs::read_to_string("/proc/loadavg")
        .map(|s| s.split_whitespace().take(3).collect::<Vec<_>>().join(" "))
        .unwrap_or_else(|_| "unknown".into())
}

fn machine() -> String {
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown CPU".into());
    let mem_gib = std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("MemTotal:"))
                .and_then(|l| l.split_whitespace().nth(1))
                .and_then(|kb| kb.parse::<f64>().ok())
        })
        .map_or(0.0, |kb| kb / 1024.0 / 1024.0);
    format!("{cores} cores ({cpu}), {mem_gib:.0} GiB")
}

struct Outputs {
    doc: PathBuf,
    svg: PathBuf,
    json: PathBuf,
}

impl Outputs {
    /// Writes all three; called after every row so that an interrupted run keeps its results.
    fn write(&self, info: &DocInfo, entries: &[Entry]) -> Result<()> {
        let previous = std::fs::read_to_string(&self.doc).ok();
        let doc = capacity_doc(info, entries, previous.as_deref());
        let samples: Vec<Value> = entries.iter().map(|e| entry_json(e, true)).collect();
        for (path, text) in [
            (&self.doc, doc),
            (&self.svg, chart(entries)),
            (
                &self.json,
                serde_json::to_string_pretty(&samples).context("JSON")?,
            ),
        ] {
            if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
                std::fs::create_dir_all(dir).with_context(|| dir.display().to_string())?;
            }
            std::fs::write(path, text).with_context(|| path.display().to_string())?;
        }
        Ok(())
    }
}

pub async fn main(args: MatrixArgs) -> Result<bool> {
    let mut named: Vec<(String, String)> = [
        ("gateway", &args.gateway),
        ("engine", &args.engine),
        ("llama-server", &args.llama_server),
    ]
    .into_iter()
    .filter_map(|(n, u)| u.clone().map(|u| (n.to_owned(), u)))
    .collect();
    named.extend(args.targets.iter().cloned());
    if named.is_empty() {
        bail!("no targets: give --gateway, --engine, --llama-server and/or --target NAME=URL");
    }
    if !(args.scale.is_finite() && args.scale > 0.0) {
        bail!("--scale must be positive");
    }
    let soak = args
        .soak
        .unwrap_or_else(|| DEPLOYMENT_SOAK.mul_f64(args.scale));
    let mut rows = matrix(args.scale, soak, &args.depths);
    for id in args.rows.iter().chain(&args.skip) {
        if !rows.iter().any(|r| &r.id == id) {
            bail!("no row {id:?} in the matrix");
        }
    }
    rows.retain(|r| {
        (args.rows.is_empty() || args.rows.contains(&r.id)) && !args.skip.contains(&r.id)
    });

    let (prompts, seed) = common::prompts(&args.prompts)?;
    let mut targets = Vec::new();
    for (name, url) in &named {
        let (target, model) = common::target(url, &args.client).await?;
        eprintln!("sluice-load: {name} = {url}, model {model:?}");
        targets.push((name.clone(), target, common::context(&prompts, model, seed)));
    }
    let outputs = Outputs {
        svg: args
            .svg
            .clone()
            .unwrap_or_else(|| args.out.with_extension("svg")),
        json: args
            .json_out
            .clone()
            .unwrap_or_else(|| args.out.with_extension("json")),
        doc: args.out.clone(),
    };
    let doc_dir = outputs.doc.parent().unwrap_or(Path::new(""));
    let started = SystemTime::now();
    let mut info = DocInfo {
        when: String::new(),
        machine: machine(),
        load_before: load_average(),
        load_after: String::new(),
        scale: args.scale,
        command: std::env::args().collect::<Vec<_>>().join(" "),
        targets: named.clone(),
        svg: Some(relative(doc_dir, &outputs.svg)),
        json: Some(relative(doc_dir, &outputs.json)),
    };
    outln!("{}", report::table_header())?;
    let mut entries = Vec::new();
    for (i, row) in rows.iter().enumerate() {
        for (name, target, ctx) in &targets {
            let entry = measure(row, name, target, ctx, i as u64 * 10_000_000, true).await?;
            outln!("{}  [{name}]", report::table_row(&entry))?;
            entries.push(entry);
        }
        info.when = format!(
            "{} – {} UTC, seed {seed}",
            utc(started),
            &utc(SystemTime::now())[11..]
        );
        info.load_after = load_average();
        outputs.write(&info, &entries)?;
    }
    eprintln!(
        "sluice-load: wrote {}, {}, {}",
        outputs.doc.display(),
        outputs.svg.display(),
        outputs.json.display()
    );
    Ok(entries.iter().any(|e| e.stats.succeeded > 0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_paths_and_dates() {
        assert_eq!(
            relative(Path::new("docs"), Path::new("docs/capacity.svg")),
            "capacity.svg"
        );
        assert_eq!(
            relative(Path::new("docs"), Path::new("loadtests/results/c.svg")),
            "../loadtests/results/c.svg"
        );
        assert_eq!(relative(Path::new(""), Path::new("c.json")), "c.json");
        let t = UNIX_EPOCH + Duration::from_secs(1_796_010_497);
        assert_eq!(utc(t), "2026-11-30 03:48");
        assert_eq!(
            utc(UNIX_EPOCH + Duration::from_secs(951_782_400)),
            "2000-02-29 00:00"
        );
        assert!(parse_target("a=http://x").is_ok() && parse_target("http://x").is_err());
    }
}
