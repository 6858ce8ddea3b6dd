//! `brief`: a contract 0.2.0 stage. It puts today's date, a random angle
//! and a random ticket number into a chat with a system prompt, and asks for
//! a structured answer (a serde type with its JSON Schema). The date and the
//! pick come from the replayed clock and generator, so a retry asks the same question and is
//! handed the journaled answer; attempt 1 fails after its model call when
//! the topic says `fail once`.
use ratchet_plugin_sdk::{Chat, Context, Error, Inputs, Outputs, Stage, export_stage};
use serde::{Deserialize, Serialize};

/// What the model must answer.
#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(deny_unknown_fields)]
pub struct Answer {
    pub headline: String,
    /// 1 (dull) to 5 (thrilling).
    #[schemars(range(min = 1, max = 5))]
    pub excitement: u8,
    pub points: Vec<String>,
    pub tone: Tone,
    pub source: Option<String>,
}

#[derive(Debug, Serialize, Deserialize, schemars::JsonSchema)]
#[serde(rename_all = "lowercase")]
pub enum Tone {
    Calm,
    Bold,
}

/// The brief as proposed: the answer, and what the stage asked with.
#[derive(Serialize)]
struct Brief<'a> {
    date: &'a str,
    angle: &'a str,
    ticket: u64,
    answer: Answer,
}

const ANGLES: [&str; 4] = ["speed", "safety", "cost", "people"];

struct BriefStage;

impl Stage for BriefStage {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let topic = inputs.text("topic")?.trim().to_string();
        let date = date(ctx.now());
        let pick = ctx.random_u64();
        let angle = ANGLES[(pick % ANGLES.len() as u64) as usize];
        let ticket = pick / ANGLES.len() as u64 % 100_000;
        let chat = Chat::new()
            .system("You write briefs for engineers. Answer in the JSON shape asked.")
            .user(format!(
                "Today is {date}. Brief us on {topic}, from the angle of {angle} (ticket {ticket})."
            ))
            .temperature(0.7)
            .max_tokens(400);
        let answer: Answer = ctx.structured(&chat)?;
        ctx.info(&format!(
            "attempt {} briefed on {topic} ({date}, {angle})",
            ctx.attempt()
        ));
        if ctx.attempt() == 1 && topic.contains("fail once") {
            return Err(Error::retryable("failing after the model call"));
        }
        let brief = Brief {
            date: &date,
            angle,
            ticket,
            answer,
        };
        Outputs::new().json("brief", &brief)
    }
}

/// `YYYY-MM-DD` (UTC) of a time after the Unix epoch.
fn date(now: std::time::SystemTime) -> String {
    let secs = now
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs());
    // Civil date from days since 1970-01-01 (Howard Hinnant's algorithm).
    let z = (secs / 86_400) as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z - era * 146_097;
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    format!("{year:04}-{month:02}-{day:02}")
}

export_stage!(BriefStage);
