/// jemalloc gives memory back to the system soon after it is freed (see
/// .cargo/config.toml for its settings): after 18,000 slow connections the
/// glibc allocator kept 250 MB resident for good (BENCHMARKS.md, "jemalloc").
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    chargeonce::cli::run()
}
