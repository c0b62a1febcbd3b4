//! What `idem probe` found: a verdict per probe with its evidence, one per tool, and the report
//! as a table a person reads or JSON a CI job consumes (its shape is in the guide).

use serde::Serialize;

/// What a probe concluded.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    /// The behaviour the hint promises was seen.
    Holds,
    /// The behaviour contradicts the hint.
    False,
    /// Nothing could be concluded (the reason is in the evidence).
    CannotTell,
}

impl Verdict {
    fn word(self) -> &'static str {
        match self {
            Self::Holds => "holds",
            Self::False => "FALSE",
            Self::CannotTell => "cannot tell",
        }
    }
}

/// One probe's finding.
#[derive(Debug, Serialize)]
pub struct Finding {
    /// `sequential_repeat`, `concurrent_repeat`, `repeat_after_lost_answer`, `different_arguments`.
    pub probe: &'static str,
    pub verdict: Verdict,
    /// What was seen, in words.
    pub evidence: String,
}

/// One tool's findings and overall verdict.
#[derive(Debug, Serialize)]
pub struct ToolReport {
    pub tool: String,
    /// Whether its annotations claim `idempotentHint: true`.
    pub hint_claimed: bool,
    /// The idem recipe it advertises (`_meta["dev.idem/recipe"]`), if any.
    pub recipe: Option<serde_json::Value>,
    pub findings: Vec<Finding>,
    /// `holds` (no probe contradicted the hint and the repeats were seen to be safe), `false`
    /// (a probe contradicted it) or `cannot_tell`.
    pub verdict: Verdict,
}

impl ToolReport {
    /// The overall verdict from the findings: false if any is; holds if the sequential and the
    /// concurrent repeat hold and nothing is false; otherwise cannot tell.
    pub fn conclude(&mut self) {
        let of = |probe: &str| self.findings.iter().find(|f| f.probe == probe).map(|f| f.verdict);
        self.verdict = if self.findings.iter().any(|f| f.verdict == Verdict::False) {
            Verdict::False
        } else if of("sequential_repeat") == Some(Verdict::Holds) && of("concurrent_repeat") == Some(Verdict::Holds) {
            Verdict::Holds
        } else {
            Verdict::CannotTell
        };
    }
}

/// The whole report.
#[derive(Debug, Serialize)]
pub struct Report {
    /// The server probed.
    pub server: String,
    /// The effect oracle, if one was given.
    pub oracle: Option<String>,
    pub tools: Vec<ToolReport>,
    /// Tools that claim the hint (or were named) and were not probed, and why.
    pub skipped: Vec<Skipped>,
}

/// A tool not probed.
#[derive(Debug, Serialize)]
pub struct Skipped {
    pub tool: String,
    pub why: String,
}

impl Report {
    /// Whether any tool's hint was found false (the exit code says so).
    pub fn any_false(&self) -> bool {
        self.tools.iter().any(|tool| tool.verdict == Verdict::False)
    }

    /// The report for a person.
    pub fn text(&self) -> String {
        let mut out = format!("idem probe — {}\n", self.server);
        out.push_str(&match &self.oracle {
            Some(oracle) => format!("effect oracle: {oracle}\n"),
            None => "effect oracle: none (give --count-with TOOL or --count-cmd CMD to count effects)\n".to_owned(),
        });
        for tool in &self.tools {
            let recipe = tool.recipe.as_ref().map_or_else(|| "none".to_owned(), ToString::to_string);
            out.push_str(&format!(
                "\n{}  hint claimed: {}  recipe: {}\n",
                tool.tool,
                if tool.hint_claimed { "idempotentHint" } else { "no" },
                recipe
            ));
            let mut table = comfy_table::Table::new();
            table.load_preset(comfy_table::presets::UTF8_FULL_CONDENSED);
            table.set_content_arrangement(comfy_table::ContentArrangement::Dynamic).set_width(110);
            table.set_header(["probe", "verdict", "evidence"]);
            for finding in &tool.findings {
                table.add_row([finding.probe, finding.verdict.word(), finding.evidence.as_str()]);
            }
            out.push_str(&format!("{table}\n"));
            out.push_str(&format!("→ {}: hint {}\n", tool.tool, tool.verdict.word()));
        }
        for Skipped { tool, why } in &self.skipped {
            out.push_str(&format!("\nnot probed: {tool} ({why})"));
        }
        if !self.skipped.is_empty() {
            out.push('\n');
        }
        out
    }
}
