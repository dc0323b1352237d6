//! `gpukit stress`'s arguments and their parsers.

use clap::Args;

#[derive(Debug, Args)]
#[command(allow_negative_numbers = true)]
pub struct StressArgs {
    /// 1 (about 30 s), 2 (about 3 min: long enough to reach and hold the power cap) or 3 (about
    /// 15 min). Each GPU's time goes 40% to bf16 matmul, 15% to fp8 (E4M3) matmul (to bf16 on
    /// a GPU below compute capability 8.9, which has no fp8), 20% to tf32 matmul, 18% to memory
    /// patterns, 5% to pinned copies, the rest to setup.
    #[arg(long, default_value = "1", value_name = "1|2|3", value_parser = parse_level)]
    pub level: u8,

    /// Seconds per GPU, all tests together, in place of the level's time (split the same way).
    #[arg(long, value_name = "S", value_parser = parse_duration)]
    pub duration: Option<f64>,

    /// GPUs to test, by CUDA ordinal (0,1 or cuda:0,cuda:1) [default: every GPU].
    #[arg(long, value_name = "N,N,...", value_delimiter = ',', value_parser = parse_gpu)]
    pub gpus: Option<Vec<usize>>,
}

fn parse_level(s: &str) -> Result<u8, String> {
    match s.trim() {
        "1" => Ok(1),
        "2" => Ok(2),
        "3" => Ok(3),
        _ => Err("the levels are 1 (about 30 s), 2 (about 3 min) and 3 (about 15 min)".into()),
    }
}

fn parse_duration(s: &str) -> Result<f64, String> {
    match s.trim().trim_end_matches('s').parse::<f64>() {
        Ok(d) if (1.0..=604_800.0).contains(&d) => Ok(d),
        Ok(_) => Err("give a number of seconds from 1 to 604800 (a week)".into()),
        Err(_) => Err("not a number of seconds (e.g. 90)".into()),
    }
}

fn parse_gpu(s: &str) -> Result<usize, String> {
    let t = s.trim();
    t.strip_prefix("cuda:")
        .unwrap_or(t)
        .parse::<usize>()
        .map_err(|_| format!("{t:?} is not a GPU (a CUDA ordinal: 0, 1, ... or cuda:0)"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels_durations_and_gpus_parse_strictly() {
        assert_eq!(parse_level("2"), Ok(2));
        for bad in ["0", "4", "x", ""] {
            assert!(parse_level(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_duration("90"), Ok(90.0));
        assert_eq!(parse_duration("90s"), Ok(90.0));
        for bad in ["0", "-5", "nan", "inf", "1e9", "soon"] {
            assert!(parse_duration(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_gpu("cuda:3"), Ok(3));
        assert_eq!(parse_gpu(" 1 "), Ok(1));
        assert!(parse_gpu("-1").is_err() && parse_gpu("gpu0").is_err());
    }
}
