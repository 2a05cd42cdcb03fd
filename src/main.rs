fn main() -> std::process::ExitCode {
    chargeonce::cli::run()
}
