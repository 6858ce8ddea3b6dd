//! Hostile test plugin: the run's input names what it does with text the
//! host stores or shows. `fatal-nul` and `retryable-nul` fail with NUL bytes
//! and a terminal escape in the message; `long-error` fails with 1 MiB of
//! message; `nul-media-type` and `huge-media-type` (20 MB, over the 1 KiB
//! output limit) break the output contract through the media type;
//! `nul-output-name` returns an undeclared output whose name holds a NUL;
//! `nul-log` logs such a line and succeeds.
use ratchet_plugin_sdk::{Context, Error, Inputs, Level, Outputs, Stage, export_stage};

struct HostileText;

const NASTY: &str = "bad\0text\u{1b}[31mred\u{1b}[0m\r\n\u{7}";

impl Stage for HostileText {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(ctx: &Context, inputs: &Inputs) -> Result<Outputs, Error> {
        let ok = || Outputs::new().text("out", "fine");
        match inputs.text("mode")? {
            "fatal-nul" => Err(Error::fatal(NASTY)),
            "retryable-nul" => Err(Error::retryable(NASTY)),
            "long-error" => Err(Error::fatal("x".repeat(1 << 20))),
            "nul-media-type" => Ok(Outputs::new().bytes("out", NASTY, b"fine".to_vec())),
            "huge-media-type" => {
                Ok(Outputs::new().bytes("out", &"a".repeat(20_000_000), b"fine".to_vec()))
            }
            "nul-output-name" => Ok(ok().text(NASTY, "fine")),
            "nul-log" => {
                ctx.log(Level::Warn, NASTY);
                Ok(ok())
            }
            other => Err(Error::fatal(format!("unknown mode `{other}`"))),
        }
    }
}

export_stage!(HostileText);
