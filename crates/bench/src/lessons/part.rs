//! `lessons` under `gpukit all`.

use super::{run_lessons, LessonsOptions, LESSONS};
use crate::error::Result;
use crate::part::{Context, Outcome, Part};

/// `lessons` under `gpukit all`: every lesson but lesson 0 (which needs a process that has not
/// opened the GPU), without PyTorch, fewer samples under `--quick`. A lesson that fails is
/// listed as skipped with its reason.
pub struct LessonsPart;

/// The lessons part of `gpukit all`.
pub static PART: LessonsPart = LessonsPart;

impl Part for LessonsPart {
    fn key(&self) -> &'static str {
        "lessons"
    }
    fn command(&self) -> &'static str {
        "lessons"
    }
    fn title(&self) -> &'static str {
        "Lessons"
    }
    fn run(&self, ctx: &Context<'_>, progress: &mut dyn FnMut(&str)) -> Result<Outcome> {
        let o = LessonsOptions {
            lessons: LESSONS[1..].iter().map(|l| l.to_string()).collect(),
            device: Some(ctx.device()),
            compare_pytorch: false,
            samples: if ctx.quick { 5 } else { 10 },
            min_sample_ms: if ctx.quick { 1.0 } else { 2.0 },
        };
        Ok(match run_lessons(ctx.discovery, &o, progress) {
            Ok(r) => {
                let mut out = Outcome::report(&r);
                for l in r.lessons.iter().filter(|l| l.failed) {
                    out = out.with_skipped(&format!("lessons {}", l.id), l.reason.clone());
                }
                out
            }
            Err(e) => Outcome::skipped("lessons", e.to_string()),
        })
    }
}
