//! Hostile test plugin: reports what each escape attempt got; the host must
//! have refused every one.
use ratchet_plugin_sdk::{Context, Error, Inputs, Outputs, Stage, export_stage};

struct EscapeArtist;

impl Stage for EscapeArtist {
    const MANIFEST: &'static str = include_str!("../plugin.toml");

    fn run(_ctx: &Context, _inputs: &Inputs) -> Result<Outputs, Error> {
        let report = serde_json::json!({
            "read_file": std::fs::read("/etc/passwd").map(|b| b.len()).map_err(|e| e.to_string()),
            "list_dir": std::fs::read_dir("/").map(|d| d.count()).map_err(|e| e.to_string()),
            "write_file": std::fs::write("/tmp/escaped", b"x").map_err(|e| e.to_string()),
            "env": std::env::vars().count(),
            "tcp": std::net::TcpStream::connect("127.0.0.1:5432").map(|_| ()).map_err(|e| e.to_string()),
        });
        Outputs::new().json("report", &report)
    }
}

export_stage!(EscapeArtist);
