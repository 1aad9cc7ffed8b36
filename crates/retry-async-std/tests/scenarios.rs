//! The scenario suite of retry-scenarios on async-io, run under both async-std's and smol's
//! executors.

use retry_async_std::AsyncIoRuntime;

mod async_std_executor {
    use super::AsyncIoRuntime;
    retry_scenarios::suite!(AsyncIoRuntime, async_std::task::block_on);
}

mod smol_executor {
    use super::AsyncIoRuntime;
    retry_scenarios::suite!(AsyncIoRuntime, smol::block_on);
}
