fn main() -> std::process::ExitCode {
    ratchet_runtime::cli::main()
}
