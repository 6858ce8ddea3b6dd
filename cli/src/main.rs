fn main() -> std::process::ExitCode {
    ratchet_cli::main()
}
