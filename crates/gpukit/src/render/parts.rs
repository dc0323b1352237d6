//! How report.md and report.html draw each part of `gpukit all`: the part's lead line, its
//! sections (the same its command prints), its charts and its headline cards. One [`View`] per
//! part, found by the part's key; `all`'s pages walk the parts in their order and draw each
//! one that has a report.

use super::html::{self, Chart};
use super::{self as render, Section};
use gpukit_bench::all::AllReport;
use gpukit_bench::bandwidth::BandwidthReport;
use gpukit_bench::check::CheckReport;
use gpukit_bench::conv::ConvReport;
use gpukit_bench::infer::InferReport;
use gpukit_bench::lessons::LessonsReport;
use gpukit_bench::matmul::MatmulReport;
use gpukit_bench::memory::MemoryReport;
use gpukit_bench::nccl::NcclReport;
use gpukit_bench::p2p::P2pReport;
use gpukit_bench::workload::profile::ProfileReport;
use gpukit_bench::workload::train::TrainReport;
use serde::de::DeserializeOwned;

/// One part as `all`'s pages draw it.
pub trait Draw: Sync {
    /// The part's key (its report's key in report.json).
    fn key(&self) -> &'static str;
    /// Everything drawn for the part, None when the report has none of it (or one this version
    /// cannot read).
    fn drawn(&self, report: &AllReport) -> Option<Drawn>;
}

/// What one part contributes to the pages.
pub struct Drawn {
    /// A line above its sections.
    pub lead: Option<String>,
    pub sections: Vec<Section>,
    /// report.html only.
    pub charts: Vec<Chart>,
    /// report.html's headline cards: `(what, figure, detail)`.
    pub cards: Vec<(String, String, String)>,
}

/// The drawing functions of a part whose report is a `T`.
pub struct View<T: 'static> {
    pub key: &'static str,
    pub lead: fn(&T) -> Option<String>,
    pub sections: fn(&T) -> Vec<Section>,
    pub charts: fn(&T) -> Vec<Chart>,
    pub cards: fn(&T) -> Vec<(String, String, String)>,
}

impl<T: 'static> View<T> {
    /// A view that draws `sections` alone.
    pub const fn sections(key: &'static str, sections: fn(&T) -> Vec<Section>) -> View<T> {
        View {
            key,
            lead: |_| None,
            sections,
            charts: |_| Vec::new(),
            cards: |_| Vec::new(),
        }
    }
}

impl<T: DeserializeOwned + 'static> Draw for View<T> {
    fn key(&self) -> &'static str {
        self.key
    }
    fn drawn(&self, report: &AllReport) -> Option<Drawn> {
        if !report.has(self.key) {
            return None;
        }
        let r: T = report.part(self.key)?;
        Some(Drawn {
            lead: (self.lead)(&r),
            sections: (self.sections)(&r),
            charts: (self.charts)(&r),
            cards: (self.cards)(&r),
        })
    }
}

/// Sections of every report of a list (training runs, profiles).
fn each<T>(items: &[T], f: fn(&T) -> Vec<Section>) -> Vec<Section> {
    items.iter().flat_map(f).collect()
}

static CHECK: View<CheckReport> = View {
    key: "check",
    lead: |r| Some(render::check_headline(r)),
    sections: render::check_sections,
    charts: |_| Vec::new(),
    cards: |_| Vec::new(),
};
static MATMUL: View<MatmulReport> = View {
    key: "matmul",
    lead: |_| None,
    sections: render::matmul_sections,
    charts: html::matmul_charts,
    cards: html::matmul_cards,
};
static BANDWIDTH: View<BandwidthReport> = View {
    key: "bandwidth",
    lead: |_| None,
    sections: render::bandwidth_sections,
    charts: |r| html::bandwidth_chart(r).into_iter().collect(),
    cards: html::bandwidth_cards,
};
static CONV: View<ConvReport> = View {
    key: "conv",
    lead: |_| None,
    sections: render::conv_sections,
    charts: |r| html::conv_chart(r).into_iter().collect(),
    cards: |_| Vec::new(),
};
static INFER: View<InferReport> = View {
    key: "infer",
    lead: |_| None,
    sections: render::infer_sections,
    charts: |r| html::infer_chart(r).into_iter().collect(),
    cards: html::infer_cards,
};
static MEMORY: View<MemoryReport> = View {
    key: "memory",
    lead: |_| None,
    sections: render::memory_sections,
    charts: |r| html::memory_chart(r).into_iter().collect(),
    cards: html::memory_cards,
};
static TRAIN: View<Vec<TrainReport>> = View {
    key: "train",
    lead: |_| None,
    sections: |r| each(r, render::train_sections),
    charts: |r| html::train_chart(r).into_iter().collect(),
    cards: |_| Vec::new(),
};
static PROFILE: View<Vec<ProfileReport>> =
    View::sections("profile", |r| each(r, render::profile_sections));
static LESSONS: View<LessonsReport> = View::sections("lessons", render::lessons_sections);
static NCCL: View<NcclReport> = View::sections("nccl", render::nccl_sections);
static P2P: View<P2pReport> = View::sections("p2p", render::p2p_sections);

/// Every part's view.
pub fn views() -> [&'static dyn Draw; 11] {
    [
        &CHECK, &MATMUL, &BANDWIDTH, &CONV, &INFER, &MEMORY, &TRAIN, &PROFILE, &LESSONS, &NCCL,
        &P2P,
    ]
}

/// Each part of `all` that has a report, in the order the parts run: its key, its heading and
/// what is drawn for it.
pub fn drawn_parts(report: &AllReport) -> Vec<(&'static str, &'static str, Drawn)> {
    let views = views();
    gpukit_bench::parts()
        .into_iter()
        .filter_map(|p| {
            let view = views.iter().find(|v| v.key() == p.key())?;
            Some((p.key(), p.title(), view.drawn(report)?))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_part_has_one_view_and_every_view_a_part() {
        let views = views();
        let parts = gpukit_bench::parts();
        for p in &parts {
            assert_eq!(
                views.iter().filter(|v| v.key() == p.key()).count(),
                1,
                "{}",
                p.key()
            );
        }
        for v in views {
            assert!(parts.iter().any(|p| p.key() == v.key()), "{}", v.key());
        }
    }
}
