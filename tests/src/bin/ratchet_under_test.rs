//! The `ratchet` CLI, built inside the test crate so tests can spawn it.
fn main() -> std::process::ExitCode {
    ratchet_cli::main()
}
