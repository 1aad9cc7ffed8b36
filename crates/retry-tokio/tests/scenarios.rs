//! The scenario suite of retry-scenarios on tokio (a multi-thread runtime with 2 workers).

use retry_tokio::TokioRuntime;

fn block_on<F: std::future::Future>(future: F) -> F::Output {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a tokio runtime")
        .block_on(future)
}

retry_scenarios::suite!(TokioRuntime, block_on);
