//! The command line: `serve`, `migrate`, `merchant create NAME`, `psp-sim`.
//! Exit codes: 0 success, 1 a runtime failure, 2 bad usage or configuration.

use std::process::ExitCode;

use clap::{Parser, Subcommand};

use crate::config::Settings;
use crate::processor::simulator::{self, SimulatorOptions};
use crate::startup::Application;
use crate::telemetry::error_chain;
use crate::{db, telemetry};

#[derive(Debug, Parser)]
#[command(
    name = "chargeonce",
    version,
    about = "Idempotent payment charges on PostgreSQL"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    #[command(flatten)]
    Service(ServiceCommand),
    /// Run the payment processor simulator (docs/processor-protocol.md), with
    /// fault injection, for tests, benchmarks and local stacks.
    PspSim(SimulatorOptions),
}

/// The commands that run on chargeonce's configuration.
#[derive(Debug, Subcommand)]
enum ServiceCommand {
    /// Run the HTTP service (applies migrations first unless
    /// database.migrate_on_start is false).
    Serve,
    /// Apply pending database migrations and exit.
    Migrate,
    /// Manage merchants.
    Merchant {
        #[command(subcommand)]
        command: MerchantCommand,
    },
}

#[derive(Debug, Subcommand)]
enum MerchantCommand {
    /// Create a merchant; prints its secret API key, and only that, on stdout.
    Create { name: String },
}

pub fn run() -> ExitCode {
    match Cli::parse().command {
        // The simulator is not chargeonce: it needs none of its configuration.
        Command::PspSim(options) => {
            if let Err(message) = options.validate() {
                eprintln!("chargeonce psp-sim: {message}");
                return ExitCode::from(2);
            }
            let _logs = telemetry::init(crate::config::LogFormat::Text);
            block_on(async {
                simulator::run(options)
                    .await
                    .map_err(|e| format!("psp-sim: {e}"))
            })
        }
        Command::Service(command) => {
            let settings = match Settings::load() {
                Ok(settings) => settings,
                Err(error) => {
                    eprintln!("chargeonce: {error}");
                    return ExitCode::from(2);
                }
            };
            let _logs = telemetry::init(settings.log.format);
            block_on(async {
                match command {
                    ServiceCommand::Serve => serve(&settings).await,
                    ServiceCommand::Migrate => migrate(&settings).await,
                    ServiceCommand::Merchant {
                        command: MerchantCommand::Create { name },
                    } => create_merchant(&settings, &name).await,
                }
            })
        }
    }
}

/// Runs `work` on a multi-threaded runtime and maps its result to an exit code.
fn block_on(work: impl std::future::Future<Output = Result<(), String>>) -> ExitCode {
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("chargeonce: cannot start the async runtime: {error}");
            return ExitCode::FAILURE;
        }
    };
    match runtime.block_on(work) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            tracing::error!("{message}");
            eprintln!("chargeonce: {message}");
            ExitCode::FAILURE
        }
    }
}

async fn serve(settings: &Settings) -> Result<(), String> {
    let app = Application::build(settings)
        .await
        .map_err(|e| error_chain(&e))?;
    app.run_until_stopped().await.map_err(|e| e.to_string())?;
    tracing::info!("stopped");
    Ok(())
}

async fn migrate(settings: &Settings) -> Result<(), String> {
    let applied = db::migrate(&settings.database)
        .await
        .map_err(|e| error_chain(&e))?;
    eprintln!(
        "applied {applied} migration(s); schema at version {}",
        db::latest_migration()
    );
    Ok(())
}

async fn create_merchant(settings: &Settings, name: &str) -> Result<(), String> {
    if name.trim().is_empty() || name.chars().count() > 200 {
        return Err("the merchant name must be 1 to 200 characters".to_owned());
    }
    if settings.database.migrate_on_start {
        db::migrate(&settings.database)
            .await
            .map_err(|e| error_chain(&e))?;
    }
    let database = db::Database::new(&settings.database, 1).map_err(|e| e.to_string())?;
    let conn = database
        .conn()
        .await
        .map_err(|e| format!("cannot connect to PostgreSQL: {}", error_chain(&e)))?;
    let (id, key) = db::merchants::create(&conn, name)
        .await
        .map_err(|e| format!("cannot create the merchant: {}", error_chain(&e)))?;
    eprintln!("created merchant {id} ({name})");
    println!("{}", key.expose_secret());
    Ok(())
}
