//! `cfp`: one binary for the operator, the workers, the estimator and the local emulator.

use std::process::ExitCode;

use changefeed_operator::cli::{self, Command};
use changefeed_operator::traces::TraceExport;

fn main() -> ExitCode {
    // SDK error values capture a stack backtrace whenever RUST_BACKTRACE is set, and a processor
    // creates them as control flow (empty polls, lease preconditions). Keep library backtraces off
    // unless asked for explicitly; panics still honour RUST_BACKTRACE.
    if std::env::var_os("RUST_LIB_BACKTRACE").is_none() {
        // SAFETY: no other thread exists yet (the async runtime starts below).
        unsafe { std::env::set_var("RUST_LIB_BACKTRACE", "0") };
    }
    let cli = match cli::config_file::parse(std::env::args_os()) {
        Ok(cli) => cli,
        Err(cli::config_file::ParseError::Clap(e)) => e.exit(),
        Err(e) => {
            eprintln!("error: {e}");
            return ExitCode::from(2);
        }
    };
    // The benchmark prints a table; the many processors it starts only log problems.
    #[cfg(feature = "emulator")]
    let quiet = matches!(cli.command, Command::Bench(_));
    #[cfg(not(feature = "emulator"))]
    let quiet = false;
    let traces = init_logging(if quiet { "warn" } else { "info" });
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(runtime) => runtime,
        Err(e) => {
            eprintln!("error: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    let result: Result<(), String> = runtime.block_on(async {
        match &cli.command {
            #[cfg(feature = "emulator")]
            Command::Emulator(args) => cli::emulator::run(args).await.map_err(|e| format!("cfp emulator: {e}")),
            Command::Worker(args) => cli::worker::run(args).await.map_err(|e| format!("cfp worker: {e}")),
            #[cfg(feature = "emulator")]
            Command::Demo(args) => changefeed_operator::demo::run(changefeed_operator::demo::DemoSettings {
                duration: args.duration,
                workers: args.workers as usize,
                partitions: args.partitions,
                rate: args.rate,
            })
            .await
            .map(|_| ())
            .map_err(|e| format!("cfp demo: {e}")),
            #[cfg(feature = "emulator")]
            Command::Bench(args) => cli::bench::run(args).await.map_err(|e| format!("cfp bench: {e}")),
            Command::Write(args) => cli::write::run(args).await.map_err(|e| format!("cfp write: {e}")),
            Command::Estimate(args) => cli::estimate::run(args).await.map_err(|e| format!("cfp estimate: {e}")),
            Command::Operator(args) => cli::operator::run(args).await.map_err(|e| format!("cfp operator: {e}")),
            Command::Deadletter(command) => cli::deadletter::run(command)
                .await
                .map_err(|e| format!("cfp deadletter: {e}")),
            Command::Checkpoints(command) => cli::checkpoints::run(command)
                .await
                .map_err(|e| format!("cfp checkpoints: {e}")),
            Command::Crd(args) => {
                if args.markdown {
                    cli::print_out(changefeed_operator::operator::crd_markdown());
                } else {
                    cli::print_out(changefeed_operator::operator::crd_yaml());
                }
                Ok(())
            }
        }
    });
    drop(runtime);
    if let Some(traces) = traces {
        traces.shutdown();
    }
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("error: {message}");
            ExitCode::FAILURE
        }
    }
}

/// Logs go to standard error (standard output carries data); `RUST_LOG` sets the level and
/// `CFP_LOG_FORMAT=json` writes one JSON object per line (for log collectors). Logs to standard
/// error at `level` (and warnings of the SDK) unless `RUST_LOG` says otherwise; spans are also
/// exported over OTLP when the `OTEL_EXPORTER_OTLP_*` variables ask for it
/// ([`changefeed_operator::traces`]): the exporter to shut down at exit.
fn init_logging(level: &str) -> Option<TraceExport> {
    use std::io::IsTerminal;
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env().unwrap_or_else(|_| {
        tracing_subscriber::EnvFilter::new(format!(
            "{level},azure_data_cosmos=warn,azure_data_cosmos_driver=warn,azure_core=warn"
        ))
    });
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = if std::env::var("CFP_LOG_FORMAT").is_ok_and(|f| f.eq_ignore_ascii_case("json")) {
        fmt.json().with_filter(filter).boxed()
    } else {
        fmt.with_ansi(std::io::stderr().is_terminal())
            .with_filter(filter)
            .boxed()
    };
    // The log level does not choose the exported spans: this product's spans (acquire cycles,
    // reads, batches, deliveries, checkpoints) are exported whatever `RUST_LOG` says.
    let (otel, traces) = match TraceExport::from_env() {
        Ok(Some((layer, traces))) => (
            Some(layer.with_filter(changefeed_operator::traces::span_filter())),
            Some(traces),
        ),
        Ok(None) => (None, None),
        Err(error) => {
            eprintln!("warning: {error}; traces are not exported");
            (None, None)
        }
    };
    tracing_subscriber::registry().with(fmt).with(otel).init();
    traces
}
